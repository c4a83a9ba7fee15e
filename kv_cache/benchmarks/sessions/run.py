"""`kv-cache sessions`, end to end: settings -> session supply -> ladder of rungs -> results -> outputs.

Climbs a concurrency ladder for each offload configuration (none, DRAM, DRAM + storage under
--cache-dir), replaying human-paced multi-turn sessions closed loop against modelled GPUs, with real I/O
to the offload tiers, and reports per-GPU throughput, completed turns and TTFT by turn class with 95 %
confidence intervals, the effective capacity of each configuration and the ratios between them.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from kv_cache import __version__
from kv_cache.benchmarks.sessions.answer import answer, refine_ladder
from kv_cache.benchmarks.sessions.ladder import LadderSettings, RungRun, flag_work_equivalence, summarize
from kv_cache.benchmarks.sessions.ladder_summary import auto_next_rung, merge_replications, rung_warnings
from kv_cache.benchmarks.sessions.steady_state import MAX_PLANNED_WINDOW_FACTOR, plan_window, planned_cycle
from kv_cache.errors import RunOutcome
from kv_cache.host.preload import snapshot_at_start
from kv_cache.host.signals import ABANDON_IO, catch_stop_signals
from kv_cache.metrics.recorder import GIB
from kv_cache.render.console import integrity_line
from kv_cache.render.sessions import print_grid, print_table
from kv_cache.results import measurement as meas
from kv_cache.results.integrity import sessions_integrity
from kv_cache.results.outputs import write_results
from kv_cache.results.run_document import SESSIONS_SCHEMA_VERSION, results_document
from kv_cache.serving.engine.calibration import (
    calibration_errors,
    constants,
    gpu_checks,
    leave_one_out,
    prefill_ttft_errors,
)
from kv_cache.settings.run import redacted_argv
from kv_cache.settings.schema import SessionsConfig
from kv_cache.storage.shaped import Shaping
from kv_cache.workload.session_supply import script_supply
from kv_cache.workload.sessions import SessionScript, sessions_from_trace
from kv_cache.workload.traces import TraceError, open_trace


@dataclass(frozen=True)
class SessionsSettings:
    """One `kv-cache sessions` run, resolved (synthetic sessions' block size until a trace is loaded): the
    ladder's own settings, and `ladder_settings`, what every rung is built with. cli/sessions.py fills in
    every field from the flags (SessionsFlags holds their defaults) and config.yaml; no field repeats one
    of LadderSettings, and none has a default of its own."""

    ladder_settings: LadderSettings
    ladder: tuple[int, ...]
    tiers: tuple[str, ...]
    sessions: SessionsConfig
    trace: str | None
    trace_format: str
    max_sessions: int
    pace_text: str
    output: str
    log_level: str
    argv: tuple[str, ...]
    replications: int
    slo_ttft_p90_s: float | None
    ladder_auto_start: int  # > 0: `--ladder auto`, climbing from this many sessions until throughput peaked
    grid: tuple[LadderSettings, ...]  # `--models` / `--gpus`: one ladder per (model, GPU) cell; () = one cell
    window_plan: str  # WINDOW_PLANS: "planned" (an answer run's windows hold 3 loaded cycles) or "fixed" (--window)


__all__ = ["METHOD", "WINDOW_PLANS", "load_trace_sessions", "run_ladder", "run_sessions"]

METHOD = (
    "Closed loop: each of N session slots issues its next turn only after the previous answer completed and "
    "its pause elapsed; a finished session is replaced by the next one. Compute is modelled (roofline per "
    "continuous-batching iteration: its linear layers, then its attention, each the larger of its compute and "
    "memory times; HBM = GPU memory - weights, block prefix cache with LRU); offload tiers "
    "are real: evicted blocks are written to DRAM / files, found blocks are read back. 95 % CIs: rates over "
    "fine bins of the measured window, circular block bootstrap (block length from the data), t interval on its "
    "standard error, clamped at 0 (or, with --replications K, t-interval across K seeded replications, every figure from all K); "
    "TTFT percentiles: pooled per-turn samples of the window, circular block bootstrap interval (block length "
    "from the data); ratios: CI of the ratio of mean throughputs (paired across replications when K > 1). "
    "Effective capacity = the rung (sessions) with the highest mean per-GPU throughput, or with "
    "--slo-ttft-p90 the largest session count whose p90 TTFT of returning turns meets the SLO; the answer: "
    "the SLO bracket bisected (up to 3 extra rungs), then a monotone fit of log p90 on log sessions over every "
    "cell with the evidence (>= 36 returning turns per rung), its crossing, and a paired residual bootstrap "
    "interval (metrics/slo_fit.py)."
)


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


WINDOW_PLANS = ("planned", "fixed")  # --window-plan: how an answer run sizes each rung's window
REPLICATION_SEED_STRIDE = 7919  # replication k runs with seed + k x this (k = 0: the given seed)


class RungProgress:
    """'rung i of n' with an ETA for the console (n unknown on an auto ladder: 'rung i' and elapsed time)."""

    def __init__(self, ls: LadderSettings, total: int | None) -> None:
        self.ls, self.total, self.done, self.started = ls, total, 0, time.monotonic()

    def label(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.total is None:
            return f"[rung {self.done + 1}, {int(elapsed) // 60}m{int(elapsed) % 60:02d}s so far]"
        return f"[rung {self.done + 1} of {self.total}, {rung_eta(self.done, self.total, elapsed, self.ls)}]"


def _run_cell(ls: LadderSettings, tier: str, n: int, supply, out: TextIO, replications: int,
              raw: dict[tuple[str, int], list[float]], progress: RungProgress,
              rungs: list[dict[str, Any]], plan: bool = False, window_plan: str = "planned") -> dict[str, Any]:
    """One (config, sessions) cell: `replications` seeded runs merged, appended to `rungs` before its last
    line is printed (an interrupt after that line keeps the cell); its throughput samples into `raw`.
    `plan` (an answer run): the warm-up lasts at least the loaded turn cycle expected from the rung below,
    and with `window_plan` "planned" the window holds >= 3 of them (steady_state.plan_window, within
    [--window, 4 x --window]); "fixed": the window is --window."""
    reps = []
    line = ""
    cycle, from_rung = planned_cycle(rungs, tier, n) if plan else (None, None)
    window = plan_window(ls.window_s, cycle) if window_plan == "planned" else ls.window_s
    for k in range(replications):
        out.write(line + f"  {progress.label()} running {tier:<13} {n:>5} sessions"
                  + (f" (replication {k + 1})" if replications > 1 else "")
                  + (f", window {window:.0f} s (3 planned cycles)" if window != ls.window_s and k == 0 else "")
                  + " ...")
        out.flush()
        lsk = dataclasses.replace(ls, seed=ls.seed + k * REPLICATION_SEED_STRIDE, window_s=window)
        rung = RungRun(lsk, tier, n, supply(lsk.seed), planned_cycle_s=cycle)
        result = rung.run()
        if result.get("storage_error"):  # the error policy stopped it: the ladder ends here, this rung kept
            rungs.append(result)
            out.write(" stopped by a storage error\n")
            raise LadderStopped(result["storage_error"])
        result["throughput_subwindow_tokens_per_s_per_gpu"] = list(rung.throughput_samples)  # for compare
        reps.append(result)
        progress.done += 1
        if k == 0:
            raw[(tier, n)] = rung.throughput_samples
        t = result["throughput_tokens_per_s_per_gpu"]
        line = f" {t['estimate']:10.1f} tok/s/GPU, {result['completed_turns']} turns\n"
    cell = merge_replications(reps)
    cell["window_plan"] = {"mode": window_plan if plan else "fixed", "requested_window_s": ls.window_s,
                           "window_s": window, "planned_cycle_s": cycle, "planned_from_rung": from_rung,
                           "rule": "with --slo-ttft-p90 and --window-plan planned (the default): the window holds "
                                   ">= 3 loaded turn cycles planned from the rung below (its measured cycle x the "
                                   "ratio of sessions), within [--window, "
                                   f"{MAX_PLANNED_WINDOW_FACTOR:g} x --window]; else (--window-plan fixed, or no "
                                   "SLO) --window"}
    if replications > 1:
        raw[(tier, n)] = cell["replications"]["throughput_tokens_per_s_per_gpu"]
    rungs.append(cell)
    out.write(line)
    out.flush()
    return cell


def run_ladder(ls: LadderSettings, ladder: list[int], tiers: list[str], supply, out: TextIO,
               rungs: list[dict[str, Any]] | None = None, replications: int = 1,
               slo_ttft_p90_s: float | None = None, auto_start: int = 0,
               window_plan: str = "planned") -> dict[str, Any]:
    """Run every (tier config, rung), `replications` times each with its own seed; `rungs` (if given)
    receives each finished cell as it completes. `supply(seed)` -> the session supply of that seed.
    `auto_start` > 0: ignore `ladder`, climb from that many sessions (doubling) until throughput peaked.
    `window_plan` (with an SLO): "planned" windows of >= 3 loaded turn cycles, or "fixed" at --window."""
    rungs = [] if rungs is None else rungs
    raw: dict[tuple[str, int], list[float]] = {}
    cap_blocks = ls.hbm_capacity_blocks()
    out.write(
        f"kv-cache {__version__} sessions: {ls.model_name} on {ls.num_gpus} x {ls.gpu_name} "
        f"(HBM for KV: {cap_blocks} blocks of {ls.block_tokens} tokens = "
        f"{cap_blocks * ls.block_tokens:,} tokens per replica), "
        f"rungs {f'auto from {auto_start}' if auto_start else ladder}, tiers {tiers}, "
        f"window {ls.window_s:g} s + warm-up {ls.warmup_s:g} s each\n"
    )
    out.write(engine_line(engine_calibration(ls)) + "\n")
    if ls.pace is not None and ls.pace.mode != "trace":
        out.write(f"Pace transform: {pace_transform(ls.pace, str(ls.pace), ls.seed)['description']}\n")
    if ls.dram_write_through:
        out.write("DRAM offload: write-through (every computed block stored on completion, as vLLM's "
                  "offloading connector)\n")
    progress = RungProgress(ls, None if auto_start else len(tiers) * len(ladder) * replications)
    plan = slo_ttft_p90_s is not None  # an answer run plans each rung's window from the loaded turn cycle
    for tier in tiers:
        if not auto_start:
            for n in ladder:
                _run_cell(ls, tier, n, supply, out, replications, raw, progress, rungs, plan, window_plan)
            continue
        history: list[tuple[int, float]] = []
        while (n := auto_next_rung(history, auto_start)) is not None:
            cell = _run_cell(ls, tier, n, supply, out, replications, raw, progress, rungs, plan, window_plan)
            history.append((n, cell["throughput_tokens_per_s_per_gpu"]["estimate"]))
    body: dict[str, Any] = {}
    if slo_ttft_p90_s is not None:  # bisect each SLO bracket, then the answer from every rung
        progress.total = None
        refine_ladder(rungs, tiers, slo_ttft_p90_s,
                      lambda tier, n: _run_cell(ls, tier, n, supply, out, replications, raw, progress, rungs, plan, window_plan))
        body["answer"], body["answer_detail"] = answer(rungs, slo_ttft_p90_s, ls.num_gpus, ls.gpu_name)
    flag_work_equivalence(rungs)
    summary = summarize(rungs, raw, slo_ttft_p90_s)
    return {"rungs": rungs, "summary": summary, "warnings": rung_warnings(rungs, summary), **body}


def rung_eta(done: int, total: int, elapsed_s: float, ls: LadderSettings) -> str:
    """Time left for the whole ladder: the finished rungs' mean time per rung, or before the first one
    the nominal warm-up + window, times the rungs left (this one included)."""
    per_rung = elapsed_s / done if done else ls.warmup_s + ls.window_s
    left = per_rung * (total - done)
    return f"ETA {int(left) // 60}m{int(left) % 60:02d}s" + ("" if done else " (nominal)")


def _interrupt(signum, frame):  # SIGTERM stops like Ctrl-C: the finished rungs are still written
    ABANDON_IO.set()  # a remote operation waiting on a frozen server gives up now
    raise KeyboardInterrupt


def tier_backends(rungs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The document's `tier_backends`: per tier configuration run (``dram``, ``dram+storage``), the
    registered backend behind each offload tier, as its rungs recorded it (a run document's
    measurement.tier_backends); {} for a configuration with no offload tier."""
    out: dict[str, dict[str, str]] = {}
    for rung in rungs:
        out.setdefault(str(rung.get("tiers")), dict(rung.get("tier_backends") or {}))
    return out


def sessions_storage_location(ls: LadderSettings, tiers: list[str]) -> dict[str, Any]:
    """parameters.storage_location (results/measurement.py): where the storage offload tier's files go (a
    temp dir without --cache-dir) and the I/O mode asked for; without a storage configuration, none."""
    if "dram+storage" not in tiers:
        return meas.storage_location(None, None)
    remote = ls.remote.storage_backend
    if remote != "file":  # a remote tier: the server, no path
        where = redacted_argv([ls.remote.redis_url or ""])[0] if remote == "redis" else f"s3://{ls.remote.s3_bucket}/{ls.remote.s3_prefix}"
        return {"cache_dir": where, "mount_point": None, "filesystem": remote, "filesystem_kind": meas.REMOTE,
                "mount_source": (redacted_argv([ls.remote.s3_endpoint or ""])[0] or None) if remote == "s3" else None, "block_device": None,
                "io_mode": "network", "io_mode_reason": "a remote storage tier (--storage-backend)"}
    return meas.storage_location(ls.cache_dir or tempfile.gettempdir(), ls.storage.io_mode,
                                 "requested; each rung's storage tier probes O_DIRECT (auto: used where it works)")


def _parameters(s: SessionsSettings, ls: LadderSettings, ladder: list[int], tiers: list[str],
                done_rungs: list[dict[str, Any]]) -> dict[str, Any]:
    """The results document's `parameters` for one (model, GPU) cell."""
    return {
        "model": ls.model_name, "gpu": ls.gpu_name, "hbm_gb": ls.gpu.hbm_gb, "num_gpus": ls.num_gpus,
        "tensor_parallel": ls.tensor_parallel, "block_tokens": ls.block_tokens,
        "ladder": ladder if not s.ladder_auto_start else sorted({r["sessions"] for r in done_rungs}),
        "ladder_auto_start": s.ladder_auto_start or None,
        "tiers": tiers, "window_s": ls.window_s, "warmup_s": ls.warmup_s, "subwindows": ls.subwindows,
        "dram_gib": ls.dram_bytes / GIB, "pace": s.pace_text, "seed": ls.seed, "trace": s.trace,
        "hbm_kv_capacity_blocks": ls.hbm_capacity_blocks(), "io_workers": ls.storage.io_workers,
        "load_policy": ls.load_policy, "steady_state": ls.steady_state, "replications": s.replications,
        "slo_ttft_p90_s": s.slo_ttft_p90_s, "window_plan": s.window_plan if s.slo_ttft_p90_s is not None else "fixed",
        "block_bytes": ls.block_bytes, "block_bytes_per_gpu": ls.block_bytes_per_gpu,
        "dram_usable_fraction": ls.dram_usable_fraction,
        "replica_assignment": "blake2b(seed:session_id) mod replicas",
        "storage_location": sessions_storage_location(ls, tiers),
        "pace_transform": pace_transform(ls.pace, s.pace_text, ls.seed),
        "dram_write_through": ls.dram_write_through,
        "engine_calibration": engine_calibration(ls),
        "tier_shaping": tier_shaping(ls),
    }


def tier_shaping(ls: LadderSettings) -> dict[str, Any]:
    """parameters.tier_shaping: the storage tier's shaping at the top (its keys from before per-tier shaping)
    and every shaped tier's under `tiers` (cpu = the DRAM tier, storage)."""
    tiers = {tier: {"bandwidth_gbps": gbps or None, "latency_ms": ms or None,
                    "described": Shaping(gbps, ms).describe()} for tier, (gbps, ms) in ls.storage.tier_shaping().items()}
    return {"bandwidth_gbps": ls.storage.tier_bandwidth_gbps or None,
            "latency_ms": ls.storage.tier_latency_ms or None, "unit": "GB/s = 10^9 bytes/s",
            "applies_to": "the storage tier's real reads and writes (token bucket per direction); "
                          "`tiers`: each shaped tier's, the DRAM tier (cpu) included",
            "tiers": tiers}


def pace_transform(pace, text: str, seed: int) -> dict[str, Any]:
    """parameters.pace_transform: what `--pace` did to the inter-turn delays, in words and numbers."""
    if pace is None or pace.mode == "trace":
        return {"pace": text, "description": "inter-turn delays as the trace or generator gives them"}
    if pace.mode == "fixed":
        return {"pace": text, "mode": "fixed", "low_s": pace.low_s, "high_s": pace.low_s,
                "description": f"every inter-turn delay replaced by {pace.low_s:g} s"}
    return {"pace": text, "mode": pace.mode, "low_s": pace.low_s, "high_s": pace.high_s, "seed": seed,
            "description": f"every inter-turn delay replaced by a uniform {pace.low_s:g}-{pace.high_s:g} s draw "
                           f"(a {pace.mode} pause), seeded by (seed {seed}, session, turn); first turns untouched"}


def engine_calibration(ls: LadderSettings) -> dict[str, Any]:
    """parameters.engine_calibration: the roofline's efficiencies and its error on every published entry
    (kv_cache/specs/calibration.yaml), and on this run's (GPU, model) where the table has it.

    ``max_abs_prefill_error`` / ``max_abs_decode_error`` and ``this_pair`` are over the per-layer entries
    (vidur's profiling data); ``end_to_end`` gives each end-to-end entry's source kind and error (vLLM's
    benchmark results, MLPerf Inference results), and which of them are within 20 %."""
    rows = calibration_errors(ls.efficiency)
    layers = [r for r in rows if r["kind"] == "layer_profile"]
    whole = [r for r in rows if r["kind"] == "end_to_end"]
    steps = [r for r in rows if r["kind"] == "decode_step"]
    this = [r for r in layers if (r["gpu"], r["model"]) == (ls.gpu_name, ls.model_name)]
    fp8 = constants()["fp8_compute_efficiency"]
    return {
        "fp8_compute_efficiency": {"value": fp8.value, "fitted_on": list(fp8.fitted_on),
                                   "held_out": list(fp8.held_out), "method": fp8.method,
                                   "leave_one_out_errors": dict(fp8.leave_one_out)},
        "prefill_mfu": ls.efficiency.prefill_mfu, "decode_hbm_efficiency": ls.efficiency.decode_hbm_efficiency,
        "max_abs_prefill_error": max(abs(r["prefill_error"]) for r in layers),
        "max_abs_decode_error": max(abs(r["decode_error"]) for r in layers),
        "this_pair": this[0] if this else None,
        "this_pair_published": [r for r in whole + steps if (r["gpu"], r["model"]) == (ls.gpu_name, ls.model_name)],
        "this_gpu": this_gpu(ls),
        "end_to_end": [{"gpu": r["gpu"], "model": r["measured_model"], "source_kind": r["source_kind"],
                        "dtype": r["dtype"], "error": r["error"], "within_20pct": r["within_20pct"],
                        "compute_efficiency": r["compute_efficiency"],
                        "contradicted_by": r.get("contradicted_by"), "input_tokens": r["input_tokens"],
                        "ttft_error": r.get("ttft_error")} for r in whole],
        "decode_steps": [{"gpu": r["gpu"], "model": r["model"], "source_kind": r["source_kind"], "dtype": r["dtype"],
                          "context_tokens": r["context_tokens"], "error": r["error"],
                          "within_20pct": r["within_20pct"]} for r in steps],
        "entries": rows,
        # single-request TTFTs at long inputs (calibration.yaml kind prefill_ttft): TTFTs, not throughputs,
        # so not among `entries`; each with its error over the published figure's reading error
        "prefill_ttfts": prefill_ttft_errors(ls.efficiency),
        "leave_one_out": leave_one_out(ls.efficiency),
        "leave_one_out_method": "each entry's error with it left out of the fit of the constant its kind "
                                "calibrates (prefill_mfu: vidur's prefill profiles; decode_hbm_efficiency: their "
                                "decode steps; fp8_compute_efficiency: the four FP8 runs); an entry in no fit "
                                "(vLLM's runs, decode steps and TTFTs, FlexAI's run) is out of sample as it is "
                                "(serving/engine/calibration.py leave_one_out)",
    }


def engine_line(cal: dict[str, Any]) -> str:
    """The roofline's constants and its error against the published table, in one console line."""
    this = cal["this_pair"]
    pair = (f"; on this GPU and model: prefill {this['prefill_error']:+.0%}, decode {this['decode_error']:+.0%}"
            if this else "")
    whole, steps = cal.get("end_to_end", []), cal.get("decode_steps", [])
    layers = len(cal["entries"]) - len(whole) - len(steps)
    ends = "; end to end: " + ", ".join(
        f"{r['source_kind'].split(' ')[0]} {r['gpu'].upper()} {r['model']} {r['dtype']} {r['error']:+.0%}"
        + ("" if r["within_20pct"] else " (outside 20%)")
        + (" (contradicted by a published run of the same work)" if r.get("contradicted_by") else "")
        for r in whole) if whole else ""
    ends += "; decode steps at batch 1: " + ", ".join(
        f"{r['source_kind'].split(' ')[0]} {r['gpu'].upper()} {r['model']} {r['dtype']} {r['context_tokens']:,} tokens "
        f"{r['error']:+.0%}" + ("" if r["within_20pct"] else " (outside 20%)") for r in steps) if steps else ""
    fp8 = cal.get("fp8_compute_efficiency")
    loo = list((fp8 or {}).get("leave_one_out_errors", {}).values())
    loo_text = f"; each left out of the fit: {min(loo):+.0%} to {max(loo):+.0%}" if loo else ""
    fp8_text = (f" (FP8 runs: {fp8['value']:g} of the FP8 peak, fitted on {len(fp8['fitted_on'])} MLPerf runs"
                f"{loo_text})" if fp8 else "")
    pairs = len({(r["gpu"], r.get("measured_model") or r["model"]) for r in cal["entries"]})
    loo = cal.get("leave_one_out") or []

    def span(fit: str) -> str:
        v = [r["out_of_sample"] for r in loo if r["fit"] == fit]
        return f"{min(v):+.0%} to {max(v):+.0%}" if v else "-"
    ttft = [r for r in cal.get("end_to_end", []) if r.get("ttft_error") is not None]
    single: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in cal.get("prefill_ttfts") or []:
        single.setdefault((r["source_kind"].split(" ")[0], r["gpu"].upper(), r["model"], r["dtype"]), []).append(r)
    oos = (f"; out of sample (each entry left out of its constant's fit): prefill {span('prefill_mfu')}, decode "
           f"{span('decode_hbm_efficiency')}, FP8 {span('fp8_compute_efficiency')}, the rest in no fit"
           + "".join(f", long-input TTFT ({r['source_kind'].split(' ')[0]} {r['gpu'].upper()} {r['model']} "
                     f"{r['dtype']}, median at ~{r['input_tokens']:,.0f} tokens) {r['ttft_error']:+.0%}" for r in ttft)
           + "".join(f", single-request TTFT ({' '.join(k)}, {min(x['input_tokens'] for x in v):,}-"
                     f"{max(x['input_tokens'] for x in v):,} tokens, read off a published figure) "
                     f"{min(x['error'] for x in v):+.0%} to {max(x['error'] for x in v):+.0%}"
                     + ("" if all(x["within_20pct"] for x in v) else " (some outside 20%)")
                     for k, v in single.items())
           ) if loo else ""
    # the "within" bounds are the per-layer profiles' only: the other entries' errors follow, each its own
    gpu = cal.get("this_gpu")
    pair += f"; this run's GPU: {gpu['statement']}" if gpu else ""
    return (f"Engine model: roofline, prefill_mfu {cal['prefill_mfu']:g}{fp8_text}, decode_hbm_efficiency "
            f"{cal['decode_hbm_efficiency']:g}; error against {len(cal['entries'])} published throughputs of "
            f"{pairs} (GPU, model) pairs (specs/calibration.yaml): {layers} per-layer profiles (vidur) prefill "
            f"within {cal['max_abs_prefill_error']:.0%}, decode within {cal['max_abs_decode_error']:.0%}"
            f"{ends}{oos}{pair}")


def _climb(s: SessionsSettings, ls: LadderSettings, scripts, out: TextIO,
           done_rungs: list[dict[str, Any]]) -> tuple[dict[str, Any], bool, str | None]:
    """One cell's ladder: (body, interrupted, storage error); its warnings lead with the engine model's
    (engine_gpu_warning), whichever way the ladder ended."""
    body, interrupted, error = _climb_ladder(s, ls, scripts, out, done_rungs)
    body["warnings"] = engine_gpu_warning(ls) + list(body.get("warnings") or [])
    return body, interrupted, error


def this_gpu(ls: LadderSettings) -> dict[str, Any]:
    """parameters.engine_calibration.this_gpu: what the published table holds for this run's GPU at its
    precision (calibration.gpu_checks)."""
    return gpu_checks(calibration_errors(ls.efficiency), ls.gpu_name, ls.efficiency.weight_bytes_per_param, ls.gpu)


def engine_gpu_warning(ls: LadderSettings) -> list[str]:
    """A warning when no published check of the roofline on this run's GPU is within 20 % (this_gpu): the
    run's absolute figures then rest on constants no run of that GPU supports."""
    this = this_gpu(ls)
    return [f"engine model unvalidated on this GPU: {this['statement']}"] if this["unvalidated"] else []


def _climb_ladder(s: SessionsSettings, ls: LadderSettings, scripts, out: TextIO,
                  done_rungs: list[dict[str, Any]]) -> tuple[dict[str, Any], bool, str | None]:
    ladder, tiers = list(s.ladder), list(s.tiers)
    try:
        body = run_ladder(ls, ladder, tiers, lambda seed: script_supply(scripts, s.sessions, seed, resample=s.replications > 1), out,
                          done_rungs, s.replications, s.slo_ttft_p90_s, s.ladder_auto_start, s.window_plan)
    except KeyboardInterrupt:  # keep what was measured: the rungs that completed, work control included
        flag_work_equivalence(done_rungs)
        sys.stderr.write(f"kv-cache sessions: interrupted after {len(done_rungs)} rung(s); writing them\n")
        return ({"rungs": done_rungs, "summary": None, "interrupted": True,
                 "warnings": rung_warnings(done_rungs, None)}, True, None)
    except LadderStopped as exc:  # keep what was measured, say why it stopped, exit 3
        flag_work_equivalence(done_rungs)
        sys.stderr.write(f"kv-cache sessions: stopped by a storage error: {exc}\n")
        return ({"rungs": done_rungs, "summary": None, "stop_reason": f"storage error: {exc}",
                 "warnings": rung_warnings(done_rungs, None)}, False, str(exc))
    return body, False, None


def run_sessions(s: SessionsSettings, out: TextIO | None = None) -> RunOutcome:
    """Load the sessions, climb the ladder of every (model, GPU) cell, write the JSON, print one table per
    cell; returns how the ladder ended (interrupted or not; the CLI makes it the exit status)."""
    out = out or sys.stdout
    libraries = snapshot_at_start()  # mapped libraries (an LD_PRELOAD shim), judged in the integrity block
    ls0, trace_scripts = load_trace_sessions(s)  # a bad trace fails here, before any rung runs
    tiers = list(s.tiers)
    started = datetime.now()
    interrupted, storage_error = False, None
    if threading.current_thread() is threading.main_thread():
        # a lost terminal keeps the rungs measured, as Ctrl-C does (a SIGHUP ignored under nohup stays so);
        # Ctrl-C itself also abandons a remote tier's waits on a frozen server (ABANDON_IO)
        catch_stop_signals(_interrupt, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    cells: list[dict[str, Any]] = []
    for cell_ls in s.grid or (s.ladder_settings,):
        ls = dataclasses.replace(cell_ls, block_tokens=ls0.block_tokens,
                                 shared_prefix_tokens=ls0.shared_prefix_tokens)
        if s.grid:
            out.write(f"\n=== grid cell {len(cells) + 1} of {len(s.grid)}: {ls.model_name} on "
                      f"{ls.num_gpus} x {ls.gpu_name} ===\n")
        done_rungs: list[dict[str, Any]] = []
        body, interrupted, storage_error = _climb(s, ls, trace_scripts, out, done_rungs)
        cells.append({"parameters": _parameters(s, ls, list(s.ladder), tiers, done_rungs), **body,
                      "tier_backends": tier_backends(done_rungs)})
        if interrupted or storage_error is not None:
            break
    first = cells[0]
    results = results_document({
        "tool": f"kv-cache {__version__}",
        "mode": "sessions",
        "timestamp": started.isoformat(timespec="seconds"),
        "command": " ".join(["kv-cache", "sessions", *redacted_argv(s.argv)]),
        "parameters": first["parameters"],
        "method": METHOD,
        **{k: v for k, v in first.items() if k != "parameters"},
        **({"grid": cells} if s.grid else {}),
        "integrity": sessions_integrity(libraries),
    }, SESSIONS_SCHEMA_VERSION)
    written = write_results(s.output, results)
    if not interrupted and storage_error is None:
        if s.grid:
            print_grid(cells, METHOD, out)
        else:
            print_table({"method": METHOD, **results}, out)
    if results["integrity"]["verdict"] != "ok":  # said when it is not ok (an LD_PRELOAD shim); always in the JSON
        out.write("\n" + "\n".join(integrity_line(results)) + "\n")
    if written.kept_as:
        out.write(f"\nNote: an earlier {s.output} was kept as {written.kept_as}\n")
    if written.error:
        sys.stderr.write(f"kv-cache sessions: could not write the results to {written.error}; "
                         f"they are in {written.path}\n")
    out.write(f"\nResults written to {written.path}\n")
    return RunOutcome(interrupted=interrupted, storage_error=storage_error)
