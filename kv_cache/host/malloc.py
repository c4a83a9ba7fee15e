"""glibc malloc over a long run: few arenas, and their free space given back to the kernel.

A run's Python objects are bounded (streaming histograms, capped lists, flat time-series rows), but its
RSS still rose about 1 MiB every 10-15 minutes over an hour: malloc's free space, not objects. glibc gives
every thread that allocates its own arena (up to 8 per core) and trims an arena only from its top, so
the free holes left by the periodic documents, the partial snapshots and the I/O workers' short-lived
objects stay resident. Three things bound it:

- `mallopt(M_ARENA_MAX, ARENA_MAX)` before the run's threads start: the threads share two arenas
  (nearly every allocation of a Python thread is made holding the GIL, so a shared arena adds no
  waiting that the GIL does not already impose);
- `malloc_trim(0)` every `--malloc-trim-interval` seconds of the window (default 60), on a thread of its
  own, woken by the driver's 1-second tick: ctypes releases the GIL for the call, the I/O workers'
  syscalls do not allocate, and each call's duration is recorded (the longest is the most an allocation of
  another thread could have waited for an arena's lock);
- `mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)` (128 KiB, glibc's initial value) at start, which fixes the
  threshold: glibc's dynamic one rises to the largest chunk freed (up to 32 MiB), so once a periodic
  document's MiB-sized arrays and JSON text are freed, the next ones come from the heap, whose free space
  stays resident between trims. An hour's soak with the dynamic threshold rose +22.4 MiB/h; the
  threshold fixed, RSS held (docs/performance.md, memory over a long run). Allocations above it are
  mmapped and given back at free, page faults and all: the I/O hot path is built to make none per request
  (its buffers are pooled, the remote tiers receive into them), so they fall on the documents' builds.

The run reports all three (`measurement.malloc`): the arena cap and the threshold and where they came
from, the trims, the RSS they gave back and their time. A `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` (or
the `GLIBC_TUNABLES` arena_max / mmap_threshold) in the environment is the user's choice and is kept. Where
malloc is not glibc's (musl, macOS, a preloaded jemalloc / tcmalloc / mimalloc) nothing is changed and the
record says why.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENA_MAX = 2
MMAP_THRESHOLD = 128 * 1024
OTHER_ALLOCATORS = ("libjemalloc", "libtcmalloc", "libmimalloc", "libhoard")
METHOD = ("malloc_trim(0) by ctypes (the GIL released) on a thread of its own, every trim_interval_s of the "
          "window (woken by the driver's 1-second tick); "
          "returned_bytes: the fall of this process's RSS "
          "(/proc/self/statm) across each call, summed (other threads allocate meanwhile: an estimate)")


DYNAMIC = "glibc's dynamic threshold (left alone)"
FIXED = f"kv-cache: mallopt(M_MMAP_THRESHOLD={MMAP_THRESHOLD}) at start"
REFUSED = "mallopt(M_MMAP_THRESHOLD) refused: glibc's dynamic threshold"


class Libc(Protocol):
    def malloc_trim(self, pad: int) -> int: ...

    def mallopt(self, param: int, value: int) -> int: ...


@dataclass
class MallocPolicy:
    """What was done to this process's malloc, and the trims of the window (`measurement.malloc`)."""

    allocator: str | None  # "glibc 2.36"; None: not glibc's malloc (nothing is done)
    note: str | None = None  # why nothing is done, or whose arena cap is in force
    arena_max: int | None = None
    arena_max_source: str | None = None
    libc: Libc | None = field(default=None, repr=False)
    mmap_threshold: str = DYNAMIC  # whose threshold sends large allocations to mmap

    def record(self) -> dict[str, Any]:
        return {"allocator": self.allocator, "arena_max": self.arena_max, "arena_max_source": self.arena_max_source,
                **({"mmap_threshold": self.mmap_threshold} if self.allocator else {}),
                **({"note": self.note} if self.note else {})}


def _other_allocator(environ: Mapping[str, str]) -> str | None:
    preload = environ.get("LD_PRELOAD", "")
    return next((name for name in OTHER_ALLOCATORS if name in preload), None)


def _glibc() -> tuple[Libc | None, str | None]:
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
        libc.malloc_trim, libc.mallopt  # noqa: B018  (AttributeError where they are missing)
    except (OSError, AttributeError):
        return None, None
    version.restype = ctypes.c_char_p
    return libc, version().decode()


def _env_arena_max(environ: Mapping[str, str]) -> str | None:
    if "MALLOC_ARENA_MAX" in environ:
        return f"MALLOC_ARENA_MAX={environ['MALLOC_ARENA_MAX']} in the environment"
    if "glibc.malloc.arena_max" in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES (glibc.malloc.arena_max) in the environment"
    return None


