"""The cache tiers of a run and the stores behind them, each store opened by the storage backend the
settings select for its tier (kv_cache.storage.backends): GPU memory (real or simulated), RAM, files (or
GPUDirect Storage), or, in trace mode, size-only stores that log every operation instead of doing it.

This module decides what is built and how big: the memory budget of the host-RAM tiers, the storage
tier's automatic capacity, the leftovers of earlier runs swept before the free space is read. A backend
only opens its store."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kv_cache.errors import StorageSetupError
from kv_cache.host.capacity import AUTO_FRACTION, auto_capacity
from kv_cache.host.leftovers import sweep
from kv_cache.host.memlimit import MemoryLimit, process_memory_limit
from kv_cache.metrics.recorder import GIB
from kv_cache.serving.cache import Tier
from kv_cache.storage import backends
from kv_cache.storage.backends import Backend, BackendRequest
from kv_cache.storage.files import FileStore
from kv_cache.storage.gpu_device import gpu_tier_mode
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.gpu_sim import SimulatedGPUStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tiername import TierName
from kv_cache.storage.tracelog import IOTraceWriter

if TYPE_CHECKING:  # pragma: no cover  (the settings are read, never imported at run time)
    from kv_cache.settings.run import RunSettings, StorageSettings, TierSettings

__all__ = ["TierSet", "available_memory_bytes", "build_tiers", "build_trace_tiers", "gpu_groups", "gpu_tier_limit",
           "gpu_tier_mode", "open_gpu_store", "open_tiers"]

log = logging.getLogger("kv_cache")


@dataclass
class TierSet:
    """The tiers in order (fastest first) and the stores this run opened, to be closed at the end."""

    tiers: list[Tier]
    file_store: FileStore | None = None
    memory_store: MemoryStore | None = None
    gpu_store: SimulatedGPUStore | DeviceStore | None = None
    tracer: IOTraceWriter | None = None
    notes: list[str] = field(default_factory=list)
    # setting -> {"asked": GiB as given, "effective": GiB in force, "clamped": why, or None}: each tier size
    # that a memory budget or the free space decided (cpu_mem_gb, gpu_mem_gb per GPU, storage_capacity_gb)
    sizes: dict[str, dict[str, object]] = field(default_factory=dict)
    backends: dict[TierName, Backend] = field(default_factory=dict)  # the backend behind each tier opened
    shaped: dict[str, object] = field(default_factory=dict)  # tier -> its ShapedStore (--tier-bandwidth / -latency)

    def backend_names(self) -> dict[str, str]:
        """The results' measurement.tier_backends: each tier opened (gpu, cpu, storage) -> its backend's
        registry name (memory, file, gds, gpu_real, gpu_sim, tracelog, or whatever was registered)."""
        return {str(tier): self.backends[tier].name for tier in TierName if tier in self.backends}  # fastest first

    def close(self) -> None:
        """Close what was opened; a failure is logged, never raised (it must not hide the results)."""
        try:
            if self.tracer is not None:
                self.tracer.close()
            if self.file_store is not None:
                self.file_store.close()
            if self.memory_store is not None:
                self.memory_store.close()
            if self.gpu_store is not None:
                self.gpu_store.close()
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


def _open(backend: Backend, tier: TierName, tiers: TierSettings, storage: StorageSettings, tier_set: TierSet,
          workers: int, capacity: int = 0, prefault: bool = False):
    backend.check(tiers)
    request = BackendRequest(tier, tiers, storage, workers, capacity, prefault, upper=tier_set.gpu_store,
                             notes=tier_set.notes)
    store = backend.open(request)
    tier_set.backends[tier] = backend
    return store


def open_gpu_store(tiers: TierSettings, storage: StorageSettings, tier_set: TierSet, workers: int = 8,
                   limit: MemoryLimit | None = None, other_bytes: int = 0) -> None:
    """Open the GPU tier's store into `tier_set` (none when the tier is off) and say what it is.

    `workers`: I/O workers that may copy at once (one pinned staging slot each, for a real tier); `limit`
    and `other_bytes`: the memory the process may use and what the run holds besides (a host-RAM backend's
    arena, the simulated tier's, is clamped to that budget like the CPU tier)."""
    backend = backends.choose(TierName.GPU, tiers)
    if backend is None:
        return
    groups = gpu_groups(tiers)
    total = int(tiers.gpu_mem_gb * GIB) * groups  # entry bytes: one 1/T shard per group (see gpu_real.py)
    prefault = False
    backend.check(tiers)
    asked = total
    if backend.capabilities.host_ram:
        if limit is not None:
            total = ram_tier_bytes(total, limit, other_bytes, tiers.strict_memory, tier_set.notes,
                                   what="simulated GPU tier (host RAM)", flag="gpu_mem_gb", per_flag=groups)
            tier_set.sizes["gpu_mem_gb"] = tier_size(tiers.gpu_mem_gb, total / groups,
                                                     _clamp_reason(limit) if total < asked else None)
        if total <= 0:
            return
        prefault = total + int(tiers.cpu_mem_gb * GIB) <= 0.5 * available_memory_bytes()
        if not prefault:
            tier_set.notes.append(f"simulated GPU tier of {total / GIB:g} GiB plus the CPU tier exceed half of the "
                                  "available RAM: not preallocated (page faults fall in the stand-in memcpy, which "
                                  "is not in the reported times)")
    tier_set.gpu_store = _open(backend, TierName.GPU, tiers, storage, tier_set, workers, total, prefault)
    if total < asked and limit is not None:  # a simulated tier clamped to the memory budget (the refusals say so)
        tier_set.gpu_store.clamped = _clamp_reason(limit)
    clamped = getattr(tier_set.gpu_store, "clamped", None)
    if clamped:  # a real tier clamped to the memory its GPUs have free
        tier_set.sizes["gpu_mem_gb"] = tier_size(tiers.gpu_mem_gb, tier_set.gpu_store.capacity_per_device, clamped)


def gpu_groups(tiers: TierSettings) -> int:
    """GPU groups (model replicas) of --tensor-parallel GPUs: each holds an entry's 1/T shard per GPU."""
    return max(1, tiers.num_gpus // max(1, tiers.tensor_parallel))


def gpu_tier_limit(store: SimulatedGPUStore | DeviceStore, largest_entry: int) -> float:
    """The GPU tier's capacity as the cache accounts it. An entry must fit in one GPU (each GPU of its
    group): one larger than a GPU's share skips the tier and goes to the next one that can hold it (the
    MLPerf tool's waterfall; the cache counts the skips, `Tier.max_entry`). With several groups,
    (groups - 1) x the footprint of the largest entry that fits a GPU is kept back, so that whenever the
    cache admits an entry some group has room for it (fragmentation across GPUs cannot leave it waiting)."""
    per_gpu = getattr(store, "capacity_per_device", store.capacity_bytes)
    groups = getattr(store, "groups", 1)
    need = min(store.footprint(largest_entry), per_gpu) if largest_entry > 0 else 0
    return max(0, store.capacity_bytes - (groups - 1) * need)


RAM_FILESYSTEMS = ("tmpfs", "ramfs")  # a storage tier there is host RAM
MEMORY_FRACTION = 0.9  # of what the process may use: the rest stays for the page cache and other processes
RESERVE_BYTES = 256 << 20  # the interpreter, numpy, the recorder's samples: kept free besides the tiers


def ram_budget_bytes(limit: MemoryLimit, other_bytes: int) -> int:
    """Bytes of host RAM the run's RAM-backed tiers may take together: MEMORY_FRACTION of what this
    process may use, less `other_bytes` (I/O buffers, upper tiers) and RESERVE_BYTES."""
    return max(0, int(MEMORY_FRACTION * limit.available) - other_bytes - RESERVE_BYTES)


def tier_size(asked_gib: float, effective_bytes: float, clamped: str | None) -> dict[str, object]:
    """One entry of TierSet.sizes."""
    return {"asked": float(asked_gib), "effective": effective_bytes / GIB, "clamped": clamped}


def _clamp_reason(limit: MemoryLimit) -> str:
    return f"{MEMORY_FRACTION:.0%} of {limit.describe()}, less buffers and reserve"


def ram_tier_bytes(requested: int, limit: MemoryLimit, other_bytes: int, strict: bool, notes: list[str],
                   what: str = "CPU tier", flag: str = "cpu_mem_gb", per_flag: int = 1) -> int:
    """A host-RAM tier's size: as requested if it fits, with the run's other memory, in what the process
    may use; else clamped with a warning (console and notes), or refused under --strict-memory.
    `per_flag`: the size is this many times `flag`'s value (a simulated GPU tier: one --gpu-mem-gb per
    group), so the refusal's "give at most" is in the flag's own unit."""
    fits = ram_budget_bytes(limit, other_bytes)
    if requested <= fits:
        return requested
    room = (f"does not fit in the memory this process may use: {MEMORY_FRACTION:.0%} of {limit.describe()}, less "
            f"{other_bytes / GIB:.2f} GiB of I/O buffers (and upper tiers) and {RESERVE_BYTES / GIB:.2f} GiB reserve")
    if strict:  # the CLI puts the flag in front: "--cpu-mem-gb 1000.00 GiB (the CPU tier) does not fit ..."
        per = max(1, per_flag)
        held = f"; {per} x that = {requested / GIB:.2f} GiB" if per > 1 else ""
        raise StorageSetupError(f"{requested / per / GIB:.2f} GiB ({what}{held}) {room}; give at most "
                                f"{fits / per / GIB:.2f}").about(flag)
    message = f"{what} of {requested / GIB:.2f} GiB {room}; clamped to {fits / GIB:.2f} GiB"
    log.warning(message)
    notes.append(message)
    return fits


def largest_entry(settings: RunSettings) -> int:
    """Bytes of the largest entry the synthetic users may write (the longest context of any template),
    at least one I/O chunk: the headroom the auto storage capacity keeps."""
    longest = max((t.context_range[1] for t in settings.config.user_templates.values()), default=0)
    per_token = settings.model.bytes_per_token // max(1, settings.tiers.tensor_parallel)
    return max(settings.storage.chunk_bytes, longest * per_token)


def gpu_reserve_note(store: SimulatedGPUStore | DeviceStore, limit: float) -> str | None:
    """The note when the GPU tier holds less than its GPUs' memory (`gpu_tier_limit`'s reserve against
    fragmentation over several groups): the banner's "GPU Memory" is the GPUs' memory, the cache fills only
    `limit`. With --num-gpus 8 --gpu-mem-gb 0.1 and entries larger than one GPU's share, the reserve is one
    GPU's share per other group, and the 0.8 GiB tier held 0.1 GiB without a word."""
    total = store.capacity_bytes
    if limit >= total:
        return None
    per_gpu = getattr(store, "capacity_per_device", total)
    groups = getattr(store, "groups", 1)
    kept = total - limit
    return (f"GPU tier: the cache fills {limit / GIB:.3f} of its {total / GIB:.3f} GiB ({100 * limit / total:.0f} %): "
            f"{kept / GIB:.3f} GiB ({groups - 1} x {kept / max(1, groups - 1) / GIB:.3f} GiB, the largest entry one "
            f"GPU of {per_gpu / GIB:.3f} GiB holds) is kept back so that an entry always finds a group of GPUs "
            "with room for it; shorter contexts or a larger --gpu-mem-gb keep less back")


def open_tiers(tiers: TierSettings, storage: StorageSettings, io_trace_log: str | None,
               tier_set: TierSet, workers: int = 8, largest_entry: int = 0, other_bytes: int = 0,
               sharers: int = 1, storage_tier: bool = True, last_ram_fraction: float = 1.0) -> None:
    """Open the stores into `tier_set` (filled as they open, so a failure part-way still closes them).
    `workers`: I/O workers that may copy at once; `largest_entry`: bytes of the largest entry the workload
    may write (headroom of the auto capacity); `other_bytes`: memory the run holds besides the host-RAM
    tiers (I/O buffers), for their budget; `sharers`: how many ranks of this run put their cache on the
    same filesystem (without --storage-capacity-gb they split its free space); `storage_tier`: False for
    a configuration without one (a sessions rung on DRAM alone), whose last RAM tier then fills to
    `last_ram_fraction` of its size."""
    if io_trace_log:
        _open_trace_tiers(tiers, io_trace_log, tier_set)
        return
    files = storage_tier and tiers.remote.storage_backend == "file"  # a remote tier sweeps its own namespace
    found = sweep(tiers.cache_dir) if files else None  # leftovers of earlier runs, before the free space is read
    for message in found.messages() if found is not None else ():
        log.warning(message)
        tier_set.notes.append(message)
    limit = process_memory_limit(tiers.host_ranks)
    # The GPU tier first: the storage tier's GDS reads land in its device, and a simulated one takes host
    # RAM before the CPU tier does (it is the upper tier).
    open_gpu_store(tiers, storage, tier_set, workers, limit, other_bytes)
    if isinstance(tier_set.gpu_store, SimulatedGPUStore):
        other_bytes += tier_set.gpu_store.capacity_bytes
    fs = None
    capacity_clamp: float | None = None
    if storage_tier:
        fs = tier_set.file_store = _open_file_store(tiers, storage, tier_set, workers)
        if fs.fs_type in RAM_FILESYSTEMS:
            tier_set.notes.append(f"the storage tier directory is on {fs.fs_type} (RAM), not a storage device")
            # before the CPU tier is allocated (and touched): a tmpfs tier with no room is refused up front
            check_ram_room(tiers, fs, limit, other_bytes, largest_entry)
        if tiers.storage_capacity_gb > 0 and fs.free_bytes() is not None:
            capacity_clamp = check_free_space(tiers, fs, sharers, largest_entry, tier_set.notes)
    _open_memory_store(tiers, storage, tier_set, workers, limit, other_bytes)
    # Ranks of this run on the filesystem, or live runs found there (which may be those ranks): the larger.
    runs = max(sharers, 1 + len(found.live)) if found is not None else sharers
    # A storage tier in RAM (tmpfs) takes host memory like the CPU tier: its automatic capacity stays
    # within what the memory budget leaves after the RAM tiers.
    ram_room = None
    if fs is not None and fs.fs_type in RAM_FILESYSTEMS:
        cpu_bytes = tier_set.memory_store.capacity_bytes if tier_set.memory_store is not None else 0
        ram_room = max(0, ram_budget_bytes(limit, other_bytes) - cpu_bytes)
    tier_set.tiers = build_tiers(tiers, fs, tier_set.memory_store, tier_set.gpu_store, largest_entry, runs,
                                 ram_room, storage_tier=storage_tier, last_ram_fraction=last_ram_fraction)
    if tier_set.gpu_store is not None:
        note = gpu_reserve_note(tier_set.gpu_store, tier_set.tiers[0].limit)
        if note:
            tier_set.notes.append(note)
    if not storage_tier:
        return
    storage_limit = tier_set.tiers[-1].limit
    if capacity_clamp is not None:
        storage_limit = tier_set.tiers[-1].limit = capacity_clamp
    in_ram = False
    if tiers.storage_capacity_gb <= 0 and fs.free_bytes() is None:  # a bucket, a server without maxmemory
        tier_set.notes.append(f"storage capacity (auto): unbounded, {fs.cache_dir} reports no free space; "
                              "give --storage-capacity-gb to bound it")
    elif tiers.storage_capacity_gb <= 0:
        by_free = auto_capacity(fs.free_bytes(), largest_entry, runs)
        check_auto_capacity(fs, storage_limit, largest_entry, runs)
        in_ram = ram_room is not None and storage_limit < by_free
        tier_set.notes.append(
            f"storage capacity (auto): {storage_limit / GIB:.2f} GiB = {AUTO_FRACTION:.0%} of "
            f"{fs.free_bytes() / GIB:.2f} GiB free / {runs} run(s) or rank(s) on this filesystem - largest entry "
            f"{largest_entry / GIB:.3f} GiB"
            + (f"; {fs.fs_type} is RAM: bounded by the memory budget left after the RAM tiers "
               f"({ram_room / GIB:.2f} GiB of {_clamp_reason(limit)})" if in_ram else ""))
    else:  # an explicit capacity on tmpfs is host RAM too: the budget clamps it like the CPU tier
        in_ram = ram_room is not None and storage_limit > ram_room
        if in_ram:
            message = (f"storage tier of {storage_limit / GIB:.2f} GiB on {fs.fs_type} (RAM) does not fit in the "
                       f"memory budget left after the RAM tiers: {ram_room / GIB:.2f} GiB of {_clamp_reason(limit)}")
            if tiers.strict_memory:
                raise StorageSetupError(f"{message}; give at most {ram_room / GIB:.2f}").about("storage_capacity_gb")
            message += f"; clamped to {ram_room / GIB:.2f} GiB"
            log.warning(message)
            tier_set.notes.append(message)
            storage_limit = tier_set.tiers[-1].limit = ram_room
        if 0 < largest_entry and tier_set.tiers[-1].cost(largest_entry) > storage_limit:
            # the user's capacity: it runs (the reference runs it), but the first entry larger than the tier
            # stops the run with a storage error (exit 3): say so before anything runs
            message = (f"storage capacity: {storage_limit / GIB:.3f} GiB is smaller than the largest entry the "
                       f"users may write ({largest_entry / GIB:.3f} GiB: the longest context's entry, or one I/O "
                       "chunk if larger); an entry larger than the storage tier, if one is written, stops the run "
                       "with a storage error; give a larger --storage-capacity-gb, a smaller model or shorter contexts")
            log.warning(message)
            tier_set.notes.append(message)
    if math.isinf(storage_limit):  # unbounded (a bucket): no size decided, none to show
        return
    tier_set.sizes["storage_capacity_gb"] = tier_size(
        tiers.storage_capacity_gb, storage_limit,
        f"{fs.fs_type} is RAM: within the memory budget left after the RAM tiers" if in_ram
        else "more than the free space: the automatic capacity" if capacity_clamp is not None else None)


def check_auto_capacity(fs: FileStore, capacity: float, largest_entry: int, runs: int) -> None:
    """The automatic capacity must hold the largest entry: otherwise the run could store nothing in its
    storage tier and would stop on its first write (exit 3, a FAIL document for a run that never ran).
    Refused up front instead (exit 2, one line), as an explicit capacity there is."""
    if largest_entry <= 0 or capacity >= largest_entry:
        return
    free = fs.free_bytes() or 0
    raise StorageSetupError(
        f"{fs.cache_dir} has {free / GIB:.3f} GiB ({free / (1 << 20):.1f} MiB) free on {fs.fs_type}: the automatic "
        f"storage capacity ({AUTO_FRACTION:.0%} of it / {runs} run(s) or rank(s), less the largest entry) is "
        f"{capacity / GIB:.3f} GiB, too small for one entry of {largest_entry / GIB:.3f} GiB (the longest context's "
        "entry, or one I/O chunk if larger); free space there, put --cache-dir elsewhere, or use a smaller model, "
        "shorter contexts or a smaller --io-chunk-mb").about("cache_dir")


def _open_trace_tiers(tiers: TierSettings, io_trace_log: str, tier_set: TierSet) -> None:
    """--io-trace-log: every tier is the trace log (no real I/O), an earlier log kept."""
    tier_set.tracer = IOTraceWriter(io_trace_log)
    if tier_set.tracer.kept_as is not None:
        message = f"an earlier trace log at {io_trace_log} was kept as {tier_set.tracer.kept_as}"
        log.warning(message)
        tier_set.notes.append(message)
    tier_set.tiers = build_trace_tiers(tiers)
    tier_set.backends = dict.fromkeys((TierName.of(t.name) for t in tier_set.tiers), backends.get("tracelog"))


def _planned_cpu_bytes(tiers: TierSettings, limit: MemoryLimit, other_bytes: int) -> int:
    """Bytes the CPU tier will take of host RAM (as ram_tier_bytes will clamp it), before it is opened."""
    backend = backends.choose(TierName.CPU, tiers)
    if backend is None or not backend.capabilities.host_ram:
        return 0
    return min(int(tiers.cpu_mem_gb * GIB), ram_budget_bytes(limit, other_bytes))


def check_ram_room(tiers: TierSettings, fs: FileStore, limit: MemoryLimit, other_bytes: int,
                   largest_entry: int) -> None:
    """A storage tier on tmpfs is host RAM: refuse (StorageSetupError, exit 2, before anything runs) when
    the memory budget leaves it no room for one entry once the RAM tiers are counted, rather than start a
    run whose storage tier holds nothing."""
    budget = ram_budget_bytes(limit, other_bytes)
    cpu = _planned_cpu_bytes(tiers, limit, other_bytes)
    room = max(0, budget - cpu)
    if room > largest_entry:
        return
    raise StorageSetupError(
        f"the storage tier directory {tiers.cache_dir} is on {fs.fs_type} (RAM), and the memory budget has no "
        f"room left for it: the CPU tier takes {cpu / GIB:.2f} GiB of the {budget / GIB:.2f} GiB budget "
        f"({_clamp_reason(limit)}), leaving {room / GIB:.2f} GiB, less than one entry "
        f"({largest_entry / GIB:.3f} GiB); lower --cpu-mem-gb or put --cache-dir on a storage device"
    ).about("cache_dir")


def check_free_space(tiers: TierSettings, fs: FileStore, sharers: int = 1, largest_entry: int = 0,
                     notes: list[str] | None = None) -> float | None:
    """An explicit --storage-capacity-gb is a hard limit the tier fills. When it, times the ranks of this
    run on that filesystem, is more than the filesystem's free space (measured after the leftovers sweep,
    in a run directory that holds nothing yet), the run could only end in ENOSPC: it is clamped to what
    the automatic capacity would take there, with a warning and a note (returns the clamped bytes), as
    --cpu-mem-gb is clamped to the memory there is; under --strict-memory it is refused (exit 2, before
    anything runs). Returns None when it fits.

    The refusal carries `most`, the capacity that fits in this rank's unit: under several ranks the flag
    is a total the ranks split, and the run's refusal (run.py `_with_rank_share`) gives the total."""
    asked = tiers.storage_capacity_gb * GIB
    free = fs.free_bytes()
    total = asked * max(1, sharers)
    if total <= free:
        return None
    ranks = f" x {sharers} ranks on that filesystem = {total / GIB:.3f} GiB" if sharers > 1 else ""
    # a remote tier (Redis: maxmemory less used_memory) has no filesystem and no --cache-dir
    where = (f"on the server {fs.cache_dir} ({fs.fs_type} maxmemory less used_memory)" if getattr(fs, "io_mode", None) == "network"
             else f"on the filesystem of {tiers.cache_dir} ({fs.fs_type})")
    most = math.floor(free / max(1, sharers) / GIB * 1000) / 1000
    said = f"{tiers.storage_capacity_gb:g} GiB{ranks} is more than the {free / GIB:.3f} GiB ({free / (1 << 20):.1f} MiB) free {where}"
    clamped = auto_capacity(free, largest_entry, sharers)
    if largest_entry > 0 and most * GIB < largest_entry:  # no capacity that fits there holds one entry
        raise StorageSetupError(
            f"{said}, and no capacity that fits there holds one entry of {largest_entry / GIB:.3f} GiB (the longest "
            "context's entry, or one I/O chunk if larger); free space there, put --cache-dir elsewhere, or use a "
            "smaller model, shorter contexts or a smaller --io-chunk-mb").about("storage_capacity_gb")
    if tiers.strict_memory or clamped < largest_entry:  # strict, or no room for one entry even clamped
        exc = StorageSetupError(
            f"{said}: the capacity is a hard limit the tier fills, so the run would stop on ENOSPC; give at most "
            f"{most:.3f}, or leave it out (automatic: {AUTO_FRACTION:.0%} of the free space)"
        ).about("storage_capacity_gb")
        exc.most = most
        raise exc
    message = (f"storage capacity: {said}; clamped to {clamped / GIB:.3f} GiB"
               + f" (what the automatic capacity takes: {AUTO_FRACTION:.0%} of the free space less the largest "
               "entry), as a run that fills the filesystem can only end in ENOSPC; --strict-memory refuses instead")
    log.warning(message)
    if notes is not None:
        notes.append(message)
    return clamped


def _open_memory_store(tiers: TierSettings, storage: StorageSettings, tier_set: TierSet, workers: int,
                       limit: MemoryLimit, other_bytes: int) -> None:
    backend = backends.choose(TierName.CPU, tiers)
    if backend is None:
        return
    cpu_bytes = int(tiers.cpu_mem_gb * GIB)
    prefault = False
    if backend.capabilities.host_ram:
        asked = cpu_bytes
        cpu_bytes = ram_tier_bytes(cpu_bytes, limit, other_bytes, tiers.strict_memory, tier_set.notes)
        tier_set.sizes["cpu_mem_gb"] = tier_size(tiers.cpu_mem_gb, cpu_bytes,
                                                 _clamp_reason(limit) if cpu_bytes < asked else None)
        # Preallocate (touch) the RAM tier so its latencies are copies, not first-touch page faults;
        # only when it comfortably fits, otherwise say that pages are faulted in on first use.
        prefault = cpu_bytes <= 0.5 * available_memory_bytes()
        if not prefault:
            tier_set.notes.append(f"CPU tier of {cpu_bytes / GIB:.2f} GiB exceeds half of the available RAM: "
                                  "not preallocated, first writes include page-fault time")
    if cpu_bytes > 0:
        tier_set.memory_store = _open(backend, TierName.CPU, tiers, storage, tier_set, workers, cpu_bytes, prefault)


def _open_file_store(tiers: TierSettings, storage: StorageSettings, tier_set: TierSet, workers: int) -> FileStore:
    """The storage tier's store: the backend the settings select (files, GPUDirect Storage, or a remote
    tier: S3 objects, Redis keys, which answer the same questions: run_dir, fs_type, free_bytes)."""
    backend = backends.choose(TierName.STORAGE, tiers)
    if backend is None:  # pragma: no cover  (the file backend selects every setting)
        raise StorageSetupError("no storage backend serves these settings").about("cache_dir")
    return _open(backend, TierName.STORAGE, tiers, storage, tier_set, workers)


def build_tiers(settings: TierSettings, file_store: FileStore | None, memory_store: MemoryStore | None,
                gpu_store: SimulatedGPUStore | DeviceStore | None = None, largest_entry: int = 0,
                runs: int = 1, ram_room: int | None = None, storage_tier: bool = True,
                last_ram_fraction: float = 1.0) -> list[Tier]:
    tiers = []
    if gpu_store is not None:
        tiers.append(Tier(TierName.GPU.legacy, gpu_store, gpu_tier_limit(gpu_store, largest_entry),
                          max_entry=getattr(gpu_store, "capacity_per_device", gpu_store.capacity_bytes)))
    if memory_store is not None:
        tiers.append(Tier(TierName.CPU.legacy, memory_store, memory_store.capacity_bytes))  # clamped to the memory there is
    if not storage_tier:
        if tiers:
            tiers[-1].limit *= last_ram_fraction
        return tiers
    if settings.storage_capacity_gb > 0:
        storage_limit = settings.storage_capacity_gb * GIB
    elif file_store is not None and file_store.free_bytes() is not None:
        storage_limit = auto_capacity(file_store.free_bytes(), largest_entry, runs, ram_room)
    else:
        storage_limit = math.inf
    tiers.append(Tier(TierName.STORAGE.legacy, file_store, storage_limit))
    return tiers


def build_trace_tiers(settings: TierSettings) -> list[Tier]:
    """Trace mode: every tier a size-only store of the trace-log backend (the GPU tier can be modelled too)."""
    trace = backends.get("tracelog")
    sizes = ((TierName.GPU, settings.gpu_mem_gb * gpu_groups(settings) * GIB), (TierName.CPU, settings.cpu_mem_gb * GIB))
    tiers = [Tier(name.legacy, trace.open(BackendRequest(name, settings, None)), size)  # type: ignore[arg-type]
             for name, size in sizes if size > 0]
    limit = settings.storage_capacity_gb * GIB if settings.storage_capacity_gb > 0 else math.inf
    tiers.append(Tier(TierName.STORAGE.legacy, trace.open(BackendRequest(TierName.STORAGE, settings, None)), limit))  # type: ignore[arg-type]
    return tiers
