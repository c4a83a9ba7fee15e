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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from kv_cache import __version__
from kv_cache.cache import EvictionPolicy, MultiTierCache, Tier
from kv_cache.config.run import RunSettings
from kv_cache.driver.autoscale import Autoscaler
from kv_cache.driver.phases import fill, ingest_rag, precondition_items, prepopulation_items
from kv_cache.driver.scheduler import Driver, DriverOptions, DriverOutcome
from kv_cache.errors import UsageError
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.report import xlsx
from kv_cache.report.console import print_report
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.results import build_summary, harness_keys, request_lists
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tracelog import IOTraceWriter, NullStore
from kv_cache.workload.arrivals import PoissonArrivals
from kv_cache.workload.conversation import ConversationManager
from kv_cache.workload.prefix import build_system_prefixes
from kv_cache.workload.rag import RagCorpus, build_documents
from kv_cache.workload.replay import (
    SESSION_FORMATS,
    OpenLoopTrace,
    SessionUser,
    ThinkTime,
    TracePlanner,
    load_sessions,
    open_sources,
)
from kv_cache.workload.users import SyntheticUser, generate_profiles
from kv_cache.workload.validation import compare

log = logging.getLogger("kv_cache")

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_STORAGE_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_MAX_WORKERS = 32
PREPOPULATION_PER_USER = 10  # decode-only: entries pre-populated per user (reference)
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


def build_tiers(settings: RunSettings, file_store: FileStore | None, memory_store: MemoryStore | None) -> list[Tier]:
    tiers = []
    if memory_store is not None:
        tiers.append(Tier("cpu", memory_store, settings.cpu_mem_gb * GIB))
    if settings.storage_capacity_gb > 0:
        storage_limit = settings.storage_capacity_gb * GIB
    elif file_store is not None:
        storage_limit = file_store.free_bytes() * 0.95
    else:
        storage_limit = math.inf
    tiers.append(Tier("nvme", file_store, storage_limit))
    return tiers


def build_trace_tiers(settings: RunSettings) -> list[Tier]:
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


class UserFactory:
    """Builds user i deterministically (the autoscaler may ask for more users than the run started with)."""

    def __init__(self, settings: RunSettings, rag: RagCorpus | None) -> None:
        cfg = settings.config
        self.settings = settings
        self.seed = settings.effective_seed
        self.conversations = (ConversationManager(cfg.conversation.max_conversations,
                                                  cfg.conversation.max_turns_per_conv)
                              if settings.multi_turn else None)
        self.prefixes = (build_system_prefixes(cfg.prefix_cache.min_prefix_length,
                                               cfg.prefix_cache.max_prefix_entries)
                         if settings.prefix_caching else ())
        self.rag = rag
        self.decode_only_entries = settings.num_users * PREPOPULATION_PER_USER if settings.decode_only else 0

    def __call__(self, index: int) -> SyntheticUser:
        return self.build(index, 1)[0]

    def build(self, first: int, count: int) -> list[SyntheticUser]:
        cfg = self.settings.config
        return [
            SyntheticUser(p, self.seed, self.conversations, cfg.conversation.end_conversation_probability,
                          self.prefixes, cfg.prefix_cache.system_prompt_hit_probability,
                          decode_only_entries=self.decode_only_entries, rag=self.rag,
                          rag_probability=cfg.rag.request_probability,
                          kv_block_tokens=self.settings.kv_block_tokens)
            for p in generate_profiles(count, cfg, self.seed, first_index=first)
        ]


@dataclass
class TraceWorkload:
    """What drives a trace run: closed-loop sessions, or timestamped arrivals (open loop)."""

    sources: list
    sessions: list[SessionUser] | None = None
    arrivals: object = None
    speedup: float = 1.0

    @property
    def format(self) -> str:
        return self.sources[0].format


def build_trace_workload(settings: RunSettings) -> TraceWorkload:
    cfg = settings.config
    max_conv = settings.max_conversations if settings.trace_format == "sharegpt" else 0
    sources = open_sources(list(settings.trace_paths), settings.trace_format, 0, max_conv)
    planner = TracePlanner(settings.kv_block_tokens, settings.multi_turn, cfg.qos_distribution, cfg.qos_profiles,
                           settings.effective_seed)
    think = settings.think_time or ThinkTime()
    if settings.request_rate > 0:  # every source can be driven open-loop at a Poisson rate
        rows = OpenLoopTrace(sources, planner, settings.replay_cycles, settings.max_requests)
        return TraceWorkload(sources, arrivals=poisson_retimed(rows, settings.request_rate, settings.effective_seed))
    if sources[0].format in SESSION_FORMATS:
        sessions = load_sessions(sources, planner, think, settings.trace_speedup, settings.effective_seed,
                                 settings.max_requests)
        return TraceWorkload(sources, sessions=sessions, speedup=settings.trace_speedup)
    return TraceWorkload(sources, arrivals=OpenLoopTrace(sources, planner, settings.replay_cycles,
                                                         settings.max_requests),
                         speedup=settings.trace_speedup)


