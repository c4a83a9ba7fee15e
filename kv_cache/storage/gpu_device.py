"""The small device interface the real GPU tier uses, and its torch and cupy implementations.

torch and cupy are optional (the ``gpu`` extra) and imported only here, inside functions.  A device offers:

* ``alloc(nbytes)``: one device arena (called once per device, at setup);
* ``pinned(nbytes) -> (handle, numpy view)``: page-locked host staging memory (once per staging slot);
* ``lane()``: one worker's own copy lane on this device: a host-to-device and a device-to-host stream,
  each with its own (start, end) timing-event pair (at setup, one per staging slot), so the events of
  one worker's copy never bracket another worker's;
* ``h2d(arena, staging, pieces, lane)`` / ``d2h(staging, arena, pieces, lane)``: enqueue the copies
  ``pieces`` = ``[(arena_offset, staging_offset, n), ...]`` (a whole chunk, contiguous slabs merged) on
  the lane's stream between its two events, without waiting;
* ``wait(lane, direction) -> ns``: wait for that lane's last copy in ``direction`` ("h2d" / "d2h") and
  return the device time its events measured;
* ``mem_info() -> (free, total)`` bytes of device memory (cudaMemGetInfo);
* ``plain_copy_gbs(nbytes) -> (h2d, d2h)``: GB/s of a plain pinned copy of ``nbytes`` (at setup).

Nothing here allocates per copy beyond the tensor views a slice needs.  Tests drive the real store through
fake devices implementing the same methods (tests/test_gpu_real.py, tests/gpu_fakes.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ["CudaUnavailable", "CupyDevice", "Device", "Lane", "TorchDevice", "cuda_status", "open_devices", "visible_count"]


class CudaUnavailable(RuntimeError):
    """No usable CUDA device (library missing, no device, or fewer devices than asked for)."""


class Device(Protocol):
    index: int
    name: str

    def alloc(self, nbytes: int) -> Any: ...

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]: ...

    def lane(self) -> Any: ...

    def h2d(self, arena: Any, staging: Any, pieces: list[tuple[int, int, int]], lane: Any) -> None: ...

    def d2h(self, staging: Any, arena: Any, pieces: list[tuple[int, int, int]], lane: Any) -> None: ...

    def wait(self, lane: Any, direction: str) -> int: ...

    def mem_info(self) -> tuple[int, int]: ...

    def plain_copy_gbs(self, nbytes: int) -> tuple[float, float]: ...


def optional_import(name: str) -> Any | None:
    """The optional dependency `name`, or None when it is missing or cannot load (no CUDA runtime)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _torch() -> Any | None:
    return optional_import("torch")


def _cupy() -> Any | None:
    return optional_import("cupy")


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


def visible_count() -> int:
    """CUDA devices this process sees (torch's count, or cupy's when torch sees none)."""
    return _count("torch") or _count("cupy")


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


def open_devices(num_gpus: int, first: int = 0) -> list[Device]:
    """Devices ``first`` .. ``first + num_gpus - 1`` through torch, or cupy when torch has no CUDA
    (``first``: this rank's local rank x num_gpus, so ranks on one host take distinct GPUs);
    CudaUnavailable when there are fewer."""
    ok, reason = cuda_status(first + num_gpus)
    if not ok:
        if first:
            reason = f"GPUs {first}..{first + num_gpus - 1} asked for (local rank x --num-gpus): {reason}"
        raise CudaUnavailable(reason)
    if _count("torch") >= first + num_gpus:
        torch = _torch()
        return [TorchDevice(torch, i) for i in range(first, first + num_gpus)]
    cupy = _cupy()
    return [CupyDevice(cupy, i) for i in range(first, first + num_gpus)]


class Lane:
    """One worker's copy lane on one device: a stream and a (start, end) event pair per direction."""

    __slots__ = ("streams", "events")

    def __init__(self, streams: dict[str, Any], events: dict[str, tuple[Any, Any]]):
        self.streams, self.events = streams, events


PLAIN_REPS = 20  # copies timed by plain_copy_gbs (after 3 untimed)


def _plain_copy_gbs(device: Any, nbytes: int, copy: Callable[[str, Any, Any, Lane, int], None]) -> tuple[float, float]:
    """GB/s of plain pinned <-> device copies of ``nbytes`` on a fresh stream (the reference): `copy(direction,
    dev, host, lane, reps)` launches `reps` copies of the whole buffer, 3 untimed, then PLAIN_REPS timed."""
    host, _ = device.pinned(nbytes)
    dev = device.alloc(nbytes)
    lane = device.lane()
    out = []
    for direction in ("h2d", "d2h"):
        for timed in (False, True):
            copy(direction, dev, host, lane, PLAIN_REPS if timed else 3)
            ns = device.wait(lane, direction)
        out.append(PLAIN_REPS * nbytes / ns if ns else 0.0)
    return out[0], out[1]


