"""Run directory ownership: the benchmark writes only inside a directory it created and marked.

``<cache_dir>/kv-cache-run-<YYYYmmdd-HHMMSS>-<pid>-<4 hex>/`` holds a marker ``.kv-cache-run`` (JSON:
tool, version, pid, host, start time) and the entry files.  Cleanup removes the marker and rmdirs the
run directory (and the temporary cache dir if we made one) - never anything it did not create, so a
user's file in either directory survives.  Nothing pre-existing is purged.

The marker is the last thing removed: while an entry file is left in the run directory (an unlink that
failed, a clean-up cut short), the marker stays with it, so the next run's sweep (leftovers.py) knows the
directory is a dead run's and removes it. A directory without its marker never holds entry files that
nothing will sweep.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import socket
import tempfile
import time
from pathlib import Path

from kv_cache.errors import StorageSetupError

MARKER = ".kv-cache-run"
RUN_PREFIX = "kv-cache-run-"
ENTRY_SUFFIX = ".npy"  # the entry files of a run directory (storage/files.py file_name)
# A run directory's name, `kv-cache-run-<YYYYmmdd-HHMMSS>-<pid>-<4 hex>` (_make_run_dir); group 1: the pid
RUN_DIR_NAME = re.compile(r"kv-cache-run-\d{8}-\d{6}-(\d+)-[0-9a-f]{4}")
TEMP_PREFIX = "kv_cache_"  # the temporary cache dir of a run without a cache dir
TOOL = "kv-cache"


def process_start(pid: int) -> int | None:
    """Start time of process `pid` in clock ticks after boot (/proc/<pid>/stat field 22); None: unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _tool_version() -> str:
    try:
        from kv_cache import __version__

        return str(__version__)
    except Exception:  # pragma: no cover
        return "unknown"


class RunDir:
    """Creates (and on :meth:`remove`, removes) this run's private directory under ``cache_dir``."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None, tool: str = TOOL):
        self.owns_cache_dir = False
        self._removed = False
        self._created: list[Path] = []  # cache dir levels this run created, deepest first
        if cache_dir is None:
            self.cache_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
            self.owns_cache_dir = True
        else:
            cd = Path(os.path.expanduser(os.fspath(cache_dir)))
            if cd.exists() and not cd.is_dir():
                raise StorageSetupError(f"cache dir {cd} exists and is not a directory")
            missing = [p for p in (cd, *cd.parents) if not p.exists()]
            try:
                cd.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageSetupError(f"cannot create cache dir {cd}: {e.strerror or e}") from None
            self._created = missing  # removed at the end if empty: a created cache dir is not left behind
            self.owns_cache_dir = bool(missing)
            self.cache_dir = cd
        try:
            self.path = self._make_run_dir()
            self.marker_path = self.path / MARKER
            self.started = time.time()
            info = {
                "tool": tool,
                "version": _tool_version(),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
                "start_unix": self.started,
                "proc_start": process_start(os.getpid()),  # with pid and host: this very process
                "boot_id": boot_id(),
            }
            fd = os.open(self.marker_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, (json.dumps(info) + "\n").encode())
            finally:
                os.close(fd)
        except BaseException:
            self.remove()
            raise

    def _make_run_dir(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for _ in range(100):
            p = self.cache_dir / f"{RUN_PREFIX}{stamp}-{os.getpid()}-{secrets.token_hex(2)}"
            try:
                os.mkdir(p, 0o755)
                return p
            except FileExistsError:
                continue
            except OSError as e:
                raise StorageSetupError(
                    f"cannot create a run directory in {self.cache_dir}: {e.strerror or e}"
                ) from None
        raise StorageSetupError(f"cannot create a unique run directory in {self.cache_dir}")  # pragma: no cover

    def remove(self) -> bool:
        """Remove the marker and rmdir the run dir (and a temp cache dir we made).

        Entry files must already be gone (their owner deletes them): while one is left, the marker and
        the directory stay (the next run's sweep removes them) and this returns False.  Returns True if
        the run dir is gone; a foreign file left in it keeps it (and it is not touched).  Idempotent,
        never raises.
        """
        gone = True
        path = getattr(self, "path", None)
        if path is not None and not self._removed and holds_entries(path):
            return False  # the marker goes last: it stays with the entry files it vouches for
        if path is not None and not self._removed:
            try:
                os.unlink(path / MARKER)
            except OSError:
                pass
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        if self.owns_cache_dir:
            for level in self._created or [self.cache_dir]:
                try:
                    os.rmdir(level)
                except FileNotFoundError:
                    continue
                except OSError:  # not empty (a user's file, another run): kept, and so are its parents
                    break
        self._removed = gone
        return gone

    def __repr__(self) -> str:
        return f"RunDir({str(getattr(self, 'path', self.cache_dir))!r})"


def holds_entries(run_dir: str | os.PathLike[str]) -> bool:
    """Whether an entry file (``*.npy``) is in the run directory (False when it cannot be listed)."""
    try:
        with os.scandir(run_dir) as it:
            return any(e.name.endswith(ENTRY_SUFFIX) for e in it)
    except OSError:
        return False


def read_marker(run_dir: str | os.PathLike[str]) -> dict | None:
    """The marker JSON of a run directory, or None if it has none / it is unreadable."""
    try:
        with open(Path(run_dir) / MARKER, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError as e:  # pragma: no cover
        return e.errno != errno.ESRCH
    return _state(pid) not in ("Z", "X")  # a killed run whose parent has not reaped it yet is gone


def _state(pid: int) -> str | None:
    """The state letter of process `pid` (/proc/<pid>/stat field 3); None: unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2:].split()[0]
    except (OSError, ValueError, IndexError):
        return None


def owner_alive(info: dict) -> bool:
    """Whether the process a marker (of this host) names still runs: same pid AND same start time, in
    this boot. A recycled pid is not the owner; a marker without a start time falls back to the pid."""
    pid = info.get("pid")
    if not isinstance(pid, int):
        return False
    if info.get("boot_id") and boot_id() and info["boot_id"] != boot_id():
        return False
    if not pid_alive(pid):
        return False
    started = info.get("proc_start")
    return started is None or process_start(pid) in (None, started)


def run_dirs(cache_dir: str | os.PathLike[str]) -> tuple[list[Path], list[tuple[Path, int]]]:
    """(stale, live) run directories under ``cache_dir`` whose marker names this tool and host: stale ones
    belong to a process that is gone, live ones (with their pid) to one that runs. Lists only."""
    stale: list[Path] = []
    live: list[tuple[Path, int]] = []
    host = socket.gethostname()
    try:
        candidates = sorted(Path(cache_dir).glob(RUN_PREFIX + "*"))
    except OSError:
        return stale, live
    for p in candidates:
        info = read_marker(p)
        if not info or info.get("tool") != TOOL or info.get("host") != host:
            continue
        if owner_alive(info):
            live.append((p, info["pid"]))
        else:
            stale.append(p)
    return stale, live


def stale_run_dirs(cache_dir: str | os.PathLike[str]) -> list[Path]:
    """Run directories under ``cache_dir`` left by a kv-cache process of this host that is gone.

    Lists only (deletes nothing): a directory counts only if its marker names this tool and host.
    """
    return run_dirs(cache_dir)[0]
