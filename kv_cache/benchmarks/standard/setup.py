"""The driver's part of a run's settings: I/O concurrency, the scheduler's options, the phases before the window.

Preconditioning, decode-only pre-population and RAG ingestion run in this order, all on the driver's worker
pool, before the measured window opens (nothing they do is counted).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any, TextIO

from kv_cache.benchmarks.standard.phases import (
    fill,
    ingest_rag,
    over_capacity_warning,
    precondition_items,
    prepopulation_items,
)
from kv_cache.benchmarks.standard.scheduler import DriverOptions
from kv_cache.core import io_workers
from kv_cache.errors import StorageError
from kv_cache.host.blockdev import BlockDeviceCounter
from kv_cache.host.blocktrace import BlockTracer, device_gib
from kv_cache.host.memlimit import process_memory_limit
from kv_cache.metrics.recorder import GIB
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.run import RunSettings
from kv_cache.storage import backends
from kv_cache.workload.rag import build_documents

log = logging.getLogger("kv_cache")

def io_worker_count(settings: RunSettings) -> int:
    """The most I/O workers this run may use (the RAM budget keeps room for their buffers): --io-workers
    bounded by memory (refused under --strict-memory), else the probe's largest count; see
    core/io_workers.py, whose `choose` then gives the count itself once the tiers are open."""
    mem = process_memory_limit(settings.tiers.host_ranks)
    most = io_workers.provisional(settings.storage.io_workers, settings.workload.num_users,
                                  io_chunk_bytes(settings), mem, settings.tiers.strict_memory,
                                  ring=worker_ring_bytes(settings))
    limit = settings.driver.max_concurrent_allocs
    return max(1, min(most, limit) if limit > 0 else most)


def worker_ring_bytes(settings: RunSettings) -> int:
    """What each I/O worker's slot ring of the remote storage tier may hold beside its buffers (the same
    figure as the opened store's `ring_bytes`: storage/remote.py ring_bytes); 0 on the file tiers and in
    trace mode."""
    chunk = io_chunk_bytes(settings)
    backend = backends.find(settings.tiers.remote.storage_backend)
    return backend.ring(settings.tiers.remote, chunk) if chunk and backend is not None else 0


def choose_io_workers(settings: RunSettings, store: Any, notes: list[str], stop: threading.Event,
                      ranks: int = 1) -> io_workers.WorkerChoice:
    """The run's I/O worker count and how it was chosen (a probe of `store`, the storage tier, when
    --io-workers is 0), in the preparation phase before the window."""
    mem = process_memory_limit(settings.tiers.host_ranks)
    return io_workers.choose(settings.storage.io_workers, settings.workload.num_users,
                             settings.driver.max_concurrent_allocs, io_chunk_bytes(settings), mem,
                             settings.tiers.strict_memory, notes, store=store, seed=settings.effective_seed,
                             stop=stop, probe_seconds=io_workers.probe_seconds(settings.driver.duration,
                                                                    settings.driver.max_requests),
                             demand=closed_loop_demand(settings), ranks=ranks,
                             budget_s=io_workers.probe_budget_s(settings.driver.duration),
                             ring=worker_ring_bytes(settings) if store is not None else 0,
                             entry_bytes=probe_entry_bytes(settings), op_chunks=probe_op_chunks(settings))


def probe_op_chunks(settings: RunSettings) -> int:
    """The most chunks one probe operation takes: the backend's (Backend.probe_op_chunks: Redis's pipeline,
    the chunk keys a run worker sends a round trip), else io_workers.REMOTE_OP_CHUNKS."""
    backend = backends.find(settings.tiers.remote.storage_backend)
    rule = backend.probe_op_chunks if backend is not None else None
    return max(1, int(rule(settings.tiers.remote))) if rule is not None else io_workers.REMOTE_OP_CHUNKS


def probe_entry_bytes(settings: RunSettings) -> tuple[int, ...]:
    """The run's entry sizes the probe's operations take on S3 (each entry one object, whose cost per
    byte the server sets by its size: on moto a 16 MiB object made 1 worker the best where the run's
    larger ones rose 1.3-1.5x to 4-8): an entry at the user templates' shortest, middle and longest
    context (io_workers.op_sizes caps them, at probe_op_chunks). On Redis and Valkey too (since 4 Dec),
    capped at one pipelined round trip: a probe of one chunk key per round trip took 8-20 workers where the
    run's were flat from 1 (a 15 s-window sweep, 0.68-0.85 GiB/s at 1-32). () elsewhere: on the file
    tiers an operation is one chunk-sized syscall, as the run's."""
    backend = backends.find(settings.tiers.remote.storage_backend)
    if not io_chunk_bytes(settings) or backend is None or not backend.probe_entries:
        return ()
    ranges = [t.context_range for t in settings.config.user_templates.values()]
    if not ranges:
        return ()
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    tp, bpt = max(1, settings.tiers.tensor_parallel), settings.model.bytes_per_token
    return tuple(max(1, tokens * bpt // tp) for tokens in (lo, (lo + hi) // 2, hi))


def closed_loop_demand(settings: RunSettings) -> int:
    """The most requests a closed-loop run has in flight (one per user), or 0 where it is not bounded so:
    an open loop (--request-rate), autoscaling (users come and go) or a trace replay."""
    if settings.driver.request_rate or settings.driver.enable_autoscaling or getattr(settings.workload, "trace_paths", None):
        return 0
    return settings.workload.num_users


def io_chunk_bytes(settings: RunSettings) -> int:
    """The workers' buffer size; 0 in trace mode (--io-trace-log), which moves no data: no buffers."""
    return 0 if settings.outputs.io_trace_log else settings.storage.chunk_bytes


def driver_options(settings: RunSettings, workers: int, record_plans: bool) -> DriverOptions:
    cfg = settings.config
    return DriverOptions(
        duration_s=float(settings.driver.duration),
        max_requests=settings.driver.max_requests,
        workers=workers,
        chunk_bytes=io_chunk_bytes(settings),
        seed=settings.effective_seed,
        bytes_per_token=settings.model.bytes_per_token,
        tensor_parallel=settings.tiers.tensor_parallel,
        decode_batch_size=cfg.decode.batch_size,
        seconds_per_token=getattr(cfg.generation_timing, settings.driver.generation_mode),
        record_plans=record_plans,
        request_rate=settings.driver.request_rate,
        admission_limit=cfg.driver.admission_queue_limit,
        prefill_only=settings.driver.prefill_only,
        decode_only=settings.driver.decode_only,
        timeline_interval_s=cfg.driver.timeline_interval_seconds,
        max_storage_errors=settings.storage.max_storage_errors,
    )


def run_phases(settings: RunSettings, cache: MultiTierCache, tiers: list[Tier], factory: Any, workers: int,
               stop: threading.Event, out: TextIO, phases: dict[str, Any] | None = None) -> dict[str, Any]:
    """Preconditioning, decode-only pre-population and RAG ingestion; `factory` gives the entry counts and corpus.
    Returns `phases` (a new dict if None), filled as each phase ends.

    A storage failure in any of them stops the run before its window: StorageError, with the OSError as
    its cause; the phases that ended before it are in `phases`."""
    phases = {} if phases is None else phases
    try:
        _phases(settings, cache, tiers, factory, stop, out, phases)
    except OSError as exc:
        done = f" (after {', '.join(phases)})" if phases else ""
        raise StorageError(f"run stopped by a storage error before the measured window{done}: {exc}") from exc
    return phases


def _phases(settings: RunSettings, cache: MultiTierCache, tiers: list[Tier], factory: Any, stop: threading.Event,
            out: TextIO, phases: dict[str, Any]) -> None:
    cfg = settings.config
    tp = settings.tiers.tensor_parallel
    bpt = settings.model.bytes_per_token

    def entry_bytes(tokens: int) -> int:
        return max(1, tokens * bpt // tp)

    chunk, seed = io_chunk_bytes(settings), settings.effective_seed
    if settings.driver.precondition:
        if settings.driver.precondition_size_gb > 0:
            target = int(settings.driver.precondition_size_gb * GIB)
        elif not math.isinf(tiers[-1].limit):
            target = int(2 * tiers[-1].limit)
        else:
            target = 0
        if target <= 0:
            out.write("WARNING: preconditioning skipped: no --precondition-size-gb and no finite storage capacity\n")
            phases["preconditioning"] = {"skipped": "no size and no finite storage capacity"}
        else:
            threads = settings.driver.precondition_threads or os.cpu_count() or 4
            out.write(f"Preconditioning: writing {target / GIB:.2f} GiB sequentially with {threads} threads...\n")
            warning = over_capacity_warning("preconditioning", target, tiers)
            if warning:  # by design without --precondition-size-gb (twice the storage tier: it then evicts)
                out.write(warning + "\n")
            phases["preconditioning"] = fill(cache, precondition_items(), entry_bytes, threads, chunk, seed, stop,
                                             "preconditioning", out, target_bytes=target)
            if warning:
                phases["preconditioning"]["over_capacity"] = warning.removeprefix("WARNING: ")
    if settings.driver.decode_only:
        count = factory.decode_only_entries
        total = count * entry_bytes(2048)
        out.write(f"Decode-only: pre-populating {count} entries of 2048 tokens, {total / GIB:.2f} GiB (not counted)...\n")
        warning = over_capacity_warning("pre-population", total, tiers)
        if warning:
            out.write(warning + "\n")
            log.warning(warning.removeprefix("WARNING: "))
        phases["prepopulation"] = fill(cache, prepopulation_items(count), entry_bytes, os.cpu_count() or 4, chunk,
                                       seed, stop, "prepopulation", out, total_bytes=total)
        if warning:
            phases["prepopulation"]["over_capacity"] = warning.removeprefix("WARNING: ")
    if factory.rag is not None:
        docs = build_documents(settings.workload.rag_num_docs, cfg.rag, settings.model, seed)
        phases["rag_ingestion"] = ingest_rag(cache, factory.rag, docs, entry_bytes, chunk, seed, stop, out)


def start_tracing(settings: RunSettings, blockdev: BlockDeviceCounter | None, out) -> tuple[BlockTracer | None,
                                                                                             str | None]:
    """bpftrace around the window when asked for; without it (or root) the run goes on and says why."""
    if not settings.outputs.latency_tracing:
        return None, None
    tracer, why = BlockTracer.start(os.getpid(), device_gib(blockdev.name if blockdev else None))
    if tracer is None:
        log.warning("latency tracing unavailable: %s", why)
    else:
        out.write("Latency tracing: bpftrace attached (block layer and syscalls of this process)\n")
    return tracer, why
