"""One benchmark run, end to end: settings -> tiers -> users -> driver -> results -> outputs.

Owns the run's lifecycle: whatever happens (Ctrl-C, SIGTERM, disk full), it writes what was measured
and removes the files it created, and only those.
"""

from __future__ import annotations

import logging
import math
import os
import random
import resource
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kv_cache.cache import EvictionPolicy, MultiTierCache, Tier
from kv_cache.config.run import RunSettings
from kv_cache.driver.autoscale import Autoscaler
from kv_cache.driver.phases import fill, ingest_rag, precondition_items, prepopulation_items
from kv_cache.driver.scheduler import Driver, DriverOptions, DriverOutcome
from kv_cache.errors import UsageError
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.report import xlsx
from kv_cache.report.banner import print_banner
from kv_cache.report.console import print_report
from kv_cache.report.document import RunRecord, build_results
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.parameters import run_mode
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tracelog import IOTraceWriter, NullStore
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

log = logging.getLogger("kv_cache")

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_STORAGE_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_MAX_WORKERS = 32
PREPOPULATION_PER_USER = 10  # decode-only: entries pre-populated per user (reference)


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
    rng = random.Random(f"kv-cache-arrivals:{seed}")
    t = 0.0
    for _, plan in rows:
        t += rng.expovariate(rate)
        yield t, plan


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
        driver = Driver(users, cache, metrics, options, stop, autoscaler=autoscaler, make_user=factory,
                        arrivals=trace.arrivals if trace is not None else None,
                        trace_speedup=trace.speedup if trace is not None else 1.0,
                        replay_cycles=settings.replay_cycles)
        outcome = driver.run()
        after = blockdev.snapshot() if blockdev else None
        interrupted = outcome.stop_reason == "interrupted"
        results = build_results(RunRecord(
            settings, metrics, outcome, cache.usage(), cache.entry_sizes(), workers, started, rusage0, notes,
            file_store=file_store, memory_store=memory_store, blockdev=blockdev, disk_before=before, disk_after=after,
            phases=phases, autoscaler=autoscaler, rag=rag, tracer=tracer, trace=trace))
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
