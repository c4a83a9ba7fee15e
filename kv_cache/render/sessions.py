"""`kv-cache sessions` console tables, from a sessions document: per-GPU throughput and TTFT by configuration and
concurrency, the answer, a grid's cells, and the engine model's line (parameters.engine_calibration)."""

from __future__ import annotations

import re
from typing import Any, TextIO

from kv_cache.metrics.stats import CLAMP_MARK

__all__ = ["engine_line", "print_grid", "print_partial", "print_table", "stopped_reason"]


def _fmt_ci(ci: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not ci or ci.get("estimate") is None:  # no value (e.g. a rung that completed no turn)
        return "-"
    est, lo, hi = ci["estimate"] * scale, ci.get("low"), ci.get("high")
    if lo is None or hi is None or lo == hi:
        return f"{est:.{digits}f}"
    mark = "*" if CLAMP_MARK in (ci.get("method") or "") else ""
    return f"{est:.{digits}f} [{lo * scale:.{digits}f}{mark}, {hi * scale:.{digits}f}]"


def stopped_reason(results: dict[str, Any]) -> str:
    """Why a sessions document has no summary: "stopped by a storage error (...)" or "interrupted"."""
    reason = results.get("stop_reason") or ""
    if reason.startswith("storage error"):
        return f"stopped by a storage error ({reason.removeprefix('storage error').lstrip(': ')})"
    return "interrupted" if results.get("interrupted") or not reason else f"stopped ({reason})"


TABLE_KEYS = ("tiers", "sessions", "throughput_tokens_per_s_per_gpu", "completed_turns", "ttft", "work")


def print_partial(results: dict[str, Any], out: TextIO, source: str) -> None:
    """A sessions document without a summary (the ladder stopped early): why, then the table of the rungs it
    completed (no capacity or ratios: those need the whole ladder)."""
    rungs = results.get("rungs") or []
    why = stopped_reason(results)
    if why == "interrupted":  # the wording of before, for the case it described
        out.write(f"{source}: an interrupted sessions run with {len(rungs)} rung(s)\n")
    else:
        out.write(f"{source}: a sessions run {why}, with {len(rungs)} completed rung(s)\n")
    rows = [r for r in rungs if all(k in r for k in TABLE_KEYS)]
    if rows:
        _rung_tables(rows, out)


def _rung_tables(rungs: list[dict[str, Any]], out: TextIO) -> None:
    """The per-rung tables: throughput and TTFT, the TTFT breakdown, the offload I/O, the storage tier."""
    _table_head(out)
    _rung_rows(rungs, out)
    _breakdown_table(rungs, out)
    _io_table(rungs, out)
    _storage_table(rungs, out)


def _table_head(out: TextIO) -> None:
    line = "=" * 118
    out.write(
        f"\n{line}\nSESSIONS HELD - per-GPU throughput and TTFT by configuration and concurrency "
        "(95 % CI in brackets; * = lower bound clamped at 0)\n{line}\n".replace("{line}", line)
    )
    out.write(
        f"{'config':<13} {'sessions':>8}  {'tokens/s per GPU':<28} {'turns':>6}  "
        f"{'TTFT p90 return (s)':<26} {'n':>4}  {'TTFT p90 start (s)':<22} {'work':<6}\n"
    )


def _rung_rows(rungs: list[dict[str, Any]], out: TextIO) -> None:
    for r in rungs:
        ret, start = r["ttft"]["return"], r["ttft"]["start"]
        out.write(
            f"{r['tiers']:<13} {r['sessions']:>8}  {_fmt_ci(r['throughput_tokens_per_s_per_gpu']):<28} "
            f"{r['completed_turns']:>6}  {_fmt_ci(ret['p90_s'], digits=2):<26} {ret['n']:>4}  "
            f"{_fmt_ci(start['p90_s'], digits=2):<22} {'FLAG' if r['work'].get('flagged') else 'ok':<6}"
            f"{' !' * bool(r.get('flags'))}\n"
        )


def print_table(results: dict[str, Any], out: TextIO) -> None:
    """A sessions document that ran to its end: the rung tables, capacity and ratios, warnings, method, answer."""
    _rung_tables(results["rungs"], out)
    s = results["summary"]
    slo = s.get("slo_ttft_p90_s")
    basis = f"largest sessions with p90 return TTFT <= {slo:g} s" if slo else "sessions at peak per-GPU throughput"
    if results.get("answer"):  # two figures for one question: say which one is the answer
        basis += "; a rung that ran, not interpolated: the answer below interpolates and is the figure to quote"
    out.write(f"\nEffective capacity ({basis}):\n")
    for cfg, c in s["configs"].items():
        cap_ci = c.get("slo_capacity_sessions_ci") or c.get("peak_throughput_sessions_ci")
        cap_text = f" (replications: {_fmt_ci(cap_ci)})" if cap_ci else ""
        if c.get("effective_capacity_sessions") is None:
            out.write(f"  {cfg:<13} {_capacity_text(c)}"
                      f"{'  [' + '; '.join(c['flags']) + ']' if c.get('flags') else ''}\n")
            continue
        out.write(
            f"  {cfg:<13} {c['effective_capacity_sessions']:>6} sessions{cap_text}; throughput peak at "
            f"{c.get('peak_throughput_sessions', c['effective_capacity_sessions'])} sessions, "
            f"{_fmt_ci(c['peak_throughput_tokens_per_s_per_gpu'])} tok/s/GPU"
            f"{'  [' + '; '.join(c['flags']) + ']' if c.get('flags') else ''}\n"
        )
    for r in s["ratios"]:
        cap = r["effective_capacity_ratio"]
        out.write(
            f"  {r['config']} vs {r['baseline']}: capacity {f'x{cap:.2f}' if cap is not None else '-'}"
            f"{' (censored)' if r.get('censored') else ''}, "
            f"peak throughput x{_fmt_ci(r['peak_throughput_ratio'], digits=2)}\n"
        )
    for r in s.get("ratios_by_rung", []):
        turns = r["completed_turns_ratio"]
        turns_text = f"x{turns:.2f}" if turns is not None else "-"
        out.write(f"  at {r['sessions']:>4} sessions, {r['config']} vs {r['baseline']}: throughput "
                  f"x{_fmt_ci(r['throughput_ratio'], digits=2)}, completed turns {turns_text}\n")
    flagged = [r for r in results["rungs"] if r["work"].get("flagged")]
    for r in flagged:
        out.write(f"  WORK FLAG {r['tiers']} @ {r['sessions']}: {'; '.join(r['work']['flag_reasons'])}\n")
    warnings = results.get("warnings") or []
    if warnings:
        lines = grouped_warnings(warnings, results["rungs"])
        count = str(len(warnings)) if len(lines) == len(warnings) else f"{len(lines)} lines for {len(warnings)} warnings"
        out.write(f"\nWarnings ({count}; cells marked ! above):\n")
        for w in lines:
            out.write(f"  - {w}\n")
    out.write(f"\nMethod: {results['method']}\n")
    _answer(results, out)


_CELL = re.compile(r"^(\S+) @ (\d+) sessions: ")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def grouped_warnings(warnings: list[str], rungs: list[dict[str, Any]]) -> list[str]:
    """The console's warning lines: the warnings of one cell ("config @ N sessions: ...") that read the same once
    their figures are ignored (one per replication) as one line, at the first one's place: its text, how many of
    the cell's replications said it and the figures that differ. Any other warning as it is."""
    reps = {(r.get("tiers"), r.get("sessions")): (r.get("replications") or {}).get("k") for r in rungs}
    groups: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str] | str] = []
    for w in warnings:
        m = _CELL.match(w)
        if not m:
            order.append(w)
            continue
        key = (m.group(0), _NUMBER.sub("#", w[m.end():]))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(w)
    lines = []
    for item in order:
        if isinstance(item, str):
            lines.append(item)
            continue
        texts = groups[item]
        if len(texts) == 1:
            lines.append(texts[0])
            continue
        m = _CELL.match(texts[0])
        k = reps.get((m.group(1), int(m.group(2)))) if m else None
        said = f"in {len(texts)} of the {k} replications" if k and len(texts) <= k else f"said {len(texts)} times"
        figures = zip(*(_NUMBER.findall(t[len(item[0]):]) for t in texts), strict=True)
        differ = "; ".join(" / ".join(f) for f in figures if len(set(f)) > 1)
        lines.append(f"{texts[0]} ({said}{'; figures differ: ' + differ if differ else ''})")
    return lines


