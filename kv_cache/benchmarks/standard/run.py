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
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kv_cache.benchmarks.standard.outputs import write_merged, write_outputs
from kv_cache.benchmarks.standard.partial import PartialDocuments, Snapshot
from kv_cache.benchmarks.standard.scheduler import Driver, DriverOutcome
from kv_cache.benchmarks.standard.setup import (
    choose_io_workers,
    driver_options,
    io_worker_count,
    run_phases,
    start_tracing,
    worker_ring_bytes,
)
from kv_cache.core import shapes
from kv_cache.core.group import RankGroup, open_group, shared_filesystem_count, shared_run_id
from kv_cache.core.observe import RankConsole
from kv_cache.errors import RunOutcome, StorageError, StorageSetupError
from kv_cache.host import malloc
from kv_cache.host.blockdev import BlockDeviceCounter
from kv_cache.host.netdev import NetCounter
from kv_cache.host.preload import snapshot_at_start
from kv_cache.host.procio import IOSnapshot, process_io
from kv_cache.host.signals import (
    ABANDON_IO,
    STOP_SIGNALS,
    catch_stop_signals,
    ignore_to_exit,
    process_exits_after_run,
)
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.banner import print_banner
from kv_cache.render.progress import make_progress
from kv_cache.results import measurement as meas
from kv_cache.results.blocklatency import block_latency
from kv_cache.results.integrity import audit_facts, facts_from_ours
from kv_cache.results.parameters import run_mode
from kv_cache.results.partial import PARTIAL_STOP
from kv_cache.results.run_document import INTERRUPTED_EARLY, RunRecord, build_results, interrupted_results
from kv_cache.results.verdict import (
    mark_incomplete,
    mark_rank_status,
    mark_storage_stop,
    verdict_keys,
    window_fraction,
)
from kv_cache.serving.build import open_cache
from kv_cache.serving.tiers import TierSet, largest_entry
from kv_cache.settings.ranks import setting_value
from kv_cache.settings.run import RunSettings
from kv_cache.storage.files import bin_syscalls, syscall_span, syscall_totals
from kv_cache.workload.factory import UserFactory, build_trace_workload, open_trace_sources
from kv_cache.workload.rag import RagCorpus
from kv_cache.workload.traces import TraceSource

__all__ = ["STOP_SIGNALS", "Interrupts", "UserFactory", "build_trace_workload", "execute", "run_benchmark"]

log = logging.getLogger("kv_cache")

# STOP_SIGNALS (host/signals.py): the signals that end a run the way Ctrl-C does (the window's results
# kept, INCOMPLETE): a terminal that hangs up (SIGHUP: an ssh session lost) must not lose what was measured
# either; a SIGHUP ignored under nohup stays ignored.

class Interrupts:
    """SIGINT / SIGTERM / SIGHUP handler of a run (STOP_SIGNALS).

    Until the measured window closes, the first signal stops the run (KeyboardInterrupt: the window ends
    there, the run is INCOMPLETE); later ones only say that clean-up is under way, so a second Ctrl-C never
    skips writing the results or removing files. Once the window has closed (`close_window`, called by the
    driver), no signal raises: the drain, tracing stop, results, writing and clean-up run to their end, so
    the window's results cannot be lost to a late Ctrl-C. The one thing a later signal does (any signal
    after the window that is not the run's first) is set `drain_cut`: the driver stops waiting for the
    requests still on a worker (an I/O call that hangs), abandons them, and the run goes on to its results
    and clean-up."""

    def __init__(self) -> None:
        self.seen = 0
        self.window_closed = False
        self.drain_cut = threading.Event()
        self.ended = False  # the run has returned: a signal to an in-process caller changes nothing of it

    def close_window(self) -> None:
        self.window_closed = True

    def __call__(self, signum, frame):
        if self.ended:  # the handler left in place after an in-process run (run_benchmark): nothing to stop
            return
        self.seen += 1
        if self.window_closed:
            if self.seen == 1:
                sys.stderr.write("kv-cache: the measured window is over; finishing the results and clean-up "
                                 "first (a second Ctrl-C abandons the requests still in flight)\n")
            elif not self.drain_cut.is_set():
                ABANDON_IO.set()  # a remote operation waiting on a frozen server gives up now
                self.drain_cut.set()
                sys.stderr.write("kv-cache: abandoning the requests still in flight; writing the results and "
                                 "removing the run's files\n")
            return
        if self.seen == 1:
            ABANDON_IO.set()  # a remote operation waiting on a frozen server gives up now (within 0.2 s)
            raise KeyboardInterrupt
        sys.stderr.write("kv-cache: stopping; writing the results and removing the run's files first\n")


