"""The cache tiers of a run and the stores behind them: RAM (MemoryStore), files (FileStore), or, in
trace mode, size-only NullStores that log every operation instead of doing it."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kv_cache.cache import Tier
from kv_cache.errors import StorageSetupError
from kv_cache.metrics.recorder import GIB
from kv_cache.storage.files import FileStore
from kv_cache.storage.leftovers import sweep
from kv_cache.storage.memlimit import MemoryLimit, process_memory_limit
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


MEMORY_FRACTION = 0.9  # of what the process may use: the rest stays for the page cache and other processes
RESERVE_BYTES = 256 << 20  # the interpreter, numpy, the recorder's samples: kept free besides the tiers


def ram_tier_bytes(requested: int, limit: MemoryLimit, other_bytes: int, strict: bool, notes: list[str]) -> int:
    """The RAM tier's size: as requested if it fits, with the run's other memory, in what the process may
    use; else clamped with a warning (console and notes), or refused under --strict-memory."""
    fits = max(0, int(MEMORY_FRACTION * limit.available) - other_bytes - RESERVE_BYTES)
    if requested <= fits:
        return requested
    message = (f"CPU tier of {requested / GIB:.2f} GiB does not fit in the memory this process may use: "
               f"{MEMORY_FRACTION:.0%} of {limit.describe()}, less {other_bytes / GIB:.2f} GiB of I/O buffers and "
               f"{RESERVE_BYTES / GIB:.2f} GiB reserve")
    if strict:
        raise StorageSetupError(f"{message}; give at most {fits / GIB:.2f}").about("cpu_mem_gb")
    message += f"; clamped to {fits / GIB:.2f} GiB"
    log.warning(message)
    notes.append(message)
    return fits


AUTO_FRACTION = 0.90  # of the free space, shared with the other live runs, before the largest entry


def auto_capacity(free: int, largest_entry: int, other_runs: int) -> float:
    """The storage tier's capacity when none is given: 90 % of the free space, split with the other live
    runs on that filesystem, less room for the largest entry (headers and writes in flight); >= 0."""
    return max(0.0, AUTO_FRACTION * free / (1 + other_runs) - largest_entry)


def open_tiers(tiers: TierSettings, storage: StorageSettings, io_trace_log: str | None,
               tier_set: TierSet, largest_entry: int = 0, other_bytes: int = 0) -> None:
    """Open the stores into `tier_set` (filled as they open, so a failure part-way still closes them).
    `largest_entry`: bytes of the largest entry the workload may write (headroom of the auto capacity);
    `other_bytes`: memory the run holds besides the RAM tier (I/O buffers), for the RAM tier's budget."""
    if io_trace_log:
        tier_set.tracer = IOTraceWriter(io_trace_log)
        tier_set.tiers = build_trace_tiers(tiers)
        return
    found = sweep(tiers.cache_dir)  # leftovers of earlier runs, before the free space is read
    for message in found.messages():
        log.warning(message)
        tier_set.notes.append(message)
    fs = tier_set.file_store = FileStore(tiers.cache_dir, storage.chunk_bytes, fsync=storage.fsync,
                                         io_mode=storage.io_mode)
    if fs.fs_type in ("tmpfs", "ramfs"):
        tier_set.notes.append(f"the storage tier directory is on {fs.fs_type} (RAM), not a storage device")
    if tiers.cpu_mem_gb > 0:
        cpu_bytes = ram_tier_bytes(int(tiers.cpu_mem_gb * GIB), process_memory_limit(), other_bytes,
                                   tiers.strict_memory, tier_set.notes)
        # Preallocate (touch) the RAM tier so its latencies are copies, not first-touch page faults;
        # only when it comfortably fits, otherwise say that pages are faulted in on first use.
        prefault = cpu_bytes <= 0.5 * available_memory_bytes()
        if not prefault:
            tier_set.notes.append(f"CPU tier of {cpu_bytes / GIB:.2f} GiB exceeds half of the available RAM: "
                                  "not preallocated, first writes include page-fault time")
        tier_set.memory_store = MemoryStore(cpu_bytes, prefault=prefault) if cpu_bytes > 0 else None
    tier_set.tiers = build_tiers(tiers, fs, tier_set.memory_store, largest_entry, len(found.live))
    if tiers.storage_capacity_gb <= 0:
        tier_set.notes.append(
            f"storage capacity (auto): {tier_set.tiers[-1].limit / GIB:.2f} GiB = {AUTO_FRACTION:.0%} of "
            f"{fs.free_bytes() / GIB:.2f} GiB free / {1 + len(found.live)} run(s) - largest entry "
            f"{largest_entry / GIB:.3f} GiB")


def build_tiers(settings: TierSettings, file_store: FileStore | None, memory_store: MemoryStore | None,
                largest_entry: int = 0, other_runs: int = 0) -> list[Tier]:
    tiers = []
    if memory_store is not None:
        tiers.append(Tier("cpu", memory_store, memory_store.capacity_bytes))  # clamped to the memory there is
    if settings.storage_capacity_gb > 0:
        storage_limit = settings.storage_capacity_gb * GIB
    elif file_store is not None:
        storage_limit = auto_capacity(file_store.free_bytes(), largest_entry, other_runs)
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
