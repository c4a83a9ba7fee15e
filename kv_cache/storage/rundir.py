"""Run directory ownership: the benchmark writes only inside a directory it created and marked.

``<cache_dir>/kv-cache-run-<YYYYmmdd-HHMMSS>-<pid>-<4 hex>/`` holds a marker ``.kv-cache-run`` (JSON:
tool, version, pid, host, start time) and the entry files.  Cleanup removes the marker and rmdirs the
run directory (and the temporary cache dir if we made one) - never anything it did not create, so a
user's file in either directory survives.  Nothing pre-existing is purged.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

from kv_cache.errors import StorageSetupError

MARKER = ".kv-cache-run"
RUN_PREFIX = "kv-cache-run-"
TOOL = "kv-cache"


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
        if cache_dir is None:
            self.cache_dir = Path(tempfile.mkdtemp(prefix="kv_cache_"))
            self.owns_cache_dir = True
        else:
            cd = Path(os.path.expanduser(os.fspath(cache_dir)))
            if cd.exists() and not cd.is_dir():
                raise StorageSetupError(f"cache dir {cd} exists and is not a directory")
            try:
                cd.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageSetupError(f"cannot create cache dir {cd}: {e.strerror or e}") from None
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

        Entry files must already be gone (their owner deletes them).  Returns True if the run dir is
        gone; a foreign file left in it keeps it (and it is not touched).  Idempotent, never raises.
        """
        gone = True
        path = getattr(self, "path", None)
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
            try:
                os.rmdir(self.cache_dir)
            except FileNotFoundError:
                pass
            except OSError:
                pass
        self._removed = gone
        return gone

    def __repr__(self) -> str:
        return f"RunDir({str(getattr(self, 'path', self.cache_dir))!r})"


def read_marker(run_dir: str | os.PathLike[str]) -> dict | None:
    """The marker JSON of a run directory, or None if it has none / it is unreadable."""
    try:
        with open(Path(run_dir) / MARKER, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError as e:  # pragma: no cover
        return e.errno != errno.ESRCH
    return True


def stale_run_dirs(cache_dir: str | os.PathLike[str]) -> list[Path]:
    """Run directories under ``cache_dir`` left by a kv-cache process of this host that is gone.

    Lists only (deletes nothing): a directory counts only if its marker names this tool and host.
    """
    out: list[Path] = []
    host = socket.gethostname()
    try:
        candidates = sorted(Path(cache_dir).glob(RUN_PREFIX + "*"))
    except OSError:
        return out
    for p in candidates:
        info = read_marker(p)
        if not info or info.get("tool") != TOOL or info.get("host") != host:
            continue
        pid = info.get("pid")
        if isinstance(pid, int) and not _pid_alive(pid):
            out.append(p)
    return out
