"""The storage tier as one file per entry under the run directory (FileStore: O_DIRECT where the
filesystem allows it, fdatasync per entry)."""

from __future__ import annotations

from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.files import FileStore
from kv_cache.storage.tiername import TierName


def _open(request: BackendRequest) -> FileStore:
    s = request.storage
    return FileStore(request.tiers.cache_dir, s.chunk_bytes, fsync=s.fsync, io_mode=s.io_mode)


BACKEND = register(Backend(
    name="file", tier=TierName.STORAGE, summary="one file per entry, pwritev/preadv in chunks",
    capabilities=Capabilities(o_direct=True, verify=True, device_counters=True), open=_open,
    selects=lambda tiers: True, choice="a directory, --cache-dir", order=0,  # the storage tier's default
    options=(Option("cache_dir", "where the run directory is made (none: a fresh temporary directory)"),
             Option("chunk_bytes", "bytes per data syscall"), Option("fsync", "fdatasync once per entry"),
             Option("io_mode", "auto | direct | buffered"),
             Option("storage_capacity_gb", "the tier's capacity (0: from the free space)")),
))
