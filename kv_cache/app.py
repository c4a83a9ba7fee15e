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

from kv_cache.cache import CapacityError, MultiTierCache
from kv_cache.config.run import RunSettings
from kv_cache.driver.autoscale import Autoscaler
from kv_cache.driver.group import MpiUnavailable, RankGroup, mpi_group, shared_filesystem_count
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
from kv_cache.report.merge import merge_documents, merged_table
from kv_cache.report.outputs import write_results
from kv_cache.report.parameters import run_mode
from kv_cache.report.progress import make_progress
from kv_cache.storage.blockdev import BlockDeviceCounter
from kv_cache.storage.blocktrace import BlockTracer, device_gib
from kv_cache.tiers import TierSet, open_tiers
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
    run = _Run(group=group if group is not None else open_group(settings))
    interrupted = False
    storage_error = None
    try:
        results = _measure(settings, run, sources, out, record_plans)
        interrupted = run.outcome.stop_reason == "interrupted"
    except KeyboardInterrupt:
        interrupted = True
        run.stop.set()
        run.metrics.close_window()
        results = interrupted_results(run.phases, settings, run.metrics, run.started)
    except (OSError, CapacityError) as exc:  # a storage error before the window (preconditioning, ...)
        run.stop.set()
        run.metrics.close_window()
        results = interrupted_results(run.phases, settings, run.metrics, run.started)
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
    open_tiers(settings.tiers, settings.storage, settings.io_trace_log, run.stores, workers,
               largest_entry(settings), buffers, sharers=sharers)
    stores, tiers = run.stores, run.stores.tiers
    cache = MultiTierCache(tiers, cfg.eviction, run.metrics,
                           settings.model.bytes_per_token, run.stop, tracer=stores.tracer,
                           retries=settings.storage.io_retries, verify=settings.storage.verify)
    rag = RagCorpus(cfg.rag) if settings.enable_rag else None
    factory = UserFactory(settings, rag)
    trace = build_trace_workload(settings, sources) if sources else None
    users = factory.build(0, settings.num_users) if trace is None else (trace.sessions or [])
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
        tracer=stores.tracer, trace=trace, gpu_store=stores.gpu_store, barrier_aligned=run.group is not None))
    if settings.latency_tracing:
        results["block_latency"] = block_latency(traced, why, os.getpid())
    return results


def largest_entry(settings: RunSettings) -> int:
    """Bytes of the largest entry the synthetic users may write (the longest context of any template),
    at least one I/O chunk: the headroom the auto storage capacity keeps."""
    longest = max((t.context_range[1] for t in settings.config.user_templates.values()), default=0)
    per_token = settings.model.bytes_per_token // max(1, settings.tensor_parallel)
    return max(settings.storage.chunk_bytes, longest * per_token)


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
    """The JSON (always, even when interrupted), the console report, the optional spreadsheet. An older file
    at --output is kept under a suffix (said in the notes); if the JSON cannot be written where asked, the report is still
    printed and the results go to a fallback path that the message names."""
    written = write_results(settings.output, results)
    print_report(results, out)
    if written.error:
        log.error("could not write the results to %s; they are in %s", written.error, written.path)
    out.write(f"\nResults written to {written.path}\n")
    if settings.xlsx_output and "summary" in results:
        try:
            out.write(f"Spreadsheet written to {xlsx.export(results, settings.xlsx_output)}\n")
        except OSError as exc:
            log.error("could not write the spreadsheet %s (%s); the JSON %s has every figure",
                      settings.xlsx_output, exc.strerror or exc, written.path)
    out.flush()


def open_group(settings: RunSettings) -> RankGroup | None:
    """The MPI ranks of this run when the launcher started several; without mpi4py each runs alone."""
    try:
        return mpi_group(settings.mpi_world_size)
    except MpiUnavailable as exc:
        log.warning("%s: each rank measures its own window and no merged result is written "
                    "(pip install 'kv-cache[mpi]'; or `kv-cache merge` the rank files afterwards)", exc)
        return None


def write_merged(settings: RunSettings, group: RankGroup, results: dict[str, Any], out) -> None:
    """Every rank's document goes to rank 0, which writes the merged one beside the rank files."""
    docs = group.gather({**results, "_source": settings.output})
    if docs is None:
        return
    path = settings.merged_output or os.path.join(os.path.dirname(settings.output) or ".", "kvcache_merged.json")
    merged = merge_documents(docs)
    write_json_atomic(path, merged)
    out.write(merged_table(merged))
    out.write(f"Merged results of {group.size} ranks written to {path}\n")
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
