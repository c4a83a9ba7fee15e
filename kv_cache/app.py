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
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kv_cache.cache import EvictionPolicy, MultiTierCache
from kv_cache.config.run import RunSettings
from kv_cache.driver.autoscale import Autoscaler
from kv_cache.driver.scheduler import Driver, DriverOutcome
from kv_cache.driver.setup import driver_options, io_worker_count, run_phases
from kv_cache.errors import ExitCode
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.report import xlsx
from kv_cache.report.banner import print_banner
from kv_cache.report.blocklatency import block_latency
from kv_cache.report.console import print_report
from kv_cache.report.document import RunRecord, build_results, interrupted_results
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.parameters import run_mode
from kv_cache.report.progress import make_progress
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.blocktrace import BlockTracer, device_gib
from kv_cache.tiers import TierSet, gpu_tier_note, open_tiers
from kv_cache.workload.factory import UserFactory, build_trace_workload, open_trace_sources
from kv_cache.workload.rag import RagCorpus
from kv_cache.workload.traces import TraceSource

__all__ = ["UserFactory", "build_trace_workload", "execute", "run_benchmark"]

log = logging.getLogger("kv_cache")

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
        results = interrupted_results(run.phases)
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
    contexts = [u.profile.context_length for u in users] if trace is None else []
    print_banner(settings, contexts, workers, stores.file_store, out)
    blockdev = BlockDeviceCounter.for_path(str(stores.file_store.run_dir)) if stores.file_store is not None else None
    before = blockdev.snapshot() if blockdev else None
    run.phases = run_phases(settings, cache, tiers, factory, workers, run.stop, out)
    tracer, why = _start_tracing(settings, blockdev, out)
    out.write(f"Starting benchmark... Mode: {run_mode(settings)}\n{'-' * 80}\n")
    out.flush()
    run.metrics.reset()  # nothing done before the window counts
    driver = Driver(users, cache, run.metrics, driver_options(settings, workers, record_plans), run.stop,
                    shape=autoscaler, make_user=factory,
                    arrivals=trace.arrivals if trace is not None else None,
                    trace_speedup=trace.speedup if trace is not None else 1.0,
                    replay_cycles=settings.replay_cycles, observers=_progress(settings))
    try:
        outcome = run.outcome = driver.run()
    finally:
        traced = tracer.stop() if tracer is not None else None
    after = blockdev.snapshot() if blockdev else None
    results = build_results(RunRecord(
        settings, run.metrics, outcome, cache.usage(), cache.entry_sizes(), workers, run.started, run.rusage0,
        stores.notes, file_store=stores.file_store, memory_store=stores.memory_store, blockdev=blockdev,
        disk_before=before, disk_after=after, phases=run.phases, autoscaler=autoscaler, rag=rag,
        tracer=stores.tracer, trace=trace))
    if settings.latency_tracing:
        results["block_latency"] = block_latency(traced, why, os.getpid())
    return results


def _start_tracing(settings: RunSettings, blockdev: BlockDeviceCounter | None, out) -> tuple[BlockTracer | None,
                                                                                             str | None]:
    """bpftrace around the window when asked for; without it (or root) the run goes on and says why."""
    if not settings.latency_tracing:
        return None, None
    tracer, why = BlockTracer.start(os.getpid(), device_gib(blockdev.name if blockdev else None))
    if tracer is None:
        log.warning("latency tracing unavailable: %s", why)
    else:
        out.write("Latency tracing: bpftrace attached (block layer and syscalls of this process)\n")
    return tracer, why


def _progress(settings: RunSettings) -> list:
    progress = make_progress(settings.log_level, float(settings.duration))
    return [progress] if progress is not None else []


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
