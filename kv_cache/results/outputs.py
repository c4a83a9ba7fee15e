"""Where the results go: output paths checked before a run, written safely after it.

A run may take hours; finding out at its end that `--output` names a directory, a read-only mount or
`/proc/version` loses everything it measured. So every output path is checked first
(check_output_path: the directory exists or is created, is writable, and the path is not a directory
or a special file), and at the end write_results writes them under the one write policy of
kv_cache/results/write.py (an existing file kept, atomic, a fallback file when the target fails).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from kv_cache.errors import UsageError
from kv_cache.results.write import Written, write_document


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


def write_results(path: str, results: dict[str, Any], keep: bool = True) -> Written:
    """The results of a run or a sessions ladder to `path`, under the one write policy (results/write.py)."""
    return write_document(path, results, keep)
