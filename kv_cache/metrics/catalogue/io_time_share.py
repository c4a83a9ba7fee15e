"""The share of requests' end-to-end time spent in their KV cache I/O (every tier operation of a request,
the evictions it caused included: the report's per-request storage latency).

Tells whether the cache I/O is what the requests waited for: near 1 it is the bottleneck, near 0 the
queue or the modelled generation is. The sum of the per-request I/O times over the sum of the
per-request end-to-end times, both from the per-request lists, which a merge holds whole: it recomputes.
"""

from __future__ import annotations

from kv_cache.metrics.catalogue import Metric, register
from kv_cache.metrics.recorder import RunMetrics


def io_share(metrics: RunMetrics) -> float | None:
    r = metrics.requests
    e2e = r.e2e_ns.sum
    return r.storage_ns.sum / e2e if e2e > 0 else None


register(Metric(
    key="request_io_time_ratio", label="Share of request time in KV cache I/O (all tiers)", unit="", spec=".3f",
    compute=io_share,
    summary="sum of the requests' KV cache I/O time (storage_io_latency_ms) over the sum of their end-to-end "
            "time, completed requests of the window; None without one"))