def _env_mmap_threshold(environ: Mapping[str, str]) -> str:
    """The environment's M_MMAP_THRESHOLD, if it sets one (kept: the run does not fix its own), else DYNAMIC."""
    if "MALLOC_MMAP_THRESHOLD_" in environ:
        return f"MALLOC_MMAP_THRESHOLD_={environ['MALLOC_MMAP_THRESHOLD_']} in the environment"
    if "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES (glibc.malloc.mmap_threshold) in the environment"
    return DYNAMIC


def configure(environ: Mapping[str, str] | None = None,
              probe: Callable[[], tuple[Libc | None, str | None]] = _glibc) -> MallocPolicy:
    """Caps glibc's arenas at ARENA_MAX and fixes its mmap threshold at MMAP_THRESHOLD (each unless the
    environment sets it): call before the run's threads start (arenas made earlier stay). Elsewhere, changes
    nothing and says why."""
    environ = os.environ if environ is None else environ
    other = _other_allocator(environ)
    if other is not None:
        return MallocPolicy(None, f"malloc is {other} (LD_PRELOAD): arenas and trims left to it")
    libc, version = probe()
    if libc is None:
        return MallocPolicy(None, "not glibc (no gnu_get_libc_version / malloc_trim / mallopt): malloc left as it is")
    allocator = f"glibc {version}"
    mmap = _env_mmap_threshold(environ)
    if mmap == DYNAMIC:
        mmap = FIXED if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 else REFUSED
    theirs = _env_arena_max(environ)
    if theirs is not None:
        return MallocPolicy(allocator, arena_max=None, arena_max_source=theirs, libc=libc, mmap_threshold=mmap)
    if libc.mallopt(M_ARENA_MAX, ARENA_MAX) != 1:
        return MallocPolicy(allocator, "mallopt(M_ARENA_MAX) refused: glibc's default arenas (8 per core)",
                            libc=libc, mmap_threshold=mmap)
    return MallocPolicy(allocator, arena_max=ARENA_MAX, arena_max_source="kv-cache: mallopt(M_ARENA_MAX) at start",
                        libc=libc, mmap_threshold=mmap)


def rss_bytes(statm: str = "/proc/self/statm") -> int | None:
    try:
        with open(statm) as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MallocTrimmer:
    """A run observer: every `interval_s` of ticks, `malloc_trim(0)` on its own thread (`trim_once`).
    `record()`: how many, the RSS they gave back, their total and longest time."""

    def __init__(self, policy: MallocPolicy, interval_s: float, rss: Callable[[], int | None] = rss_bytes,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.policy, self.interval_s, self._rss, self._clock = policy, float(interval_s), rss, clock
        self.trims = 0
        self.released = 0  # calls that said they released memory (malloc_trim's 1)
        self.returned_bytes = 0
        self.seconds_total = 0.0
        self.seconds_max = 0.0
        self._next_s = self.interval_s
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.policy.libc is not None and self.interval_s > 0

    def trim_once(self) -> None:
        libc = self.policy.libc
        if libc is None:
            return
        before = self._rss()
        t0 = self._clock()
        freed = libc.malloc_trim(0)
        seconds = self._clock() - t0
        after = self._rss()
        with self._lock:
            self.trims += 1
            self.released += int(freed == 1)
            if before is not None and after is not None and before > after:
                self.returned_bytes += before - after
            self.seconds_total += seconds
            self.seconds_max = max(self.seconds_max, seconds)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            self.trim_once()

    def tick(self, tick: Any) -> None:  # (the scheduler thread: only sets an event)
        if not self.active or tick.elapsed_s < self._next_s:
            return
        self._next_s = tick.elapsed_s + self.interval_s
        self.trim_soon()

    def trim_soon(self) -> None:
        """A trim on the trimmer's thread now (the tick calls it every trim_interval_s; the run does not call
        it after each periodic document: a trim can hold an arena's lock for tens of ms, and an allocating
        thread waits holding the GIL)."""
        if not self.active or self._stop:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kv-malloc-trim", daemon=True)
                self._thread.start()
        self._wake.set()

    def done(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def record(self) -> dict[str, Any]:
        out = self.policy.record()
        if self.policy.libc is None:
            return out
        with self._lock:
            out.update({"trim_interval_s": self.interval_s, "trims": self.trims, "trims_released": self.released,
                        "trim_returned_bytes": self.returned_bytes, "trim_seconds_total": self.seconds_total,
                        "trim_seconds_max": self.seconds_max,
                        "trim_method": METHOD if self.interval_s > 0 else "off (--malloc-trim-interval 0)"})
        return out
