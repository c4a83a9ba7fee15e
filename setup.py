"""The one compiled part: the storage tier's timed syscalls (kv_cache/storage/_timedio.c).

``optional=True``: where there is no compiler or no Python headers the install still succeeds and the
tier falls back to timing in Python (kv_cache/storage/timedio.py), and every run says which timer it used.
Everything else about the package is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "kv_cache/storage/_timedio.c"
# The source's SHA-256, in the module: timedio.py compares it with the _timedio.c beside it, so that a
# helper built from an older source (a checkout updated without a rebuild) is not taken for the current one.
SHA = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension("kv_cache.storage._timedio", [SOURCE], optional=True, extra_compile_args=["-O2"],
                  define_macros=[("TIMEDIO_SOURCE_SHA256", f'"{SHA}"')]),
    ],
)
