"""Entry point of `kv-cache`, `python3 -m kv_cache` and kv-cache.py: the CLI, behind a missing-dependency guard.

Only the standard library here, so that a checkout run without its dependencies installed gets one line
naming the package and the command that installs it, instead of a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import sys

# Import name -> the pip package that provides it (where they differ).
PIP_NAMES = {"yaml": "pyyaml", "zstandard": "zstandard", "openpyxl": "openpyxl", "mpi4py": "mpi4py",
             "tiktoken": "tiktoken"}


def missing_dependency_message(exc: ModuleNotFoundError, prog: str = "kv-cache") -> str:
    """`<prog>: error: ...` naming the missing package and how to install it."""
    module = (exc.name or str(exc)).split(".")[0]
    package = PIP_NAMES.get(module, module)
    return (f"{prog}: error: the Python package '{package}' is not installed; install it with "
            f"`{sys.executable} -m pip install {package}` (or `pip install -e .` in the checkout for all "
            "dependencies)")


def main(argv: list[str] | None = None) -> int:
    try:
        from kv_cache.cli import main as cli_main  # noqa: PLC0415  (the guarded import)

        return cli_main(argv)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "kv_cache":
            raise  # our own package broken: a bug, not a missing dependency
        sys.stderr.write(missing_dependency_message(exc) + "\n")
        return 2