def poisson_retimed(rows, rate: float, seed: int):
    """The rows in order, re-timed as a Poisson process of `rate` per second."""
    return PoissonArrivals(rate, seed).retime(rows)


def build_users(settings: RunSettings) -> list[SyntheticUser]:
    return UserFactory(settings, None).build(0, settings.num_users)


def run_benchmark(settings: RunSettings, out=None) -> int:
    """Run, write the JSON (and XLSX), print the report. Returns the process exit code."""
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


def execute(settings: RunSettings, out, record_plans: bool = False) -> tuple[dict[str, Any], int]:
    cfg = settings.config
    notes: list[str] = []
    trace_mode = bool(settings.io_trace_log)
    gpu_note = None if trace_mode else gpu_tier_note(settings)
    if gpu_note:
        log.warning(gpu_note)
        notes.append(gpu_note)

    stop = threading.Event()
    metrics = RunMetrics()
    file_store = memory_store = tracer = None
    outcome: DriverOutcome | None = None
    autoscaler: Autoscaler | None = None
    phases: dict[str, Any] = {}
    interrupted = False
    started = datetime.now()
    rusage0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        if trace_mode:
            tracer = IOTraceWriter(settings.io_trace_log)
            tiers = build_trace_tiers(settings)
        else:
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
        policy = EvictionPolicy.from_config(cfg.eviction)
        cache = MultiTierCache(tiers, policy, metrics, settings.model.bytes_per_token, stop, tracer=tracer)
        rag = RagCorpus(cfg.rag) if settings.enable_rag else None
        factory = UserFactory(settings, rag)
        trace = build_trace_workload(settings) if settings.trace_paths else None
        if trace is None:
            users = factory.build(0, settings.num_users)
        else:
            users = trace.sessions or []
        workers = io_worker_count(settings)
        if settings.enable_autoscaling:
            autoscaler = Autoscaler(settings.autoscaler_mode, settings.target_saturation, cfg.autoscaler,
                                    cfg.saturation_detection, settings.num_users)
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
            request_rate=settings.request_rate,
            admission_limit=cfg.driver.admission_queue_limit,
            prefill_only=settings.prefill_only,
            decode_only=settings.decode_only,
            timeline_interval_s=cfg.driver.timeline_interval_seconds,
        )
        print_banner(settings, users, workers, file_store, out)
        blockdev = BlockDeviceCounter.for_path(str(file_store.run_dir)) if file_store is not None else None
        before = blockdev.snapshot() if blockdev else None
        phases = run_phases(settings, cache, tiers, factory, workers, stop, out)
        out.write(f"Starting benchmark... Mode: {run_mode(settings)}\n{'-' * 80}\n")
        out.flush()
        metrics.reset()  # nothing done before the window counts
        driver = Driver(users, cache, metrics, options, stop, shape=autoscaler, make_user=factory,
                        arrivals=trace.arrivals if trace is not None else None,
                        trace_speedup=trace.speedup if trace is not None else 1.0,
                        replay_cycles=settings.replay_cycles)
        outcome = driver.run()
        after = blockdev.snapshot() if blockdev else None
        interrupted = outcome.stop_reason == "interrupted"
        results = assemble(settings, metrics, outcome, cache.usage(), cache.entry_sizes(), file_store,
                           memory_store, workers, blockdev, before, after, notes, started, rusage0)
        finish_results(results, settings, outcome, autoscaler, phases, rag, tracer, metrics, trace)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        metrics.close_window()
        results = {"interrupted": True, "stop_reason": "interrupted before the measured phase", "phases": phases}
    finally:
        stop.set()
        try:
            if tracer is not None:
                tracer.close()
            if file_store is not None:
                file_store.close()
            if memory_store is not None:
                memory_store.close()
        except Exception as exc:  # cleanup failure must not hide the results
            log.error("cleanup failed: %s", exc)

    write_json_atomic(settings.output, results)
    print_report(results, out)
    out.write(f"\nResults written to {settings.output}\n")
    if settings.xlsx_output and "summary" in results:
        written = xlsx.export(results, settings.xlsx_output)
        out.write(f"Spreadsheet written to {written}\n")
    out.flush()
    if interrupted:
        return results, EXIT_INTERRUPTED
    if outcome is not None and outcome.fatal_error:
        log.error("run stopped by a storage error: %s", outcome.fatal_error)
        return results, EXIT_STORAGE_ERROR
    if settings.fail_exit_code and not results.get("overall_passed"):
        return results, EXIT_FAIL
    return results, EXIT_PASS  # the verdict is in the results (overall_passed), not in the exit status


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
