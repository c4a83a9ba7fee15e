"""The errors that cross module boundaries, under one root (KvCacheError), and how a run ended (RunOutcome).

Lower layers raise these with messages about their own inputs (a path, a value); they never name a
command-line flag. An error may say which setting it is about (`setting`, a RunSettings field name):
the CLI, and only the CLI, turns that into the flag's name in the one-line message. The CLI alone
decides the exit status (kv_cache/cli/exit.py), from an error or from a RunOutcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of `kv-cache`."""

    OK = 0  # completed (whatever the verdict, unless --fail-exit-code)
    FAIL = 1  # the performance profile said FAIL and --fail-exit-code was given
    USAGE = 2  # bad flags, config, paths or trace files: nothing was run
    STORAGE_ERROR = 3  # the run stopped because the storage tier failed
    RANKS_LOST = 4  # a rank (process) of the run was killed or crashed; the others' results are kept
    INTERNAL = 70  # a programming error (an exception that is no KvCacheError): a bug, traceback in the log
    INTERRUPTED = 130  # Ctrl-C or SIGTERM before the measured window ended


class KvCacheError(Exception):
    """The root of every error this tool raises on purpose; anything else reaching the CLI is a bug."""


class UsageError(KvCacheError):
    """Input the run cannot start with (flags, config, paths, trace files): one line on stderr, exit 2."""

    setting: str | None = None  # the setting the message is about; the CLI prefixes its flag

    def about(self, setting: str) -> UsageError:
        """This error, marked as being about `setting` (returns self, for `raise Err(...).about(...)`)."""
        self.setting = setting
        return self


class ConfigError(UsageError):
    """A config.yaml problem; the message names the file and the key."""


class StorageSetupError(UsageError):
    """The storage tier cannot be set up as asked (directory, I/O mode, trace log)."""


class DocumentError(UsageError):
    """A file given as a results document that is not one: unreadable, not JSON, no or an unknown
    `schema_version`, or rank documents that are not one run's (a merge). One line, exit 2."""


class StorageError(KvCacheError):
    """The storage tier failed and that stopped the run (exit 3): a write or read error while
    preconditioning or ingesting, an entry that fits no tier. The results measured so far are written."""


class RanksLost(KvCacheError):
    """A rank of the run ended without its results (killed, out of memory, crashed): exit 4."""

    def __init__(self, message: str, missing: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


class InternalError(KvCacheError):
    """A programming error seen in another process (its traceback is in the log): exit 70, never 2."""


@dataclass(frozen=True)
class RunOutcome:
    """How a run that wrote its results ended; the CLI turns it into the exit status.

    interrupted: a signal stopped it before its window ended (verdict INCOMPLETE).
    storage_error: the storage failure that stopped it, if one did.
    passed: the verdict (overall_passed); None when there is none (the sessions ladder).
    missing_ranks: ranks whose results never came (killed, crashed); the others' were merged.
    fail_exit_code: --fail-exit-code was given: a FAIL verdict exits 1.
    """

    interrupted: bool = False
    storage_error: str | None = None
    passed: bool | None = None
    missing_ranks: tuple[int, ...] = ()
    fail_exit_code: bool = False
