"""The ladder's summary: replications merged per cell, the work-equivalence control, effective capacity
(SLO on returning turns, or the throughput peak), ratios with their intervals, and the warnings.

Capacity with `slo_ttft_p90_s`: the largest session count whose p90 TTFT of returning turns meets the SLO;
the throughput peak is reported beside it. A peak (or an SLO capacity) at the ladder's top rung is censored:
the true value may lie beyond the ladder. With K > 1 replications per cell, every figure also gets a
t-interval across the replications (the per-replication capacities, peaks and their ratios).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from kv_cache.benchmarks.sessions.rung_results import mean_of
from kv_cache.metrics.block_bootstrap import paired_ratio_ci
from kv_cache.metrics.stats import CI, nonnegative, ratio_ci

__all__ = ["AUTO_MAX_RUNGS", "CENSORED", "auto_next_rung", "flag_work_equivalence", "merge_replications", "rung_warnings", "slo_capacity", "summarize",
           "unfinished_rung"]

CENSORED = "censored: extend the ladder"


AUTO_MAX_RUNGS = 12
AUTO_PAST_PEAK = 2  # rungs below the best one that end the climb


def auto_next_rung(history: list[tuple[int, float]], start: int, max_rungs: int = AUTO_MAX_RUNGS) -> int | None:
    """`--ladder auto`: the next session count to run after `history` ((sessions, throughput) so far), or None
    when the throughput has peaked (the best rung is followed by AUTO_PAST_PEAK lower ones) or the climb hit
    `max_rungs` (then the top rung may be the peak: the summary flags it as censored). Doubles each time."""
    if not history:
        return start
    if len(history) >= max_rungs:
        return None
    best = max(range(len(history)), key=lambda i: history[i][1])
    if len(history) - 1 - best >= AUTO_PAST_PEAK:
        return None
    return history[-1][0] * 2


def _p90_return(r: dict[str, Any]) -> float | None:
    p = r["ttft"]["return"]["p90_s"]
    return p["estimate"] if p else None


def _merge_ttft(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per turn class and percentile: the mean of the K replications' pooled percentiles with the t-interval
    across them; n = the turns of all K."""
    out: dict[str, Any] = {}
    for cls, first in reps[0]["ttft"].items():
        out[cls] = {"n": sum(r["ttft"].get(cls, {}).get("n", 0) for r in reps)}
        for key in first:
            if key == "n":
                continue
            values = [r["ttft"][cls][key]["estimate"] for r in reps
                      if (r["ttft"].get(cls) or {}).get(key) and r["ttft"][cls][key].get("estimate") is not None]
            if not values:
                out[cls][key] = None
                continue
            ci = mean_of(values)
            ci["method"] = f"mean of {len(values)} replications' pooled percentiles, t-interval across them"
            out[cls][key] = ci
    return out


