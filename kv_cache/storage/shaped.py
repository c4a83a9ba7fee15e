"""A tier as slow as the user's: a store wrapper that shapes the REAL I/O of the store it wraps.

`--tier-bandwidth GB/s` and `--tier-latency ms` ask "what if my tier moved X GB/s" on any host: the
wrapped store still does every read and write (the bytes still reach its files or its arena), and the
wrapper holds each operation back until a token bucket allows it.

- One bucket per direction (reads, writes) per wrapped tier, shared by all the I/O workers: each data
  chunk (a `_get` or `_put` of the wrapped store) reserves `device bytes / rate` seconds of the bucket's
  time line from when it started (the bytes it handed the device, header and padding included) and, once
  its real I/O is done, sleeps until its reservation ends. The bucket holds
  at most one chunk of credit (no burst beyond that): over any stretch of time the direction moves at most
  `rate` bytes per second, and a real store slower than the rate is not slowed further.
- `--tier-latency` is added once per operation (per entry read or written), before its first byte.
- A store with its own whole-entry read or write (the S3 tier's parallel ranged GETs and part uploads, the
  Redis tier's pipelines) keeps it: the wrapper calls it and paces the operation as one reservation of its
  device bytes, instead of putting the store's chunk primitives in its place. Moves between tiers use the
  primitives on both sides, paced per chunk.
- The sleeps are part of the measured I/O time: they fall inside the primitives, so they count as device
  time (`IOResult.device_ns`) in every latency and bandwidth the run reports, as a slow device's would.
- GB/s here are 10^9 bytes per second (the unit storage vendors quote), not GiB/s.
- The holds end at the run's stop (the event the cache passes its operations): a hold cut short raises
  IOAborted, as an operation stopped between chunks does, so a very slow rate or a long latency cannot keep
  a run sleeping past its window (a 16 MiB chunk at 10^-6 GB/s would be held 4.7 hours).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kv_cache.storage.base import IOAborted, IOResult, StoreBase
from kv_cache.storage.buffers import WorkerBuffers

__all__ = ["HELD_COUNTED", "Shaping", "ShapedStore", "TokenBucket"]

GB = 1e9
HELD_COUNTED = ("read_held_s / write_held_s and the bytes: from the tier's open to when the results were taken "
                "(warm-up, window and drain, not the window alone), held seconds summed over the I/O workers "
                "(they can exceed the wall time)")
_SLICE_S = 3600.0  # the longest single wait (a longer hold is waited in slices: Event.wait's timeout is bounded)


@dataclass(frozen=True)
class Shaping:
    """How one tier is shaped: bytes per second per direction (0 = unlimited) and latency per operation."""

    bandwidth_gbps: float = 0.0  # GB/s (10^9 bytes/s) per direction; 0 = not limited
    latency_ms: float = 0.0  # added once per operation

    @property
    def active(self) -> bool:
        return self.bandwidth_gbps > 0 or self.latency_ms > 0

    def describe(self) -> str:
        parts = []
        if self.bandwidth_gbps > 0:
            parts.append(f"{self.bandwidth_gbps:g} GB/s (10^9 B/s) per direction")
        if self.latency_ms > 0:
            parts.append(f"+{self.latency_ms:g} ms per operation")
        return ", ".join(parts) or "unshaped"


@dataclass
class TokenBucket:
    """A pacer over one direction: `reserve(n)` returns the perf_counter time at which `n` bytes may be
    done; the caller does its I/O, then sleeps until then (`wait_until`). Thread-safe."""

    rate_bps: float  # bytes per second; <= 0: unlimited
    _next: float = 0.0  # when the bytes reserved so far are done, at the rate
    _lock: threading.Lock = field(default_factory=threading.Lock)
    slept_s: float = 0.0  # total time callers were held back
    bytes: int = 0

    def reserve(self, nbytes: int, now: float | None = None) -> float:
        if self.rate_bps <= 0:
            return 0.0
        now = time.perf_counter() if now is None else now
        with self._lock:
            start = max(now, self._next)
            self._next = start + nbytes / self.rate_bps
            self.bytes += nbytes
            return self._next

    def wait_until(self, deadline: float, stop: threading.Event | None = None) -> bool:
        """Sleep until `deadline` (perf_counter seconds) or until `stop` is set; the time actually held
        is added to `slept_s`. Returns False when the stop cut the hold short."""
        t0 = time.perf_counter()
        held = _hold(deadline - t0, stop)
        if held:
            with self._lock:
                self.slept_s += time.perf_counter() - t0
        return not (stop is not None and stop.is_set() and time.perf_counter() < deadline)


def _hold(seconds: float, stop: threading.Event | None) -> bool:
    """Sleep `seconds` (in slices), ending early at `stop`; True when it slept at all."""
    if seconds <= 0:
        return False
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        if stop is None:
            time.sleep(min(left, _SLICE_S))
        elif stop.wait(min(left, _SLICE_S)):
            break
    return True


class ShapedStore(StoreBase):
    """`inner` (any StoreBase) with its reads and writes shaped (module docstring). Everything that is not
    a data primitive (capacity, footprint, fs_type, io_mode, paths...) is the inner store's."""

    def __init__(self, inner: StoreBase, shaping: Shaping, stop: threading.Event | None = None) -> None:
        self.inner = inner
        self.shaping = shaping
        self.stop = stop  # the run's stop: it ends every hold (IOAborted), see the module docstring
        rate = shaping.bandwidth_gbps * GB
        self.read_bucket = TokenBucket(rate)
        self.write_bucket = TokenBucket(rate)
        self._latency_s = shaping.latency_ms / 1e3
        self.name = inner.name
        self.lead_bytes = inner.lead_bytes
        self.keeps_fill_layout = getattr(inner, "keeps_fill_layout", True)

    def __getattr__(self, attr: str) -> Any:  # only called for what this wrapper does not define
        return getattr(self.__dict__["inner"], attr)

    def _delay(self, key: str) -> int:
        if self._latency_s <= 0:
            return 0
        t0 = time.perf_counter_ns()
        _hold(self._latency_s, self.stop)
        if self.stop is not None and self.stop.is_set():
            raise IOAborted(f"{self.name}: {key!r} abandoned at stop during its shaped latency")
        return time.perf_counter_ns() - t0

    def _paced(self, bucket: TokenBucket, done: int, t0: int) -> None:
        if not bucket.wait_until(bucket.reserve(done, t0 / 1e9), self.stop):
            raise IOAborted(f"{self.name}: shaped hold cut short at stop")

    # -- whole operations: the inner store's own, if it has one (module docstring) ---------------
    def _own(self, op: str) -> bool:
        return getattr(type(self.inner), op) is not getattr(StoreBase, op)

    def _held(self, res: IOResult, extra: int, t0: int) -> IOResult:
        held = time.perf_counter_ns() - t0 - res.total_ns  # the bucket's hold after the real operation
        return res._replace(total_ns=res.total_ns + extra + held, device_ns=res.device_ns + extra + held)

    def write(self, key: str, nbytes: int, bufs: WorkerBuffers, stop: threading.Event | None = None) -> IOResult:
        if not self._own("write"):
            return super().write(key, nbytes, bufs, stop)
        extra = self._delay(key)
        t0 = time.perf_counter_ns()
        res = self.inner.write(key, nbytes, bufs, stop)
        try:
            self._paced(self.write_bucket, res.device_bytes, t0)
        except IOAborted:
            self.inner.delete(key)  # abandoned at stop: not kept, as any aborted write
            raise
        return self._held(res, extra, t0)

    def read(self, key: str, bufs: WorkerBuffers, stop: threading.Event | None = None, verify: bool = False,
             on_chunk: Any = None) -> IOResult:
        if not self._own("read"):
            return super().read(key, bufs, stop, verify=verify, on_chunk=on_chunk)
        extra = self._delay(key)
        t0 = time.perf_counter_ns()
        res = self.inner.read(key, bufs, stop, verify=verify, on_chunk=on_chunk)
        self._paced(self.read_bucket, res.device_bytes, t0)
        return self._held(res, extra, t0)

    # -- primitives: the inner store's, paced ---------------------------------------------------
    def _begin_write(self, key: str, nbytes: int) -> tuple[Any, int]:
        extra = self._delay(key)
        h, ns = self.inner._begin_write(key, nbytes)
        return h, ns + extra

    def _put(self, h: Any, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        done, _ = self.inner._put(h, offset, view, first)
        self._paced(self.write_bucket, done, t0)
        return done, time.perf_counter_ns() - t0  # the sleep is device time: the tier was that slow

    def _commit(self, h: Any) -> int:
        return self.inner._commit(h)

    def _abort(self, h: Any) -> int | None:
        return self.inner._abort(h)

    def _begin_read(self, key: str) -> tuple[Any, int, int]:
        extra = self._delay(key)
        h, nbytes, ns = self.inner._begin_read(key)
        return h, nbytes, ns + extra

    def _get(self, h: Any, offset: int, view: memoryview) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        done, _ = self.inner._get(h, offset, view)
        self._paced(self.read_bucket, done, t0)
        return done, time.perf_counter_ns() - t0  # the sleep is device time: the tier was that slow

    def _end_read(self, h: Any) -> int:
        return self.inner._end_read(h)

    def _account(self, res, op: str):
        return self.inner._account(res, op)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict[str, Any]:
        """What the shaping did: its settings, how long each direction was held back and the bytes it paced
        (the bytes are counted only under a bandwidth: the latency alone has no bucket)."""
        return {"bandwidth_gbps": self.shaping.bandwidth_gbps or None, "latency_ms": self.shaping.latency_ms or None,
                "unit": "GB/s = 10^9 bytes/s", "read_held_s": self.read_bucket.slept_s,
                "write_held_s": self.write_bucket.slept_s, "described": self.shaping.describe(),
                "read_bytes": self.read_bucket.bytes, "write_bytes": self.write_bucket.bytes,
                "held_counted": HELD_COUNTED}
