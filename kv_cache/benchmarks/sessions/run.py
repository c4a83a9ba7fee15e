"""`kv-cache sessions`, end to end: settings -> session supply -> ladder of rungs -> results -> outputs.

The composition root: builds and climbs a concurrency ladder for each offload configuration (none, DRAM,
DRAM + storage under --cache-dir) of each (model, GPU) cell, replaying human-paced multi-turn sessions closed
loop against modelled GPUs, with real I/O to the offload tiers, then writes the document. What a cell's
results say comes from ladder_summary.py and answer.py, the document from results/sessions_document.py, and
every line it prints from render/sessions_live.py.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TextIO

from kv_cache.benchmarks.sessions.answer import answer, refine_ladder
from kv_cache.benchmarks.sessions.ladder import RungRun
from kv_cache.benchmarks.sessions.ladder_summary import (
    auto_next_rung,
    flag_work_equivalence,
    merge_replications,
    rung_warnings,
    summarize,
    unfinished_rung,
)
from kv_cache.benchmarks.sessions.steady_state import (
    evidence_window,
    pilot_enough,
    pilot_record,
    plan_window,
    planned_cycle,
    window_plan_record,
)
from kv_cache.errors import RunOutcome
from kv_cache.host.preload import snapshot_at_start
from kv_cache.host.signals import ABANDON_IO, catch_stop_signals, process_exits_after_run
from kv_cache.metrics.slo_fit import turns_needed_per_replication
from kv_cache.render.sessions_live import (
    RungProgress,
    ladder_ended,
    print_banner,
    print_grid_heading,
    print_written,
)
from kv_cache.results.outputs import write_results
from kv_cache.results.sessions_document import engine_gpu_warning, sessions_cell, sessions_document
from kv_cache.settings.sessions import LadderSettings, SessionsSettings
from kv_cache.workload.session_supply import script_supply
from kv_cache.workload.sessions import SessionScript, sessions_from_trace
from kv_cache.workload.traces import TraceError, open_trace

__all__ = ["load_trace_sessions", "run_ladder", "run_sessions"]

REPLICATION_SEED_STRIDE = 7919  # replication k runs with seed + k x this (k = 0: the given seed)
Supply = Callable[[int], Callable[[], Iterator[SessionScript]]]  # seed -> that seed's session supply


def load_trace_sessions(s: SessionsSettings) -> tuple[LadderSettings, list[SessionScript] | None]:
    """The trace's sessions (None without --trace) and the ladder settings on the trace's block size."""
    ls = s.ladder_settings
    if not s.trace:
        return ls, None
    scripts = sessions_from_trace(open_trace(s.trace, s.trace_format), max_sessions=s.max_sessions)
    if not scripts:
        raise TraceError(s.trace, "no sessions found")
    return dataclasses.replace(ls, block_tokens=scripts[0].block_tokens, shared_prefix_tokens=0), scripts


class LadderStopped(Exception):
    """A rung was stopped by the storage-error policy (a fatal error, or more than tolerated)."""


def _run_cell(ls: LadderSettings, tier: str, n: int, supply: Supply, out: TextIO, replications: int,
              raw: dict[tuple[str, int], list[float]], progress: RungProgress,
              rungs: list[dict[str, Any]], plan: bool = False, window_plan: str = "planned") -> dict[str, Any]:
    """One (config, sessions) cell: `replications` seeded runs merged, appended to `rungs` before its last
    line is printed (an interrupt after that line keeps the cell); its throughput samples into `raw`.
    `plan` (an answer run): the warm-up lasts at least the loaded turn cycle expected from the rung below,
    and with `window_plan` "planned" the window holds >= 3 of them (steady_state.plan_window, within
    [--window, 4 x --window]); "fixed": the window is --window."""
    reps = []
    cycle, from_rung = planned_cycle(rungs, tier, n) if plan else (None, None)
    window = plan_window(ls.window_s, cycle) if window_plan == "planned" else ls.window_s
    need = turns_needed_per_replication(replications)  # the answer's evidence rule (evidence_text's)
    pilot: dict[str, Any] | None = None  # a first replication short of the evidence, run again longer
    k = 0
    try:
        while k < replications:
            progress.running(out, tier, n, k, replications, window, pilot)
            lsk = dataclasses.replace(ls, seed=ls.seed + k * REPLICATION_SEED_STRIDE, window_s=window)
            rung = RungRun(lsk, tier, n, supply(lsk.seed), planned_cycle_s=cycle)
            result = rung.run()
            if result.get("storage_error"):  # the error policy stopped it: the ladder ends here, this rung kept
                rungs.append(result)
                progress.stopped(out)
                raise LadderStopped(result["storage_error"])
            result["throughput_subwindow_tokens_per_s_per_gpu"] = list(rung.throughput_samples)  # for compare
            progress.measured(result)
            longer = (evidence_window(window, ls.window_s, int(result["ttft"]["return"].get("n") or 0), need,
                                      replications)
                      if plan and window_plan == "planned" and k == 0 and pilot is None else None)
            if longer is not None:  # the pilot: every replication (this one again) at the window the evidence needs
                pilot = pilot_record(result, window, longer, need, pilot_enough(need, replications))
                window = longer
                progress.pilot()  # one more run than the ladder counted: "rung i of n" and the ETA say so
                continue
            reps.append(result)
            if k == 0:
                raw[(tier, n)] = rung.throughput_samples
            k += 1
    except KeyboardInterrupt as exc:  # a cell's finished runs are no cell: the document says what was lost
        exc.unfinished_rung = unfinished_rung(tier, n, replications, reps, window, pilot)  # type: ignore[attr-defined]
        raise
    cell = merge_replications(reps)
    cell["window_plan"] = window_plan_record(window_plan if plan else "fixed", ls.window_s, window, cycle, from_rung,
                                             pilot, need)
    if replications > 1:
        raw[(tier, n)] = cell["replications"]["throughput_tokens_per_s_per_gpu"]
    rungs.append(cell)
    progress.cell_done(out)
    return cell


def run_ladder(ls: LadderSettings, s: SessionsSettings, supply: Supply, out: TextIO,
               rungs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run every (tier config, rung) of `s`, `s.replications` times each with its own seed; `rungs` (if given)
    receives each finished cell as it completes. `supply(seed)` -> the session supply of that seed.
    `s.ladder_auto_start` > 0: ignore `s.ladder`, climb from that many sessions (doubling) until throughput
    peaked. `s.window_plan` (with an SLO): "planned" windows of >= 3 loaded turn cycles, or "fixed" at --window."""
    rungs = [] if rungs is None else rungs
    raw: dict[tuple[str, int], list[float]] = {}
    tiers, slo = list(s.tiers), s.slo_ttft_p90_s
    print_banner(ls, s, out)
    progress = RungProgress(ls, None if s.ladder_auto_start else len(tiers) * len(s.ladder) * s.replications)
    plan = slo is not None  # an answer run plans each rung's window from the loaded turn cycle

    def run_cell(tier: str, n: int) -> dict[str, Any]:
        return _run_cell(ls, tier, n, supply, out, s.replications, raw, progress, rungs, plan, s.window_plan)

    for tier in tiers:
        if not s.ladder_auto_start:
            for n in s.ladder:
                run_cell(tier, n)
            continue
        history: list[tuple[int, float]] = []
        while (n := auto_next_rung(history, s.ladder_auto_start)) is not None:
            history.append((n, run_cell(tier, n)["throughput_tokens_per_s_per_gpu"]["estimate"]))
    body: dict[str, Any] = {}
    if slo is not None:  # bisect each SLO bracket, then the answer from every rung
        progress.total = None
        refine_ladder(rungs, tiers, slo, run_cell)
        flag_work_equivalence(rungs)  # before the answer: its sentence carries the rungs the control flagged
        unvalidated = ["engine model unvalidated on this GPU"] if engine_gpu_warning(ls) else []
        body["answer"], body["answer_detail"] = answer(rungs, slo, ls.num_gpus, ls.gpu_name, unvalidated)
    flag_work_equivalence(rungs)
    summary = summarize(rungs, raw, slo)
    return {"rungs": rungs, "summary": summary, "warnings": rung_warnings(rungs, summary), **body}


