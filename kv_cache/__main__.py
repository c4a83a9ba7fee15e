import sys

from kv_cache.cli import main

sys.exit(main())
