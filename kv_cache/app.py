"""One benchmark run, end to end: settings -> workload -> tiers and cache -> driver -> results -> outputs.

The composition root: builds every part from one RunSettings, runs them, and owns the run's lifecycle:
whatever happens (Ctrl-C, SIGTERM, disk full), it writes what was measured and removes the files it
created, and only those. Errors it cannot run with are raised for the CLI to report.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kv_cache.cache import CapacityError
from kv_cache.config.run import RunSettings
from kv_cache.driver import shapes
from kv_cache.driver.group import RankGroup, open_group, shared_filesystem_count, shared_run_id
from kv_cache.driver.scheduler import Driver, DriverOutcome
from kv_cache.driver.setup import driver_options, io_worker_count, run_phases, start_tracing
from kv_cache.errors import ExitCode
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.report.banner import print_banner
from kv_cache.report.blocklatency import block_latency
from kv_cache.report.document import RunRecord, build_results, interrupted_results
from kv_cache.report.parameters import run_mode
from kv_cache.report.progress import make_progress
from kv_cache.report.run_outputs import write_merged, write_outputs
from kv_cache.serving.build import open_cache
from kv_cache.serving.tiers import TierSet, largest_entry
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.workload.factory import UserFactory, build_trace_workload, open_trace_sources
from kv_cache.workload.rag import RagCorpus
from kv_cache.workload.traces import TraceSource

__all__ = ["UserFactory", "build_trace_workload", "execute", "run_benchmark"]

log = logging.getLogger("kv_cache")

class _InterruptOnce:
    """SIGINT / SIGTERM handler: the first signal stops the run (KeyboardInterrupt); later ones only say
    that clean-up is under way, so a second Ctrl-C never skips writing the results or removing files."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, signum, frame):
        self.seen += 1
        if self.seen == 1:
            raise KeyboardInterrupt
        sys.stderr.write("kv-cache: stopping; writing the results and removing the run's files first\n")


def run_benchmark(settings: RunSettings, out=None, group: RankGroup | None = None) -> int:
    """Run, write the JSON (and XLSX), print the report. Returns the process exit code.

    `group`: the ranks of this run (None: the MPI ranks when mpirun started several, else this one alone)."""
    out = out or sys.stdout
    previous = {}
    handler = _InterruptOnce()
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return int(execute(settings, out, group=group)[1])
    finally:
        if not handler.seen:  # once stopping, a late signal must not kill the exit either: keep ours
            for sig, old in previous.items():
                signal.signal(sig, old)


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
    group: RankGroup | None = None  # the other ranks: shared barriers, one merged document
    run_id: str | None = None  # one id for all the ranks of this run (shared_run_id)


def execute(settings: RunSettings, out, record_plans: bool = False,
            group: RankGroup | None = None) -> tuple[dict[str, Any], int]:
    """Build, run, write and print; returns (results, exit code).

    Trace files are opened first, once: a bad one raises TraceError before any I/O is done. With several
    ranks, rank 0 also writes the merged document of all ranks (settings.merged_output).
    """
    sources = open_trace_sources(settings) if settings.trace_paths else None
    if sources:  # "auto" becomes the detected format, as shown in the banner and the results
        settings = dataclasses.replace(
            settings, workload=dataclasses.replace(settings.workload, trace_format=sources[0].format))
    run = _Run(group=group if group is not None else open_group(settings.mpi_world_size))
    interrupted = False
    storage_error = None
    try:
        results = _measure(settings, run, sources, out, record_plans)
        interrupted = run.outcome.stop_reason == "interrupted"
    except KeyboardInterrupt:
        interrupted = True
        run.stop.set()
        run.metrics.close_window()
        results = interrupted_results(run.phases, settings, run.metrics, run.started, run.run_id)
    except (OSError, CapacityError) as exc:  # a storage error before the window (preconditioning, ...)
        run.stop.set()
        run.metrics.close_window()
        results = interrupted_results(run.phases, settings, run.metrics, run.started, run.run_id)
        results["stop_reason"] = f"storage error before the measured phase: {exc}"
        storage_error = str(exc)
    finally:
        run.stop.set()
        run.stores.close()
    write_outputs(settings, results, out)
    if storage_error is not None:
        log.error("run stopped by a storage error: %s", storage_error)
        return results, ExitCode.STORAGE_ERROR
    if run.group is not None and not interrupted:
        write_merged(settings, run.group, results, out)
    return results, exit_code(settings, results, run.outcome, interrupted)


