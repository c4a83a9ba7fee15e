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
- The sleeps are part of the measured I/O time: they fall inside the primitives, so they count as device
  time (`IOResult.device_ns`) in every latency and bandwidth the run reports, as a slow device's would.
- GB/s here are 10^9 bytes per second (the unit storage vendors quote), not GiB/s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kv_cache.storage.base import StoreBase

__all__ = ["Shaping", "ShapedStore", "TokenBucket"]

GB = 1e9


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

    def wait_until(self, deadline: float) -> None:
        left = deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
            with self._lock:
                self.slept_s += left


class ShapedStore(StoreBase):
    """`inner` (any StoreBase) with its reads and writes shaped (module docstring). Everything that is not
    a data primitive (capacity, footprint, fs_type, io_mode, paths...) is the inner store's."""

    def __init__(self, inner: StoreBase, shaping: Shaping) -> None:
        self.inner = inner
        self.shaping = shaping
        rate = shaping.bandwidth_gbps * GB
        self.read_bucket = TokenBucket(rate)
        self.write_bucket = TokenBucket(rate)
        self._latency_s = shaping.latency_ms / 1e3
        self.name = inner.name
        self.lead_bytes = inner.lead_bytes

    def __getattr__(self, attr: str) -> Any:  # only called for what this wrapper does not define
        return getattr(self.__dict__["inner"], attr)

    def _delay(self) -> int:
        if self._latency_s <= 0:
            return 0
        t0 = time.perf_counter_ns()
        time.sleep(self._latency_s)
        return time.perf_counter_ns() - t0

    # -- primitives: the inner store's, paced ---------------------------------------------------
    def _begin_write(self, key: str, nbytes: int) -> tuple[Any, int]:
        extra = self._delay()
        h, ns = self.inner._begin_write(key, nbytes)
        return h, ns + extra

    def _put(self, h: Any, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        done, _ = self.inner._put(h, offset, view, first)
        self.write_bucket.wait_until(self.write_bucket.reserve(done, t0 / 1e9))
        return done, time.perf_counter_ns() - t0  # the sleep is device time: the tier was that slow

    def _commit(self, h: Any) -> int:
        return self.inner._commit(h)

    def _abort(self, h: Any) -> None:
        self.inner._abort(h)

    def _begin_read(self, key: str) -> tuple[Any, int, int]:
        extra = self._delay()
        h, nbytes, ns = self.inner._begin_read(key)
        return h, nbytes, ns + extra

    def _get(self, h: Any, offset: int, view: memoryview) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        done, _ = self.inner._get(h, offset, view)
        self.read_bucket.wait_until(self.read_bucket.reserve(done, t0 / 1e9))
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
                "read_bytes": self.read_bucket.bytes, "write_bytes": self.write_bucket.bytes}
