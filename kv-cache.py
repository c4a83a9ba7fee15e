#!/usr/bin/env python3
"""kv-cache: run the benchmark from a source checkout (`python3 kv-cache.py --help`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kv_cache.launcher import entry  # noqa: E402  (stdlib only: a missing dependency is one line)

if __name__ == "__main__":
    sys.exit(entry())
