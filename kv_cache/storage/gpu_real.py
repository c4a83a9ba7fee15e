"""The real GPU tier: a preallocated slab arena in each GPU's memory, fed through pinned host staging.

Set up once: one device arena of ``capacity_per_device`` on each device (:mod:`kv_cache.storage.gpu_device`),
and a pool of ``staging_slots`` pinned host buffers of one chunk each, with a pair of timing events per
device.  Per chunk, a write copies the worker's (pageable) buffer into a pinned slot, then the slot to
the device on that device's host-to-device stream; a read goes the other way on the device-to-host stream.

Placement: the devices form ``num_gpus / tensor_parallel`` groups of ``tensor_parallel`` GPUs; entries go
to the groups round-robin (the next one with room if that one is full), and an entry's slabs are split in
``tensor_parallel`` contiguous shards, one per GPU of its group (tensor_parallel = 1: whole entries,
round-robin over the GPUs).

Timing: ``device_ns`` of an operation is the sum of its copies' CUDA-event times (device time); the
operation's total is the wall clock, so host time is staging memcpys, launches, waits and bookkeeping.
:meth:`DeviceStore.stats` also gives each direction's wall-clock copy time (launch + wait) on its own.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter_ns
from typing import Any

import numpy as np

from kv_cache.storage.base import BLOCK, StoreFull, padded
from kv_cache.storage.gpu_device import Device
from kv_cache.storage.slabs import SlabEntry, SlabPending, SlabStore

__all__ = ["DeviceStore"]


class _Slot:
    __slots__ = ("handle", "host", "events")

    def __init__(self, handle: Any, host: np.ndarray, events: list[Any]):
        self.handle = handle  # what the device copies from/to (pinned tensor or array)
        self.host = host  # numpy view of the same pinned bytes
        self.events = events  # per device index: a (start, end) event pair


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
        self.slab_bytes = slab_bytes
        self.chunk_bytes = chunk_bytes
        self.capacity_bytes = capacity_per_device * len(devices)
        self.slabs_per_device = capacity_per_device // slab_bytes
        self._lock = threading.Lock()
        self._entries: dict[str, SlabEntry] = {}
        self._free = [list(range(self.slabs_per_device - 1, -1, -1)) for _ in devices]
        self._next_group = 0
        self._closed = False
        self._arenas = [d.alloc(self.slabs_per_device * slab_bytes) for d in devices]
        self._pool: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for _ in range(max(1, staging_slots)):
            handle, host = devices[0].pinned(chunk_bytes)
            self._pool.put(_Slot(handle, host, [d.events() for d in devices]))
        self._stats_lock = threading.Lock()
        # per direction: [copies, bytes, device (event) ns, wall-clock copy ns]
        self._dir = {"h2d": [0, 0, 0, 0], "d2h": [0, 0, 0, 0]}

    # ------------------------------------------------------------------ info
    def footprint(self, nbytes: int) -> int:
        """Device bytes an entry occupies (whole slabs)."""
        return -(-nbytes // self.slab_bytes) * self.slab_bytes

    def placement(self, key: str) -> list[int]:
        """The device index of each slab of ``key`` (for tests and diagnostics)."""
        with self._lock:
            return [d for d, _ in self._entries[key].slabs]

    # ------------------------------------------------------------------ slabs
    def _take(self, need: int) -> list[tuple[int, int]] | None:  # lock held
        groups = len(self.devices) // self.tp
        for step in range(groups):
            g = (self._next_group + step) % groups
            devs = range(g * self.tp, (g + 1) * self.tp)
            shares = [(k + 1) * need // self.tp - k * need // self.tp for k in range(self.tp)]
            if all(len(self._free[d]) >= s for d, s in zip(devs, shares, strict=True)):
                self._next_group = (g + 1) % groups
                out: list[tuple[int, int]] = []
                for d, s in zip(devs, shares, strict=True):
                    out += [(d, self._free[d].pop()) for _ in range(s)]
                return out
        return None

    def _give(self, slabs: list[tuple[int, int]]) -> None:  # lock held
        if not self._closed:
            for d, s in slabs:
                self._free[d].append(s)

    # ------------------------------------------------------------------ copies
    def _copy(self, slabs: list[tuple[int, int]], offset: int, view: memoryview, to_device: bool) -> int:
        """Move ``view`` to/from the entry's bytes at ``offset`` through one staging slot; device ns."""
        n = len(view)
        buf = np.frombuffer(view, dtype=np.uint8)
        slot = self._pool.get()
        dev_ns = wall_ns = 0
        try:
            for base in range(0, n, self.chunk_bytes):  # a view larger than a staging slot goes in pieces
                k = min(self.chunk_bytes, n - base)
                if to_device:
                    np.copyto(slot.host[:k], buf[base:base + k])
                d_ns, w_ns = self._slabs_copy(slabs, offset + base, slot, k, to_device)
                dev_ns += d_ns
                wall_ns += w_ns
                if not to_device:
                    np.copyto(buf[base:base + k], slot.host[:k])
        finally:
            self._pool.put(slot)
        acc = self._dir["h2d" if to_device else "d2h"]
        with self._stats_lock:
            acc[0] += 1
            acc[1] += n
            acc[2] += dev_ns
            acc[3] += wall_ns
        return dev_ns

    def _slabs_copy(self, slabs: list[tuple[int, int]], offset: int, slot: _Slot, n: int,
                    to_device: bool) -> tuple[int, int]:
        """Copy the slot's first ``n`` bytes to/from payload ``offset``, slab by slab: (device ns, wall ns)."""
        dev_ns = wall_ns = 0
        pos = 0
        while pos < n:
            i, o = divmod(offset + pos, self.slab_bytes)
            m = min(self.slab_bytes - o, n - pos)
            d, s = slabs[i]
            dev, a = self.devices[d], s * self.slab_bytes + o
            t = perf_counter_ns()
            if to_device:
                dev_ns += dev.h2d(self._arenas[d], a, slot.handle, pos, m, slot.events[d])
            else:
                dev_ns += dev.d2h(slot.handle, pos, self._arenas[d], a, m, slot.events[d])
            wall_ns += perf_counter_ns() - t
            pos += m
        return dev_ns, wall_ns

    # ------------------------------------------------------------------ primitives
    def _begin_write(self, key: str, nbytes: int) -> tuple[SlabPending, int]:
        need = -(-padded(nbytes) // self.slab_bytes)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            slabs = self._take(need) if need <= self.slabs_per_device * len(self.devices) else None
            if slabs is None:
                raise StoreFull(f"{self.name}: entry {key!r} needs {need} slab(s); no GPU group has room")
        return SlabPending(key, slabs, nbytes), 0

    # ------------------------------------------------------------------ public
    def close(self) -> None:
        """Drop every entry and the references to the arenas and staging (the library frees them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._entries.clear()
            self._free = [[] for _ in self.devices]
        self._arenas = []

    def stats(self) -> dict[str, Any]:
        """What this tier was and did (for the results' ``measurement.gpu_tier``)."""
        with self._stats_lock:
            dirs = {k: list(v) for k, v in self._dir.items()}
        out: dict[str, Any] = {
            "mode": "real",
            "backend": getattr(self.devices[0], "backend", "device"),
            "devices": [f"{d.index}: {d.name}" for d in self.devices],
            "tensor_parallel": self.tp,
            "capacity_bytes": self.capacity_bytes,
            "staging_bytes": self.chunk_bytes,
            "timed": ("real: device time = CUDA events around each copy on the H2D / D2H stream; copy wall "
                      "time = launch + wait per copy; host time = the rest of the operation (staging "
                      "memcpy between the worker buffer and pinned memory, bookkeeping); counts cover the whole run, "
                      "setup phases included"),
        }
        for d, (ops, nbytes, dev_ns, wall_ns) in dirs.items():
            out[d] = {
                "copies": ops,
                "bytes": nbytes,
                "device_seconds": dev_ns / 1e9,
                "device_gbs": nbytes / dev_ns if dev_ns else 0.0,
                "copy_wall_seconds": wall_ns / 1e9,
                "copy_wall_gbs": nbytes / wall_ns if wall_ns else 0.0,
            }
        return out
