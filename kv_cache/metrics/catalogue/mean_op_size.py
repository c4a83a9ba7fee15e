"""Mean size of one storage-tier operation (one KV entry read or written), per direction, in MiB.

The block size a storage engineer sizes a device and a queue for: bytes moved in the window over the
operations that moved them (operations cut off by the end of the window count in neither). Both numbers
are in the recorder's state, so a merge recomputes it from the ranks' sums.
"""

from __future__ import annotations

from kv_cache.metrics.catalogue import Metric, register
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.storage.tiername import TierName

MIB = float(1 << 20)


def mean_op_mib(op: str):
    def compute(metrics: RunMetrics) -> float | None:
        s = metrics.tier_op(TierName.STORAGE, op)
        return s.bytes / s.ops / MIB if s.ops else None

    return compute


for _op, _word in (("read", "Read"), ("write", "Write")):
    register(Metric(
        key=f"storage_{_op}_mean_op_mib", label=f"Storage {_op} size per operation (mean)", unit="MiB",
        compute=mean_op_mib(_op),
        summary=f"KV entry bytes per storage-tier {_op} operation in the window, mean; None without one"))