def _answer(results: dict[str, Any], out: TextIO) -> None:
    """The answer (with --slo-ttft-p90): each configuration's crossing, its flags, the throughput plateau and
    knee beside it (not capacity), then the one sentence, last."""
    detail = results.get("answer_detail")
    if not results.get("answer") or not detail:
        return
    out.write(f"\nSessions held at p90 return TTFT <= {detail['slo_ttft_p90_s']:g} s (a monotone fit of log p90 "
              "on log sessions over every cell with the evidence; 95 % CI by a paired bootstrap over "
              "replications):\n")
    for cfg, c in detail["configs"].items():
        value = "-" if c["sessions"] is None else f"{c['sessions']:.1f}"
        ci = c.get("sessions_ci")
        ci_text = (f" [{'<' if ci.get('low_is_bound') else ''}{ci['low']:.1f}, "
                   f"{'>' if ci.get('high_is_bound') else ''}{ci['high']:.1f}]") if ci else ""
        if ci and ci.get("no_residuals"):  # bounds from the rungs either side, not a confidence interval
            ci_text = f" (between {ci['low']:g} and {ci['high']:g}: no interval)"
        fit = c.get("fit") or {}
        if c["status"] in ("censored_high", "censored_low") and "bound_95" in fit:  # the bound at 95 %
            b, op = fit["bound_95"], ">=" if c["status"] == "censored_high" else "<"
            ci_text = f" (95 % bound: {op} {b:.1f})" if b is not None else " (no 95 % bound)"
        br = c.get("bracket")
        t = c.get("throughput") or {}
        plateau, knee = t.get("plateau_tokens_per_s_per_gpu"), t.get("knee_sessions")
        reps = c.get("per_replication") or []
        # with K replications the figure is the mean of their crossings, which can lie outside the bracket of
        # the mean curve (the replications bracket it each on their own): say whose bracket it is
        if c["status"] in ("not_enough_evidence", "no data"):
            br, reps = None, []  # the first-miss bracket of p90s short of the evidence: no figure
        where = (f", mean curve between {br[0]} and {br[1]}; replications (their own first-miss crossings, "
                 "for comparison) "
                 + ", ".join(_rep_crossing(v, st) for v, st in zip(reps, c.get("per_replication_status")
                                                                    or ["interpolated"] * len(reps), strict=False))
                 ) if br and len(reps) > 1 else (
                 f", between {br[0]} and {br[1]}" if br else "")
        out.write(f"  {cfg:<13} {value}{ci_text} sessions ({c['status']}{where}); throughput plateau "
                  f"{_s(plateau, 1)} tok/s/GPU at {t.get('plateau_sessions') or '-'} sessions, knee "
                  f"({t.get('knee_rule', '90 % of plateau')}) {'<= ' if t.get('knee_censored') else ''}"
                  f"{_s(knee, 1)} sessions\n")
        for f in c["flags"] + t.get("flags", []):
            out.write(f"    - {f}\n")
    out.write(f"\nAnswer: {results['answer']}\n")


