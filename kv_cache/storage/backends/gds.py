"""The storage tier's files read into GPU memory through kvikio (GPUDirect Storage; writes as FileStore)."""

from __future__ import annotations

from kv_cache.errors import StorageSetupError
from kv_cache.storage import gds
from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.tiername import TierName


def _open(request: BackendRequest) -> gds.GDSFileStore:
    kvikio = gds.import_kvikio()
    if kvikio is None or not isinstance(request.upper, DeviceStore):
        raise StorageSetupError("GPUDirect Storage needs kvikio and the real GPU tier (CUDA)").about("gds")
    s = request.storage
    fs = gds.GDSFileStore(request.tiers.cache_dir, s.chunk_bytes, fsync=s.fsync, io_mode=s.io_mode,
                          kvikio=kvikio, device=request.upper.devices[0], slots=request.workers)
    request.notes.append(f"storage-tier reads land in GPU memory through kvikio (GPUDirect Storage; compat "
                         f"mode: {fs.compat_mode})")
    return fs


BACKEND = register(Backend(
    name="gds", tier=TierName.STORAGE, summary="files, read into GPU memory by kvikio (cuFile)",
    capabilities=Capabilities(o_direct=True, verify=True, device_counters=True), open=_open,
    selects=lambda tiers: tiers.gds, priority=10,
    options=(Option("gds", "read the storage tier into GPU memory (needs the real GPU tier)"),
             Option("cache_dir", "where the run directory is made"), Option("chunk_bytes", "bytes per call"),
             Option("fsync", "fdatasync once per entry"), Option("io_mode", "auto | direct | buffered")),
))
