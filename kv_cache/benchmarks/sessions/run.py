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
)
from kv_cache.benchmarks.sessions.steady_state import (
    EVIDENCE_MARGIN,
    MAX_PLANNED_WINDOW_FACTOR,
    evidence_window,
    pilot_enough,
    plan_window,
    planned_cycle,
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
from kv_cache.results.sessions_document import (
    cell_parameters,
    engine_gpu_warning,
    sessions_document,
    tier_backends,
)
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


def _pilot_record(result: dict[str, Any], window_s: float, rerun_window_s: float, need: int,
                  wanted: int) -> dict[str, Any]:
    """What a pilot (a first replication short of the evidence, left out of its cell) measured, for a reader
    of the document to see what was left out: its window and returning turns, the turns needed per
    replication (and wanted of a first one, steady_state.pilot_enough), the window every replication ran at
    instead, and its own figures."""
    p90 = (result["ttft"]["return"].get("p90_s") or {}).get("estimate")
    thr = (result.get("throughput_tokens_per_s_per_gpu") or {}).get("estimate")
    return {"window_s": window_s, "returning_turns": int(result["ttft"]["return"].get("n") or 0),
            "needed_returning_turns": need, "wanted_returning_turns": wanted, "rerun_window_s": rerun_window_s, "seed": result.get("seed"),
            "completed_turns": result.get("completed_turns"), "ttft_return_p90_s": p90,
            "throughput_tokens_per_s_per_gpu": thr, "left_out": True}


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
            progress.running(out, tier, n, k, replications, window,
                             *((f"the pilot had {pilot['returning_turns']} returning turns, under {pilot['wanted_returning_turns']} "
                                f"({need} needed per replication): all again",)
                               if pilot else ()))
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
                pilot = _pilot_record(result, window, longer, need, pilot_enough(need, replications))
                window = longer
                progress.pilot()  # one more run than the ladder counted: "rung i of n" and the ETA say so
                continue
            reps.append(result)
            if k == 0:
                raw[(tier, n)] = rung.throughput_samples
            k += 1
    except KeyboardInterrupt as exc:  # a cell's finished runs are no cell: the document says what was lost
        exc.unfinished_rung = {  # type: ignore[attr-defined]
            "tiers": tier, "sessions": n, "replications": replications, "replications_finished": len(reps),
            "window_s": window, "evidence_pilot": pilot,
            "ttft_return_n": [int(r["ttft"]["return"].get("n") or 0) for r in reps],
            "ttft_return_p90_s": [(r["ttft"]["return"].get("p90_s") or {}).get("estimate") for r in reps],
            "note": "interrupted inside this rung: its finished replications (and a pilot, left out) are not a "
                    "cell and are not in `rungs`"}
        raise
    cell = merge_replications(reps)
    cell["window_plan"] = {"mode": window_plan if plan else "fixed", "requested_window_s": ls.window_s,
                           "window_s": window, "planned_cycle_s": cycle, "planned_from_rung": from_rung,
                           "evidence_pilot": pilot,
                           "rule": "with --slo-ttft-p90 and --window-plan planned (the default): the window holds "
                                   ">= 3 loaded turn cycles planned from the rung below (its measured cycle x the "
                                   "ratio of sessions), within [--window, "
                                   f"{MAX_PLANNED_WINDOW_FACTOR:g} x --window]; and when the first replication "
                                   f"measures fewer returning turns than the evidence rule needs per replication "
                                   f"({need}; {EVIDENCE_MARGIN:g} x that with replications > 1, as each must have "
                                   f"it), it is a pilot, left out: every replication runs again at the window "
                                   f"that would give {EVIDENCE_MARGIN:g} x as many (in proportion), within the same "
                                   "cap (evidence_pilot: its window and turns); else (--window-plan fixed, or no "
                                   "SLO) --window"}
    if replications > 1:
        raw[(tier, n)] = cell["replications"]["throughput_tokens_per_s_per_gpu"]
    rungs.append(cell)
    progress.cell_done(out)
    return cell


def run_ladder(ls: LadderSettings, ladder: list[int], tiers: list[str], supply: Supply, out: TextIO,
               rungs: list[dict[str, Any]] | None = None, replications: int = 1,
               slo_ttft_p90_s: float | None = None, auto_start: int = 0,
               window_plan: str = "planned") -> dict[str, Any]:
    """Run every (tier config, rung), `replications` times each with its own seed; `rungs` (if given)
    receives each finished cell as it completes. `supply(seed)` -> the session supply of that seed.
    `auto_start` > 0: ignore `ladder`, climb from that many sessions (doubling) until throughput peaked.
    `window_plan` (with an SLO): "planned" windows of >= 3 loaded turn cycles, or "fixed" at --window."""
    rungs = [] if rungs is None else rungs
    raw: dict[tuple[str, int], list[float]] = {}
    print_banner(ls, ladder, tiers, auto_start, out)
    progress = RungProgress(ls, None if auto_start else len(tiers) * len(ladder) * replications)
    plan = slo_ttft_p90_s is not None  # an answer run plans each rung's window from the loaded turn cycle

    def run_cell(tier: str, n: int) -> dict[str, Any]:
        return _run_cell(ls, tier, n, supply, out, replications, raw, progress, rungs, plan, window_plan)

    for tier in tiers:
        if not auto_start:
            for n in ladder:
                run_cell(tier, n)
            continue
        history: list[tuple[int, float]] = []
        while (n := auto_next_rung(history, auto_start)) is not None:
            history.append((n, run_cell(tier, n)["throughput_tokens_per_s_per_gpu"]["estimate"]))
    body: dict[str, Any] = {}
    if slo_ttft_p90_s is not None:  # bisect each SLO bracket, then the answer from every rung
        progress.total = None
        refine_ladder(rungs, tiers, slo_ttft_p90_s, run_cell)
        flag_work_equivalence(rungs)  # before the answer: its sentence carries the rungs the control flagged
        unvalidated = ["engine model unvalidated on this GPU"] if engine_gpu_warning(ls) else []
        body["answer"], body["answer_detail"] = answer(rungs, slo_ttft_p90_s, ls.num_gpus, ls.gpu_name, unvalidated)
    flag_work_equivalence(rungs)
    summary = summarize(rungs, raw, slo_ttft_p90_s)
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
        body = run_ladder(ls, list(s.ladder), list(s.tiers),
                          lambda seed: script_supply(scripts, s.sessions, seed, resample=s.replications > 1), out,
                          done_rungs, s.replications, s.slo_ttft_p90_s, s.ladder_auto_start, s.window_plan)
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


def _run_cells(s: SessionsSettings, ls0, trace_scripts, libraries, started, out: TextIO) -> RunOutcome:
    interrupted, storage_error = False, None
    cells: list[dict[str, Any]] = []
    for cell_ls in s.grid or (s.ladder_settings,):
        ls = dataclasses.replace(cell_ls, block_tokens=ls0.block_tokens,
                                 shared_prefix_tokens=ls0.shared_prefix_tokens)
        if s.grid:
            print_grid_heading(len(cells) + 1, len(s.grid), ls, out)
        done_rungs: list[dict[str, Any]] = []
        body, interrupted, storage_error = _climb(s, ls, trace_scripts, out, done_rungs)
        cells.append({"parameters": cell_parameters(s, ls, done_rungs), **body,
                      "tier_backends": tier_backends(done_rungs)})
        if interrupted or storage_error is not None:
            break
    results = sessions_document(s, started, cells, libraries)
    written = write_results(s.output, results)
    print_written(results, not interrupted and storage_error is None, s.output, written, out)
    return RunOutcome(interrupted=interrupted, storage_error=storage_error)