def run_benchmark(settings: RunSettings, out=None, group: RankGroup | None = None) -> RunOutcome:
    """Run, write the JSON (and XLSX), print the report. Returns how the run ended (the CLI makes it the
    exit status); an error it could not run with, or a storage error before the window, is raised.

    `group`: the ranks of this run (None: the MPI ranks when mpirun started several, else this one alone)."""
    out = out or sys.stdout
    previous = {}
    handler = Interrupts()
    if threading.current_thread() is threading.main_thread():
        previous = catch_stop_signals(handler)
    try:
        return execute(settings, out, group=group, interrupts=handler)[1]
    finally:
        # the stop signal was this run's: a remote store opened after it (a library's next run, the next test
        # in the same process) must not take it for its own and abandon its first request (host/signals.py)
        handler.ended = True
        ABANDON_IO.clear()
        if previous and process_exits_after_run():
            # from the results to the exit a signal changes nothing: ignored (not our Python handler, which
            # the interpreter's shutdown would put back to SIG_DFL under a late Ctrl-C: status -2). Only in a
            # process that exits next: SIG_IGN is inherited by every program it starts afterwards (an
            # in-process caller's later children would take a SIGHUP as nohup's and run on)
            ignore_to_exit(tuple(previous))
        elif handler.seen:  # in-process, once stopping: ours stays, so a late signal cannot raise either
            pass
        else:
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
    libraries: dict[str, Any] = field(default_factory=snapshot_at_start)  # mapped libraries, at the start
    group: RankGroup | None = None  # the other ranks: shared barriers, one merged document
    run_id: str | None = None  # one id for all the ranks of this run (shared_run_id)
    interrupts: Interrupts | None = None  # told when the window closes (signals no longer stop the run)
    partial: PartialDocuments | None = None  # the periodic INCOMPLETE document at --output, in the window