def _interrupt(signum, frame):  # SIGTERM stops like Ctrl-C: the finished rungs are still written
    ABANDON_IO.set()  # a remote operation waiting on a frozen server gives up now
    raise KeyboardInterrupt


def _climb(s: SessionsSettings, ls: LadderSettings, scripts: list[SessionScript] | None, out: TextIO,
           done_rungs: list[dict[str, Any]]) -> tuple[dict[str, Any], bool, str | None]:
    """One cell's ladder: (body, interrupted, storage error); what was measured is kept whichever way it
    ended, and its warnings lead with the engine model's (engine_gpu_warning)."""
    interrupted, error = False, None
    try:
        body = run_ladder(ls, s, lambda seed: script_supply(scripts, s.sessions, seed, resample=s.replications > 1),
                          out, done_rungs)
    except KeyboardInterrupt as exc:  # the rungs that completed, work control included
        interrupted = True
        body = {"rungs": done_rungs, "summary": None, "interrupted": True}
        if getattr(exc, "unfinished_rung", None):  # the rung it stopped in, and what of it was lost
            body["unfinished_rung"] = exc.unfinished_rung
    except LadderStopped as exc:  # say why it stopped, exit 3
        error = str(exc)
        body = {"rungs": done_rungs, "summary": None, "stop_reason": f"storage error: {exc}"}
    if interrupted or error is not None:
        flag_work_equivalence(done_rungs)
        ladder_ended(len(done_rungs), error, body.get("unfinished_rung"))
        body["warnings"] = rung_warnings(done_rungs, None)
    body["warnings"] = engine_gpu_warning(ls) + list(body.get("warnings") or [])
    return body, interrupted, error


