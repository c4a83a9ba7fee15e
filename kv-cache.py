#!/usr/bin/env python3
"""kv-cache: run the benchmark from a source checkout (`python3 kv-cache.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kv_cache.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
