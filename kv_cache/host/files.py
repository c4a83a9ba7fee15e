"""Keeping what is already on disk: the file half of the one write policy (results/write.py has the rest).

Every output of kv-cache (results, spreadsheet, trace log, plots, pages) goes through these two:
- keep_existing renames an existing regular file at the path to `PATH.1` (`.2`, ...), never overwriting a
  result silently;
- atomic_target yields a temporary path in the same directory; what is written there replaces the target
  in one rename when the block ends without an error, and is removed when it raises. A crash or a Ctrl-C
  never leaves a half-written file under the target's name. A SIGKILL between the temporary file's creation
  and its rename leaves it (`.NAME.XXXXXXXX.tmp.EXT`, mode 0600, beside the target): nothing reads it as a
  result (`is_atomic_temp`: `kv-cache audit DIR` skips it and says so) and nothing removes it.
They live here, below storage/ and render/, so every writer can use them (the layers contract).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_target", "current_umask", "is_atomic_temp", "keep_existing"]

_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]{8}\.tmp(?P<suffix>\.[^.]*)?$")  # (mkstemp's 8 characters)


def keep_existing(path: str | os.PathLike) -> str | None:
    """Rename an existing regular file at `path` to `path.1` (`.2`, ...): never overwrite a result silently.
    Returns the new name, or None when there was nothing to keep (no file, or not a regular file such as
    /dev/null)."""
    path = os.fspath(path)
    target = Path(path)
    if not target.is_file():
        return None
    n = 1
    while Path(f"{path}.{n}").exists():
        n += 1
    kept = f"{path}.{n}"
    os.rename(target, kept)
    return kept


@contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path beside `path` to write to; on a clean exit it is fsynced and renamed onto `path`
    (permissions as an ordinary new file), on an error it is removed. The caller keeps any existing file
    first (keep_existing): this only makes the write all-or-nothing."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # the suffix keeps the target's extension: writers such as openpyxl and matplotlib pick the format by it
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def is_atomic_temp(name: str) -> bool:
    """Whether a file name is one of atomic_target's temporary files (`.NAME.XXXXXXXX.tmp.EXT`: a write
    killed before its rename left it), not a result."""
    m = _TEMP_NAME.match(name)
    return bool(m) and (m.group("suffix") or "") == Path(m.group("target")).suffix


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status `Umask:`):
    the os.umask(0)-then-restore idiom changes it for every thread for that moment, and the periodic
    results document is written on its own thread while the I/O workers create files. Elsewhere, that
    idiom."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask
