"""Entry point of `kv-cache`, `python3 -m kv_cache` and kv-cache.py: the CLI, behind a missing-dependency guard.

Only the standard library here, so that a checkout run without its dependencies installed gets one line
naming the package and the command that installs it, instead of a ModuleNotFoundError traceback.

A closed stdout (`kv-cache ... | head`) never stops a command: the CLI's tolerant stdout (cli/stdout.py)
drops the output once the reader has gone, the command runs to its end and writes its files, and the CLI
ends it with 141 (128 + SIGPIPE, what a shell shows for any tool its pipe reader stopped; cli/exits.py).
Here only the fallback for output that went around those streams: a BrokenPipeError ends the process
quietly with the same 141, no traceback, and no second one from the interpreter's final flush.
"""

from __future__ import annotations

import os
import signal
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


# Exit status when stdout's reader went away (128 + SIGPIPE, as for a process the signal ended); the same
# value as kv_cache.cli.stdout.CLOSED_PIPE, written here too because this module imports only the stdlib.
CLOSED_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))


def entry() -> int:
    """The process's entry (`kv-cache`, `mlperf-kv-cache`, `python3 -m kv_cache`, kv-cache.py): the process
    exits when the command returns, so a run ignores the stop signals from its results to that exit
    (kv_cache/host/signals.py `exit_follows`). `main` alone, called in-process, leaves them as they were."""
    _exit_follows()
    return main()


def wrapper_entry() -> int:
    """mlperf_wrapper.py's process entry (see `entry`)."""
    _exit_follows()
    return wrapper_main()


def _exit_follows() -> None:
    try:
        from kv_cache.host.signals import exit_follows  # noqa: PLC0415  (after the guard's own imports)
    except ModuleNotFoundError:  # a missing dependency: _guarded_main says which, in one line
        return
    exit_follows()


def _version_asked(argv: list[str] | None) -> bool:
    """`--version` alone: print what the CLI's own --version prints (cli/flags.py), without its dependencies, so
    that a checkout or a broken install still says which version it is (kv_cache/__init__.py imports nothing)."""
    if (sys.argv[1:] if argv is None else argv) != ["--version"]:
        return False
    from kv_cache import __version__  # noqa: PLC0415

    print(f"kv-cache {__version__}")
    return True


def main(argv: list[str] | None = None) -> int:
    if _version_asked(argv):
        return 0
    try:
        return _guarded_main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that the interpreter's flush of stdout at exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout already closed or not a real file
        pass


def wrapper_main(argv: list[str] | None = None) -> int:
    """Entry point of mlperf_wrapper.py: the wrapper's CLI behind the same guard (the same one-line install
    hint, under the wrapper's name, and exit 2 when a dependency is missing; 141 for a closed stdout). Alone,
    `--version` prints kv-cache's version, as `kv-cache --version` does (it was a usage error: the rank flags
    missing)."""
    if _version_asked(argv):
        return 0
    try:
        return _guarded_main(argv, WRAPPER_PROG)
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE


WRAPPER_PROG = "mlperf_wrapper.py"


def _guarded_main(argv: list[str] | None, prog: str = "kv-cache") -> int:
    try:
        if prog == WRAPPER_PROG:
            from kv_cache.cli.wrapper import main as cli_main  # noqa: PLC0415  (the guarded import)
        else:
            from kv_cache.cli import main as cli_main  # noqa: PLC0415  (the guarded import)
        code = cli_main(argv)
        sys.stdout.flush()  # inside the guard: a closed pipe shows here, not in the interpreter's exit
        return code
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "kv_cache":
            raise  # our own package broken: a bug, not a missing dependency
        sys.stderr.write(missing_dependency_message(exc, prog) + "\n")
        return 2
