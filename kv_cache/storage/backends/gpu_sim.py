"""The GPU tier simulated in host RAM, its copy times modelled from the GPU spec's host link."""

from __future__ import annotations

from kv_cache.errors import StorageSetupError
from kv_cache.storage.backends import BackendRequest, Option, gpu_backend, register
from kv_cache.storage.gpu_sim import SimulatedGPUStore, TransferModel

GIB = 1 << 30


def transfer_model(tiers) -> TransferModel:
    """The modelled host link of `tiers`' GPU type (StorageSetupError when the spec has no figure)."""
    spec = tiers.gpu_spec
    if spec is None or spec.host_link_gbs <= 0:
        raise StorageSetupError(f"GPU type {tiers.gpu_type!r} has no host link figure to model a simulated "
                                "GPU tier with").about("gpu_type")
    return TransferModel(tiers.gpu_type, spec.host_link, spec.host_link_gbs, spec.hbm_bandwidth_gbs,
                         shards=tiers.tensor_parallel)


def _open(request: BackendRequest) -> SimulatedGPUStore:
    tiers, total = request.tiers, request.capacity_bytes
    spec = tiers.gpu_spec
    store = SimulatedGPUStore(total, transfer_model(tiers), prefault=request.prefault)
    store.groups = max(1, tiers.num_gpus // max(1, tiers.tensor_parallel))
    store.capacity_per_device = total // store.groups
    request.notes.append(
        f"GPU tier: SIMULATED, {total / GIB:.2f} GiB ({tiers.num_gpus} GPU(s) in {store.groups} group(s) of "
        f"tensor-parallel {tiers.tensor_parallel}; one 1/T shard per entry held) in host RAM; its copy times are "
        f"modelled from the {spec.name} {spec.host_link} ({spec.host_link_gbs:g} GB/s per direction), not measured")
    return store


BACKEND = register(gpu_backend(
    "gpu_sim", "simulated", "host RAM standing in for HBM, transfer times modelled", _open,
    (Option("gpu_mem_gb", "HBM per GPU (all GPUs' worth is held in RAM)"), Option("num_gpus", "GPUs"),
     Option("gpu_type", "the GPU spec whose host link is modelled")), host_ram=True, check=transfer_model))
