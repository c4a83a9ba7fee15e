"""The small device interface the real GPU tier uses, and its torch and cupy implementations.

torch and cupy are optional (the ``gpu`` extra) and imported only here, inside functions.  A device offers:

* ``alloc(nbytes)``: one device arena (called once per device, at setup);
* ``pinned(nbytes) -> (handle, numpy view)``: page-locked host staging memory (called once per staging
  slot, at setup);
* ``events()``: a (start, end) pair of timing events for this device (at setup, one per staging slot);
* ``h2d(arena, offset, staging, staging_offset, n, events)`` / ``d2h(staging, staging_offset, arena,
  offset, n, events)``: copy ``n`` bytes on the device's own host-to-device / device-to-host stream,
  bracketed by the events, wait for that copy only, and return the device time the events measured, ns.

Nothing here allocates per copy beyond the tensor views a slice needs.  Tests drive the real store through
a fake device implementing the same methods (tests/test_gpu_real.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

__all__ = ["CudaUnavailable", "CupyDevice", "Device", "TorchDevice", "cuda_status", "open_devices"]


class CudaUnavailable(RuntimeError):
    """No usable CUDA device (library missing, no device, or fewer devices than asked for)."""


class Device(Protocol):
    index: int
    name: str

    def alloc(self, nbytes: int) -> Any: ...

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]: ...

    def events(self) -> Any: ...

    def h2d(self, arena: Any, offset: int, staging: Any, staging_offset: int, n: int, events: Any) -> int: ...

    def d2h(self, staging: Any, staging_offset: int, arena: Any, offset: int, n: int, events: Any) -> int: ...


def _torch() -> Any | None:
    try:
        import torch  # noqa: PLC0415  (optional dependency)
    except Exception:
        return None
    return torch


def _cupy() -> Any | None:
    try:
        import cupy  # noqa: PLC0415  (optional dependency)
    except Exception:
        return None
    return cupy


def _count(lib: str) -> int:
    """CUDA devices seen through ``lib`` ("torch" or "cupy"); 0 when it is missing or has no CUDA."""
    try:
        if lib == "torch":
            torch = _torch()
            return int(torch.cuda.device_count()) if torch is not None and torch.cuda.is_available() else 0
        cupy = _cupy()
        return int(cupy.cuda.runtime.getDeviceCount()) if cupy is not None else 0
    except Exception:  # cupy raises CUDARuntimeError without a driver
        return 0


def cuda_status(num_gpus: int = 1) -> tuple[bool, str]:
    """(usable, why not / which library): torch first, cupy when torch has no CUDA."""
    for lib in ("torch", "cupy"):
        n = _count(lib)
        if n >= num_gpus:
            return True, f"{lib}, {n} CUDA device(s)"
        if n:
            return False, f"{num_gpus} GPU(s) asked for, {lib} sees {n}"
    have = [lib for lib, mod in (("torch", _torch), ("cupy", _cupy)) if mod() is not None]
    if not have:
        return False, "neither torch nor cupy is installed (pip install 'kv-cache[gpu]')"
    return False, f"no CUDA device visible to {' or '.join(have)}"


def open_devices(num_gpus: int) -> list[Device]:
    """``num_gpus`` devices through torch, or cupy when torch has no CUDA; CudaUnavailable otherwise."""
    ok, reason = cuda_status(num_gpus)
    if not ok:
        raise CudaUnavailable(reason)
    if _count("torch") >= num_gpus:
        torch = _torch()
        return [TorchDevice(torch, i) for i in range(num_gpus)]
    cupy = _cupy()
    return [CupyDevice(cupy, i) for i in range(num_gpus)]


class TorchDevice:
    """One CUDA device through torch: uint8 arena tensor, pinned staging tensors, two streams."""

    backend = "torch"

    def __init__(self, torch: Any, index: int):
        self._t = torch
        self.index = index
        self.device = torch.device("cuda", index)
        self.name = torch.cuda.get_device_name(index)
        self._h2d = torch.cuda.Stream(device=self.device)
        self._d2h = torch.cuda.Stream(device=self.device)

    def alloc(self, nbytes: int) -> Any:
        return self._t.empty(nbytes, dtype=self._t.uint8, device=self.device)

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]:
        t = self._t.empty(nbytes, dtype=self._t.uint8, pin_memory=True)
        return t, t.numpy()

    def events(self) -> Any:
        with self._t.cuda.device(self.device):
            return (self._t.cuda.Event(enable_timing=True), self._t.cuda.Event(enable_timing=True))

    def _copy(self, stream: Any, dst: Any, src: Any, events: Any) -> int:
        start, end = events
        with self._t.cuda.device(self.device), self._t.cuda.stream(stream):
            start.record(stream)
            dst.copy_(src, non_blocking=True)
            end.record(stream)
        end.synchronize()
        return int(start.elapsed_time(end) * 1e6)  # ms -> ns

    def h2d(self, arena: Any, offset: int, staging: Any, staging_offset: int, n: int, events: Any) -> int:
        return self._copy(self._h2d, arena[offset:offset + n], staging[staging_offset:staging_offset + n], events)

    def d2h(self, staging: Any, staging_offset: int, arena: Any, offset: int, n: int, events: Any) -> int:
        return self._copy(self._d2h, staging[staging_offset:staging_offset + n], arena[offset:offset + n], events)


class CupyDevice:
    """One CUDA device through cupy: uint8 arena array, pinned staging from cupy's pinned allocator."""

    backend = "cupy"

    def __init__(self, cupy: Any, index: int):
        self._cp = cupy
        self.index = index
        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props.get("name", b"cuda")
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self._keep: list[Any] = []  # pinned allocations backing the staging arrays
        with cupy.cuda.Device(index):
            self._h2d = cupy.cuda.Stream(non_blocking=True)
            self._d2h = cupy.cuda.Stream(non_blocking=True)

    def alloc(self, nbytes: int) -> Any:
        with self._cp.cuda.Device(self.index):
            return self._cp.empty(nbytes, dtype=self._cp.uint8)

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]:
        mem = self._cp.cuda.alloc_pinned_memory(nbytes)
        self._keep.append(mem)
        arr = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
        return arr, arr

    def events(self) -> Any:
        with self._cp.cuda.Device(self.index):
            return (self._cp.cuda.Event(), self._cp.cuda.Event())

    def h2d(self, arena: Any, offset: int, staging: Any, staging_offset: int, n: int, events: Any) -> int:
        start, end = events
        with self._cp.cuda.Device(self.index):
            start.record(self._h2d)
            arena[offset:offset + n].set(staging[staging_offset:staging_offset + n], stream=self._h2d)
            end.record(self._h2d)
            end.synchronize()
        return int(self._cp.cuda.get_elapsed_time(start, end) * 1e6)

    def d2h(self, staging: Any, staging_offset: int, arena: Any, offset: int, n: int, events: Any) -> int:
        start, end = events
        with self._cp.cuda.Device(self.index):
            start.record(self._d2h)
            arena[offset:offset + n].get(stream=self._d2h, out=staging[staging_offset:staging_offset + n])
            end.record(self._d2h)
            end.synchronize()
        return int(self._cp.cuda.get_elapsed_time(start, end) * 1e6)


def gpu_tier_mode(tiers: Any) -> str:
    """"off", "real" or "simulated": what --gpu-tier (auto = real where CUDA is present) comes to for the
    TierSettings `tiers`."""
    if tiers.gpu_mem_gb <= 0 or tiers.gpu_tier == "off":
        return "off"
    if tiers.gpu_tier == "auto":
        return "real" if cuda_status(tiers.num_gpus)[0] else "simulated"
    return tiers.gpu_tier
