"""The storage tier's syscalls with their device time: the C helper where it built, else Python.

``pwritev(fd, buffers, offset)`` and ``preadv(fd, buffer, offset)`` return ``(bytes, ns)``;
``fdatasync(fd)``, ``close(fd)``, ``unlink(path)`` and ``fadvise_dontneed(fd)`` (``posix_fadvise(fd, 0, 0,
POSIX_FADV_DONTNEED)``, the buffered mode's) return ``ns``; ``open(path, flags, mode)`` returns ``(fd, ns)``.

- **c** (``kv_cache.storage._timedio``, built at install from ``_timedio.c``): ``clock_gettime
  (CLOCK_MONOTONIC)`` on both sides of the syscall, in C, with the GIL released. The duration ends when the
  syscall returns, not when the thread wins the GIL back.
- **python** (the fallback, when the extension did not build, is out of date (its calls, or the source's
  SHA-256 setup.py built into it against the ``_timedio.c`` beside it, in a checkout), or ``KV_CACHE_PURE_TIMER=1``):
  ``time.perf_counter_ns()`` around ``os.pwritev`` / ``os.preadv``; the stop timestamp is taken after the
  GIL is taken back, so under load or beside a busy thread the figure includes that wait. The run says so.

Chosen by measurement (benchmarks/device_timer.py): ctypes calls cannot do it, since each foreign call
re-takes the GIL before the next (the stop ``clock_gettime`` comes after the GIL wait, as in Python).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from time import perf_counter_ns

__all__ = ["TIMER", "TIMER_DESCRIPTION", "close", "fadvise_dontneed", "fdatasync", "open", "preadv", "pwritev",
           "timer_info", "unlink"]

_why_python = ""
_c = None
if os.environ.get("KV_CACHE_PURE_TIMER", "") not in ("", "0"):
    _why_python = "KV_CACHE_PURE_TIMER is set"
else:
    try:
        _c = importlib.import_module("kv_cache.storage._timedio")
    except ImportError as e:  # the C helper did not build (no compiler or headers at install)
        _why_python = f"the C helper is not built ({e})"
    else:
        _missing = [n for n in ("pwritev", "preadv", "fdatasync", "open", "close", "unlink") if not hasattr(_c, n)]
        if _missing:  # built from an older _timedio.c: rebuild (pip install ., or setup.py build_ext --inplace)
            _c, _why_python = None, f"the C helper is out of date (it has no {', '.join(_missing)}): rebuild it"
        else:  # the same calls, but built from another source? (the source lies here in a checkout)
            _src = os.path.join(os.path.dirname(__file__), "_timedio.c")
            _built = getattr(_c, "SOURCE_SHA256", "")
            if os.path.exists(_src):
                _sha = hashlib.sha256(Path(_src).read_bytes()).hexdigest()
                if _built != _sha:
                    _c, _why_python = None, (f"the C helper was built from another _timedio.c (built "
                                             f"{_built[:12] or 'without its hash'}, source {_sha[:12]}): rebuild it")


def _py_fadvise_dontneed(fd: int) -> int:
    """posix_fadvise(DONTNEED) timed in Python (the fallback; also where the C helper has no such call)."""
    t = perf_counter_ns()
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return perf_counter_ns() - t


if _c is not None:
    TIMER = "c"
    TIMER_DESCRIPTION = ("clock_gettime(CLOCK_MONOTONIC) around each syscall in C, GIL released "
                         "(kv_cache.storage._timedio)")
    pwritev = _c.pwritev
    preadv = _c.preadv
    fdatasync = _c.fdatasync
    open = _c.open  # noqa: A001
    close = _c.close
    unlink = _c.unlink
    fadvise_dontneed = getattr(_c, "fadvise_dontneed", _py_fadvise_dontneed)
else:
    TIMER = "python"
    TIMER_DESCRIPTION = ("perf_counter_ns() around os.pwritev/os.preadv in Python (fallback: "
                         f"{_why_python}); includes the wait to re-take the GIL")

    def pwritev(fd: int, buffers, offset: int) -> tuple[int, int]:
        t = perf_counter_ns()
        n = os.pwritev(fd, buffers, offset)
        return n, perf_counter_ns() - t

    def preadv(fd: int, buffer, offset: int) -> tuple[int, int]:
        t = perf_counter_ns()
        n = os.preadv(fd, [buffer], offset)
        return n, perf_counter_ns() - t

    def fdatasync(fd: int) -> int:
        t = perf_counter_ns()
        os.fdatasync(fd)
        return perf_counter_ns() - t

    def open(path, flags: int, mode: int = 0o777) -> tuple[int, int]:  # noqa: A001
        t = perf_counter_ns()
        fd = os.open(path, flags, mode)
        return fd, perf_counter_ns() - t

    def close(fd: int) -> int:
        t = perf_counter_ns()
        os.close(fd)
        return perf_counter_ns() - t

    def unlink(path) -> int:
        t = perf_counter_ns()
        os.unlink(path)
        return perf_counter_ns() - t

    fadvise_dontneed = _py_fadvise_dontneed


def timer_info() -> dict[str, str]:
    """What the storage tier's device times were taken with (the results JSON's ``device_timer``)."""
    return {"timer": TIMER, "description": TIMER_DESCRIPTION}
