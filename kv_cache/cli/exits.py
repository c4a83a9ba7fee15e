"""The exit status of `kv-cache`, decided here and nowhere else: from the error that ended the process, or
from the outcome of a run that wrote its results (kv_cache.errors.RunOutcome), and then whether stdout's
reader went away (`after_output`)."""

from __future__ import annotations

from kv_cache.cli.stdout import CLOSED_PIPE
from kv_cache.errors import (
    ExitCode,
    InternalError,
    KvCacheError,
    RanksLost,
    RunOutcome,
    StorageError,
    UsageError,
)

__all__ = ["CLOSED_PIPE", "EXIT_CODES", "after_output", "exit_code_for", "exit_status"]

# Which exit status each kind of error ends the process with; the first matching row wins.
EXIT_CODES: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (KeyboardInterrupt, ExitCode.INTERRUPTED),
    (StorageError, ExitCode.STORAGE_ERROR),  # CapacityError included
    (UsageError, ExitCode.USAGE),  # ConfigError, TraceError, PaceError, StorageSetupError included
    (RanksLost, ExitCode.RANKS_LOST),
    (InternalError, ExitCode.INTERNAL),
    (KvCacheError, ExitCode.INTERNAL),  # a KvCacheError with no row of its own: a gap in this table
)


def exit_code_for(exc: BaseException) -> ExitCode | None:
    """The exit status an uncaught error ends the process with; None for errors that are no KvCacheError
    (a bug: the caller lets the traceback show)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return None


def exit_status(ended: RunOutcome | int) -> ExitCode | int:
    """The exit status of a run that wrote its results (an int: a sub-command that decided its own, e.g.
    `report`, passes through). Interrupted before the window ended, then ranks lost, then a storage error,
    then a FAIL verdict under --fail-exit-code; else 0 (the verdict is in the results, not the status)."""
    if not isinstance(ended, RunOutcome):
        return ended
    if ended.interrupted:
        return ExitCode.INTERRUPTED
    if ended.missing_ranks:
        return ExitCode.RANKS_LOST
    if ended.storage_error is not None:
        return ExitCode.STORAGE_ERROR
    if ended.fail_exit_code and ended.passed is False:
        return ExitCode.FAIL
    return ExitCode.OK


def after_output(code: ExitCode | int, stdout_closed: bool) -> int:
    """The status a command ends with once its output is done: CLOSED_PIPE (141) when it ended 0 but its
    stdout's reader went away (`kv-cache ... | head`), so that a pipeline (`set -o pipefail`) sees that not
    everything was read, as it would for any tool the pipe stopped; the results say the run completed. A
    status that is not 0 (FAIL, storage error, ranks lost, interrupted, ...) stands: it says more."""
    return CLOSED_PIPE if stdout_closed and int(code) == ExitCode.OK else int(code)
