"""Keeping what is already on disk: the file half of the one write policy (results/write.py has the rest).

Every output of kv-cache (results, spreadsheet, trace log, plots, pages) goes through these two:
- keep_existing renames an existing regular file at the path to `PATH.1` (`.2`, ...), never overwriting a
  result silently;
- atomic_target yields a temporary path in the same directory; what is written there replaces the target
  in one rename when the block ends without an error, and is removed when it raises. A crash or a Ctrl-C
  never leaves a half-written file under the target's name.
They live here, below storage/ and render/, so every writer can use them (the layers contract).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_target", "keep_existing"]


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
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
