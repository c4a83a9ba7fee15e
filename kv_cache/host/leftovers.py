"""Leftovers of earlier runs: run directories whose owner process is gone (SIGKILL, OOM kill, a power
cut) are removed at start and reported; directories of a live run are left alone and reported, since that
run shares the device and the free space.

Only what a run directory of this tool holds is removed: its entry files (``*.npy``) and its marker; a
foreign file keeps the directory (and is not touched). An empty temporary cache dir (``kv_cache_*``
under the temp dir) left by such a run goes too.

A run directory whose marker is gone but whose entry files are not (left by versions that removed the
marker first, when their clean-up was cut short) is removed too, but only when all of this holds: its
name is exactly a run directory's (`kv-cache-run-<date>-<time>-<pid>-<4 hex>`), the pid in it runs on no
process of this host, it holds nothing but regular ``*.npy`` files (at least one), and none of them, nor
the directory, changed for ORPHAN_AGE_S. Anything else in it keeps it whole.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.host.rundir import (
    ENTRY_SUFFIX,
    MARKER,
    RUN_DIR_NAME,
    RUN_PREFIX,
    TEMP_PREFIX,
    pid_alive,
    run_dirs,
)

__all__ = ["ENTRY_SUFFIX", "ORPHAN_AGE_S", "Sweep", "markerless_run_dirs", "sweep"]

ORPHAN_AGE_S = 600.0  # a marker-less run directory untouched this long is a dead run's, not one starting


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
    for name in sorted(names, key=lambda n: n == MARKER):  # the marker last (see rundir.py)
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
        stale += markerless_run_dirs(parent)
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


def markerless_run_dirs(cache_dir: str | os.PathLike[str], now: float | None = None) -> list[Path]:
    """Run directories under `cache_dir` that lost their marker but kept entry files, and are provably a
    dead run's (see the module docstring); lists only."""
    now = time.time() if now is None else now
    found: list[Path] = []
    try:
        candidates = sorted(Path(cache_dir).glob(RUN_PREFIX + "*"))
    except OSError:
        return found
    for p in candidates:
        name = RUN_DIR_NAME.fullmatch(p.name)
        if name is None or pid_alive(int(name.group(1))) or not _markerless_orphan(p, now):
            continue
        found.append(p)
    return found


def _markerless_orphan(path: Path, now: float) -> bool:
    """A real directory, no marker, only old regular entry files (at least one)."""
    try:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < ORPHAN_AGE_S:
            return False
        entries = list(os.scandir(path))
        if not entries:
            return False
        for e in entries:
            est = e.stat(follow_symlinks=False)
            if (e.name == MARKER or not e.name.endswith(ENTRY_SUFFIX) or not stat.S_ISREG(est.st_mode)
                    or now - est.st_mtime < ORPHAN_AGE_S):
                return False
    except OSError:
        return False
    return True
