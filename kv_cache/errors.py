"""Exceptions that cross module boundaries, and the process exit codes the CLI maps them to.

Lower layers raise these with messages about their own inputs (a path, a value); they never name a
command-line flag. An error may say which setting it is about (`setting`, a RunSettings field name):
the CLI, and only the CLI, turns that into the flag's name in the one-line message.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of `kv-cache`."""

    OK = 0  # completed (whatever the verdict, unless --fail-exit-code)
    FAIL = 1  # the performance profile said FAIL and --fail-exit-code was given
    USAGE = 2  # bad flags, config, paths or trace files: nothing was run
    STORAGE_ERROR = 3  # the run stopped because the storage tier failed
    INTERRUPTED = 130  # Ctrl-C or SIGTERM


class UsageError(Exception):
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


class StorageError(Exception):
    """The storage tier failed while the run was going (exit 3)."""
