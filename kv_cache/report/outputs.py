"""Where the results go: output paths checked before a run, written safely after it.

A run may take hours; finding out at its end that `--output` names a directory, a read-only mount or
`/proc/version` loses everything it measured. So every output path is checked first
(check_output_path: the directory exists or is created, is writable, and the path is not a directory
or a special file), and at the end write_results never loses the results: an existing file is kept under
a numbered suffix, and if writing still fails the results go to a fallback path that the caller names.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kv_cache.errors import UsageError
from kv_cache.report.jsonfile import write_json_atomic


class OutputPathError(UsageError):
    """An output path the run could not write its results to (checked before anything runs)."""


def check_output_path(path: str, example: str = "results.json", allow_devnull: bool = False) -> None:
    """Raise OutputPathError unless `path` can take a results file: not a directory nor a special file, in a
    directory that exists (created here if missing) and accepts new files. `allow_devnull`: /dev/null is
    accepted (a stream written in place, such as the I/O trace log; never a file replaced atomically)."""
    if not path or not path.strip():
        raise OutputPathError(f"is empty: give a file name such as {example}")
    if allow_devnull and os.path.realpath(path) == os.devnull:
        return
    target = Path(path).expanduser()
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise OutputPathError(f"{path}: part of its directory is a file, not a directory; "
                              "choose a path in a writable directory") from None
    except OSError as exc:
        raise OutputPathError(f"{path}: cannot be checked ({exc.strerror}); choose another path") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{path} is a directory; give a file name in it, e.g. {target / example}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputPathError(f"{path} is a special file (device, FIFO or socket), not a results file; "
                              "choose a regular file path")
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{path}: cannot create its directory {parent} ({exc.strerror}); "
                              "choose a writable directory") from None
    if not parent.is_dir():
        raise OutputPathError(f"{path}: {parent} is not a directory; choose a path in a writable directory")
    _probe(parent, path)


def _probe(parent: Path, path: str) -> None:
    """Create and remove a file in `parent`: the only sure test (a read-only mount, /proc, permissions)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".kv-cache-probe-", dir=parent)
    except OSError as exc:
        why = "its filesystem takes no new files" if exc.errno == errno.ENOENT else exc.strerror
        raise OutputPathError(f"{path}: cannot write in {parent} ({why}); choose a writable directory") from None
    os.close(fd)
    os.unlink(probe)


@dataclass(frozen=True)
class Written:
    """Where the results went: `path` (the one asked for, or the fallback), the older file's new name when
    one was kept, and the error that sent them to the fallback (None: written where asked)."""

    path: str
    kept_as: str | None = None
    error: str | None = None


def keep_existing(path: str) -> str | None:
    """Rename an existing regular file at `path` to `path.1` (`.2`, ...): never overwrite a result silently.
    Returns the new name, or None when there was nothing to keep."""
    target = Path(path)
    if not target.is_file():
        return None
    n = 1
    while Path(f"{path}.{n}").exists():
        n += 1
    kept = f"{path}.{n}"
    os.rename(target, kept)
    return kept


def fallback_path(path: str) -> str:
    """A path in the temporary directory, named after the one that failed."""
    name = Path(path).name or "results.json"
    return os.path.join(tempfile.gettempdir(), f"kv-cache-fallback-{os.getpid()}-{int(time.time())}-{name}")


def write_results(path: str, results: dict[str, Any], keep: bool = True) -> Written:
    """Write `results` as JSON to `path`, keeping an existing file there (when `keep`); on an OSError write
    them to fallback_path instead (an error there too is raised)."""
    kept = None
    try:
        kept = keep_existing(path) if keep else None
        if kept is not None:
            results.setdefault("measurement", {}).setdefault("notes", []).append(
                f"an earlier results file at {path} was kept as {kept}")
        write_json_atomic(path, results)
        return Written(path, kept)
    except OSError as exc:
        error = f"{path}: {exc.strerror or exc}"
    other = fallback_path(path)
    write_json_atomic(other, results)
    return Written(other, kept, error)