def _merge_mean_ci(cis: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Per-turn means of K replications as one: weighted by their n, standard errors combined."""
    have = [c for c in cis if c and c.get("estimate") is not None and c.get("n")]
    if not have:
        return None
    total = sum(c["n"] for c in have)
    est = sum(c["estimate"] * c["n"] for c in have) / total
    var = sum((c["n"] / total) ** 2 * ((c["high"] - c["low"]) / 2 / 1.96) ** 2 for c in have
              if c.get("high") is not None and c.get("low") is not None)
    half = 1.96 * math.sqrt(var)
    return {"estimate": est, "low": est - half, "high": est + half, "n": total,
            "method": f"{len(have)} replications pooled: n-weighted mean, standard errors combined",
            "confidence": have[0].get("confidence", 0.95)}


def _merge_work(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The work-control inputs of all K replications: counts summed, per-turn means n-weighted."""
    works = [r["work"] for r in reps]
    w = dict(works[0])
    for key in ("turns_offered", "turns_completed"):
        if key in w:
            w[key] = sum(x.get(key, 0) for x in works)
    for key, count in (("mean_new_tokens_offered", "turns_offered"), ("mean_new_tokens_completed", "turns_completed"),
                       ("mean_output_tokens_completed", "turns_completed")):
        if key in w:
            n = sum(x.get(count, 0) for x in works)
            w[key] = sum(x.get(key, 0.0) * x.get(count, 0) for x in works) / n if n else 0.0
    for key in ("new_tokens_per_turn_ci", "context_tokens_per_turn_ci", "output_tokens_per_turn_ci"):
        if key in w:
            w[key] = _merge_mean_ci([x.get(key) for x in works])
    return w


def merge_replications(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell from K replications, every reported figure from all K: throughput and TTFT percentiles as the
    t-interval across the replications, completed turns and the work control summed over them; replication
    0's own figures kept as `*_within_run`, the values per replication in `replications`."""
    cell = reps[0]
    if len(reps) < 2:
        return cell
    thr = [r["throughput_tokens_per_s_per_gpu"]["estimate"] for r in reps]
    p90 = [_p90_return(r) for r in reps]
    p90_ok = [x for x in p90 if x is not None]
    cell = dict(cell)
    cell["throughput_within_run_tokens_per_s_per_gpu"] = cell["throughput_tokens_per_s_per_gpu"]
    cell["throughput_tokens_per_s_per_gpu"] = mean_of(thr)
    cell["ttft_within_run"] = cell["ttft"]
    cell["ttft"] = _merge_ttft(reps)
    cell["work_within_run"] = cell["work"]
    cell["work"] = _merge_work(reps)
    cell["completed_turns"] = sum(r["completed_turns"] for r in reps)
    cell["replications"] = {
        "k": len(reps),
        "seeds": [r["seed"] for r in reps],
        "throughput_tokens_per_s_per_gpu": thr,
        "completed_turns": [r["completed_turns"] for r in reps],
        "ttft_return_p90_s": p90,
        "ttft_return_n": [r["ttft"]["return"]["n"] for r in reps],
        "ttft_return_p90_ci": mean_of(p90_ok) if p90_ok else None,
        "method": "K independent seeded replications; t-interval across their values, clamped at 0; "
                  "completed turns and the work control summed over the K",
    }
    cell["flags"] = _merge_flags(reps)
    return cell


_FEW = re.compile(r"^TTFT (\w+): n = (\d+) < (\d+), percentiles unreliable$")


def _merge_flags(reps: list[dict[str, Any]]) -> list[str]:
    """The replications' flags once each; a turn class's "n < 20" of several replications as one line with
    each replication's n (the merged percentile is the mean of theirs, so each one's n matters)."""
    out: dict[str, None] = {}
    few: dict[str, tuple[str, dict[int, str]]] = {}
    for k, r in enumerate(reps):
        for f in r.get("flags", []):
            m = _FEW.match(f)
            if m is None:
                out.setdefault(f)
                continue
            key = f"TTFT {m[1]}"
            few.setdefault(key, (m[3], {}))[1][k] = m[2]
            out.setdefault(key)
    lines = []
    for f in out:
        if f in few:
            limit, ns = few[f]
            each = ", ".join(ns.get(k, f">={limit}") for k in range(len(reps)))
            lines.append(f"{f}: n = {each} in the {len(reps)} replications, some < {limit}: percentiles unreliable")
        else:
            lines.append(f)
    return lines


def flag_work_equivalence(rungs: list[dict[str, Any]], tolerance: float = 0.10) -> None:
    """At each session count, configs must have done comparable work per turn, or a config that "looks
    faster" may simply have done less. A rung is flagged when its mean new, context or output tokens
    per completed turn differs from the median config's by more than `tolerance` AND their 95 % CIs do not
    overlap (so sampling noise of a short window is not flagged), or when it completed no turn."""
    by_sessions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rungs:
        by_sessions[r["sessions"]].append(r)
    for group in by_sessions.values():
        done = sorted((r for r in group if r["work"]["turns_completed"]),
                      key=lambda r: r["work"]["mean_new_tokens_completed"])
        ref = done[len(done) // 2]["work"] if done else None
        for r in group:
            w = r["work"]
            reasons = []
            if w["turns_completed"] == 0:
                reasons.append("no turn completed in the window")
            elif ref is not None and w is not ref:
                for key, what in (("new_tokens_per_turn_ci", "new tokens"),
                                  ("context_tokens_per_turn_ci", "context tokens"),
                                  ("output_tokens_per_turn_ci", "output tokens")):
                    a, b = w.get(key), ref.get(key)
                    if not a or not b:
                        continue
                    differs = abs(a["estimate"] - b["estimate"]) > tolerance * b["estimate"]
                    if differs and not CI(**a).overlaps(CI(**b)):
                        reasons.append(f"{what} per completed turn {a['estimate']:.0f} [{a['low']:.0f}, "
                                       f"{a['high']:.0f}] vs {b['estimate']:.0f} [{b['low']:.0f}, {b['high']:.0f}]"
                                       " at this rung")
            w["flagged"] = bool(reasons)
            w["flag_reasons"] = reasons


def slo_capacity(points: list[tuple[int, float | None]], slo_s: float) -> int:
    """Largest session count whose p90 return TTFT meets the SLO (0 when none does or none was measured)."""
    ok = [n for n, p90 in points if p90 is not None and p90 <= slo_s]
    return max(ok) if ok else 0


def _per_rep(mine: list[dict[str, Any]], slo: float | None) -> tuple[list[float], list[float], list[float]]:
    """Per replication: SLO capacity, throughput-peak sessions, peak throughput (empty without replications)."""
    k = min((r.get("replications", {}).get("k", 1) for r in mine), default=1)
    if k < 2:
        return [], [], []
    caps, peaks, peak_thr = [], [], []
    for i in range(k):
        pts = [(r["sessions"], r["replications"]["throughput_tokens_per_s_per_gpu"][i]) for r in mine]
        n_peak, thr = max(pts, key=lambda p: p[1])
        peaks.append(float(n_peak))
        peak_thr.append(thr)
        if slo is not None:
            caps.append(float(slo_capacity([(r["sessions"], r["replications"]["ttft_return_p90_s"][i])
                                            for r in mine], slo)))
    return caps, peaks, peak_thr


def _config_summary(mine: list[dict[str, Any]], slo: float | None, top: int) -> dict[str, Any]:
    peak = max(mine, key=lambda r: r["throughput_tokens_per_s_per_gpu"]["estimate"])
    caps, peaks, _ = _per_rep(mine, slo)
    c: dict[str, Any] = {
        "curve": [{"sessions": r["sessions"], "throughput_tokens_per_s_per_gpu": r["throughput_tokens_per_s_per_gpu"]}
                  for r in mine],
        "effective_capacity_sessions": peak["sessions"],
        "capacity_basis": "throughput peak",
        "peak_throughput_sessions": peak["sessions"],
        "peak_throughput_tokens_per_s_per_gpu": peak["throughput_tokens_per_s_per_gpu"],
        "peak_throughput_sessions_ci": mean_of(peaks) if peaks else None,
        "flags": [],
    }
    if not any(r["completed_turns"] for r in mine):
        c["flags"].append("no rung completed a turn: no capacity or peak can be read from this ladder "
                          "(the rungs' flags say why)")
        c["no_completed_turns"] = True
    if peak["sessions"] == top and len(mine) > 1:
        c["flags"].append(f"throughput peak at the top rung ({top} sessions): {CENSORED}")
    if slo is not None:
        cap = slo_capacity([(r["sessions"], _p90_return(r)) for r in mine], slo)
        c.update(effective_capacity_sessions=cap, capacity_basis=f"largest sessions with p90 return TTFT <= {slo:g} s",
                 slo_capacity_sessions=cap, slo_capacity_sessions_ci=mean_of(caps) if caps else None)
        if cap == top:
            c["flags"].append(f"the SLO is still met at the top rung ({top} sessions): {CENSORED}")
        if cap == 0:
            c["flags"].append("no rung met the SLO (or none had returning turns)")
    if c.get("no_completed_turns"):  # nothing measured: no figure, not the lowest rung or 0 as one
        c.update(effective_capacity_sessions=None, peak_throughput_sessions=None,
                 capacity_basis="none: no rung completed a turn")
        if slo is not None:
            c["slo_capacity_sessions"] = None
    return c


def _ratio_ci(rungs_by: dict[tuple[str, int], dict[str, Any]], raw: dict[tuple[str, int], list[float]],
              a: tuple[str, int], b: tuple[str, int]) -> CI:
    """Throughput ratio of cell a to cell b: with replications on both (paired by seed: replication k of every
    cell replays the same sessions) the paired ratio of the replications' means; else the delta-method
    ratio of the sub-window rates of one run."""
    ra, rb = rungs_by.get(a, {}).get("replications"), rungs_by.get(b, {}).get("replications")
    if ra and rb and ra.get("k") == rb.get("k") and len(raw[a]) == len(raw[b]) >= 2:
        return paired_ratio_ci(raw[a], raw[b])
    return ratio_ci(raw[a], raw[b])


def summarize(rungs: list[dict[str, Any]], raw: dict[tuple[str, int], list[float]],
              slo_ttft_p90_s: float | None = None) -> dict[str, Any]:
    """Curve per config, effective capacity, throughput peak, ratios with CIs, censoring flags.

    `raw[(config, sessions)]`: that cell's throughput samples for the ratio CIs (sub-window rates of one
    run, or the replications' means).
    """
    configs = list(dict.fromkeys(r["tiers"] for r in rungs))
    top = max((r["sessions"] for r in rungs), default=0)
    out: dict[str, Any] = {"configs": {}, "ratios": [], "slo_ttft_p90_s": slo_ttft_p90_s}
    for cfg in configs:
        out["configs"][cfg] = _config_summary([r for r in rungs if r["tiers"] == cfg], slo_ttft_p90_s, top)
    base = "none" if "none" in configs else configs[0]
    by_rung = {(r["tiers"], r["sessions"]): r for r in rungs}
    for cfg in configs:
        if cfg == base:
            continue
        a, b = out["configs"][cfg], out["configs"][base]
        ci = (_ratio_ci(by_rung, raw, (cfg, a["peak_throughput_sessions"]), (base, b["peak_throughput_sessions"]))
              if a["peak_throughput_sessions"] is not None and b["peak_throughput_sessions"] is not None
              else CI(math.nan, math.nan, math.nan, 0, "no ratio: a configuration completed no turn"))
        cap_a, cap_b = a["effective_capacity_sessions"], b["effective_capacity_sessions"]
        entry = {
            "config": cfg,
            "baseline": base,
            "effective_capacity_ratio": cap_a / cap_b if cap_a is not None and cap_b else math.nan,
            "peak_throughput_ratio": nonnegative(ci).to_dict(),
            "censored": bool(a["flags"] or b["flags"]),
        }
        caps_a, _, _ = _per_rep([r for r in rungs if r["tiers"] == cfg], slo_ttft_p90_s)
        caps_b, _, _ = _per_rep([r for r in rungs if r["tiers"] == base], slo_ttft_p90_s)
        if caps_a and caps_b:
            paired = len(caps_a) == len(caps_b) and min(caps_a + caps_b) > 0
            entry["effective_capacity_ratio_ci"] = (paired_ratio_ci(caps_a, caps_b) if paired
                                                    else ratio_ci(caps_a, caps_b)).to_dict()
        if not cap_b or a.get("no_completed_turns") or b.get("no_completed_turns"):
            entry["effective_capacity_ratio"] = None
        out["ratios"].append(entry)
        for (c, n), r in by_rung.items():
            if c != cfg or (base, n) not in by_rung:
                continue
            done = by_rung[(base, n)]["completed_turns"]
            out.setdefault("ratios_by_rung", []).append({
                "config": cfg, "baseline": base, "sessions": n,
                "throughput_ratio": nonnegative(_ratio_ci(by_rung, raw, (cfg, n), (base, n))).to_dict(),
                "completed_turns_ratio": r["completed_turns"] / done if done else None,
            })
    return out


def unfinished_rung(tier: str, n: int, replications: int, reps: list[dict[str, Any]], window_s: float,
                    pilot: dict[str, Any] | None) -> dict[str, Any]:
    """The document's `unfinished_rung`: the rung an interrupt stopped in, and what of it was lost."""
    return {"tiers": tier, "sessions": n, "replications": replications, "replications_finished": len(reps),
            "window_s": window_s, "evidence_pilot": pilot,
            "ttft_return_n": [int(r["ttft"]["return"].get("n") or 0) for r in reps],
            "ttft_return_p90_s": [(r["ttft"]["return"].get("p90_s") or {}).get("estimate") for r in reps],
            "note": "interrupted inside this rung: its finished replications (and a pilot, left out) are not a "
                    "cell and are not in `rungs`"}


def rung_warnings(rungs: list[dict[str, Any]], summary: dict[str, Any] | None) -> list[str]:
    """Every cell's and config's flags, one line each, for the results' `warnings`."""
    out = [f"{r['tiers']} @ {r['sessions']} sessions: {f}" for r in rungs for f in r.get("flags", [])]
    out += [f"{r['tiers']} @ {r['sessions']} sessions: work differs: {x}"
            for r in rungs for x in r["work"].get("flag_reasons", [])]
    if summary:
        out += [f"{cfg}: {f}" for cfg, c in summary["configs"].items() for f in c["flags"]]
    return out
