"""The GPU tier in real HBM: CUDA devices through torch or cupy (DeviceStore)."""

from __future__ import annotations

from kv_cache.errors import StorageSetupError
from kv_cache.storage import gpu_device
from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.tiername import TierName

GIB = 1 << 30


def _open(request: BackendRequest) -> DeviceStore:
    tiers = request.tiers
    try:
        devices = gpu_device.open_devices(tiers.num_gpus)
    except gpu_device.CudaUnavailable as exc:
        raise StorageSetupError(f"the real GPU tier needs CUDA: {exc}").about("gpu_tier") from None
    store = DeviceStore(devices, int(tiers.gpu_mem_gb * GIB), request.storage.chunk_bytes,
                        tensor_parallel=tiers.tensor_parallel, staging_slots=request.workers)
    request.notes.append(f"GPU tier: real, {tiers.num_gpus} x {tiers.gpu_mem_gb:g} GiB of HBM via "
                         f"{getattr(devices[0], 'backend', 'device')} ({devices[0].name})")
    return store


BACKEND = register(Backend(
    name="gpu_real", tier=TierName.GPU, summary="CUDA device memory, copies through pinned staging slots",
    capabilities=Capabilities(verify=True), open=_open,
    selects=lambda tiers: gpu_device.gpu_tier_mode(tiers) == "real",
    options=(Option("gpu_mem_gb", "HBM per GPU"), Option("num_gpus", "devices"),
             Option("tensor_parallel", "shards per entry"), Option("gpu_tier", "auto | real | simulated | off")),
))