def run_sessions(s: SessionsSettings, out: TextIO | None = None) -> RunOutcome:
    """Load the sessions, climb the ladder of every (model, GPU) cell, write the JSON, print one table per
    cell; returns how the ladder ended (interrupted or not; the CLI makes it the exit status)."""
    out = out or sys.stdout
    libraries = snapshot_at_start()  # mapped libraries (an LD_PRELOAD shim), judged in the integrity block
    ls0, trace_scripts = load_trace_sessions(s)  # a bad trace fails here, before any rung runs
    started = datetime.now()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # a lost terminal keeps the rungs measured, as Ctrl-C does (a SIGHUP ignored under nohup stays so);
        # Ctrl-C itself also abandons a remote tier's waits on a frozen server (ABANDON_IO)
        previous = catch_stop_signals(_interrupt, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    try:
        return _run_cells(s, ls0, trace_scripts, libraries, started, out)
    finally:
        # the stop signal was this run's: a store opened by a later run in this process starts clear, and an
        # in-process caller (a library, the tests) gets its own handlers back (the CLI exits next: left as is)
        ABANDON_IO.clear()
        if not process_exits_after_run():
            for sig, old in previous.items():
                signal.signal(sig, old)


def _run_cells(s: SessionsSettings, ls0: LadderSettings, trace_scripts: list[SessionScript] | None,
               libraries: dict[str, Any], started: datetime, out: TextIO) -> RunOutcome:
    interrupted, storage_error = False, None
    cells: list[dict[str, Any]] = []
    for cell_ls in s.grid or (s.ladder_settings,):
        ls = dataclasses.replace(cell_ls, block_tokens=ls0.block_tokens,
                                 shared_prefix_tokens=ls0.shared_prefix_tokens)
        if s.grid:
            print_grid_heading(len(cells) + 1, len(s.grid), ls, out)
        done_rungs: list[dict[str, Any]] = []
        body, interrupted, storage_error = _climb(s, ls, trace_scripts, out, done_rungs)
        cells.append(sessions_cell(s, ls, body, done_rungs))
        if interrupted or storage_error is not None:
            break
    results = sessions_document(s, started, cells, libraries)
    written = write_results(s.output, results)
    print_written(results, not interrupted and storage_error is None, s.output, written, out)
    return RunOutcome(interrupted=interrupted, storage_error=storage_error)
