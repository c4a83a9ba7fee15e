"""The simulated GPU (HBM) tier: capacity is accounted, the bytes live in host RAM, transfer time is modelled.

Where there is no CUDA device this stands in for GPU memory.  It is a :class:`MemoryStore` (one
preallocated slab arena, no allocation per request) whose reported times are rewritten:

* the **device time** of an operation is *modelled*: ``padded bytes / min(host link, HBM)``
  nanoseconds (GB/s = bytes/ns), the time the GPU's host link (PCIe Gen4/Gen5 x16, NVLink-C2C: ``GPUSpec``
  ``host_link_gbs``, per direction) needs to move them.  The entry is already one GPU's shard (1/T of the
  model's KV, sized by the driver); the T GPUs of a group move their shards in parallel, each over its own
  link, so T does not divide the time again (``shards`` is reported, not applied).  A write is host ->
  device (H2D), a read device -> host (D2H).  Not modelled: the
  per-copy launch latency, contention of several workers for one link, and the copy engines' overlap;
* the **host time** is measured: everything the operation did (stamping, bookkeeping) *except* the host
  memcpy that stands in for the DMA.  That memcpy is measured too, but reported on its own
  (:meth:`SimulatedGPUStore.stats`, ``host_memcpy_seconds``), never counted in a latency.  The wall clock
  of the thread that ran the operation spent the memcpy where a GPU would have spent the modelled copy, so
  the difference (memcpy - modelled, either sign) goes into a per-thread counter (:func:`standin_ns`) that
  the drivers take off the wall-clock latencies (end-to-end, QoS) of the request whose operations made it:
  those latencies then hold the modelled copy, as the operation's own time does, and not the stand-in;
* the total is host time + modelled device time.

Every figure from this store is labelled "simulated" by the report.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kv_cache.storage.base import IOResult
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.slabs import direction_figures

__all__ = ["SimulatedGPUStore", "TransferModel", "standin_ns"]

_standin = threading.local()


def standin_ns() -> int:
    """Nanoseconds of wall clock this thread has spent so far in simulated GPU tiers' stand-in memcpys
    beyond the modelled copy times they stand for (memcpy - modelled, summed; negative where the modelled
    link is slower than the memcpy): a driver takes the difference over a request and subtracts it from
    that request's wall-clock times, which then hold the modelled copies instead of the memcpys."""
    return getattr(_standin, "ns", 0)


@dataclass(frozen=True)
class TransferModel:
    """Host<->HBM copy time of one GPU type: bytes / the slower of host link and HBM (one GPU's shard)."""

    gpu: str  # the GPU spec's key (h100, ...)
    host_link: str  # e.g. "PCIe Gen5 x16"
    host_link_gbs: float  # per direction, GB/s (10**9 bytes/s)
    hbm_bandwidth_gbs: float
    shards: int = 1  # GPUs of a group, each moving its own shard in parallel (reported; not a divisor)

    def __post_init__(self) -> None:
        if self.host_link_gbs <= 0 or self.hbm_bandwidth_gbs <= 0:
            raise ValueError(f"GPU {self.gpu!r}: host link and HBM bandwidth must be > 0 to model transfers")
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")

    @property
    def bytes_per_ns(self) -> float:
        """Copy rate of one entry (one GPU's shard over its own link), bytes per nanosecond (= GB/s)."""
        return min(self.host_link_gbs, self.hbm_bandwidth_gbs)

    def ns(self, nbytes: int) -> int:
        """Modelled nanoseconds to move ``nbytes`` in one direction."""
        return round(nbytes / self.bytes_per_ns)


class SimulatedGPUStore(MemoryStore):
    """A host-RAM slab arena of ``capacity_bytes`` that reports modelled GPU copy times."""

    kind = "simulated"

    def __init__(self, capacity_bytes: int, model: TransferModel, *, slab_bytes: int = 1 << 20,
                 prefault: bool = False, name: str = "gpu"):
        super().__init__(capacity_bytes, slab_bytes, prefault=prefault, name=name)
        self.model = model
        self.groups = 1  # GPU groups (replicas) whose per-GPU capacity this arena holds (set by the backend)
        self.capacity_per_device = capacity_bytes
        self.clamped: str | None = None  # why the memory budget made it smaller than asked (set by the builder)
        self._stats_lock = threading.Lock()
        # per direction: [operations, device bytes, modelled ns, measured host-memcpy ns]
        self._dir = {"h2d": [0, 0, 0, 0], "d2h": [0, 0, 0, 0]}

    def _account(self, res: IOResult, op: str) -> IOResult:
        memcpy_ns = res.device_ns  # what MemoryStore measured: the copy standing in for the DMA
        modelled = self.model.ns(res.device_bytes)
        host = max(0, res.total_ns - memcpy_ns)
        acc = self._dir["h2d" if op == "write" else "d2h"]
        _standin.ns = getattr(_standin, "ns", 0) + memcpy_ns - modelled
        with self._stats_lock:
            acc[0] += 1
            acc[1] += res.device_bytes
            acc[2] += modelled
            acc[3] += memcpy_ns
        return IOResult(res.nbytes, res.device_bytes, host + modelled, modelled, host)

    def stats(self) -> dict[str, Any]:
        """What this tier was and did (for the results' ``measurement.gpu_tier``)."""
        m = self.model
        with self._stats_lock:
            dirs = {k: list(v) for k, v in self._dir.items()}
        out: dict[str, Any] = {
            "mode": "simulated",
            "gpu": m.gpu,
            "host_link": m.host_link,
            "host_link_gbs_per_direction": m.host_link_gbs,
            "hbm_bandwidth_gbs": m.hbm_bandwidth_gbs,
            "shards_per_entry": m.shards,
            "capacity_bytes": self.capacity_bytes,
            "capacity_bytes_per_gpu": self.capacity_per_device,
            "capacity_bytes_all_gpus": self.capacity_per_device * self.groups * m.shards,  # the HBM it stands for
            "replicas": self.groups,
            "entry_sizing": ("an entry is 1/tensor_parallel of the model's KV (the driver's size, one GPU's "
                             "shard), held once per group: nbytes per GPU, shards_per_entry x nbytes per replica"),
            "timed": ("simulated: device time = modelled, padded bytes / min(host link, HBM "
                      "bandwidth) (the entry is one GPU's 1/T shard; a group's GPUs move theirs in parallel); host time = measured, the operation minus the host memcpy that stands in "
                      "for the DMA (that memcpy is reported as host_memcpy_seconds; the end-to-end and QoS latencies of the request that made it hold the modelled copy in its place); counts cover "
                      "the whole run, setup phases included; "
                      "data held in host RAM"),
        }
        for d, (ops, nbytes, mod_ns, cpy_ns) in dirs.items():  # each GPU of a group moves its own shard
            out[d] = direction_figures("operations", ops, nbytes, m.shards, modelled=mod_ns, host_memcpy=cpy_ns)
        return out

    def __repr__(self) -> str:
        return f"SimulatedGPUStore(capacity_bytes={self.capacity_bytes}, gpu={self.model.gpu!r})"
