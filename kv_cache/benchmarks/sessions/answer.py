"""The capacity answer: how many sessions a configuration holds at the SLO, in one sentence, with intervals.

With ``--slo-ttft-p90 S`` the ladder's coarse rungs bracket each configuration's SLO crossing (the last rung
whose p90 TTFT of returning turns meets S, the first one that misses it). ``next_refinement`` bisects that
bracket on session counts (a bounded number of extra rungs, until it is at most max(1, 10 %) wide), and
``crossing`` interpolates between the two neighbours on a log-log scale (log p90 linear in log sessions,
the shape of a queue's latency climbing with load) to the session count where p90 = S.

The crossing is computed per replication (replication k of every rung and every configuration runs with
the same seed, so the same sessions): its estimate and 95 % interval are the t-interval across the K
replications' crossings, and the ratio between configurations is the paired ratio of the replications'
crossings (geometric mean, t-interval on the logs). The throughput plateau (the rungs whose interval
overlaps the peak's) and its knee (the session count where the curve first reaches 90 % of the plateau,
interpolated) are reported beside the answer, never called capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kv_cache.benchmarks.sessions.rung_results import mean_of
from kv_cache.metrics.block_bootstrap import paired_ratio_ci

__all__ = ["DEFAULT_ANSWER_REPLICATIONS", "MAX_REFINEMENTS", "answer", "crossing", "next_refinement", "plateau_and_knee", "refine_ladder"]

MAX_REFINEMENTS = 3  # extra rungs per configuration
BRACKET_FRACTION = 0.10  # a bracket at most max(1, 10 % of its lower end) wide is narrow enough
KNEE_FRACTION = 0.90
DEFAULT_ANSWER_REPLICATIONS = 3  # K when an answer is asked for and --replications is not given


def _p90_ci(cell: dict[str, Any]) -> dict[str, Any] | None:
    return cell["ttft"]["return"].get("p90_s")


def _p90s(cell: dict[str, Any]) -> list[float | None]:
    """The cell's p90 return TTFT per replication (one value without replications)."""
    reps = cell.get("replications")
    if reps:
        return list(reps["ttft_return_p90_s"])
    p = _p90_ci(cell)
    return [p["estimate"] if p else None]


def _curve(cells: list[dict[str, Any]], rep: int | None = None) -> list[tuple[int, float]]:
    """(sessions, p90) sorted by sessions; replication `rep`, or the cells' p90 (mean of replications). A
    rung without a returning turn's p90 counts as a miss (inf: its turns took longer than it could measure)
    when some rung has one; with none anywhere the curve is empty (no data)."""
    pts = []
    for c in cells:
        if rep is None:
            p = _p90_ci(c)
            value = p["estimate"] if p else None
        else:
            vals = _p90s(c)
            value = vals[rep] if rep < len(vals) else None
        pts.append((c["sessions"], float(value) if value is not None and value > 0 else math.inf))
    return sorted(pts) if any(math.isfinite(p) for _, p in pts) else []


def _bracket(points: list[tuple[int, float]], slo: float) -> tuple[int, int] | None:
    """(last n meeting the SLO, first n missing it) at the first miss; None when censored either way."""
    for i, (n, p) in enumerate(points):
        if p > slo:
            return (points[i - 1][0], n) if i > 0 else None
    return None


def crossing(points: list[tuple[int, float]], slo: float) -> tuple[float, str]:
    """Session count where p90 = slo, log-log interpolated between the bracketing rungs, and its status:
    "interpolated", "censored_high" (every rung meets it: value = the top rung) or "censored_low" (none
    does: value = the lowest rung); "no data" (value nan) without any rung with returning turns."""
    if not points:
        return math.nan, "no data"
    if points[0][1] > slo:
        return float(points[0][0]), "censored_low"
    br = _bracket(points, slo)
    if br is None:
        return float(points[-1][0]), "censored_high"
    lo, hi = br
    p_lo, p_hi = dict(points)[lo], dict(points)[hi]
    if p_lo == slo or math.isinf(p_hi):  # no p90 above: the last rung meeting the SLO, conservatively
        return float(lo), "interpolated"
    frac = (math.log(slo) - math.log(p_lo)) / (math.log(p_hi) - math.log(p_lo))
    return math.exp(math.log(lo) + frac * (math.log(hi) - math.log(lo))), "interpolated"


