"""The one compiled part: the storage tier's timed syscalls (kv_cache/storage/_timedio.c).

``optional=True``: where there is no compiler or no Python headers the install still succeeds and the
tier falls back to timing in Python (kv_cache/storage/timedio.py), and every run says which timer it used.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("kv_cache.storage._timedio", ["kv_cache/storage/_timedio.c"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
