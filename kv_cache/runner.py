"""One benchmark run, end to end: settings -> tiers -> users -> driver -> results -> outputs.

Owns the run's lifecycle: whatever happens (Ctrl-C, SIGTERM, disk full), it writes what was measured
and removes the files it created, and only those.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import signal
import sys
import threading
from datetime import datetime
from typing import Any

import numpy as np

from kv_cache import __version__
from kv_cache.cache import EvictionPolicy, MultiTierCache, Tier
from kv_cache.driver import Driver, DriverOptions, DriverOutcome
from kv_cache.errors import UsageError
from kv_cache.metrics import GIB, RunMetrics
from kv_cache.report.console import print_report
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.results import build_summary, harness_keys, request_lists
from kv_cache.settings import RunSettings
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.workload.conversation import ConversationManager
from kv_cache.workload.prefix import build_system_prefixes
from kv_cache.workload.users import SyntheticUser, generate_profiles

log = logging.getLogger("kv_cache")

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_STORAGE_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_MAX_WORKERS = 32
TIMED = ("device = open + pwritev/preadv + fdatasync + posix_fadvise + close syscalls of each entry; "
         "host = the rest of the operation (block stamping, bookkeeping); total = both "
         "(time.perf_counter_ns). RAM tier: device = the memcpy.")


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def io_worker_count(settings: RunSettings) -> int:
    workers = settings.storage.io_workers or min(settings.num_users, DEFAULT_MAX_WORKERS)
    if settings.max_concurrent_allocs > 0:
        workers = min(workers, settings.max_concurrent_allocs)
    return max(1, workers)


def gpu_tier_note(settings: RunSettings) -> str | None:
    """This version has no GPU tier; say why once instead of silently pretending."""
    if settings.gpu_mem_gb <= 0:
        return None
    reason = "no CUDA device is available"
    try:
        import torch  # noqa: PLC0415  (optional dependency)

        if torch.cuda.is_available():
            reason = "the GPU tier is not implemented in this version"
    except Exception:  # torch missing or broken: same outcome
        pass
    return f"--gpu-mem-gb {settings.gpu_mem_gb:g} requested but {reason}; running without a GPU tier"


def _raise_interrupt(signum, frame):  # SIGTERM behaves like Ctrl-C: stop, report, clean up
    raise KeyboardInterrupt


def build_tiers(settings: RunSettings, file_store: FileStore, memory_store: MemoryStore | None) -> list[Tier]:
    tiers = []
    if memory_store is not None:
        tiers.append(Tier("cpu", memory_store, settings.cpu_mem_gb * GIB))
    if settings.storage_capacity_gb > 0:
        storage_limit = settings.storage_capacity_gb * GIB
    else:
        storage_limit = file_store.free_bytes() * 0.95
    tiers.append(Tier("nvme", file_store, storage_limit))
    return tiers


def build_users(settings: RunSettings) -> list[SyntheticUser]:
    cfg = settings.config
    seed = settings.effective_seed
    conversations = (ConversationManager(cfg.conversation.max_conversations, cfg.conversation.max_turns_per_conv)
                     if settings.multi_turn else None)
    prefixes = (build_system_prefixes(cfg.prefix_cache.min_prefix_length, cfg.prefix_cache.max_prefix_entries)
                if settings.prefix_caching else ())
    return [
        SyntheticUser(p, seed, conversations, cfg.conversation.end_conversation_probability, prefixes,
                      cfg.prefix_cache.system_prompt_hit_probability)
        for p in generate_profiles(settings.num_users, cfg, seed)
    ]


def run_benchmark(settings: RunSettings, out=None) -> int:
    """Run, write the JSON, print the report. Returns the process exit code."""
    out = out or sys.stdout
    previous_term = None
    if threading.current_thread() is threading.main_thread():
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        results, code = execute(settings, out)
    except UsageError as exc:
        sys.stderr.write(f"kv-cache: error: {exc}\n")
        return EXIT_USAGE
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    return code


def execute(settings: RunSettings, out, record_plans: bool = False) -> tuple[dict[str, Any], int]:
    cfg = settings.config
    notes: list[str] = []
    gpu_note = gpu_tier_note(settings)
    if gpu_note:
        log.warning(gpu_note)
        notes.append(gpu_note)

    stop = threading.Event()
    metrics = RunMetrics()
    file_store = memory_store = None
    outcome: DriverOutcome | None = None
    interrupted = False
    started = datetime.now()
    rusage0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        file_store = FileStore(settings.cache_dir, settings.storage.chunk_bytes, fsync=settings.storage.fsync,
                               io_mode=settings.storage.io_mode)
        if file_store.fs_type in ("tmpfs", "ramfs"):
            notes.append(f"the storage tier directory is on {file_store.fs_type} (RAM), not a storage device")
        if settings.cpu_mem_gb > 0:
            cpu_bytes = int(settings.cpu_mem_gb * GIB)
            # Preallocate (touch) the RAM tier so its latencies are copies, not first-touch page faults;
            # only when it comfortably fits, otherwise say that pages are faulted in on first use.
            prefault = cpu_bytes <= 0.5 * available_memory_bytes()
            if not prefault:
                notes.append(f"CPU tier of {settings.cpu_mem_gb:g} GiB exceeds half of the available RAM: "
                             "not preallocated, first writes include page-fault time")
            memory_store = MemoryStore(cpu_bytes, prefault=prefault)
        tiers = build_tiers(settings, file_store, memory_store)
        policy = EvictionPolicy(**{k: getattr(cfg.eviction, k) for k in EvictionPolicy.__dataclass_fields__})
        cache = MultiTierCache(tiers, policy, metrics, settings.model.bytes_per_token, stop)
        users = build_users(settings)
        workers = io_worker_count(settings)
        options = DriverOptions(
            duration_s=float(settings.duration),
            max_requests=settings.max_requests,
            workers=workers,
            chunk_bytes=settings.storage.chunk_bytes,
            seed=settings.effective_seed,
            bytes_per_token=settings.model.bytes_per_token,
            tensor_parallel=settings.tensor_parallel,
            decode_batch_size=cfg.decode.batch_size,
            seconds_per_token=getattr(cfg.generation_timing, settings.generation_mode),
            record_plans=record_plans,
        )
        print_banner(settings, users, workers, file_store, out)
        blockdev = BlockDeviceCounter.for_path(str(file_store.run_dir))
        before = blockdev.snapshot() if blockdev else None
        outcome = Driver(users, cache, metrics, options, stop).run()
        after = blockdev.snapshot() if blockdev else None
        interrupted = outcome.stop_reason == "interrupted"
        usage = cache.usage()
        entry_sizes = cache.entry_sizes()
        results = assemble(settings, metrics, outcome, usage, entry_sizes, file_store, memory_store, workers,
                           blockdev, before, after, notes, started, rusage0)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        metrics.close_window()
        results = {"interrupted": True, "stop_reason": "interrupted before the measured phase"}
    finally:
        stop.set()
        try:
            if file_store is not None:
                file_store.close()
            if memory_store is not None:
                memory_store.close()
        except Exception as exc:  # cleanup failure must not hide the results
            log.error("cleanup failed: %s", exc)

    write_json_atomic(settings.output, results)
    print_report(results, out)
    out.write(f"\nResults written to {settings.output}\n")
    out.flush()
    if interrupted:
        return results, EXIT_INTERRUPTED
    if outcome is not None and outcome.fatal_error:
        log.error("run stopped by a storage error: %s", outcome.fatal_error)
        return results, EXIT_STORAGE_ERROR
    return results, (EXIT_PASS if results.get("overall_passed") else EXIT_FAIL)


def print_banner(settings: RunSettings, users, workers: int, file_store: FileStore, out) -> None:
    line = "=" * 80
    m = settings.model
    ms = getattr(settings.config.generation_timing, settings.generation_mode) * 1000
    out.write(f"{line}\nIntegrated Multi-User KV Cache Benchmark - MLPerf Edition (kv-cache {__version__})\n")
    out.write(f"Model: {m.name} ({m.bytes_per_token:,} bytes/token)\n")
    out.write(f"GPU Memory: {settings.gpu_mem_gb * settings.num_gpus:g} GiB | CPU Memory: {settings.cpu_mem_gb:g} GiB"
              f" | Storage: {file_store.run_dir} ({file_store.fs_type}, {file_store.io_mode} I/O)\n")
    out.write(f"Users: {settings.num_users} | Duration: {settings.duration:g} s | Seed: {settings.effective_seed}"
              f" | Generation: {settings.generation_mode} ({ms:.1f} ms/token) | I/O workers: {workers}\n")
    feats = [f"multi-turn {'on' if settings.multi_turn else 'off'}", f"prefix caching {'on' if settings.prefix_caching else 'off'}"]
    if settings.max_concurrent_allocs:
        feats.append(f"max concurrent requests {settings.max_concurrent_allocs}")
    if settings.max_requests:
        feats.append(f"stop after {settings.max_requests} requests")
    out.write("Features: " + ", ".join(feats) + "\n")
    ctx = [u.profile.context_length for u in users]
    if ctx:
        bpt = m.bytes_per_token / settings.tensor_parallel
        out.write(f"User context lengths: min {min(ctx)}, max {max(ctx)}, mean {np.mean(ctx):.0f} tokens "
                  f"(max entry {max(ctx) * bpt / 2**20:.1f} MiB)\n")
    out.write(line + "\n")
    out.flush()


def assemble(settings, metrics, outcome, usage, entry_sizes, file_store, memory_store, workers, blockdev,
             before, after, notes, started, rusage0) -> dict[str, Any]:
    summary = build_summary(metrics, usage, settings.config.qos_profiles, settings.performance_profile) \
        if metrics.requests.completed > 0 else None
    results: dict[str, Any] = request_lists(metrics)
    results["seed"] = settings.seed
    if summary is not None:
        results["summary"] = summary
    results.update(harness_keys(summary))
    window = metrics.window_seconds
    st_read, st_write = metrics.tier_op("storage", "read"), metrics.tier_op("storage", "write")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru.ru_utime - rusage0.ru_utime) + (ru.ru_stime - rusage0.ru_stime)
    moved = sum(s.bytes for s in metrics.io.values())
    late = metrics.late
    block = {"name": None}
    if blockdev is not None and before is not None and after is not None:
        block = {
            "name": blockdev.name,
            "bytes_read": after[0] - before[0],
            "bytes_written": after[1] - before[1],
            "tool_bytes_read": st_read.device_bytes + late.get("storage_read_device_bytes", 0)
            + late.get("storage_read_aborted_device_bytes", 0),
            "tool_bytes_written": st_write.device_bytes + late.get("storage_write_device_bytes", 0)
            + late.get("storage_write_aborted_device_bytes", 0),
            "note": "deltas of /proc/diskstats over the whole run phase (includes other processes' I/O and "
                    "filesystem metadata); tool bytes include work finished after the window",
        }
    sizes = np.asarray(entry_sizes, dtype=np.float64) / 2**20
    results["measurement"] = {
        "tool": f"kv-cache {__version__}",
        "timed": TIMED,
        "io_mode": file_store.io_mode,
        "direct_io": file_store.io_mode == "direct",
        "chunk_bytes": settings.storage.chunk_bytes,
        "fsync": settings.storage.fsync,
        "io_workers": workers,
        "run_dir": str(file_store.run_dir),
        "filesystem": file_store.fs_type,
        "storage_capacity_bytes": None if math.isinf(usage["nvme"]["limit_bytes"]) else usage["nvme"]["limit_bytes"],
        "cpu_tier_bytes": int(settings.cpu_mem_gb * GIB) if memory_store is not None else 0,
        "gpu_tier": "absent",
        "window_seconds": window,
        "stop_reason": outcome.stop_reason,
        "requests_issued": outcome.requests_issued,
        "requests_abandoned_at_stop": outcome.requests_abandoned,
        "requests_failed": outcome.requests_failed,
        "after_window": {
            "requests": int(late.get("requests", 0)),
            "aborted_ops": int(sum(v for k, v in late.items() if k.endswith("_aborted_ops"))),
            **{k: int(v) for k, v in late.items()},
        },
        "achieved_queue_depth": {
            "read": st_read.busy_ns / 1e9 / window if window > 0 else 0.0,
            "write": st_write.busy_ns / 1e9 / window if window > 0 else 0.0,
        },
        "process_cpu_seconds": cpu_s,
        "cpu_seconds_per_gib": cpu_s / (moved / GIB) if moved else 0.0,
        "peak_rss_mib": ru.ru_maxrss / 1024,
        "block_device": block,
        "entry_size_mib": {
            "count": int(sizes.size),
            **({"min": float(sizes.min()), "mean": float(sizes.mean()), "p95": float(np.percentile(sizes, 95)),
                "max": float(sizes.max())} if sizes.size else {}),
        },
        "errors": int(sum(metrics.errors.values())),
        "errors_by_kind": dict(metrics.errors),
        "first_error": metrics.first_error,
        "notes": notes,
    }
    results["run_parameters"] = run_parameters(settings, started)
    if outcome.plans:
        results["_plans"] = outcome.plans  # only when asked for (tests of reproducibility)
    return results


def run_parameters(settings: RunSettings, started: datetime) -> dict[str, Any]:
    return {
        "timestamp": started.isoformat(timespec="seconds"),
        "command": " ".join(settings.argv),
        "config_path": settings.config_path,
        "model": settings.model_name,
        "bytes_per_token": settings.model.bytes_per_token,
        "num_users": settings.num_users,
        "duration": settings.duration,
        "gpu_mem_gb": settings.gpu_mem_gb,
        "num_gpus": settings.num_gpus,
        "tensor_parallel": settings.tensor_parallel,
        "cpu_mem_gb": settings.cpu_mem_gb,
        "cache_dir": settings.cache_dir,
        "generation_mode": settings.generation_mode,
        "generation_ms_per_token": getattr(settings.config.generation_timing, settings.generation_mode) * 1000,
        "performance_profile": settings.performance_profile,
        "multi_turn": settings.multi_turn,
        "prefix_caching": settings.prefix_caching,
        "seed": settings.seed,
        "max_concurrent_allocs": settings.max_concurrent_allocs,
        "max_requests": settings.max_requests,
        "storage_capacity_gb": settings.storage_capacity_gb,
        "pid": os.getpid(),
    }