def next_refinement(cells: list[dict[str, Any]], slo: float) -> int | None:
    """The session count to run next for this configuration: the middle of its SLO bracket, or None when
    the crossing is censored or the bracket is at most max(1, 10 %) wide (or its middle already ran)."""
    br = _bracket(_curve(cells), slo)
    if br is None:
        return None
    lo, hi = br
    if hi - lo <= max(1, BRACKET_FRACTION * lo):
        return None
    mid = (lo + hi) // 2
    return None if mid in {c["sessions"] for c in cells} else mid


def refine_ladder(rungs: list[dict[str, Any]], tiers: list[str], slo: float,
                  run_cell: Callable[[str, int], dict[str, Any]], max_extra: int = MAX_REFINEMENTS) -> list[int]:
    """Bisect each configuration's SLO bracket with up to `max_extra` extra rungs (run_cell(tier, n) runs one
    cell and appends it to `rungs`), then sort `rungs` by configuration and sessions. Returns the session
    counts added."""
    added = []
    for tier in tiers:
        for _ in range(max_extra):
            n = next_refinement([r for r in rungs if r["tiers"] == tier], slo)
            if n is None:
                break
            run_cell(tier, n)
            added.append(n)
    order = {t: i for i, t in enumerate(tiers)}
    rungs.sort(key=lambda r: (order.get(r["tiers"], len(order)), r["sessions"]))
    return added


