#!/usr/bin/env python3
"""mlperf_wrapper.py: the per-rank entry the mlpstorage harness runs under mpirun (`--help`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kv_cache.launcher import wrapper_entry  # noqa: E402  (stdlib only: a missing dependency is one line)

if __name__ == "__main__":
    sys.exit(wrapper_entry())