def execute(settings: RunSettings, out, record_plans: bool = False, group: RankGroup | None = None,
            interrupts: Interrupts | None = None) -> tuple[dict[str, Any], RunOutcome]:
    """Build, run, write and print; returns (results, how the run ended).

    Trace files are opened first, once: a bad one raises TraceError before any I/O is done. With several
    ranks, rank 0 also writes the merged document of all ranks (settings.merged_output). A storage error
    before the window (preconditioning, ingestion) writes the results of the phases done, removes the
    run's files, then raises StorageError (under mpirun the CLI ends the other ranks with it).
    """
    sources = open_trace_sources(settings) if settings.workload.trace_paths else None
    if sources:  # "auto" becomes the detected format, as shown in the banner and the results
        settings = dataclasses.replace(
            settings, workload=dataclasses.replace(settings.workload, trace_format=sources[0].format))
    run = _Run(group=group if group is not None else open_group(settings.mpi_world_size), interrupts=interrupts)
    interrupted = False
    storage_error: StorageError | None = None
    # The results are written before the run's files are removed: removing gigabytes takes time, and a
    # launcher that ends this process meanwhile (mpirun after another rank died) must find them on disk.
    try:
        try:
            results = _measure(settings, run, sources, out, record_plans)
            interrupted = run.outcome.stop_reason == "interrupted"
        except KeyboardInterrupt:  # before the window closed (after it, Interrupts never raises)
            interrupted = True
            run.stop.set()
            run.metrics.close_window()
            failed = getattr(run.group, "failed_rank", None)  # ended by mpirun because that rank failed
            results = interrupted_results(run.phases, settings, run.metrics, run.started, run.run_id,
                                          f"stopped before the measured phase: rank {failed} failed"
                                          if failed is not None else INTERRUPTED_EARLY)
        except (OSError, StorageError) as exc:  # a storage error before the window (preconditioning, ...)
            run.stop.set()
            run.metrics.close_window()
            results = interrupted_results(run.phases, settings, run.metrics, run.started, run.run_id,
                                          f"storage error before the measured phase: {exc}")
            storage_error = exc if isinstance(exc, StorageError) else StorageError(
                f"run stopped by a storage error before the measured window: {exc}")
            mark_storage_stop(results, str(storage_error))
        finally:
            run.stop.set()
        if "remote_tier" not in results.get("measurement", {}):  # stopped before the window: a remote tier's
            remote = getattr(run.stores.file_store, "remote_stats", None)  # counters still say what it saw
            if remote is not None:  # (a server frozen in preconditioning: its operations stopped answering)
                results.setdefault("measurement", {})["remote_tier"] = remote()
        if run.outcome is not None and run.outcome.peers_lost:
            results.setdefault("measurement", {}).setdefault("notes", []).append(
                "another rank ended before the window's closing barrier (lost): this rank's window is whole, "
                "but the ranks' windows were not closed together")
        late = run.outcome.signal_after_window_s if run.outcome is not None else None
        if late is not None:
            results.setdefault("measurement", {}).setdefault("notes", []).append(
                f"a stop signal arrived at {late:.3f} s, once the {settings.driver.duration} s window was complete: "
                "the window is whole and the run complete")
        if run.outcome is not None and run.outcome.drain_cut:
            measurement = results.setdefault("measurement", {})
            measurement["requests_abandoned_at_drain_cut"] = run.outcome.requests_abandoned_at_cut
            measurement.setdefault("notes", []).append(
                f"the drain after the window was cut short by a second signal: "
                f"{run.outcome.requests_abandoned_at_cut} request(s) still in flight were abandoned (counted in "
                "requests_abandoned; their latencies censored at the stop)")
        if interrupted or storage_error is not None:
            window = run.outcome.window_s if run.outcome is not None and interrupted else 0.0
            mark_incomplete(results, window_fraction(window, float(settings.driver.duration)),
                            "interrupted" if interrupted else "storage error before the window")
        else:
            results.update(verdict_keys(results))
        mark_rank_status(results)  # whether this rank's document counts (complete / incomplete / failed)
        owned = run.partial is not None and run.partial.owns()
        if owned and run.partial.kept_as:
            results.setdefault("measurement", {}).setdefault("notes", []).append(
                f"an earlier results file at {settings.outputs.output} was kept as {run.partial.kept_as}")
        write_outputs(settings, results, out, keep=not owned)  # (replacing this run's periodic document)
    finally:
        run.stores.close()
    if storage_error is not None:
        raise storage_error
    if interrupted:
        out.write(f"Run INCOMPLETE: interrupted after {results['window_fraction'] * 100:.0f} % of the "
                  f"{settings.driver.duration} s window; the verdict is not PASS\n")
        out.flush()
    lost: list[int] = []
    if run.group is not None and (not interrupted or not run.group.gather_waits):  # (an interrupted MPI
        lost = write_merged(settings, run.group, results, out)  # rank may be alone at the gather: never wait)
    fatal = run.outcome.fatal_error if run.outcome is not None else None
    if fatal:
        log.error("run stopped by a storage error: %s", fatal)
    return results, RunOutcome(interrupted=interrupted, storage_error=fatal, passed=bool(results.get("overall_passed")),
                               missing_ranks=tuple(lost), fail_exit_code=settings.outputs.fail_exit_code)


