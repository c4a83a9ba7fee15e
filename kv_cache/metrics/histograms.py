"""Latency distributions in bounded memory: HdrHistogram (the `hdrhistogram` package), mergeable across
ranks and runs.

One histogram covers 1 ns .. 1 hour in nanoseconds at 3 significant digits, in a fixed 264 KiB counts
array however many values it holds: a 24-hour run does not grow it. Precision: 3 significant digits give
2048 sub-buckets per power of two, so a value's bucket is at most 1/1024 of it wide (and 1 ns wide below
2048 ns); a percentile read back is the top of its bucket, within 0.1 % of the exact recorded value at the
same rank, round(q/100 x n) as HdrHistogram ranks (not ceil(q/100 x n), the textbook nearest rank: of twelve
1 us values and one of 1 s, p95 is 1 us here, 1 s by ceil), at every magnitude from 1 ns to 1 h
(tests/test_histograms.py); 0 ns is recorded as 1 ns and values above 1 h as 1 h. The
floor was 1 µs until Dec 2026: that gave 512-ns-wide buckets below ~1 ms, +1.4 % at 23 µs. `encode`/`decode` give the standard compressed base64 form, so histograms travel in the results
JSON and between MPI ranks, and `merge` adds them up (the merge of two histograms is the histogram of the
union of their values, within the precision above).
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Iterable, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_NS = 1  # 1 ns: the floor sets the resolution (a 1 µs floor gave 512 ns buckets below ~1 ms)
HIGHEST_NS = 3_600 * 10**9  # 1 hour: slower values are clamped down to it
SIGNIFICANT_DIGITS = 3
RELATIVE_PRECISION = 1 / 1024  # a bucket's width over its values (3 digits: 2048 sub-buckets): < 0.1 %


def _acyclic(h: HdrHistogram) -> HdrHistogram:
    """`h` without its reference cycle: the hdrh package's histogram holds its encoder, and the encoder the
    histogram, so a dropped histogram (its ~90 KiB of ctypes counts, at 3 digits over 1 ns-1 h) waited for
    the cyclic collector's full pass, which a run with many long-lived objects makes rarely: a periodic
    results document copies every histogram, and a soak's RSS rose by hundreds of MiB in 15 min. The
    encoder's reference becomes a weak proxy (it is only used while the histogram is)."""
    enc = getattr(h, "encoder", None)
    if enc is not None and getattr(enc, "histogram", None) is h:
        enc.histogram = weakref.proxy(h)
    return h


def new_histogram() -> HdrHistogram:
    return _acyclic(HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS))


def record(h: HdrHistogram, value_ns: int) -> None:
    """Record one value, clamped into the histogram's range (never dropped)."""
    h.record_value(min(HIGHEST_NS, max(LOWEST_NS, int(value_ns))))


def from_values(values_ns: Iterable[int]) -> HdrHistogram:
    h = new_histogram()
    for v in values_ns:
        record(h, v)
    return h


def merge(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    """One histogram holding every value of `histograms` (from ranks, runs or time buckets)."""
    out = new_histogram()
    for h in histograms:
        out.add(h)
    return out


def encode(h: HdrHistogram) -> str:
    """The standard compressed, base64 HdrHistogram encoding (readable by every HdrHistogram port)."""
    return h.encode().decode("ascii")


def decode(text: str) -> HdrHistogram:
    return _acyclic(HdrHistogram.decode(text.encode("ascii")))


def merge_encoded(texts: Iterable[str]) -> str:
    """Merge histograms in their encoded form (what ranks send and results files hold)."""
    return encode(merge(decode(t) for t in texts))


def clear(h: HdrHistogram) -> None:
    """`h.reset()` in one memset: the hdrh package's reset is a Python loop over every count (~11,000 at
    3 digits over 1 ns-1 h), which the time series ran for each tier and direction every second of a run
    (its largest per-second cost in a py-spy profile of the CLI, issue 30). Same fields as hdrh's reset."""
    counts = h.counts
    if not isinstance(counts, ctypes.Array):  # (not the ctypes array hdrh makes: its own loop)
        h.reset()
        return
    ctypes.memset(counts, 0, ctypes.sizeof(counts))
    h.total_count = 0
    h.min_value = sys.maxsize
    h.max_value = 0
    h.start_time_stamp_msec = sys.maxsize
    h.end_time_stamp_msec = 0


def percentile_values(h: HdrHistogram, qs: Sequence[float]) -> dict[float, int]:
    """`h.get_percentile_to_value_dict(qs)` from a cumulative sum of the counts (numpy) instead of hdrh's
    Python loop over them: for each q the first index whose running total reaches hdrh's target count,
    read back as hdrh reads it (the top of its bucket; the bottom for q = 0); a q above 100 or one the
    counts do not reach is left out, as hdrh leaves it out (tests/test_histograms.py compares the two)."""
    try:
        counts = np.ctypeslib.as_array(h.counts)[: h.counts_len]
    except (TypeError, ValueError, AttributeError):
        return h.get_percentile_to_value_dict(list(qs))
    total = np.cumsum(counts, dtype=np.uint64)
    out: dict[float, int] = {}
    for q in sorted(set(qs)):
        if q > 100:
            break
        i = int(np.searchsorted(total, h.get_target_count_at_percentile(q), side="left"))
        if i >= len(total):
            break
        v = h.get_value_from_index(i)
        out[q] = h.get_highest_equivalent_value(v) if q else h.get_lowest_equivalent_value(v)
    return out


def percentiles_ms(h: HdrHistogram, qs: Sequence[float] = (50.0, 95.0, 99.0)) -> dict[str, float]:
    """{"p50": ms, ...} of a histogram ({} when it is empty): each within 0.1 % of the exact recorded value
    at the rank round(q/100 x n) (RELATIVE_PRECISION)."""
    if h.get_total_count() == 0:
        return {}
    values = percentile_values(h, qs)
    return {f"p{q:g}".replace(".", ""): values[q] / 1e6 for q in qs}


def cdf_points(h: HdrHistogram) -> tuple[list[float], list[float]]:
    """(latency ms, cumulative fraction) at every recorded value level: a CDF to plot."""
    total = h.get_total_count()
    xs: list[float] = []
    ys: list[float] = []
    if total == 0:
        return xs, ys
    seen = 0
    for item in h.get_recorded_iterator():
        seen += item.count_at_value_iterated_to
        xs.append(item.value_iterated_to / 1e6)
        ys.append(seen / total)
    return xs, ys


def summary(h: HdrHistogram) -> dict[str, object]:
    """The JSON form: count, a few percentiles in ms, and the encoded histogram itself."""
    return {"count": h.get_total_count(), **percentiles_ms(h, (50.0, 95.0, 99.0, 99.9)),
            "max_ms": h.get_max_value() / 1e6 if h.get_total_count() else 0.0, "hdr": encode(h)}