def _rep_crossing(value: float | None, status: str) -> str:
    """One replication's crossing: censored ones as the bound they are."""
    if value is None:
        return "-"
    return {"censored_low": f"<{value:g}", "censored_high": f">={value:g}"}.get(status, f"{value:.1f}")


def _s(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _breakdown_table(rungs: list[dict[str, Any]], out: TextIO) -> None:
    """Each returning turn's TTFT = queue wait (HBM admission) + offload load + prefill (incl. batching)."""
    if not any("ttft_breakdown" in r for r in rungs):
        return
    out.write("\nTTFT of returning turns, broken down (mean s; p90 s in brackets), and what the loads moved "
              "(GB = 10^9 bytes):\n")
    out.write(f"{'config':<13} {'sessions':>8}  {'n':>5}  {'queue wait':<17} {'load':<17} {'prefill':<17} "
              f"{'loading':>7} {'GB/turn':>8} {'load GB/s':>9}\n")
    for r in rungs:
        b = r.get("ttft_breakdown", {}).get("return")
        if not b:
            continue

        def part(name: str, b: dict[str, Any] = b) -> str:
            return f"{_s(b[name]['mean'])} [{_s(b[name]['p90'])}]"

        out.write(f"{r['tiers']:<13} {r['sessions']:>8}  {b['n']:>5}  {part('queue_wait_s'):<17} {part('load_s'):<17} "
                  f"{part('prefill_s'):<17} {b['turns_loading']:>7} {_s(b['load_gb_per_turn']):>8} "
                  f"{_s(b['load_gbps'], 2):>9}\n")


def _io_table(rungs: list[dict[str, Any]], out: TextIO) -> None:
    """Offered vs sustained offload bandwidth and the backlog: is the tier keeping up?"""
    rows = [r for r in rungs if r.get("offload_io_rates")]
    if not rows:
        return
    out.write("\nOffload I/O per rung: offered / sustained GB/s (10^9 bytes/s; load, store), backlog (moves queued: "
              "end, max):\n")
    for r in rows:
        io = r["offload_io_rates"]
        ld, st = io["load"], io["store"]
        clock = r.get("engine_clock") or {}
        out.write(f"  {r['tiers']:<13} {r['sessions']:>5}  load {ld['offered_gbps']:.2f} / {ld['sustained_gbps']:.2f}"
                  f"  store {st['offered_gbps']:.2f} / {st['sustained_gbps']:.2f}  backlog load "
                  f"{ld['backlog_ops_end']}/{ld['backlog_ops_max']} store {st['backlog_ops_end']}/{st['backlog_ops_max']}"
                  f"  engine late mean {_s(clock.get('late_ms_mean'), 2)} ms\n")


def _lat(block: dict[str, Any] | None) -> str:
    if not block or not block.get("ops"):
        return "-"
    return "/".join(_s(block.get(k), 2) for k in ("p50_ms", "p95_ms", "p99_ms"))


def _storage_table(rungs: list[dict[str, Any]], out: TextIO) -> None:
    """Which storage the offload tiers were on (path, filesystem, I/O mode, shaping) and their load and store
    latency percentiles per rung (ms per block move; GiB = 2^30 bytes)."""
    rows = [r for r in rungs if (r.get("offload_tier") or {}).get("tiers")]
    if not rows:
        return
    kinds: dict[str, list[str]] = {}  # what the tier was -> the paths it was at (a temp dir per rung without --cache-dir)
    for r in rows:
        st = r["offload_tier"].get("storage")
        if st:
            shaping = (st.get("shaping") or {}).get("described")
            kind = (f"{st['filesystem']}{' (RAM)' if st.get('ram_backed') else ''}, {st['io_mode']} I/O"
                    + (f", shaped: {shaping}" if shaping else ", unshaped"))
            kinds.setdefault(kind, []).append(st["path"])
    out.write("\n")
    for kind, paths in kinds.items():
        more = f" (and {len(paths) - 1} more: one directory per rung)" if len(set(paths)) > 1 else ""
        out.write(f"Storage tier: {kind}, at {paths[0]}{more}\n")
    shaped = {(tier, sh.get("described")) for r in rows for tier, sh in (r["offload_tier"].get("shaping") or {}).items()
              if tier != "storage"}  # the storage tier's shaping is on its line above
    for tier, described in sorted(shaped, key=str):
        out.write(f"{'DRAM' if tier == 'cpu' else tier} tier ({tier}): shaped: {described}\n")
    out.write("Offload tier latency per block move, ms p50/p95/p99 (load = read from the tier, store = write into it):\n")
    for r in rows:
        parts = [f"{t['tier']} load {_lat(t['latency_ms']['load'])} store {_lat(t['latency_ms']['store'])} "
                 f"(peak {t['peak_gib']:.2f} GiB{', ' + str(t['evictions']) + ' evictions' if t['evictions'] else ''})"
                 for t in r["offload_tier"]["tiers"]]
        out.write(f"  {r['tiers']:<13} {r['sessions']:>5}  {'; '.join(parts)}\n")


def _capacity_text(c: dict[str, Any]) -> str:
    """A configuration's effective capacity for a one-line summary: never a figure no rung measured."""
    if c.get("no_completed_turns") or c.get("effective_capacity_sessions") is None:
        return "none measured (no rung completed a turn)"
    return str(c["effective_capacity_sessions"])


def grid_cell_line(cell: dict[str, Any]) -> str:
    """One grid cell in a line: its answer where one was asked for, else each configuration's capacity."""
    p, summary = cell["parameters"], cell.get("summary") or {}
    answer = cell.get("answer") or summary.get("answer")
    if isinstance(answer, dict):
        answer = answer.get("sentence") or answer.get("text")
    if not answer:
        caps = "; ".join(f"{k}: {_capacity_text(c)}" for k, c in (summary.get("configs") or {}).items())
        answer = f"effective capacity (sessions): {caps or '-'}"
    return f"  {p['model']} on {p['num_gpus']} x {p['gpu']}: {answer}"


def print_grid(cells: list[dict[str, Any]], method: str, out: TextIO) -> None:
    """A `--models` / `--gpus` grid: every cell's table under its name, then one line per cell."""
    for cell in cells:
        p = cell["parameters"]
        out.write(f"\n=== {p['model']} on {p['num_gpus']} x {p['gpu']} ===\n")
        if cell.get("summary"):
            print_table({"method": method, **cell}, out)
        else:
            print_partial(cell, out, f"{p['model']} on {p['gpu']}")
    out.write("\nGrid (one answer per model and GPU):\n" + "\n".join(grid_cell_line(c) for c in cells) + "\n")


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