def _with_rank_share(exc: StorageSetupError, settings: RunSettings) -> StorageSetupError:
    """A refusal about a size that ranks split (--gpu-mem-gb, --storage-capacity-gb, ...): the size it
    speaks of is this rank's share of the total given, which the message then says (the same flags run as
    one process would not be refused). Its advice ("give at most X", `exc.most`, in this rank's unit) is
    put in the flag's own unit, the total over the ranks, so that following it gives each rank X."""
    setting = getattr(exc, "setting", None)
    total = (settings.rank_totals or {}).get(setting) if setting else None
    if settings.flags_per_rank or not total:
        return exc
    share = setting_value(settings, setting)
    if share == total:
        return exc
    flag = "--" + setting.replace("_", "-")
    text = str(exc)
    most = getattr(exc, "most", None)
    ranks = max(1, settings.mpi_world_size)
    if most is not None and f"give at most {most:.3f}" in text:
        text = text.replace(f"give at most {most:.3f}",
                            f"give at most {math.floor(most * ranks * 1000) / 1000:.3f} in all ({ranks} ranks x "
                            f"{most:.3f})")
    out = StorageSetupError(f"{text} (under several ranks {flag} {total:g} is the total: this rank's share is "
                            f"{share:g})")
    return out.about(setting)


def _window_rusage(run: _Run) -> Any:
    """The process's usage when the window opened (its CPU counts from there): the driver opens it after
    the I/O workers have allocated and filled their buffers, set-up the engine's figure (pure_storage.py)
    and fio's jobs leave out too (issue 30: 8 workers' buffers were ~0.5 CPU-s of an 8 s run's figure);
    run.rusage0 (taken before the driver) where no window opened."""
    return run.metrics.window_rusage if run.metrics.window_rusage is not None else run.rusage0