def _measure(settings: RunSettings, run: _Run, sources: list[TraceSource] | None, out,
             record_plans: bool) -> dict[str, Any]:
    """Tiers and cache, workload, phases, driver: the measured run, assembled into results."""
    cfg = settings.config
    workers = io_worker_count(settings)
    buffers = 2 * settings.storage.chunk_bytes * workers  # each worker's read + write buffer
    sharers = shared_filesystem_count(run.group, settings.tiers.cache_dir or tempfile.gettempdir())
    run.run_id = shared_run_id(run.group)
    cache = open_cache(settings.tiers, settings.storage, cfg.eviction, run.metrics, settings.model.bytes_per_token,
                       run.stop, run.stores, io_trace_log=settings.io_trace_log, workers=workers,
                       largest_entry=largest_entry(settings), other_bytes=buffers, sharers=sharers)
    stores, tiers = run.stores, run.stores.tiers
    rag = RagCorpus(cfg.rag) if settings.enable_rag else None
    factory = UserFactory(settings, rag)
    trace = build_trace_workload(settings, sources) if sources else None
    users = factory.build(0, settings.num_users) if trace is None else (trace.sessions or [])
    autoscaler = (shapes.build(settings.autoscaler_mode, shapes.ShapeRequest(
                      settings.num_users, target_saturation=settings.target_saturation, scaler_cfg=cfg.autoscaler,
                      saturation_cfg=cfg.saturation_detection))
                  if settings.enable_autoscaling else None)
    contexts = [u.profile.context_length for u in users] if trace is None else []
    print_banner(settings, contexts, workers, stores.file_store, out, sizes=stores.sizes)
    blockdev = BlockDeviceCounter.for_path(str(stores.file_store.run_dir)) if stores.file_store is not None else None
    before = blockdev.snapshot() if blockdev else None
    run.phases = run_phases(settings, cache, tiers, factory, workers, run.stop, out)
    tracer, why = start_tracing(settings, blockdev, out)
    out.write(f"Starting benchmark... Mode: {run_mode(settings)}\n{'-' * 80}\n")
    out.flush()
    run.metrics.reset()  # nothing done before the window counts
    driver = Driver(users, cache, run.metrics, driver_options(settings, workers, record_plans), run.stop,
                    shape=autoscaler, make_user=factory,
                    arrivals=trace.arrivals if trace is not None else None,
                    trace_speedup=trace.speedup if trace is not None else 1.0,
                    replay_cycles=settings.replay_cycles, group=run.group, observers=_progress(settings))
    try:
        outcome = run.outcome = driver.run()
    finally:
        traced = tracer.stop() if tracer is not None else None
    after = blockdev.snapshot() if blockdev else None
    results = build_results(RunRecord(
        settings, run.metrics, outcome, cache.usage(), cache.entry_sizes(), workers, run.started, run.rusage0,
        stores.notes, file_store=stores.file_store, memory_store=stores.memory_store, blockdev=blockdev,
        disk_before=before, disk_after=after, phases=run.phases, autoscaler=autoscaler, rag=rag,
        tracer=stores.tracer, trace=trace, gpu_store=stores.gpu_store, barrier_aligned=run.group is not None,
        run_id=run.run_id, tier_sizes=stores.sizes))
    if settings.latency_tracing:
        results["block_latency"] = block_latency(traced, why, os.getpid())
    return results


def _progress(settings: RunSettings) -> list:
    progress = make_progress(settings.log_level, float(settings.duration))
    return [progress] if progress is not None else []


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
