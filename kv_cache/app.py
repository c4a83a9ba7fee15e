"""One benchmark run, end to end: settings -> workload -> tiers and cache -> driver -> results -> outputs.

The composition root: builds every part from one RunSettings, runs them, and owns the run's lifecycle:
whatever happens (Ctrl-C, SIGTERM, disk full), it writes what was measured and removes the files it
created, and only those. Errors it cannot run with are raised for the CLI to report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import signal
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from kv_cache import __version__
from kv_cache.cache import EvictionPolicy, MultiTierCache, Tier
from kv_cache.config.run import RunSettings
from kv_cache.driver.autoscale import Autoscaler
from kv_cache.driver.phases import fill, ingest_rag, precondition_items, prepopulation_items
from kv_cache.driver.scheduler import Driver, DriverOptions, DriverOutcome
from kv_cache.errors import ExitCode
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.report import xlsx
from kv_cache.report.console import print_report
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.results import build_summary, harness_keys, request_lists
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.files import FileStore
from kv_cache.storage.tracelog import IOTraceWriter
from kv_cache.tiers import TierSet, gpu_tier_note, open_tiers
from kv_cache.workload.factory import TraceWorkload, UserFactory, build_trace_workload, open_trace_sources
from kv_cache.workload.rag import RagCorpus, build_documents
from kv_cache.workload.traces import TraceSource
from kv_cache.workload.validation import compare

__all__ = ["UserFactory", "build_trace_workload", "execute", "run_benchmark"]

log = logging.getLogger("kv_cache")

DEFAULT_MAX_WORKERS = 32
TIMED = ("device = open + pwritev/preadv + fdatasync + posix_fadvise + close syscalls of each entry; "
         "host = the rest of the operation (block stamping, bookkeeping); total = both "
         "(time.perf_counter_ns). RAM tier: device = the memcpy.")


def io_worker_count(settings: RunSettings) -> int:
    workers = settings.storage.io_workers or min(settings.num_users, DEFAULT_MAX_WORKERS)
    if settings.max_concurrent_allocs > 0:
        workers = min(workers, settings.max_concurrent_allocs)
    return max(1, workers)


def _raise_interrupt(signum, frame):  # SIGTERM behaves like Ctrl-C: stop, report, clean up
    raise KeyboardInterrupt


def run_benchmark(settings: RunSettings, out=None) -> int:
    """Run, write the JSON (and XLSX), print the report. Returns the process exit code."""
    out = out or sys.stdout
    previous_term = None
    if threading.current_thread() is threading.main_thread():
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return int(execute(settings, out)[1])
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


def run_mode(settings: RunSettings) -> str:
    parts = []
    if settings.prefill_only:
        parts.append("PREFILL-ONLY (writes; no decode reads)")
    elif settings.decode_only:
        parts.append("DECODE-ONLY (reads of pre-populated entries)")
    else:
        parts.append("standard (prefill+decode)")
    if settings.request_rate > 0:
        parts.append(f"open loop, Poisson arrivals at {settings.request_rate:g} req/s")
    else:
        parts.append("closed loop")
    if settings.enable_autoscaling:
        parts.append(f"autoscaling ({settings.autoscaler_mode})")
    if settings.io_trace_log:
        parts.append("TRACE MODE (no real I/O)")
    return ", ".join(parts)


@dataclass
class _Run:
    """What a run has built and measured so far (kept when it is interrupted part-way)."""

    stop: threading.Event = field(default_factory=threading.Event)
    metrics: RunMetrics = field(default_factory=RunMetrics)
    stores: TierSet = field(default_factory=lambda: TierSet([]))
    outcome: DriverOutcome | None = None
    phases: dict[str, Any] = field(default_factory=dict)
    started: datetime = field(default_factory=datetime.now)
    rusage0: Any = field(default_factory=lambda: resource.getrusage(resource.RUSAGE_SELF))


def execute(settings: RunSettings, out, record_plans: bool = False) -> tuple[dict[str, Any], int]:
    """Build, run, write and print; returns (results, exit code).

    Trace files are opened first, once: a bad one raises TraceError before any I/O is done.
    """
    sources = open_trace_sources(settings) if settings.trace_paths else None
    if sources:  # "auto" becomes the detected format, as shown in the banner and the results
        settings = dataclasses.replace(
            settings, workload=dataclasses.replace(settings.workload, trace_format=sources[0].format))
    run = _Run()
    gpu_note = None if settings.io_trace_log else gpu_tier_note(settings.tiers)
    if gpu_note:
        log.warning(gpu_note)
        run.stores.notes.append(gpu_note)
    interrupted = False
    try:
        results = _measure(settings, run, sources, out, record_plans)
        interrupted = run.outcome.stop_reason == "interrupted"
    except KeyboardInterrupt:
        interrupted = True
        run.stop.set()
        run.metrics.close_window()
        results = {"interrupted": True, "stop_reason": "interrupted before the measured phase",
                   "phases": run.phases}
    finally:
        run.stop.set()
        run.stores.close()
    write_outputs(settings, results, out)
    return results, exit_code(settings, results, run.outcome, interrupted)


def _measure(settings: RunSettings, run: _Run, sources: list[TraceSource] | None, out,
             record_plans: bool) -> dict[str, Any]:
    """Tiers and cache, workload, phases, driver: the measured run, assembled into results."""
    cfg = settings.config
    open_tiers(settings.tiers, settings.storage, settings.io_trace_log, run.stores)
    stores, tiers = run.stores, run.stores.tiers
    cache = MultiTierCache(tiers, EvictionPolicy.from_config(cfg.eviction), run.metrics,
                           settings.model.bytes_per_token, run.stop, tracer=stores.tracer)
    rag = RagCorpus(cfg.rag) if settings.enable_rag else None
    factory = UserFactory(settings, rag)
    trace = build_trace_workload(settings, sources) if sources else None
    users = factory.build(0, settings.num_users) if trace is None else (trace.sessions or [])
    workers = io_worker_count(settings)
    autoscaler = (Autoscaler(settings.autoscaler_mode, settings.target_saturation, cfg.autoscaler,
                             cfg.saturation_detection, settings.num_users)
                  if settings.enable_autoscaling else None)
    print_banner(settings, users, workers, stores.file_store, out)
    blockdev = BlockDeviceCounter.for_path(str(stores.file_store.run_dir)) if stores.file_store is not None else None
    before = blockdev.snapshot() if blockdev else None
    run.phases = run_phases(settings, cache, tiers, factory, workers, run.stop, out)
    out.write(f"Starting benchmark... Mode: {run_mode(settings)}\n{'-' * 80}\n")
    out.flush()
    run.metrics.reset()  # nothing done before the window counts
    driver = Driver(users, cache, run.metrics, driver_options(settings, workers, record_plans), run.stop,
                    autoscaler=autoscaler, make_user=factory,
                    arrivals=trace.arrivals if trace is not None else None,
                    trace_speedup=trace.speedup if trace is not None else 1.0,
                    replay_cycles=settings.replay_cycles)
    outcome = run.outcome = driver.run()
    after = blockdev.snapshot() if blockdev else None
    results = assemble(settings, run.metrics, outcome, cache.usage(), cache.entry_sizes(), stores.file_store,
                       stores.memory_store, workers, blockdev, before, after, stores.notes, run.started,
                       run.rusage0)
    finish_results(results, settings, outcome, autoscaler, run.phases, rag, stores.tracer, run.metrics, trace)
    return results


def driver_options(settings: RunSettings, workers: int, record_plans: bool) -> DriverOptions:
    cfg = settings.config
    return DriverOptions(
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
        request_rate=settings.request_rate,
        admission_limit=cfg.driver.admission_queue_limit,
        prefill_only=settings.prefill_only,
        decode_only=settings.decode_only,
        timeline_interval_s=cfg.driver.timeline_interval_seconds,
    )


def write_outputs(settings: RunSettings, results: dict[str, Any], out) -> None:
    """The JSON (always, even when interrupted), the console report, the optional spreadsheet."""
    write_json_atomic(settings.output, results)
    print_report(results, out)
    out.write(f"\nResults written to {settings.output}\n")
    if settings.xlsx_output and "summary" in results:
        written = xlsx.export(results, settings.xlsx_output)
        out.write(f"Spreadsheet written to {written}\n")
    out.flush()


def exit_code(settings: RunSettings, results: dict[str, Any], outcome: DriverOutcome | None,
              interrupted: bool) -> ExitCode:
    if interrupted:
        return ExitCode.INTERRUPTED
    if outcome is not None and outcome.fatal_error:
        log.error("run stopped by a storage error: %s", outcome.fatal_error)
        return ExitCode.STORAGE_ERROR
    if settings.fail_exit_code and not results.get("overall_passed"):
        return ExitCode.FAIL
    return ExitCode.OK  # the verdict is in the results (overall_passed), not in the exit status


def run_phases(settings: RunSettings, cache: MultiTierCache, tiers: list[Tier], factory: UserFactory, workers: int,
               stop: threading.Event, out) -> dict[str, Any]:
    """Preconditioning, decode-only pre-population and RAG ingestion, in the reference's order."""
    cfg = settings.config
    phases: dict[str, Any] = {}
    tp = settings.tensor_parallel
    bpt = settings.model.bytes_per_token

    def entry_bytes(tokens: int) -> int:
        return max(1, tokens * bpt // tp)

    chunk, seed = settings.storage.chunk_bytes, settings.effective_seed
    if settings.precondition:
        if settings.precondition_size_gb > 0:
            target = int(settings.precondition_size_gb * GIB)
        elif not math.isinf(tiers[-1].limit):
            target = int(2 * tiers[-1].limit)
        else:
            target = 0
        if target <= 0:
            out.write("WARNING: preconditioning skipped: no --precondition-size-gb and no finite storage capacity\n")
            phases["preconditioning"] = {"skipped": "no size and no finite storage capacity"}
        else:
            threads = settings.precondition_threads or os.cpu_count() or 4
            out.write(f"Preconditioning: writing {target / GIB:.2f} GiB sequentially with {threads} threads...\n")
            phases["preconditioning"] = fill(cache, precondition_items(), entry_bytes, threads, chunk, seed, stop,
                                             "preconditioning", out, target_bytes=target)
    if settings.decode_only:
        count = factory.decode_only_entries
        out.write(f"Decode-only: pre-populating {count} entries of 2048 tokens (not counted)...\n")
        phases["prepopulation"] = fill(cache, prepopulation_items(count), entry_bytes, os.cpu_count() or 4, chunk,
                                       seed, stop, "prepopulation", out)
    if factory.rag is not None:
        docs = build_documents(settings.rag_num_docs, cfg.rag, settings.model, seed)
        phases["rag_ingestion"] = ingest_rag(cache, factory.rag, docs, entry_bytes, chunk, seed, stop, out)
    return phases


def finish_results(results: dict[str, Any], settings: RunSettings, outcome: DriverOutcome,
                   autoscaler: Autoscaler | None, phases: dict[str, Any], rag: RagCorpus | None,
                   tracer: IOTraceWriter | None, metrics: RunMetrics, trace: TraceWorkload | None) -> None:
    """Mode-specific parts of the results: timeline, autoscaling, phases, RAG, validation, trace."""
    results["throughput_timeline"] = outcome.timeline
    summary = results.get("summary")
    if summary is not None:
        summary["per_turn"] = per_turn_stats(metrics)
        if settings.kv_block_tokens > 0:
            summary["block_stats"] = block_stats(metrics, settings.kv_block_tokens)
    if trace is not None:
        results["trace_replay"] = {
            "format": trace.format,
            "paths": list(settings.trace_paths),
            "replay": ("open loop, Poisson" if settings.request_rate > 0 else
                       "closed-loop sessions" if trace.sessions is not None else "open loop, recorded timestamps"),
            "trace_speedup": settings.trace_speedup,
            "think_time": settings.think_time.kind if settings.think_time else "trace",
            "sessions": len(trace.sessions) if trace.sessions is not None else None,
            "kv_block_tokens": settings.kv_block_tokens,
            "trace_block_tokens": trace.sources[0].block_tokens,
            "stats": [src.stats.to_dict() for src in trace.sources],
        }
    if summary is not None and autoscaler is not None:
        summary["autoscaling_stats"] = autoscaler.history
        summary["autoscaling_summary"] = autoscaler.summary()
    if phases:
        results["phases"] = phases
    if summary is not None and rag is not None:
        c = results["measurement"]["counters"]
        summary["rag_stats"] = {
            "documents_retrievable": len(rag.live),
            "chunk_hits": int(c.get("rag_chunk_hits", 0)),
            "chunk_misses": int(c.get("rag_chunk_misses", 0)),
        }
    if settings.validation_trace_stats is not None and summary is not None:
        cs = summary["cache_stats"]
        results["validation"] = compare(settings.validation_trace_stats, cs["cache_hit_rate"], cs["read_write_ratio"])
    if tracer is not None:
        results["measurement"]["io_trace"] = {"path": tracer.path, "rows": tracer.rows}


def print_banner(settings: RunSettings, users, workers: int, file_store: FileStore, out) -> None:
    line = "=" * 80
    m = settings.model
    ms = getattr(settings.config.generation_timing, settings.generation_mode) * 1000
    out.write(f"{line}\nIntegrated Multi-User KV Cache Benchmark - MLPerf Edition (kv-cache {__version__})\n")
    out.write(f"Model: {m.name} ({m.bytes_per_token:,} bytes/token)\n")
    where = (f"{file_store.run_dir} ({file_store.fs_type}, {file_store.io_mode} I/O)" if file_store is not None
             else f"trace only -> {settings.io_trace_log}")
    out.write(f"GPU Memory: {settings.gpu_mem_gb * settings.num_gpus:g} GiB | CPU Memory: {settings.cpu_mem_gb:g} GiB"
              f" | Storage: {where}\n")
    out.write(f"Users: {settings.num_users} | Duration: {settings.duration:g} s | Seed: {settings.effective_seed}"
              f" | Generation: {settings.generation_mode} ({ms:.1f} ms/token) | I/O workers: {workers}\n")
    feats = [f"multi-turn {'on' if settings.multi_turn else 'off'}", f"prefix caching {'on' if settings.prefix_caching else 'off'}"]
    if settings.max_concurrent_allocs:
        feats.append(f"max concurrent requests {settings.max_concurrent_allocs}")
    if settings.max_requests:
        feats.append(f"stop after {settings.max_requests} requests")
    out.write("Features: " + ", ".join(feats) + "\n")
    if settings.trace_paths:
        out.write(f"Trace: {', '.join(settings.trace_paths)} ({settings.trace_format}), speed-up "
                  f"{settings.trace_speedup:g}{' (no pacing)' if settings.trace_speedup == 0 else ''}, "
                  f"KV layout: {f'{settings.kv_block_tokens}-token blocks' if settings.kv_block_tokens else 'entry per request'}\n")
    ctx = [u.profile.context_length for u in users if hasattr(u, "profile")]
    if ctx:
        bpt = m.bytes_per_token / settings.tensor_parallel
        out.write(f"User context lengths: min {min(ctx)}, max {max(ctx)}, mean {np.mean(ctx):.0f} tokens "
                  f"(max entry {max(ctx) * bpt / 2**20:.1f} MiB)\n")
    out.write(line + "\n")
    out.flush()


def assemble(settings, metrics, outcome, usage, entry_sizes, file_store, memory_store, workers, blockdev,
             before, after, notes, started, rusage0) -> dict[str, Any]:
    error_rate = outcome.requests_failed / max(1, outcome.requests_issued)
    summary = build_summary(metrics, usage, settings.config.qos_profiles, settings.performance_profile,
                            settings.config.performance_criteria, error_rate) \
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
        "run_mode": run_mode(settings),
        "io_mode": file_store.io_mode if file_store is not None else "trace (no I/O)",
        "direct_io": file_store is not None and file_store.io_mode == "direct",
        "chunk_bytes": settings.storage.chunk_bytes,
        "fsync": settings.storage.fsync,
        "io_workers": workers,
        "run_dir": str(file_store.run_dir) if file_store is not None else None,
        "filesystem": file_store.fs_type if file_store is not None else None,
        "storage_capacity_bytes": None if math.isinf(usage["nvme"]["limit_bytes"]) else usage["nvme"]["limit_bytes"],
        "cpu_tier_bytes": int(settings.cpu_mem_gb * GIB) if memory_store is not None else 0,
        "gpu_tier": "absent",
        "window_seconds": window,
        "stop_reason": outcome.stop_reason,
        "requests_issued": outcome.requests_issued,
        "requests_abandoned_at_stop": outcome.requests_abandoned,
        "requests_failed": outcome.requests_failed,
        "requests_rejected": outcome.requests_rejected,
        "offered_request_rate": settings.request_rate or None,
        "final_active_users": outcome.final_active_users,
        "counters": {k: v for k, v in metrics.snapshot_counters().items()},
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


def per_turn_stats(metrics: RunMetrics, limit: int = 200) -> list[dict[str, Any]]:
    """Mean context and bytes moved per turn number: how a session's context growth shows in the I/O."""
    out = []
    for turn in sorted(metrics.turns)[:limit]:
        n, tokens, read_b, written_b = metrics.turns[turn]
        out.append({"turn": turn, "requests": n, "mean_context_tokens": tokens / n,
                    "mean_bytes_read": read_b / n, "mean_bytes_written": written_b / n})
    return out


def block_stats(metrics: RunMetrics, kv_block_tokens: int) -> dict[str, Any]:
    c = metrics.snapshot_counters()
    hits, stores = int(c.get("block_hits", 0)), int(c.get("block_stores", 0))
    total = hits + stores
    return {
        "kv_block_tokens": kv_block_tokens,
        "blocks": total,
        "loads": hits,
        "stores": stores,
        "block_hit_rate": hits / total if total else 0.0,
        "hit_rate_by_tier": {t: int(c.get(f"block_hits_{t}", 0)) / total if total else 0.0
                             for t in ("gpu", "cpu", "storage")},
        "bytes_saved_by_reuse": int(c.get("block_bytes_reused", 0)),
    }


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
        "request_rate": settings.request_rate,
        "autoscaling": settings.enable_autoscaling,
        "autoscaler_mode": settings.autoscaler_mode if settings.enable_autoscaling else None,
        "target_saturation": settings.target_saturation if settings.enable_autoscaling else None,
        "rag_enabled": settings.enable_rag,
        "rag_num_docs": settings.rag_num_docs if settings.enable_rag else None,
        "precondition": settings.precondition,
        "precondition_size_gb": settings.precondition_size_gb,
        "precondition_threads": settings.precondition_threads or os.cpu_count(),
        "prefill_only": settings.prefill_only,
        "decode_only": settings.decode_only,
        "io_trace_log": settings.io_trace_log,
        "validation_trace": settings.validation_trace,
        "mpi_rank": settings.mpi_rank,
        "mpi_world_size": settings.mpi_world_size,
        "pid": os.getpid(),
    }
