import sys

from kv_cache.launcher import entry

sys.exit(entry())