def plateau_and_knee(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput plateau (mean of the rungs whose interval overlaps the peak's) and knee (first session
    count reaching 90 % of it, linear between rungs), with a flag when the peak is not significant."""
    pts = sorted((c["sessions"], c["throughput_tokens_per_s_per_gpu"]) for c in cells)
    pts = [(n, t) for n, t in pts if t and t.get("estimate") is not None]
    if not pts:
        return {"plateau_tokens_per_s_per_gpu": None, "plateau_sessions": [], "knee_sessions": None, "flags": []}
    peak_n, peak = max(pts, key=lambda p: p[1]["estimate"])
    lo = peak["low"] if peak.get("low") is not None else peak["estimate"]
    on = [(n, t) for n, t in pts if (t.get("high") if t.get("high") is not None else t["estimate"]) >= lo]
    plateau = sum(t["estimate"] for _, t in on) / len(on)
    target = KNEE_FRACTION * plateau
    knee, censored = None, False
    for i, (n, t) in enumerate(pts):
        if t["estimate"] >= target:
            if i == 0:
                knee, censored = float(n), True
            else:
                n0, y0 = pts[i - 1][0], pts[i - 1][1]["estimate"]
                knee = n0 + (target - y0) / (t["estimate"] - y0) * (n - n0)
            break
    flags = []
    others = [n for n, _ in on if n != peak_n]
    if others:
        flags.append(f"throughput peak at {peak_n} sessions not significant: {', '.join(map(str, others))} "
                     "within its interval (a plateau, not a peak)")
    if censored:
        flags.append(f"knee at or below the lowest rung ({pts[0][0]} sessions): censored, start the ladder lower")
    return {"plateau_tokens_per_s_per_gpu": plateau, "plateau_sessions": [n for n, _ in on],
            "peak_sessions": peak_n, "knee_sessions": knee, "knee_censored": censored,
            "knee_rule": f"first session count reaching {KNEE_FRACTION:.0%} of the plateau (linear between rungs)",
            "flags": flags}


def _config_answer(cells: list[dict[str, Any]], slo: float) -> dict[str, Any]:
    """One configuration: its crossing (all K replications), bracket, flags, plateau and knee."""
    k = max(len(_p90s(c)) for c in cells)
    value, status = crossing(_curve(cells), slo)
    per_rep = [crossing(_curve(cells, i), slo) for i in range(k)] if k > 1 else [(value, status)]
    reps_ok = [v for v, s in per_rep if s == "interpolated"]
    ci = None
    if status == "interpolated" and len(reps_ok) == k and k > 1:
        ci = mean_of(reps_ok)
        ci["method"] = f"t-interval across {k} replications' interpolated crossings"
        value = ci["estimate"]  # the figure its interval belongs to (the mean curve's crossing may differ)
    flags = []
    top, bottom = max(c["sessions"] for c in cells), min(c["sessions"] for c in cells)
    if status == "censored_high":
        flags.append(f"censored: the SLO is still met at the top rung ({top} sessions); extend --ladder")
    elif status == "censored_low":
        flags.append(f"censored: no rung meets the SLO, not even the lowest ({bottom} sessions); start --ladder lower")
        if not _p90_ci(min(cells, key=lambda c: c["sessions"])):
            flags.append(f"no returning turn completed at the lowest rung ({bottom} sessions): it counts as a miss, "
                         "but the window may simply be too short to see one; use a longer --window")
    elif status == "no data":
        flags.append("no rung measured a returning turn: the answer needs them; use a --pace whose pauses exceed "
                     "sessions.human_threshold_s and a longer --window")
    elif status == "interpolated" and len(reps_ok) < k:
        flags.append(f"crossing not significant: {k - len(reps_ok)} of {k} replications do not cross between rungs")
    if status == "interpolated" and k == 1:
        flags.append("one replication per rung: no interval on the crossing nor on the ratio "
                     "(--replications 3 or more gives them)")
    br = _bracket(_curve(cells), slo)
    lower_bound = False
    if br is not None:
        by_n = {c["sessions"]: _p90_ci(c) for c in cells}
        met, miss = by_n.get(br[0]), by_n.get(br[1])
        lower_bound = not miss
        if not miss:
            flags.append(f"no returning turn completed at {br[1]} sessions: the crossing is placed at {br[0]} "
                         "sessions, the last rung meeting the SLO (a lower bound)")
        if met and met.get("high") is not None and met["high"] > slo:
            flags.append(f"SLO met only within its interval at {br[0]} sessions: p90 {met['estimate']:.2f} "
                         f"[{met['low']:.2f}, {met['high']:.2f}] s against {slo:g} s")
        if miss and miss.get("low") is not None and miss["low"] <= slo:
            flags.append(f"crossing not significant at {br[1]} sessions: p90 {miss['estimate']:.2f} "
                         f"[{miss['low']:.2f}, {miss['high']:.2f}] s reaches down to the SLO")
    return {"sessions": _num(value), "sessions_ci": ci, "status": status, "bracket": list(br) if br else None,
            "lower_bound": lower_bound,
            "per_replication": [_num(v) for v, _ in per_rep], "per_replication_status": [s for _, s in per_rep],
            "flags": flags, "throughput": plateau_and_knee(cells)}


def _num(x: float) -> float | None:
    """A JSON-ready number: None for nan (no value)."""
    return x if math.isfinite(x) else None


def _fmt(c: dict[str, Any]) -> str:
    if c["status"] == "censored_high":
        return f"at least {c['sessions']:g}"
    if c.get("lower_bound"):  # no returning turn measured above the bracket: the rung below, a lower bound
        return f"at least {c['sessions']:.1f}"
    if c["status"] == "censored_low":
        return f"fewer than {c['sessions']:g}"
    if c["status"] == "no data":
        return "an unknown number of"
    ci = c["sessions_ci"]
    return f"{c['sessions']:.1f} [{ci['low']:.1f}, {ci['high']:.1f}]" if ci else f"{c['sessions']:.1f}"


# a's status, b's status -> what a / b is: "at least N" over anything below, or anything over "fewer than N",
# is a lower bound; the other way round an upper one (a / b with a >= top and b < bottom is > top / bottom)
_BOUNDS = {("censored_high", "interpolated"): "lower", ("interpolated", "censored_low"): "lower",
           ("censored_high", "censored_low"): "lower",
           ("censored_low", "interpolated"): "upper", ("interpolated", "censored_high"): "upper",
           ("censored_low", "censored_high"): "upper"}


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """a's sessions over b's: paired across replications; a bound when one side is censored (or only a lower
    bound, as "at least" at the top); else None."""
    sa, sb = (("censored_high" if c.get("lower_bound") else c["status"]) for c in (a, b))
    if sa != "interpolated" or sb != "interpolated":
        bound = _BOUNDS.get((sa, sb))
        if bound is None or not a["sessions"] or not b["sessions"]:
            return None
        return {"estimate": a["sessions"] / b["sessions"], "low": None, "high": None, "n": 1, "bound": bound,
                "method": f"a {bound} bound: one configuration's crossing is censored by the ladder"}
    if a["sessions_ci"] and b["sessions_ci"]:
        return paired_ratio_ci(a["per_replication"], b["per_replication"]).to_dict()
    k = max(len(a["per_replication"]), len(b["per_replication"]))
    why = ("no replications: no interval" if k < 2 else
           "no interval: some replications' crossings are censored by the ladder (per_replication_status)")
    return {"estimate": a["sessions"] / b["sessions"], "low": None, "high": None, "n": 1,
            "method": f"ratio of single crossings ({why})"}


def _fmt_ratio(r: dict[str, Any] | None) -> str:
    if r is None:
        return "x? (censored)"
    if r.get("bound"):
        return f"{'at least' if r['bound'] == 'lower' else 'at most'} x{r['estimate']:.2f} (censored)"
    if r.get("low") is None:
        return f"x{r['estimate']:.2f}"
    return f"x{r['estimate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"


def answer(rungs: list[dict[str, Any]], slo: float, gpus: int, gpu_name: str) -> tuple[str, dict[str, Any]]:
    """The one-sentence answer and its structured detail (per configuration and each ratio to the baseline:
    `none` when it ran, else the first configuration)."""
    configs = list(dict.fromkeys(r["tiers"] for r in rungs))
    per = {cfg: _config_answer([r for r in rungs if r["tiers"] == cfg], slo) for cfg in configs}
    base = "none" if "none" in configs else configs[0]
    others = [c for c in configs if c != base]
    ratios = {c: _ratio(per[c], per[base]) for c in others}
    for c, r in ratios.items():
        if r and r.get("low") is not None and r["low"] <= 1.0 <= r["high"]:
            per[c]["flags"].append(f"ratio to {base} not significant: its interval contains 1")
    slo_text = f"at p90 return TTFT <= {slo:g} s"
    base_text = "without a tier" if base == "none" else f"with {base}"
    head = f"{gpus} x {gpu_name.upper()} hold"
    if not others:
        sentence = f"{base_text}, {head} {_fmt(per[base])} sessions {slo_text}"
    else:
        parts = [f"with {c}, {head} {_fmt(per[c])} sessions {slo_text}" if i == 0 else f"with {c}, {_fmt(per[c])}"
                 for i, c in enumerate(others)]
        tail = ", ".join(_fmt_ratio(ratios[c]) + (f" ({c})" if len(others) > 1 else "") for c in others)
        sentence = f"{'; '.join(parts)}; {base_text}, {_fmt(per[base])}: {tail}"
    detail = {"slo_ttft_p90_s": slo, "baseline": base, "configs": per,
              "ratios": [{"config": c, "baseline": base, "sessions_ratio": ratios[c]} for c in others],
              "method": __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()}
    return sentence, detail
