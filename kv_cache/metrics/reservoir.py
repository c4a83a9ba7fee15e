"""Latency samples in fixed memory: every value while they fit, a uniform reservoir beyond.

`LatencySamples` keeps the count, exact sum and max of every value appended, the values themselves while
there are at most `cap` of them, and past that a uniform random sample of `cap` of them (Vitter's
algorithm R, seeded: the same run keeps the same sample). With ``histogram=True`` it also records every
value into an HdrHistogram (metrics/histograms.py: within 0.1 %), which gives the percentiles once the
reservoir is a sample. Its memory is bounded by `cap` (8 bytes a value) plus the histogram (264 KiB),
whatever the run's length; `recent` adds a ring of the last values, for "since a mark" views.

A list of at most PREALLOC_CAP values (every list of a run's recorder) takes its whole `cap` when it is
made, zero-filled so that its pages are resident: a run's memory is then the same after 5 minutes as after
24 hours, instead of rising for as long as the lists fill (1.6 MiB each; the per-QoS lists of the 1-hour
soak at 120 req/s were still filling at its end). A merge's lists (results/merge.py EXACT_CAP) grow as
they fill.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from kv_cache.metrics.histograms import merge, new_histogram, percentile_values, record
from kv_cache.metrics.stats import percentiles

SAMPLE_CAP = 200_000  # values kept per list (1.6 MiB): beyond, a uniform reservoir of this many
PREALLOC_CAP = SAMPLE_CAP  # a list of at most this many values is allocated whole when it is made
RECENT = 8_192  # the ring of last values for the autoscaler's P95 since a mark


class LatencySamples:
    """Count, sum and max of every value; the values while they fit in `cap`, a reservoir beyond."""

    __slots__ = ("count", "sum", "max", "_buf", "_n", "_pre", "cap", "hist", "_rng", "_ring", "_ring_n")

    def __init__(self, cap: int = SAMPLE_CAP, *, histogram: bool = False, recent: int = 0, seed: int = 0):
        self.cap = int(cap)
        self.count = 0
        self.sum = 0
        self.max = 0
        self._pre = self.cap <= PREALLOC_CAP
        self._buf = array("q", bytes(8 * self.cap)) if self._pre else array("q")  # written: resident now
        self._n = 0  # values held (the first _n of _buf)
        self.hist = new_histogram() if histogram else None
        self._rng = random.Random(seed)
        self._ring = array("q", bytes(8 * recent)) if recent else None
        self._ring_n = recent

    def append(self, v: int) -> None:
        self.count += 1
        self.sum += v
        if v > self.max:
            self.max = v
        if self.hist is not None:
            record(self.hist, v)
        if self._ring is not None:
            self._ring[(self.count - 1) % self._ring_n] = v
        n = self._n
        if n < self.cap:
            if self._pre:
                self._buf[n] = v
            else:
                self._buf.append(v)
            self._n = n + 1
        else:
            j = self._rng.randrange(self.count)
            if j < self.cap:
                self._buf[j] = v

    def extend(self, values: Iterable[int]) -> None:
        for v in values:
            self.append(int(v))

    def frombytes(self, raw: bytes) -> None:
        """Append int64s in the machine's byte order (what a merge hands over)."""
        vals = np.frombuffer(raw, dtype=np.int64)
        if not self._pre and self.hist is None and self._ring is None and self._n + len(vals) <= self.cap:
            self._buf.frombytes(raw)  # the common case of a merge: no per-value work
            self._n += len(vals)
            self.count += len(vals)
            self.sum += int(vals.sum()) if len(vals) else 0
            self.max = max(self.max, int(vals.max())) if len(vals) else self.max
            return
        self.extend(vals.tolist())

    def copy(self) -> LatencySamples:
        """A copy to read while this one goes on recording (a rank's periodic document): the count, sum,
        max, held values and histogram as they are now (memcpys; no per-value work). The copy keeps no
        ring of recent values and is not meant to be appended to."""
        other = LatencySamples.__new__(LatencySamples)
        other.cap, other.count, other.sum, other.max = self.cap, self.count, self.sum, self.max
        other._buf = self._buf[: self._n]  # (one copy, of the filled part only: a copy is never appended to)
        other._n, other._pre = self._n, False
        other.hist = merge([self.hist]) if self.hist is not None else None
        other._rng, other._ring, other._ring_n = self._rng, None, 0
        return other

    def clear(self) -> None:
        self.__init__(self.cap, histogram=self.hist is not None, recent=self._ring_n if self._ring else 0)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def values(self) -> array:
        """The held values (every value while `exact`): the list itself, or a copy of its filled part for a
        list allocated whole."""
        return self._buf[: self._n] if self._pre else self._buf

    def __iter__(self):
        """The held values (every value while `exact`)."""
        return iter(self.values)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.values[i]
        if not -self._n <= i < self._n:
            raise IndexError("array index out of range")
        return self._buf[i % self._n]

    @property
    def exact(self) -> bool:
        """Every value is still held (the reservoir has not started sampling)."""
        return self.count == self._n

    def array(self) -> np.ndarray:
        """The held values (all of them while `exact`) as int64, without a copy."""
        return np.frombuffer(self._buf, dtype=np.int64, count=self._n) if self._n else np.zeros(0, np.int64)

    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """Exact percentiles of every value while they are held; else the histogram's (within 0.1 %), or
        the reservoir's where there is no histogram."""
        if not self.count:
            return []
        if not self.exact and self.hist is not None:
            d = percentile_values(self.hist, qs)
            return [float(d[q]) for q in qs]
        return list(percentiles(self.array(), list(qs)))

    def since(self, start: int) -> np.ndarray:
        """The values appended after the first `start` (the last RECENT of them at most, from the ring;
        all of them, from the list, while it is exact)."""
        n = self.count - start
        if n <= 0:
            return np.zeros(0, np.int64)
        if self.exact:
            return self.array()[start:].copy()
        if self._ring is None:
            return self.array().copy()
        n = min(n, self._ring_n, self.count)
        ring = np.frombuffer(self._ring, dtype=np.int64)
        end = self.count % self._ring_n
        idx = (np.arange(end - n, end)) % self._ring_n
        return ring[idx].copy()
