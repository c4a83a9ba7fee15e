"""The real GPU tier: a preallocated slab arena in each GPU's memory, fed through pinned host staging.

Set up once: one device arena of ``capacity_per_device`` on each device (:mod:`kv_cache.storage.gpu_device`),
and a pool of ``staging_slots`` slots (one per I/O worker), each with pinned host buffers of one chunk and
its own copy lane (an H2D and a D2H stream with their own timing events) on every device.  Per chunk, a
write copies the worker's (pageable) buffer into the slot's pinned buffer, then launches the whole chunk
(contiguous slabs merged into one copy) on the slot's H2D stream of each GPU of the entry's group and waits
once; a read goes the other way on the D2H streams.

Sizing (tensor parallelism counted once): the driver sizes an entry as 1/T of the model's KV, the shard one
GPU holds.  The devices form ``num_gpus / tensor_parallel`` groups of T GPUs (model replicas); an entry is
placed whole, that shard on EACH GPU of one group (each GPU of a TP group holds its own shard of the same
size; the same bytes stand in for the T shards).  So one entry costs ``nbytes`` per GPU and
``T x nbytes`` per replica, and the tier holds ``groups x capacity_per_device`` bytes of entries
(:attr:`capacity_bytes`).  Placement: the group with the most free slabs (ties in round-robin order).

Timing: ``device_ns`` of an operation is, per chunk, the longest of the group's GPUs' CUDA-event times (their
copies run in parallel, each on its own link), summed over chunks; the events are the worker's own, so they
never include another worker's copy.  The operation's total is the wall clock, so host time is staging
memcpys, launches, waits and bookkeeping.  :meth:`DeviceStore.stats` also gives each direction's wall-clock
copy time (launch + wait) and the GB/s of a plain pinned copy of one chunk measured at setup.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter_ns
from typing import Any

import numpy as np

from kv_cache.storage.base import BLOCK, StoreFull, padded
from kv_cache.storage.gpu_device import Device
from kv_cache.storage.slabs import SlabEntry, SlabPending, SlabStore, direction_figures

__all__ = ["DeviceStore"]

class _Slot:
    __slots__ = ("handles", "hosts", "lanes")

    def __init__(self, handles: list[Any], hosts: list[np.ndarray], lanes: list[Any]):
        self.handles = handles  # per position in a group: what the device copies from/to (pinned)
        self.hosts = hosts  # numpy views of the same pinned bytes
        self.lanes = lanes  # per device index: this slot's own copy lane (streams + events)


class DeviceStore(SlabStore):
    """Slab arenas on ``devices`` (``capacity_per_device`` bytes each) behind a pinned staging pool."""

    kind = "real"

    def __init__(self, devices: list[Device], capacity_per_device: int, chunk_bytes: int, *,
                 tensor_parallel: int = 1, slab_bytes: int = 1 << 20, staging_slots: int = 8, name: str = "gpu"):
        if not devices:
            raise ValueError("at least one device is required")
        if tensor_parallel < 1 or len(devices) % tensor_parallel:
            raise ValueError(f"{len(devices)} device(s) cannot form groups of tensor_parallel={tensor_parallel}")
        if slab_bytes <= 0 or slab_bytes % BLOCK or chunk_bytes <= 0 or chunk_bytes % BLOCK:
            raise ValueError(f"slab and chunk sizes must be positive multiples of {BLOCK}")
        self.name = name
        self.devices = list(devices)
        self.tp = tensor_parallel
        self.groups = len(devices) // tensor_parallel
        self.slab_bytes = slab_bytes
        self.chunk_bytes = chunk_bytes
        self.slabs_per_device = capacity_per_device // slab_bytes
        self.capacity_per_device = self.slabs_per_device * slab_bytes
        self.capacity_bytes = self.capacity_per_device * self.groups  # entry bytes (one shard per GPU)
        self._lock = threading.Lock()
        self._entries: dict[str, SlabEntry] = {}
        self._free = [list(range(self.slabs_per_device - 1, -1, -1)) for _ in devices]
        self._next_group = 0
        self._closed = False
        self._arenas = [d.alloc(self.capacity_per_device) for d in devices]
        self._pool: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for _ in range(max(1, staging_slots)):
            pinned = [devices[0].pinned(chunk_bytes) for _ in range(self.tp)]
            self._pool.put(_Slot([h for h, _ in pinned], [v for _, v in pinned], [d.lane() for d in devices]))
        self._stats_lock = threading.Lock()
        # per direction: [copies, bytes (per GPU), device (event) ns, wall-clock copy ns]
        self._dir = {"h2d": [0, 0, 0, 0], "d2h": [0, 0, 0, 0]}
        self._per_gpu = [0] * len(devices)  # bytes moved to or from each GPU
        self.plain_gbs: dict[str, float] | None = None  # measure_plain_copy()
        self.clamped: str | None = None  # set by the backend when free device memory clamped the size
        self.chosen_by = "GPUs 0.. (one rank on this host)"  # how this rank's GPUs were picked (the backend says)

    # ------------------------------------------------------------------ info
    def footprint(self, nbytes: int) -> int:
        """Bytes of the tier's capacity an entry occupies (whole slabs, per GPU of its group)."""
        return -(-nbytes // self.slab_bytes) * self.slab_bytes

    def placement(self, key: str) -> list[int]:
        """The device index of each slab of ``key``, group member after member (tests and diagnostics)."""
        with self._lock:
            return [d for d, _ in self._entries[key].slabs]

    def measure_plain_copy(self) -> dict[str, float]:
        """GB/s of a plain pinned copy of one chunk on the first GPU, each direction (the reference)."""
        h2d, d2h = self.devices[0].plain_copy_gbs(self.chunk_bytes)
        self.plain_gbs = {"h2d": h2d, "d2h": d2h}
        return self.plain_gbs

    # ------------------------------------------------------------------ slabs
    def _take(self, need: int) -> list[tuple[int, int]] | None:  # lock held
        best, room = -1, need - 1
        for step in range(self.groups):  # the group with the most free slabs; ties in round-robin order
            g = (self._next_group + step) % self.groups
            free = min(len(self._free[d]) for d in range(g * self.tp, (g + 1) * self.tp))
            if free > room:
                best, room = g, free
        if best < 0:
            return None
        self._next_group = (best + 1) % self.groups
        out: list[tuple[int, int]] = []
        for d in range(best * self.tp, (best + 1) * self.tp):
            out += [(d, self._free[d].pop()) for _ in range(need)]
        return out

    def _give(self, slabs: list[tuple[int, int]]) -> None:  # lock held
        if not self._closed:
            for d, s in slabs:
                self._free[d].append(s)

    # ------------------------------------------------------------------ copies
    def _pieces(self, slabs: list[tuple[int, int]], offset: int, n: int) -> list[tuple[int, int, int]]:
        """(arena offset, staging offset, bytes) covering payload [offset, offset + n), adjacent slabs merged."""
        out: list[tuple[int, int, int]] = []
        pos = 0
        while pos < n:
            i, o = divmod(offset + pos, self.slab_bytes)
            m = min(self.slab_bytes - o, n - pos)
            a = slabs[i][1] * self.slab_bytes + o
            if out and out[-1][0] + out[-1][2] == a:
                last = out[-1]
                out[-1] = (last[0], last[1], last[2] + m)
            else:
                out.append((a, pos, m))
            pos += m
        return out

    def _copy(self, slabs: list[tuple[int, int]], offset: int, view: memoryview, to_device: bool) -> int:
        """Move ``view`` to/from the entry's bytes at ``offset`` on every GPU of its group; device ns."""
        n = len(view)
        buf = np.frombuffer(view, dtype=np.uint8)
        need = len(slabs) // self.tp
        members = [slabs[k * need:(k + 1) * need] for k in range(self.tp)]
        slot = self._pool.get()
        dev_ns = wall_ns = 0
        try:
            for base in range(0, n, self.chunk_bytes):  # a view larger than a staging slot goes in pieces
                k = min(self.chunk_bytes, n - base)
                if to_device:
                    np.copyto(slot.hosts[0][:k], buf[base:base + k])
                t = perf_counter_ns()
                dev_ns += self._chunk(members, offset + base, k, slot, to_device)
                wall_ns += perf_counter_ns() - t
                if not to_device:
                    np.copyto(buf[base:base + k], slot.hosts[0][:k])
        finally:
            self._pool.put(slot)
        acc = self._dir["h2d" if to_device else "d2h"]
        with self._stats_lock:
            acc[0] += 1
            acc[1] += n
            acc[2] += dev_ns
            acc[3] += wall_ns
            for m in members:
                self._per_gpu[m[0][0]] += n
        return dev_ns

    def _chunk(self, members: list[list[tuple[int, int]]], offset: int, n: int, slot: _Slot, to_device: bool) -> int:
        """One chunk to/from each GPU of the group: launched on all, then waited for; the longest event time."""
        direction = "h2d" if to_device else "d2h"
        used = []
        for pos, mslabs in enumerate(members):
            d = mslabs[0][0]
            dev, lane = self.devices[d], slot.lanes[d]
            pieces = self._pieces(mslabs, offset, n)
            if to_device:
                dev.h2d(self._arenas[d], slot.handles[0], pieces, lane)
            else:  # each GPU's shard lands in its own pinned buffer; the first one is the worker's
                dev.d2h(slot.handles[pos], self._arenas[d], pieces, lane)
            used.append((dev, lane))
        return max(dev.wait(lane, direction) for dev, lane in used)

    # ------------------------------------------------------------------ primitives
    def _begin_write(self, key: str, nbytes: int) -> tuple[SlabPending, int]:
        need = -(-padded(nbytes) // self.slab_bytes)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            slabs = self._take(need) if need <= self.slabs_per_device else None
            if slabs is None:
                raise StoreFull(f"{self.name}: entry {key!r} needs {need} slab(s) on each GPU of a group; "
                                "no group has room")
        return SlabPending(key, slabs, nbytes), 0

    # ------------------------------------------------------------------ public
    def _forget_free(self) -> None:
        self._free = [[] for _ in self.devices]

    def _drop_arena(self) -> None:
        """Drop the references to the arenas and staging (the library frees them)."""
        self._arenas = []

    def stats(self) -> dict[str, Any]:
        """What this tier was and did (for the results' ``measurement.gpu_tier``)."""
        with self._stats_lock:
            dirs = {k: list(v) for k, v in self._dir.items()}
            per_gpu = list(self._per_gpu)
        plain = self.plain_gbs or {}
        out: dict[str, Any] = {
            "mode": "real",
            "backend": getattr(self.devices[0], "backend", "device"),
            "devices": [f"{d.index}: {d.name}" for d in self.devices],
            "gpus_chosen_by": self.chosen_by,
            "tensor_parallel": self.tp,
            "replicas": self.groups,
            "capacity_bytes": self.capacity_bytes,
            "capacity_bytes_per_gpu": self.capacity_per_device,
            "capacity_bytes_all_gpus": self.capacity_per_device * len(self.devices),
            "entry_sizing": ("an entry is 1/tensor_parallel of the model's KV (the driver's size, one GPU's "
                             "shard); it is placed whole on each GPU of one group: nbytes per GPU, "
                             "tensor_parallel x nbytes per replica"),
            "bytes_per_gpu": per_gpu,  # bytes moved to or from each GPU, in the order of "devices"
            "clamped": self.clamped,
            "staging_bytes": self.chunk_bytes,
            "timed": ("real: device time = CUDA events on the worker's own H2D / D2H stream around each whole "
                      "chunk (the longest of the group's GPUs, which copy in parallel); copy wall "
                      "time = launch + wait per chunk; host time = the rest of the operation (staging "
                      "memcpy between the worker buffer and pinned memory, bookkeeping); counts cover the whole run, "
                      "setup phases included; plain_pinned_copy_gbs = one chunk copied pinned <-> device at setup"),
        }
        for d, (ops, nbytes, dev_ns, wall_ns) in dirs.items():
            out[d] = {**direction_figures("copies", ops, nbytes, self.tp, device=dev_ns, copy_wall=wall_ns),
                      "plain_pinned_copy_gbs": plain.get(d)}
        return out
