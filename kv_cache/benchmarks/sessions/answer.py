"""The capacity answer: how many sessions a configuration holds at the SLO, in one sentence, with intervals.

With ``--slo-ttft-p90 S`` the ladder's coarse rungs bracket each configuration's SLO crossing (the last rung
whose p90 TTFT of returning turns meets S, the first one that misses it). ``next_refinement`` bisects that
bracket on session counts (a bounded number of extra rungs, until it is at most max(1, 10 %) wide).

The figure comes from every cell, not from the bracket: ``kv_cache.metrics.slo_fit.estimate`` fits log p90
on log sessions over every (rung, replication) with the evidence (>= 36 returning turns per rung, the
binomial interval of a p90; >= 10 in every replication), weighted by their returning turns, with an isotonic
(monotone) regression and a monotone cubic between its blocks; the crossing is where the fit reaches S, and
it is censored only when the fit stays on one side of S over the whole ladder (then a bound, saying why).
Its 95 % interval is a residual bootstrap whose draws every configuration shares (replication k of every
configuration replays the same sessions), so the ratio between configurations is paired. When the fit
passes through every counted cell (one replication per rung on a monotone curve) there is no residual to
redraw: the counted rungs either side bound the crossing, "(between 4 and 8: no interval)", and the ratio
likewise. Without the evidence the sentence says "not enough evidence", the turns per cell and the --window
that would give enough, and gives no figure, nor a first-miss bracket or a flag on it. Each replication's own first-miss crossing is kept beside it for comparison.
The throughput plateau (the rungs whose interval overlaps the peak's) and its knee (the session count
where the curve first reaches 90 % of the plateau, interpolated) are reported beside the answer, never
called capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from kv_cache.metrics.slo_fit import (
    MIN_CELL_TURNS,
    MIN_RUNG_TURNS,
    Cell,
    Crossing,
    estimate,
    rung_has_evidence,
    turns_needed_per_replication,
)

__all__ = ["MAX_REFINEMENTS", "answer", "crossing", "next_refinement", "plateau_and_knee", "refine_ladder"]

MAX_REFINEMENTS = 3  # extra rungs per configuration
BRACKET_FRACTION = 0.10  # a bracket at most max(1, 10 % of its lower end) wide is narrow enough
KNEE_FRACTION = 0.90


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
    if p_lo == slo or math.isinf(p_hi) or lo == hi or p_lo == p_hi:  # no p90 above (or one rung twice): the
        # last rung meeting the SLO, conservatively
        return float(lo), "interpolated"
    frac = (math.log(slo) - math.log(p_lo)) / (math.log(p_hi) - math.log(p_lo))
    return math.exp(math.log(lo) + frac * (math.log(hi) - math.log(lo))), "interpolated"


def next_refinement(cells: list[dict[str, Any]], slo: float) -> int | None:
    """The session count to run next for this configuration: the middle of its SLO bracket, or None when
    the crossing is censored, the bracket is at most max(1, 10 %) wide (or its middle already ran), or its
    rung meeting the SLO lacks the evidence (slo_fit's rule)."""
    br = _bracket(_curve(cells), slo)
    if br is None:
        return None
    lo, hi = br
    if hi - lo <= max(1, BRACKET_FRACTION * lo):
        return None
    # the met end must have the evidence: a "met" on 1 returning turn beside a rung with none is no bracket
    # (a real --window 3 run bisected [2, 4] so, and ran rung 3 for every configuration: 6 cells, 0 turns)
    k = max(len(_p90s(c)) for c in cells)
    if not rung_has_evidence(fit_cells([c for c in cells if c["sessions"] == lo]), k):
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


def fit_cells(cells: list[dict[str, Any]]) -> list[Cell]:
    """The estimator's cells of one configuration: every (rung, replication) with its p90 return TTFT and the
    returning turns behind it (a merged cell's `replications.ttft_return_n`; in documents from before it was
    recorded, the rung's turns split evenly over the K)."""
    out = []
    for c in cells:
        reps = c.get("replications")
        if reps:
            p90s = list(reps["ttft_return_p90_s"])
            ns = reps.get("ttft_return_n") or [c["ttft"]["return"]["n"] // max(1, len(p90s))] * len(p90s)
        else:
            p = _p90_ci(c)
            p90s, ns = [p["estimate"] if p else None], [c["ttft"]["return"]["n"]]
        out += [Cell(c["sessions"], i, v, int(n) if v is not None else 0)
                for i, (v, n) in enumerate(zip(p90s, ns, strict=False))]
    return out


def _config_answer(cells: list[dict[str, Any]], slo: float, fit: Crossing) -> dict[str, Any]:
    """One configuration: the fit's crossing and interval, the first-miss bracket and each replication's own
    crossing (for comparison), flags, plateau and knee."""
    k = max(len(_p90s(c)) for c in cells)
    mean_value, mean_status = crossing(_curve(cells), slo)
    per_rep = [crossing(_curve(cells, i), slo) for i in range(k)] if k > 1 else [(mean_value, mean_status)]
    flags = []
    status = fit.status
    value = fit.sessions if fit.sessions is not None else math.nan
    ci = None
    if status == "interpolated":
        ci = {"estimate": fit.sessions, "low": fit.low, "high": fit.high, "low_is_bound": fit.low_bound,
              "high_is_bound": fit.high_bound, "n": len(fit_cells(cells)), "confidence": 0.95,
              "method": "isotonic fit of log p90 on log sessions over every cell (weighted by returning turns), "
                        "monotone cubic between its blocks; paired two-level residual bootstrap (replications' "
                        "effects, then cells) (kv_cache/metrics/slo_fit.py)"}
    if status in ("censored_high", "censored_low"):
        flags.append(f"censored: {fit.why}")
    elif status == "not_enough_evidence":
        flags.append(f"not enough evidence: {fit.why}")
    if fit.rungs_short and status != "not_enough_evidence":
        flags.append(f"rungs short of evidence (< {MIN_RUNG_TURNS} returning turns over the replications, or "
                     f"< {MIN_CELL_TURNS} in any one): {', '.join(f'{n:g}' for n in fit.rungs_short)} sessions, "
                     "left out of the fit")
    if fit.pooled_across_slo and status != "not_enough_evidence":
        flags.append("non-monotone across the SLO: the fit pooled rungs whose own p90s lie on both sides of it ("
                     + ", ".join(f"{p:.2f} s at {n:g}" for n, p in fit.pooled_across_slo)
                     + f", against {slo:g} s); the figure assumes p90 rises with sessions")
    if status == "interpolated" and (fit.low_bound or fit.high_bound):
        flags.append("interval reaches the ladder's end: the interval (the bootstrap draws' percentiles, widened by "
                     f"t) goes past it, {1 - fit.answered_draws:.0%} of the draws crossing outside the ladder; a "
                     "bound is printed there")
    if status == "interpolated" and fit.no_residuals:
        ci["no_residuals"] = True
        ci["method"] = ("bounds, not a confidence interval: the counted rungs either side of the crossing (the fit "
                        "passes through every counted cell, so a bootstrap has no residual to redraw)")
        flags.append(fit.why)
    elif k == 1 and status == "interpolated":
        flags.append("one replication per rung: the interval rests on the fit's residuals across rungs alone, "
                     "not on replications (--replications 3 or more)")
    elif k == 1 and status in ("censored_high", "censored_low"):  # p90 1.95 s at the top rung read "at least
        # 16" with nothing saying that no replication measured the noise behind it
        flags.append("one replication per rung: the bound's 95 % rests on the fit's residuals across rungs alone "
                     "(none where the fit passes through every cell), not on replications (--replications 3 or more)")
    br = _bracket(_curve(cells), slo)
    if br is not None and status != "not_enough_evidence":  # without the evidence the bracket says nothing
        by_n = {c["sessions"]: _p90_ci(c) for c in cells}
        counted = set(fit.rungs_counted)  # a rung short of the evidence qualifies nothing the fit used
        met = by_n.get(br[0]) if br[0] in counted else None
        miss = by_n.get(br[1]) if br[1] in counted else None
        if met and met.get("high") is not None and met["high"] > slo:
            flags.append(f"SLO met only within its interval at {br[0]} sessions: p90 {met['estimate']:.2f} "
                         f"[{met['low']:.2f}, {met['high']:.2f}] s against {slo:g} s")
        if miss and miss.get("low") is not None and miss["low"] <= slo:
            flags.append(f"crossing not significant at {br[1]} sessions: p90 {miss['estimate']:.2f} "
                         f"[{miss['low']:.2f}, {miss['high']:.2f}] s reaches down to the SLO")
    if status == "not_enough_evidence":  # the JSON says no more than the sentence: no bracket, no crossing
        br, per_rep = None, [(math.nan, "not_enough_evidence")] * len(per_rep)
    return {"sessions": _num(value), "sessions_ci": ci, "status": status, "bracket": list(br) if br else None,
            "lower_bound": status == "censored_high", "fit": fit.to_dict(),
            "per_replication": [_num(v) for v, _ in per_rep], "per_replication_status": [s for _, s in per_rep],
            "per_replication_method": "each replication's own first-miss crossing, log-log interpolated (for "
                                      "comparison: the figure is the fit's)",
            "flags": flags, "throughput": plateau_and_knee(cells)}


def _num(x: float) -> float | None:
    """A JSON-ready number: None for nan (no value)."""
    return x if math.isfinite(x) else None


def _fmt(c: dict[str, Any]) -> str:
    """A configuration's figure: the value with its interval (a bound where a draw crossed outside the
    ladder), or the bound itself with why, or "not enough evidence"."""
    counted = (c.get("fit") or {}).get("rungs_counted") or []
    fit = c.get("fit") or {}
    b95 = fit.get("bound_95")
    if c["status"] in ("censored_high", "censored_low") and "bound_95" in fit and b95 is None:
        side = "meets" if c["status"] == "censored_high" else "misses"
        return (f"no 95 % bound (the fit {side} the SLO over the ladder's rungs with the evidence, but over 2.5 % "
                "of the bootstrap draws cross beyond its other end)")
    if c["status"] == "censored_high":
        if b95 is not None and b95 < c["sessions"] * (1 - 1e-9):
            return (f"at least {b95:.1f} (95 %: the fit meets the SLO up to the top rung with the evidence, "
                    f"{c['sessions']:g}, but bootstrap draws cross below it)")
        return f"at least {c['sessions']:g} (the SLO is met up to the top rung with the evidence)"
    if c["status"] == "censored_low":
        if b95 is not None and b95 > c["sessions"] * (1 + 1e-9):
            return (f"fewer than {b95:.1f} (95 %: the fit misses the SLO already at the lowest rung with the "
                    f"evidence, {c['sessions']:g}, but bootstrap draws cross above it)")
        return f"fewer than {c['sessions']:g} (the SLO is missed already at the lowest rung with the evidence)"
    if c["status"] in ("not_enough_evidence", "no data") or c["sessions"] is None:
        return "not enough evidence"
    ci = c["sessions_ci"]
    if ci.get("no_residuals"):
        return f"{c['sessions']:.1f} (between {ci['low']:g} and {ci['high']:g}: no interval)"
    # one decimal, more where one decimal would print a zero-width interval ("10.4 [10.4, 10.4]" from
    # replications agreeing to 0.01 %): the printed interval shows the width the bootstrap found
    d = next((d for d in (1, 2, 3) if f"{ci['low']:.{d}f}" != f"{ci['high']:.{d}f}"), 3)
    lo = f"below {min(counted):g}" if ci.get("low_is_bound") and counted else f"{ci['low']:.{d}f}"
    hi = f"above {max(counted):g}" if ci.get("high_is_bound") and counted else f"{ci['high']:.{d}f}"
    return f"{c['sessions']:.{d}f} [{lo}, {hi}]"


# a's status, b's status -> what a / b is: "at least N" over anything below, or anything over "fewer than N",
# is a lower bound; the other way round an upper one (a / b with a >= top and b < bottom is > top / bottom)
_BOUNDS = {("censored_high", "interpolated"): "lower", ("interpolated", "censored_low"): "lower",
           ("censored_high", "censored_low"): "lower",
           ("censored_low", "interpolated"): "upper", ("interpolated", "censored_high"): "upper",
           ("censored_low", "censored_high"): "upper"}


def _ratio(a: dict[str, Any], b: dict[str, Any], fitted: dict[str, Any] | None) -> dict[str, Any] | None:
    """a's sessions over b's: the paired bootstrap ratio of the fits; a bound when one side is censored; else
    None (both censored the same way, or not enough evidence)."""
    sa, sb = a["status"], b["status"]
    if sa == sb == "interpolated" and fitted is not None:
        return dict(fitted)
    bound = _BOUNDS.get((sa, sb))
    if bound is None or not a["sessions"] or not b["sessions"]:
        return None

    def end(c: dict[str, Any], side: str) -> float | None:
        """A crossing's far end for the bound: the bound itself when censored, else its interval's end (the
        bound must hold over the interpolated side's uncertainty, not at its point estimate); None when that
        end is itself only a bound at the ladder's end (the crossing may lie beyond it: no ratio bound holds)."""
        ci = c.get("sessions_ci") or {}
        if c["status"] != "interpolated" or not ci.get(side):
            fit = c.get("fit") or {}  # a censored side: its 95 % bound (None: there is none)
            if "bound_95" in fit:
                return None if fit["bound_95"] is None else float(fit["bound_95"])
            return float(c["sessions"])
        return None if ci.get(f"{side}_is_bound") else float(ci[side])

    # a / b >= a's low end / b's high end (a lower bound); <= a's high end / b's low end (an upper one)
    ends = (end(a, "low"), end(b, "high")) if bound == "lower" else (end(a, "high"), end(b, "low"))
    if None in ends:
        return None
    value = ends[0] / ends[1]
    return {"estimate": value, "low": None, "high": None, "n": 1, "bound": bound,
            "method": f"a {bound} bound: one configuration's crossing lies outside the ladder; the other's 95 % "
                      "interval end is taken, so the bound holds over its uncertainty"}


def _fmt_ratio(r: dict[str, Any] | None, why: str = "censored") -> str:
    if r is None:
        return f"x? ({why})"
    if r.get("bound"):
        return f"{'at least' if r['bound'] == 'lower' else 'at most'} x{r['estimate']:.2f} (censored)"
    x = "x" if r.get("no_residuals") else ""  # bounds from the rungs either side: ratios, not an interval
    lo = f"{'<' if r.get('low_is_bound') else ''}{x}{r['low']:.2f}"
    hi = f"{'>' if r.get('high_is_bound') else ''}{x}{r['high']:.2f}"
    return f"x{r['estimate']:.2f} " + (f"(between {lo} and {hi}: no interval)" if x else f"[{lo}, {hi}]")


def evidence_text(rungs: list[dict[str, Any]], replications: int | None = None, beyond: bool = False) -> str:
    """"not enough evidence: 4-12 returning turns per cell ...; about --window 240 would give 40": the returning
    turns each (rung, replication) measured and the window that would give the median one enough (the rule of
    kv_cache/metrics/slo_fit.py: >= MIN_RUNG_TURNS over a rung's replications, >= MIN_CELL_TURNS in each;
    turns grow with the window in proportion once it holds a few loaded turn cycles)."""
    k = replications or max((len(_p90s(r)) for r in rungs), default=1)  # the run's K (estimate's rule)
    need = turns_needed_per_replication(k)
    turns, wanted = [], []  # every cell's returning turns; the window each short one would need
    for r in rungs:
        for c in fit_cells([r]):
            turns.append(c.turns)
            if 0 < c.turns < need and r.get("window_s"):
                wanted.append(float(r["window_s"]) * need / c.turns)
    turns.sort()
    span = f"{turns[0]}-{turns[-1]}" if turns and turns[0] != turns[-1] else (f"{turns[0]}" if turns else "0")
    text = (f"not enough evidence: {span} returning turns per cell (one rung's replication; {need} needed, "
            f"{MIN_RUNG_TURNS} per rung)")
    if not wanted and all(c.turns > 0 for r in rungs for c in fit_cells([r])):  # turns enough: not the window
        counted, bad, missing = 0, 0, 0
        for key in dict.fromkeys((r["tiers"], r["sessions"]) for r in rungs):
            cells = fit_cells([r for r in rungs if (r["tiers"], r["sessions"]) == key])
            counted += rung_has_evidence(cells, k)
            bad += sum(1 for c in cells if not (c.p90_s is not None and c.p90_s > 0 and math.isfinite(c.p90_s)))
            missing += len({c.replication for c in cells}) < k
        why = ([f"{missing} rung(s) lack a replication (each needs all {k})"] if missing else []) + (
            [f"{bad} cell(s) with returning turns have no finite positive p90 (every replication of a rung needs "
             "one)"] if bad else [])
        if why or beyond:
            return text + "; " + "; ".join(why or ["the rungs beyond the bound lack the evidence"])
        return text + (f"; {counted} rung(s) with the evidence, and the fit needs 2 of one configuration: give "
                       "--ladder at least two rungs that complete turns")
    if wanted:
        requested = max(float((r.get("window_plan") or {}).get("requested_window_s") or r.get("window_s") or 0.0)
                        for r in rungs)
        suggested = max(requested, 10 * math.ceil(sorted(wanted)[len(wanted) // 2] / 10))
        return text + f"; about --window {suggested:g} would give {need}"
    return text + ("; the cells short of it measured no returning turn: a --window several loaded turn cycles "
                   "long is needed, or pauses over sessions.human_threshold_s")


def answer(rungs: list[dict[str, Any]], slo: float, gpus: int, gpu_name: str,
           run_flags: Sequence[str] = ()) -> tuple[str, dict[str, Any]]:
    """The one-sentence answer and its structured detail (per configuration and each ratio to the baseline:
    `none` when it ran, else the first configuration). Every figure carries its interval or a bound, and the
    sentence ends with the flags that qualify it (`run_flags`: the run's own, e.g. an engine model no published
    run of this GPU supports); without the evidence, it says so and gives no figure."""
    configs = list(dict.fromkeys(r["tiers"] for r in rungs))
    by_cfg = {cfg: [r for r in rungs if r["tiers"] == cfg] for cfg in configs}
    fits, fitted_ratios = estimate({cfg: fit_cells(cells) for cfg, cells in by_cfg.items()}, slo)
    per = {cfg: _config_answer(by_cfg[cfg], slo, fits[cfg]) for cfg in configs}
    base = "none" if "none" in configs else configs[0]
    others = [c for c in configs if c != base]
    ratios = {c: _ratio(per[c], per[base], fitted_ratios.get((c, base))) for c in others}
    for c, r in ratios.items():
        if r and r.get("low") is not None and r["low"] <= 1.0 <= r["high"]:
            per[c]["flags"].append(f"ratio to {base} not significant: its interval contains 1")
    slo_text = f"at p90 return TTFT <= {slo:g} s"
    base_text = "without a tier" if base == "none" else f"with {base}"
    head = f"{gpus} x {gpu_name.upper()} hold"
    short = [cfg for cfg in configs if per[cfg]["status"] in ("not_enough_evidence", "no data")]
    k_run = max((len(_p90s(r)) for r in rungs), default=1)  # every rung needs this many replications
    if len(short) == len(configs):
        sentence = evidence_text(rungs, k_run)
    elif not others:
        sentence = f"{base_text}, {head} {_fmt(per[base])} sessions {slo_text}"
    else:
        def why(c: str) -> str:
            if c in short or base in short:
                return "not enough evidence"
            if ratios[c] is None and (per[c]["status"] == "interpolated") != (per[base]["status"] == "interpolated"):
                # one side censored, the other's interval end a bound at its ladder's end: no bound holds
                return "censored; no 95 % bound: an interval or bound involved reaches beyond its ladder"
            return "censored"
        def held(c: str) -> str:  # "1 x H100 hold 9.6 [...] sessions", or "not enough evidence" (no "hold")
            return f"{head} {_fmt(per[c])} sessions" if c not in short else f"{head}: not enough evidence"

        parts = [f"with {c}, {held(c)} {slo_text}" if i == 0 else f"with {c}, {_fmt(per[c])}"
                 for i, c in enumerate(others)]
        tail = ", ".join(_fmt_ratio(ratios[c], why(c)) + (f" ({c})" if len(others) > 1 else "") for c in others)
        sentence = f"{'; '.join(parts)}; {base_text}, {_fmt(per[base])}: {tail}"
        if short:
            sentence += f" ({', '.join(short)}: {evidence_text([r for r in rungs if r['tiers'] in short], k_run)})"
    # a bound whose far side lacks the evidence (not the ladder's end): say so, with the window that would do
    beyond = [c for c in configs if (per[c].get("fit") or {}).get("censored_by_missing_evidence")]
    if beyond and len(short) < len(configs):
        for c in beyond:
            cut = set(per[c]["fit"]["rungs_short_of_evidence"])
            sentence += (f" ({c}, beyond the bound: "
                         f"{evidence_text([r for r in rungs if r['tiers'] == c and r['sessions'] in cut], k_run, True)})")
    tags = sentence_flags(rungs, per) + [f for f in run_flags if f]
    if tags:
        sentence += f" [flags: {'; '.join(tags)}]"
    detail = {"slo_ttft_p90_s": slo, "baseline": base, "configs": per,
              "ratios": [{"config": c, "baseline": base, "sessions_ratio": ratios[c]} for c in others],
              "evidence_rule": {"min_returning_turns_per_rung": MIN_RUNG_TURNS,
                                "min_returning_turns_per_replication": MIN_CELL_TURNS,
                                "why": "the distribution-free 95 % interval of a p90 (order statistics, binomial) "
                                       f"has its upper end inside the sample only from {MIN_RUNG_TURNS} values; "
                                       f"below {MIN_CELL_TURNS} a p90 is the sample's maximum; every replication "
                                       "of a rung needs them (the one short of turns is most likely the slow one)",
                                "windows": "--window-plan planned (default): >= 3 loaded turn cycles, within "
                                           "[--window, 4 x --window]; fixed: --window"},
              "flags_in_sentence": tags,
              "method": __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()}
    return sentence, detail


def sentence_flags(rungs: list[dict[str, Any]], per: dict[str, dict[str, Any]]) -> list[str]:
    """Every flag that qualifies the answer, in a few words each (their whole text is in answer_detail):
    the configurations' (censored, short of evidence, interval at the ladder's end, ratio not significant,
    one replication, an SLO met only within its interval) and the rungs' (windows under 3 turn cycles,
    warm-ups not detected, windows the plan lengthened, and, counted by kind, the rung flags that qualify what
    was measured: HBM never filled, an offload tier never read, a storage tier in RAM unshaped, a tier faster
    than the host link, work per turn unlike the other configurations')."""
    tags = []
    for cfg, c in per.items():
        for f in c["flags"]:
            head = f.split(":")[0].split(" (")[0]
            tags.append(f"{cfg} {head}")
    few = sum(1 for r in rungs if any("turn cycles" in f and "< 3" in f for f in r.get("flags", [])))
    if few:
        tags.append(f"windows under 3 turn cycles at {few} of {len(rungs)} rungs")
    nowarm = sum(1 for r in rungs if any(f.startswith("no stationary warm-up") for f in r.get("flags", [])))
    if nowarm:
        tags.append(f"no stationary warm-up detected at {nowarm} of {len(rungs)} rungs")
    tags += planned_windows_flag(rungs)
    for words, hit in _QUALIFYING_RUNG_FLAGS:
        n = sum(1 for r in rungs if any(hit(f) for f in r.get("flags", [])))
        if n:
            tags.append(f"{words} at {n} of {len(rungs)} rungs")
    # flag_work_equivalence's verdict (a configuration that "holds more" may have done less work per turn)
    unequal = sum(1 for r in rungs if (r.get("work") or {}).get("flagged") and (r.get("work") or {}).get("turns_completed"))
    if unequal:
        tags.append(f"work per turn differs from the other configurations' at {unequal} of {len(rungs)} rungs")
    return list(dict.fromkeys(tags))


# the rung flags that qualify what a figure measured (rung_results.rung_flags, tier_checks.tier_flags): the
# sentence names each kind with its count of rungs; the table under it gives their whole text
_QUALIFYING_RUNG_FLAGS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("HBM never filled (the offload tier cannot matter)", lambda f: f.startswith("HBM never filled")),
    ("offload tier never read", lambda f: f.startswith("the offload tier was never read")),
    ("storage tier in RAM, unshaped", lambda f: f.startswith("the storage tier is on") and "(RAM), unshaped" in f),
    ("a tier faster than the GPU's host link", lambda f: "is faster than the GPU's host link" in f),
)


def planned_windows_flag(rungs: list[dict[str, Any]]) -> list[str]:
    """The windows the planning lengthened beyond --window (a figure from them is not a --window figure):
    "windows planned to 16-32 s at 5 of 8 rungs (--window 8; --window-plan fixed holds it)", with ", 2 run
    again after a pilot short of the evidence, left out" when the evidence lengthened some; [] when none."""
    plans = [r.get("window_plan") or {} for r in rungs]
    longer = [float(p["window_s"]) for p in plans
              if p.get("window_s") and p.get("requested_window_s") and p["window_s"] > p["requested_window_s"]]
    if not longer:
        return []
    requested = max(float(p.get("requested_window_s") or 0.0) for p in plans)
    def secs(x: float) -> str:
        return f"{x:.1f}".rstrip("0").rstrip(".")

    span = f"{secs(min(longer))}-{secs(max(longer))}" if secs(min(longer)) != secs(max(longer)) else secs(longer[0])
    piloted = sum(1 for p in plans if p.get("evidence_pilot"))
    return [f"windows planned to {span} s at {len(longer)} of {len(rungs)} rungs"
            + (f", {piloted} run again after a pilot short of the evidence, left out" if piloted else "")
            + f" (--window {requested:g}; --window-plan fixed holds it)"]
