"""The GPU tier in real HBM: CUDA devices through torch or cupy (DeviceStore)."""

from __future__ import annotations

import os
from typing import Any

from kv_cache.errors import StorageSetupError
from kv_cache.storage import gpu_device
from kv_cache.storage.backends import BackendRequest, Option, gpu_backend, register
from kv_cache.storage.gpu_real import DeviceStore

GIB = 1 << 30
PROCESSES_INDEX = "the --processes index"  # local_rank_from of a --processes child (benchmarks/standard/processes.py)
DEVICE_RESERVE_FRACTION = 0.05  # of each GPU's memory, left free for the library's own allocations


def device_capacity(devices: list[Any], asked: int, strict: bool, notes: list[str]) -> tuple[int, str | None]:
    """Bytes of arena per GPU: `asked` when every device has that much free (less the reserve), else
    clamped to the least any of them has, with a note (refused, StorageSetupError, under --strict-memory
    or when nothing is left). Returns (bytes, why clamped or None)."""
    room = []
    for d in devices:
        try:
            free, total = d.mem_info()
        except Exception:  # a device library that cannot say: take the size as asked
            continue
        room.append((max(0, free - int(DEVICE_RESERVE_FRACTION * total)), free, d))
    if not room or all(r >= asked for r, _, _ in room):
        return asked, None
    fits, free, worst = min(room, key=lambda x: x[0])
    room_text = (f"does not fit in GPU {worst.index} ({worst.name}): {free / GIB:.2f} GiB free, less a "
                 f"{DEVICE_RESERVE_FRACTION:.0%} reserve = {fits / GIB:.2f} GiB")
    message = f"GPU tier of {asked / GIB:.2f} GiB per GPU {room_text}"
    if strict or fits <= 0:  # the CLI puts the flag in front: "--gpu-mem-gb 16.00 GiB per GPU does not fit ..."
        raise StorageSetupError(f"{asked / GIB:.2f} GiB per GPU {room_text}; give at most "
                                f"{max(0.0, fits / GIB):.2f}").about("gpu_mem_gb")
    why = f"{free / GIB:.2f} GiB free on GPU {worst.index}, less a {DEVICE_RESERVE_FRACTION:.0%} reserve"
    notes.append(f"{message}; clamped to {fits / GIB:.2f} GiB per GPU")
    return fits, why


def first_gpu(tiers) -> tuple[int, str | None]:
    """(index of this rank's first GPU, how it was chosen or None for one rank on a host): local rank x
    --num-gpus, so ranks on one host take distinct GPUs; except under an MPI launcher that bound each rank
    to its own GPUs through CUDA_VISIBLE_DEVICES (the rank sees exactly --num-gpus devices), where the
    offset would point past them: then the devices it sees, said so."""
    n, rank = tiers.num_gpus, tiers.local_rank
    bound = os.environ.get("CUDA_VISIBLE_DEVICES")
    if rank and bound and tiers.local_rank_from != PROCESSES_INDEX and gpu_device.visible_count() == n:
        return 0, (f"CUDA_VISIBLE_DEVICES={bound}: this rank (local rank {rank}, {tiers.local_rank_from}) sees "
                   f"exactly its --num-gpus {n} device(s), taken as the launcher bound them")
    if not tiers.local_rank_from:
        return 0, None
    return rank * n, (f"local rank {rank} ({tiers.local_rank_from}) x --num-gpus {n}: GPUs "
                      f"{rank * n}..{rank * n + n - 1}")


def _out_of_memory(exc: BaseException) -> bool:
    """Whether a device library's error is an allocation failure (device or pinned host memory)."""
    return "OutOfMemory" in type(exc).__name__ or "out of memory" in str(exc).lower()


def _open(request: BackendRequest) -> DeviceStore:
    tiers = request.tiers
    first, chosen_by = first_gpu(tiers)  # ranks on one host take distinct GPUs
    try:
        devices = gpu_device.open_devices(tiers.num_gpus, first)
    except gpu_device.CudaUnavailable as exc:
        raise StorageSetupError(f"the real GPU tier needs CUDA: {exc}").about("gpu_tier") from None
    per_gpu, clamped = device_capacity(devices, int(tiers.gpu_mem_gb * GIB), tiers.strict_memory, request.notes)
    store = None
    try:
        store = DeviceStore(devices, per_gpu, request.storage.chunk_bytes,
                            tensor_parallel=tiers.tensor_parallel, staging_slots=request.workers)
        plain = store.measure_plain_copy()  # it allocates one chunk more on the first GPU
    except Exception as exc:  # torch.cuda.OutOfMemoryError, cupy's OutOfMemoryError, a CUDA RuntimeError
        if store is not None:
            store.close()
        if not _out_of_memory(exc):
            raise
        raise StorageSetupError(
            f"{per_gpu / GIB:.2f} GiB per GPU could not be allocated on GPUs "
            f"{', '.join(str(d.index) for d in devices)} ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); "
            "another process may have taken the memory since it was checked: give less").about("gpu_mem_gb") from None
    store.clamped = clamped
    if chosen_by:
        store.chosen_by = chosen_by
    which = ", ".join(str(d.index) for d in devices)
    rank = (f"; local rank {tiers.local_rank} (from {tiers.local_rank_from})" if tiers.local_rank_from else "")
    if chosen_by and chosen_by.startswith("CUDA_VISIBLE_DEVICES"):
        rank = f"; {chosen_by}"
    request.notes.append(
        f"GPU tier: real, {tiers.num_gpus} x {per_gpu / GIB:g} GiB of HBM via {getattr(devices[0], 'backend', 'device')}"
        f" ({devices[0].name}), GPUs {which}{rank}; {store.groups} group(s) of tensor-parallel {tiers.tensor_parallel}, "
        f"each entry (1/{tiers.tensor_parallel} of the KV) on every GPU of its group; plain pinned copy of one "
        f"chunk: H2D {plain['h2d']:.1f} GB/s, D2H {plain['d2h']:.1f} GB/s")
    return store


BACKEND = register(gpu_backend(
    "gpu_real", "real", "CUDA device memory, copies through pinned staging slots", _open,
    (Option("gpu_mem_gb", "HBM per GPU"), Option("num_gpus", "devices"), Option("gpu_tier", "auto | real | simulated | off"))))