class TorchDevice:
    """One CUDA device through torch: uint8 arena tensor, pinned staging tensors, a stream pair per lane."""

    backend = "torch"

    def __init__(self, torch: Any, index: int):
        self._t = torch
        self.index = index
        self.device = torch.device("cuda", index)
        self.name = torch.cuda.get_device_name(index)

    def alloc(self, nbytes: int) -> Any:
        return self._t.empty(nbytes, dtype=self._t.uint8, device=self.device)

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]:
        t = self._t.empty(nbytes, dtype=self._t.uint8, pin_memory=True)
        return t, t.numpy()

    def lane(self) -> Lane:
        cuda = self._t.cuda
        with cuda.device(self.device):
            streams = {d: cuda.Stream(device=self.device) for d in ("h2d", "d2h")}
            events = {d: (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for d in ("h2d", "d2h")}
        return Lane(streams, events)

    def _launch(self, lane: Lane, direction: str, pairs: list[tuple[Any, Any]]) -> None:
        stream = lane.streams[direction]
        start, end = lane.events[direction]
        with self._t.cuda.device(self.device), self._t.cuda.stream(stream):
            start.record(stream)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            end.record(stream)

    def h2d(self, arena: Any, staging: Any, pieces: list[tuple[int, int, int]], lane: Lane) -> None:
        self._launch(lane, "h2d", [(arena[a:a + n], staging[s:s + n]) for a, s, n in pieces])

    def d2h(self, staging: Any, arena: Any, pieces: list[tuple[int, int, int]], lane: Lane) -> None:
        self._launch(lane, "d2h", [(staging[s:s + n], arena[a:a + n]) for a, s, n in pieces])

    def wait(self, lane: Lane, direction: str) -> int:
        start, end = lane.events[direction]
        end.synchronize()
        return int(start.elapsed_time(end) * 1e6)  # ms -> ns

    def mem_info(self) -> tuple[int, int]:
        free, total = self._t.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def plain_copy_gbs(self, nbytes: int) -> tuple[float, float]:
        """GB/s of plain pinned <-> device copies of ``nbytes`` (`_plain_copy_gbs`), whole tensors copied."""
        def copy(direction: str, dev: Any, host: Any, lane: Lane, reps: int) -> None:
            dst, src = (dev, host) if direction == "h2d" else (host, dev)
            self._launch(lane, direction, [(dst, src)] * reps)

        return _plain_copy_gbs(self, nbytes, copy)


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

    def alloc(self, nbytes: int) -> Any:
        with self._cp.cuda.Device(self.index):
            return self._cp.empty(nbytes, dtype=self._cp.uint8)

    def pinned(self, nbytes: int) -> tuple[Any, np.ndarray]:
        mem = self._cp.cuda.alloc_pinned_memory(nbytes)
        self._keep.append(mem)
        arr = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
        return arr, arr

    def lane(self) -> Lane:
        cuda = self._cp.cuda
        with cuda.Device(self.index):
            streams = {d: cuda.Stream(non_blocking=True) for d in ("h2d", "d2h")}
            events = {d: (cuda.Event(), cuda.Event()) for d in ("h2d", "d2h")}
        return Lane(streams, events)

    def h2d(self, arena: Any, staging: Any, pieces: list[tuple[int, int, int]], lane: Lane) -> None:
        stream, (start, end) = lane.streams["h2d"], lane.events["h2d"]
        with self._cp.cuda.Device(self.index):
            start.record(stream)
            for a, s, n in pieces:
                arena[a:a + n].set(staging[s:s + n], stream=stream)
            end.record(stream)

    def d2h(self, staging: Any, arena: Any, pieces: list[tuple[int, int, int]], lane: Lane) -> None:
        stream, (start, end) = lane.streams["d2h"], lane.events["d2h"]
        with self._cp.cuda.Device(self.index):
            start.record(stream)
            for a, s, n in pieces:
                arena[a:a + n].get(stream=stream, out=staging[s:s + n])
            end.record(stream)

    def wait(self, lane: Lane, direction: str) -> int:
        start, end = lane.events[direction]
        with self._cp.cuda.Device(self.index):
            end.synchronize()
            return int(self._cp.cuda.get_elapsed_time(start, end) * 1e6)

    def mem_info(self) -> tuple[int, int]:
        with self._cp.cuda.Device(self.index):
            free, total = self._cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def plain_copy_gbs(self, nbytes: int) -> tuple[float, float]:
        """GB/s of plain pinned <-> device copies of ``nbytes`` (`_plain_copy_gbs`), as one piece each."""
        def copy(direction: str, dev: Any, host: Any, lane: Lane, reps: int) -> None:
            pieces = [(0, 0, nbytes)] * reps
            if direction == "h2d":
                self.h2d(dev, host, pieces, lane)
            else:
                self.d2h(host, dev, pieces, lane)

        gbs = _plain_copy_gbs(self, nbytes, copy)
        self._keep.pop()
        return gbs


def gpu_tier_mode(tiers: Any) -> str:
    """"off", "real" or "simulated": what --gpu-tier (auto = real where CUDA is present) comes to for the
    TierSettings `tiers`."""
    if tiers.gpu_mem_gb <= 0 or tiers.gpu_tier == "off":
        return "off"
    if tiers.gpu_tier == "auto":
        return "real" if cuda_status(tiers.num_gpus)[0] else "simulated"
    return tiers.gpu_tier
