"""What a rank's results document carries so that several ranks can be merged exactly afterwards.

- `latency_samples`: the storage and CPU tiers' per-operation latencies (total, device and host time, ns, each a list in
  completion order), so a merge takes its percentiles from the union of the ranks' samples rather than
  averaging percentiles. Bounded: a list longer than SAMPLE_CAP keeps every k-th sample (k the smallest
  stride that fits) and says so (`stride` > 1); a merge then takes that list's percentiles from the ranks'
  merged HdrHistograms (results/merge.py), never from the strided subsample.
- `window_wallclock`: the measured window in Unix seconds, so a merge can take the union of the ranks'
  windows (perf_counter_ns is per process; the offset to the wall clock is taken once, here).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.storage.tiername import TierName

__all__ = ["SAMPLE_CAP", "latency_samples", "window_wallclock"]

SAMPLE_CAP = 200_000  # per list (beyond, a merge takes its percentiles from the HdrHistograms): 16 MiB-class operations at ~2 GiB/s give ~40k per 300 s run


def _bounded(samples, cap: int) -> tuple[np.ndarray, int]:
    """The list's held values (a reservoir once it samples) as at most `cap`, an int64 array (written as
    the list of ints it stands for; no Python int per value, see results/summary.py `_seconds`); `stride`
    > 1 says it is not every operation's (count / values kept, rounded up)."""
    held = samples.array()  # (a view: the copy below is the document's own, the list stays appendable)
    step = max(1, -(-len(held) // cap))
    values = held[::step].copy() if step > 1 else held.copy()
    return values, max(1, -(-len(samples) // max(1, len(values))))


def latency_samples(metrics: RunMetrics, cap: int = SAMPLE_CAP) -> dict[str, Any]:
    """{"unit": "ns", "<tier>_<op>_<total|device>_ns": {"values": int64 array, "count": n, "stride": k}, ...}."""
    out: dict[str, Any] = {"unit": "ns", "cap": cap}
    for tier in (TierName.STORAGE, TierName.CPU):
        for op in ("read", "write"):
            s = metrics.tier_op(tier, op)
            for part, arr in (("total", s.total_ns), ("device", s.device_ns), ("host", s.host_ns)):
                if not len(arr):
                    continue
                values, stride = _bounded(arr, cap)  # (arr: a LatencySamples, bounded itself)
                out[f"{tier}_{op}_{part}_ns"] = {"values": values, "count": len(arr), "stride": stride}
    return out


def window_wallclock(metrics: RunMetrics, barrier_aligned: bool = False) -> dict[str, Any]:
    """The measured window's start and end in Unix seconds (None when no window was opened)."""
    if metrics.window_start_ns is None:
        return {"start_unix": None, "end_unix": None, "barrier_aligned": barrier_aligned}
    offset = time.time() - time.perf_counter_ns() / 1e9
    end_ns = metrics.window_end_ns if metrics.window_end_ns is not None else time.perf_counter_ns()
    return {"start_unix": metrics.window_start_ns / 1e9 + offset, "end_unix": end_ns / 1e9 + offset,
            "barrier_aligned": barrier_aligned}
