import sys

from kv_cache.launcher import main

sys.exit(main())
