"""The time-series and distribution blocks of the results document.

`time_series`: one flat row per 1-second bucket of the measured window (metrics/timeseries.py says what a
row holds). `latency_histograms`: per tier and direction ("total", "device" and "host" time) and per request
(end to end), the HdrHistogram of the whole window: count, percentiles and the encoded histogram, which
`kv_cache.metrics.histograms.decode` / `merge_encoded` read back (to merge ranks or runs, or to plot a CDF).
"""

from __future__ import annotations

from typing import Any

from kv_cache.metrics.histograms import summary
from kv_cache.metrics.recorder import RunMetrics

SERIES_NOTE = ("one row per bucket of the measured window; t_s = end of the bucket; <tier>_<op>_bytes/ops count "
               "operations completed in the bucket, <tier>_<op>_p95_ms their latency (total = host + device); "
               "occupancy_*_bytes, queue_depth (requests waiting for an I/O worker), in_flight and active_users "
               "are sampled at the end of the bucket")


def time_series(metrics: RunMetrics, bucket_s: float = 1.0) -> dict[str, Any]:
    """The block, its rows a compact copy (metrics/timeseries.py Rows: a list of dicts to a reader, no dict
    per row held): the writers serialise them a slice at a time (results/write.py), so a periodic document
    of a long run makes no 4,096 dicts at once, whose heap space stayed resident (docs/performance.md)."""
    return {"bucket_seconds": bucket_s, "note": SERIES_NOTE, "rows": metrics.series.rows.copy()}


def latency_histograms(metrics: RunMetrics) -> dict[str, Any]:
    """{"storage_read_total": {...}, "storage_read_device": {...}, ..., "request_e2e_total": {...}}."""
    return {f"{a}_{b}_{kind}": summary(h) for (a, b, kind), h in sorted(metrics.histograms.items())}
