"""The read share of the storage tier's traffic in the window, of its operations and of its bytes: the mix a
storage engineer sets up to reproduce this load on the device alone.

fio's ``rwmixread`` is the percentage of I/Os that are reads, so 100 x the operation share is the value to
give it (with ``bs=R,W`` from ``storage_{read,write}_mean_op_mib``); the byte share differs from it where
reads and writes move entries of different sizes. A KV cache's mix moves with the hit rate: all writes while
it fills, mostly reads once sessions come back. Operations cut off by the end of the window count in neither
share's operations, and their bytes moved inside the window count in the byte share, as bandwidth counts
them. Every number is in the recorder's state, so a merge recomputes both from the ranks' sums. None when
the storage tier moved nothing in the window.
"""

from __future__ import annotations

from collections.abc import Callable

from kv_cache.metrics.catalogue import Metric, register
from kv_cache.metrics.recorder import RunMetrics, TierOpStats
from kv_cache.storage.tiername import TierName


def read_share(amount: Callable[[TierOpStats], int]) -> Callable[[RunMetrics], float | None]:
    def compute(metrics: RunMetrics) -> float | None:
        reads = amount(metrics.tier_op(TierName.STORAGE, "read"))
        total = reads + amount(metrics.tier_op(TierName.STORAGE, "write"))
        return reads / total if total else None

    return compute


register(Metric(
    key="storage_read_ops_share_ratio", label="Storage read share of operations (fio rwmixread / 100)", unit="",
    compute=read_share(lambda s: s.ops), spec=".3f",
    summary="storage-tier read operations over read + write operations in the window (x 100: fio's rwmixread); "
            "None without one"))
register(Metric(
    key="storage_read_bytes_share_ratio", label="Storage read share of bytes", unit="",
    compute=read_share(lambda s: s.window_bytes), spec=".3f",
    summary="storage-tier KV bytes read over bytes read + written in the window (the bytes of operations cut "
            "off by its end included, as in the bandwidth); None without any"))
