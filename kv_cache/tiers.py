"""The cache tiers of a run and the stores behind them: RAM (MemoryStore), files (FileStore), or, in
trace mode, size-only NullStores that log every operation instead of doing it."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kv_cache.cache import Tier
from kv_cache.metrics.recorder import GIB
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tracelog import IOTraceWriter, NullStore

if TYPE_CHECKING:  # pragma: no cover  (the settings are read, never imported at run time)
    from kv_cache.config.run import StorageSettings, TierSettings

__all__ = ["TierSet", "available_memory_bytes", "build_tiers", "build_trace_tiers", "gpu_tier_note", "open_tiers"]

log = logging.getLogger("kv_cache")


@dataclass
class TierSet:
    """The tiers in order (fastest first) and the stores this run opened, to be closed at the end."""

    tiers: list[Tier]
    file_store: FileStore | None = None
    memory_store: MemoryStore | None = None
    tracer: IOTraceWriter | None = None
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Close what was opened; a failure is logged, never raised (it must not hide the results)."""
        try:
            if self.tracer is not None:
                self.tracer.close()
            if self.file_store is not None:
                self.file_store.close()
            if self.memory_store is not None:
                self.memory_store.close()
        except Exception as exc:
            log.error("cleanup failed: %s", exc)


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def gpu_tier_note(tiers: TierSettings) -> str | None:
    """This version has no GPU tier; say why once instead of silently pretending."""
    if tiers.gpu_mem_gb <= 0:
        return None
    reason = "no CUDA device is available"
    try:
        import torch  # noqa: PLC0415  (optional dependency)

        if torch.cuda.is_available():
            reason = "the GPU tier is not implemented in this version"
    except Exception:  # torch missing or broken: same outcome
        pass
    return f"--gpu-mem-gb {tiers.gpu_mem_gb:g} requested but {reason}; running without a GPU tier"


def open_tiers(tiers: TierSettings, storage: StorageSettings, io_trace_log: str | None,
               tier_set: TierSet, sharers: int = 1) -> None:
    """Open the stores into `tier_set` (filled as they open, so a failure part-way still closes them).

    `sharers`: how many ranks of this run put their cache on the same filesystem; without
    --storage-capacity-gb they split its free space instead of each taking 95 % of it."""
    if io_trace_log:
        tier_set.tracer = IOTraceWriter(io_trace_log)
        tier_set.tiers = build_trace_tiers(tiers)
        return
    fs = tier_set.file_store = FileStore(tiers.cache_dir, storage.chunk_bytes, fsync=storage.fsync,
                                         io_mode=storage.io_mode)
    if fs.fs_type in ("tmpfs", "ramfs"):
        tier_set.notes.append(f"the storage tier directory is on {fs.fs_type} (RAM), not a storage device")
    if tiers.cpu_mem_gb > 0:
        cpu_bytes = int(tiers.cpu_mem_gb * GIB)
        # Preallocate (touch) the RAM tier so its latencies are copies, not first-touch page faults;
        # only when it comfortably fits, otherwise say that pages are faulted in on first use.
        prefault = cpu_bytes <= 0.5 * available_memory_bytes()
        if not prefault:
            tier_set.notes.append(f"CPU tier of {tiers.cpu_mem_gb:g} GiB exceeds half of the available RAM: "
                                  "not preallocated, first writes include page-fault time")
        tier_set.memory_store = MemoryStore(cpu_bytes, prefault=prefault)
    tier_set.tiers = build_tiers(tiers, fs, tier_set.memory_store, sharers)
    if sharers > 1 and tiers.storage_capacity_gb <= 0:
        tier_set.notes.append(f"storage capacity: 95 % of the free space split between the {sharers} ranks "
                              "whose cache is on this filesystem")


def build_tiers(settings: TierSettings, file_store: FileStore | None, memory_store: MemoryStore | None,
                sharers: int = 1) -> list[Tier]:
    tiers = []
    if memory_store is not None:
        tiers.append(Tier("cpu", memory_store, settings.cpu_mem_gb * GIB))
    if settings.storage_capacity_gb > 0:
        storage_limit = settings.storage_capacity_gb * GIB
    elif file_store is not None:
        storage_limit = file_store.free_bytes() * 0.95 / max(1, sharers)
    else:
        storage_limit = math.inf
    tiers.append(Tier("nvme", file_store, storage_limit))
    return tiers


def build_trace_tiers(settings: TierSettings) -> list[Tier]:
    """Trace mode: every tier is a size-only NullStore (the GPU tier can be modelled too)."""
    tiers = []
    gpu_bytes = settings.gpu_mem_gb * settings.num_gpus * GIB
    if gpu_bytes > 0:
        tiers.append(Tier("gpu", NullStore("gpu"), gpu_bytes))
    if settings.cpu_mem_gb > 0:
        tiers.append(Tier("cpu", NullStore("cpu"), settings.cpu_mem_gb * GIB))
    limit = settings.storage_capacity_gb * GIB if settings.storage_capacity_gb > 0 else math.inf
    tiers.append(Tier("nvme", NullStore("nvme"), limit))
    return tiers