def _measure(settings: RunSettings, run: _Run, sources: list[TraceSource] | None, out,
             record_plans: bool) -> dict[str, Any]:
    """Tiers and cache, workload, phases, driver: the measured run, assembled into results."""
    cfg = settings.config
    trimmer = malloc.MallocTrimmer(malloc.configure(), settings.driver.malloc_trim_interval)  # (before any thread)
    workers = io_worker_count(settings)  # the most it may be: the RAM tiers keep room for their buffers
    buffers = (2 * settings.storage.chunk_bytes + worker_ring_bytes(settings)) * workers  # buffers + slot ring each
    sharers = shared_filesystem_count(run.group, settings.tiers.cache_dir or tempfile.gettempdir())
    run.run_id = shared_run_id(run.group)
    try:
        cache = open_cache(settings.tiers, settings.storage, cfg.eviction, run.metrics, settings.model.bytes_per_token,
                           run.stop, run.stores, io_trace_log=settings.outputs.io_trace_log, workers=workers,
                           largest_entry=largest_entry(settings), other_bytes=buffers, sharers=sharers)
    except StorageSetupError as exc:
        raise _with_rank_share(exc, settings) from exc.__cause__
    stores, tiers = run.stores, run.stores.tiers
    try:  # the preparation phase's probe of the storage tier, when --io-workers is 0
        choice = choose_io_workers(settings, stores.file_store, stores.notes, run.stop,
                                   ranks=2 if run.group is not None else 1)
    except StorageSetupError as exc:
        raise _with_rank_share(exc, settings) from exc.__cause__
    workers = min(workers, choice.count)
    out.write(choice.line() + "\n")
    rag = RagCorpus(cfg.rag) if settings.workload.enable_rag else None
    factory = UserFactory(settings, rag)
    trace = build_trace_workload(settings, sources) if sources else None
    users = factory.build(0, settings.workload.num_users) if trace is None else (trace.sessions or [])
    autoscaler = (shapes.build(settings.driver.autoscaler_mode, shapes.ShapeRequest(
                      settings.workload.num_users, target_saturation=settings.driver.target_saturation, scaler_cfg=cfg.autoscaler,
                      saturation_cfg=cfg.saturation_detection))
                  if settings.driver.enable_autoscaling else None)
    contexts = [u.profile.context_length for u in users] if trace is None else []
    print_banner(settings, contexts, workers, stores.file_store, out, sizes=stores.sizes)
    if isinstance(run.group, RankConsole):  # --processes: the parent prints the banner, every rank's sizes
        run.group.announce(stores.sizes)
    blockdev = BlockDeviceCounter.for_path(str(stores.file_store.run_dir)) if stores.file_store is not None else None
    before = blockdev.snapshot() if blockdev else None
    run_io0 = process_io()
    net = NetCounter.for_host(getattr(stores.file_store, "endpoint_host", None))  # a remote tier's server
    run_phases(settings, cache, tiers, factory, workers, run.stop, out, run.phases)
    net_before = net.snapshot() if net else None  # after the phases: their bytes are not the tier's counted ones
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)  # so is their (and the set-up's) client CPU
    tracer, why = start_tracing(settings, blockdev, out)
    bin_syscalls(tracer is not None)  # each syscall's time binned as the trace bins the kernel's (P50/P95)
    tool0 = syscall_totals()  # the tool's own per-syscall times over the traced span
    out.write(f"Starting benchmark... Mode: {run_mode(settings)}\n{'-' * 80}\n")
    out.flush()
    run.metrics.reset()  # nothing done before the window counts
    run.rusage0 = resource.getrusage(resource.RUSAGE_SELF)  # nor its CPU (the set-up's, the probe's, the phases')
    proc_io = IOSnapshot(blockdev.name if blockdev else None)  # this process's (and its cgroup's) bytes, window
    partial = run.partial = _partial_documents(settings, run, cache, autoscaler, trimmer, lambda snap: RunRecord(
        settings, snap.metrics, snap.outcome, snap.usage, [], workers, run.started, _window_rusage(run), list(stores.notes),
        file_store=stores.file_store, memory_store=stores.memory_store, blockdev=blockdev, disk_before=before,
        disk_after=blockdev.snapshot() if blockdev else None, phases=dict(run.phases), autoscaler=snap.autoscaler,
        rag=rag, trace=trace, gpu_store=stores.gpu_store, barrier_aligned=run.group is not None, run_id=run.run_id,
        tier_sizes=stores.sizes, tier_backends=stores.backend_names(),
        tier_shaping={tier: shaped.stats() for tier, shaped in stores.shaped.items()}))
    observers = (_progress(settings, run.group) + ([partial] if partial is not None else [])
                 + ([trimmer] if trimmer.active else []))
    driver = Driver(users, cache, run.metrics, driver_options(settings, workers, record_plans), run.stop,
                    shape=autoscaler, make_user=factory,
                    arrivals=trace.arrivals if trace is not None else None,
                    trace_speedup=trace.speedup if trace is not None else 1.0,
                    replay_cycles=settings.workload.replay_cycles, group=run.group, observers=observers,
                    on_window_close=run.interrupts.close_window if run.interrupts is not None else None,
                    drain_cut=run.interrupts.drain_cut if run.interrupts is not None else None)
    if partial is not None:
        partial.driver = driver
    try:
        outcome = run.outcome = driver.run()
    finally:
        if partial is not None:
            partial.close()  # (waits for a document being written: none lands after the final one)
        traced = tracer.stop() if tracer is not None else None
        tool1 = syscall_totals()
        bin_syscalls(False)
    after = blockdev.snapshot() if blockdev else None
    process_bytes = proc_io.delta()
    if process_bytes is not None and run_io0 is not None and (run_io1 := process_io()) is not None:
        # over the block device's own interval too, so that device - process is the other I/O on it
        process_bytes.update(run_read_bytes=run_io1[0] - run_io0[0], run_write_bytes=run_io1[1] - run_io0[1])
    results = build_results(RunRecord(
        settings, run.metrics, outcome, cache.usage(), cache.entry_sizes(), workers, run.started, _window_rusage(run),
        stores.notes, file_store=stores.file_store, memory_store=stores.memory_store, blockdev=blockdev,
        disk_before=before, disk_after=after, phases=run.phases, autoscaler=autoscaler, rag=rag,
        tracer=stores.tracer, trace=trace, gpu_store=stores.gpu_store, barrier_aligned=run.group is not None,
        run_id=run.run_id, tier_sizes=stores.sizes, tier_backends=stores.backend_names(),
        tier_shaping={tier: shaped.stats() for tier, shaped in stores.shaped.items()}, process_io=process_bytes))
    if "measurement" in results:
        results["measurement"]["io_workers_choice"] = choice.as_dict()
        results["measurement"]["malloc"] = trimmer.record()
        if partial is not None:
            results["measurement"]["partial_documents"] = partial.record()
            _periodic_bytes_on_the_device(results["measurement"], settings.outputs.output, blockdev)
    if hasattr(stores.file_store, "remote_stats"):  # a remote tier: its counters and the interface's bytes
        results["measurement"]["timed"] = meas.TIMED_REMOTE
        results["measurement"]["device_timer"] = {"timer": "python", "description": "perf_counter_ns() around "
                                                  "the remote client's calls"}
        results["measurement"]["remote_tier"] = {
            **stores.file_store.remote_stats(),
            "network": meas.network(run.metrics, net.name if net else None, net_before,
                                    net.snapshot() if net else None, cpu_before)}
        results["integrity"] = audit_facts(facts_from_ours(results))  # its page-cache check reads remote_tier
    if settings.outputs.latency_tracing:
        results["block_latency"] = block_latency(traced, why, os.getpid(), syscall_span(tool0, tool1))
    return results


