"""Leftovers of earlier runs: run directories whose owner process is gone (SIGKILL, OOM kill, a power
cut) are removed at start and reported; directories of a live run are left alone and reported, since that
run shares the device and the free space.

Only what a run directory of this tool holds is removed: its entry files (``*.npy``) and its marker; a
foreign file keeps the directory (and is not touched). An empty temporary cache dir (``kv_cache_*``
under the temp dir) left by such a run goes too.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.storage.rundir import MARKER, TEMP_PREFIX, run_dirs

ENTRY_SUFFIX = ".npy"


@dataclass
class Sweep:
    """What the start-of-run sweep did: removed stale run dirs (path, bytes freed), kept live ones."""

    removed: list[tuple[Path, int]] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)  # stale but not removable: (path, why)
    live: list[tuple[Path, int]] = field(default_factory=list)  # (path, pid)

    def messages(self) -> list[str]:
        """One line per finding, for the console log and measurement.notes."""
        out = [f"removed the run directory {p} left by an earlier run whose process is gone "
               f"({n / (1 << 20):.1f} MiB freed)" for p, n in self.removed]
        out += [f"could not remove the stale run directory {p}: {why}" for p, why in self.kept]
        out += [f"another kv-cache run (pid {pid}) is using {p}: it shares the device and its free space, "
                "so both runs' figures are affected" for p, pid in self.live]
        return out


def _remove_run_dir(path: Path) -> tuple[int, str | None]:
    """Delete a stale run dir's entry files and marker, then the dir. Returns (bytes freed, why kept)."""
    freed = 0
    try:
        names = os.listdir(path)
    except OSError as e:
        return 0, e.strerror or str(e)
    for name in names:
        if not name.endswith(ENTRY_SUFFIX) and name != MARKER:
            continue
        p = path / name
        try:
            size = p.lstat().st_size
            if not p.is_file() or p.is_symlink():
                continue
            p.unlink()
            freed += size
        except FileNotFoundError:
            continue
        except OSError as e:
            return freed, f"{p}: {e.strerror or e}"
    try:
        path.rmdir()
    except OSError as e:
        return freed, f"{e.strerror or e} (a file this tool did not write is left in it)"
    return freed, None


def sweep(cache_dir: str | os.PathLike[str] | None) -> Sweep:
    """Remove stale run dirs under `cache_dir` (None: under every temporary cache dir of this tool)."""
    result = Sweep()
    if cache_dir is not None:
        parents = [Path(os.path.expanduser(os.fspath(cache_dir)))]
    else:
        try:
            parents = sorted(Path(tempfile.gettempdir()).glob(TEMP_PREFIX + "*"))
        except OSError:
            parents = []
    for parent in parents:
        stale, live = run_dirs(parent)
        result.live += live
        for path in stale:
            freed, why = _remove_run_dir(path)
            if why is None:
                result.removed.append((path, freed))
            else:
                result.kept.append((path, why))
        if cache_dir is None and stale:
            try:  # the temp cache dir was that run's own: gone with it when empty
                parent.rmdir()
            except OSError:
                pass
    return result
