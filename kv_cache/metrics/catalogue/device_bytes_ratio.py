"""Bytes the data syscalls moved per KV byte, per storage direction: the I/O amplification of the layout.

A stored entry carries a header and is padded to whole 4 KiB blocks (O_DIRECT needs both), so the device
moves more than the entry holds; small entries pay the most. 1.00 means no overhead. From the recorder's
byte and device-byte sums, so a merge recomputes it. None when nothing reached a device (no operation,
or a backend without one, such as the trace log).
"""

from __future__ import annotations

from kv_cache.metrics.catalogue import Metric, register
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.storage.tiername import TierName


def device_ratio(op: str):
    def compute(metrics: RunMetrics) -> float | None:
        s = metrics.tier_op(TierName.STORAGE, op)
        return s.device_bytes / s.bytes if s.bytes and s.device_bytes else None

    return compute


for _op in ("read", "write"):
    register(Metric(
        key=f"storage_{_op}_device_bytes_ratio", label=f"Storage {_op} syscall bytes per KV byte", unit="",
        compute=device_ratio(_op), spec=".3f",
        summary=f"bytes the storage tier's {_op} syscalls moved (header and block padding included) over the KV "
                "entry bytes, in the window; None without device bytes"))