def _partial_documents(settings: RunSettings, run: _Run, cache, autoscaler, trimmer: malloc.MallocTrimmer,
                       record_of) -> PartialDocuments | None:
    """The periodic INCOMPLETE document of the window so far at --output (benchmarks/standard/partial.py),
    every --partial-results-interval seconds; None when it is 0. `record_of(snapshot)`: the RunRecord of a
    snapshot, as the final document's is made. Each document's build allocates in proportion to the
    per-request lists (up to their caps); `trimmer` gives that memory back at its own interval only, not
    after each document: a trim can hold an arena's lock for tens of ms, and a thread that allocates in it
    meanwhile waits holding the GIL, which would stall every Python thread once per document."""
    interval = float(settings.outputs.partial_results_interval or 0.0)
    if interval <= 0:
        return None
    holder: dict[str, Any] = {}

    def take(elapsed_s: float, sequence: int) -> Snapshot:  # (on the scheduler thread, at a tick)
        driver = holder["partial"].driver
        history = getattr(autoscaler, "history", None)
        return Snapshot(run.metrics.snapshot(), driver.outcome_so_far(PARTIAL_STOP), cache.usage(), elapsed_s,
                        sequence, autoscaler=(_History(list(history)) if history is not None else None))

    partial = holder["partial"] = PartialDocuments(settings.outputs.output, interval, float(settings.driver.duration),
                                                   take, lambda snap: build_results(record_of(snap)))
    return partial


def _periodic_bytes_on_the_device(measurement: dict[str, Any], output: str, blockdev) -> None:
    """When --output is on the storage tier's block device, the periodic documents' bytes (written during
    the window) are in that device's counters: said beside them (`block_device.periodic_document_bytes`, a
    note, the console's block-device line), so that "device minus tool" is not read as other I/O only."""
    bd, record = measurement.get("block_device"), measurement.get("partial_documents") or {}
    written = int(record.get("bytes_total") or 0)
    if not isinstance(bd, dict) or blockdev is None or not written:
        return
    there = BlockDeviceCounter.for_path(os.path.dirname(os.path.abspath(output)))
    if there is None or there.name != blockdev.name:
        return
    bd["periodic_document_bytes"] = written
    measurement.setdefault("notes", []).append(
        f"the periodic results documents ({record.get('written')} of them, {written / 2**20:.1f} MiB in all) were "
        f"written to {output} during the window, on {blockdev.name}, the storage tier's block device: its written "
        "bytes include them (--partial-results-interval 0, or --output on another device, keeps them off it)")


@dataclass
class _History:
    """An autoscaler's history as it stood at a snapshot (its summary is the final document's)."""

    history: list


def _progress(settings: RunSettings, group: RankGroup | None = None) -> list:
    """The run's progress display; a rank of --processes sends its ticks to the parent's instead."""
    progress = (group.observer() if isinstance(group, RankConsole)
                else make_progress(settings.outputs.log_level, float(settings.driver.duration)))
    return [progress] if progress is not None else []
