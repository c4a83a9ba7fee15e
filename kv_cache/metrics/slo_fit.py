"""How many sessions a configuration holds at a p90 TTFT SLO: one monotone fit over every cell, its crossing,
and a bootstrap interval (numpy only; pure functions, shared by `kv-cache sessions` and
`benchmarks/slo_fit_coverage.py`, which checks the interval's coverage and the crossing's bias on known curves).

The data are cells: one (rung, replication), its p90 return TTFT and the returning turns behind it.

- **Evidence.** A cell's p90 counts only with at least ``MIN_CELL_TURNS`` (10) returning turns: below that the
  90th percentile of n values is their maximum (the order statistic ceil(0.9 n) = n for n <= 9), a number
  that says nothing about the p90. A rung counts only when every replication has that many (the one short of
  turns is most likely the slow one) and together they have at least ``MIN_RUNG_TURNS`` (36) returning turns: the smallest n for which the distribution-free 95 % interval of
  a 90th percentile (order statistics, binomial: [X_(l), X_(u)] with Bin(n, 0.9) putting 2.5 % outside
  each end) has its upper end inside the sample, i.e. 1 - 0.9^n >= 0.975 (n >= 36; at 35 it is 0.97497). With fewer the p90's
  upper confidence bound is beyond every measured turn: the data cannot say the SLO is met.
- **The fit.** y = log p90 of every counted cell, x = log sessions; the cells of a rung are averaged with
  every replication alike (a slow replication completes fewer turns: turn weights would
  lean a rung toward its fast ones), and a turn-weighted isotonic (non-decreasing) regression (pool-adjacent-violators)
  runs over the rungs. Each pooled block is represented by its weighted centre (mean x, mean y), and the
  fitted curve is the monotone cubic (PCHIP, Fritsch-Carlson) through the centres in (log sessions, log
  p90): monotone, and following the bend of a queue's latency climbing with load where straight chords
  would cut its corner (on the coverage study's queueing curve the chords' crossing was 0.27 sessions low).
- **The crossing** is where the fitted curve reaches log S. It is censored only by the fit: when the fit
  stays below S up to the top counted rung ("at least N": the SLO is met throughout the ladder) or above S
  from the lowest ("fewer than N"); then a bound is printed, with why.
- **The interval** comes from a two-level residual bootstrap over replications and cells. A replication
  replays one sample of sessions at every rung, so its effect is shared along the ladder: each
  replication's effect (the mean of its cells' residuals, centred) is redrawn whole, from a random
  replication, scaled by sqrt(K / (K - 1)). The rest of each cell's residual, scaled by the square root of its
  turns and inflated by sqrt(n / (n - blocks - (K - 1))), is redrawn from the cell of a random replication at
  a random place on the ladder (the configuration's own cell of that replication there). Every draw
  (replication effects, cells' replication and place) is the same for every configuration: replication k of
  every configuration replays the same sessions, so a replication's effect on both is carried into the ratio
  (paired). Residuals are pooled over the ladder because redrawing them within a rung (3 values at K = 3)
  covered 0.78-0.80 in the coverage study; redrawing cells alone, without the replication level, covered
  0.74-0.79 where the noise is a replication effect. The fit and crossing are recomputed on every draw;
  the interval is the percentile interval of the draws around the estimate, widened by the t-quantile over
  the normal one at Satterthwaite's degrees of freedom (K - 1 for the replications' share of the crossing's
  variance, the cells' residual df for the rest); an end where draws cross outside the ladder is a bound
  there. With one replication the cells' level alone is redrawn. Each replication is a fresh sample of sessions (workload/session_supply.py resamples a
  trace's sessions per replication), so resampling replications resamples sessions.
- **The ratio** of two configurations' crossings comes from the same draws (paired).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kv_cache.metrics.stats import t_quantile

__all__ = ["MIN_CELL_TURNS", "MIN_RUNG_TURNS", "Cell", "Crossing", "estimate", "fit_curve", "isotonic",
           "min_turns_for_p90_interval", "rung_has_evidence", "turns_needed_per_replication"]

MIN_CELL_TURNS = 10
N_BOOT = 400
N_COMPONENT_DRAWS = 100  # draws of each level alone, for the degrees of freedom of the t widening
CONFIDENCE = 0.95


def min_turns_for_p90_interval(q: float = 0.9, confidence: float = CONFIDENCE) -> int:
    """The smallest n for which the distribution-free two-sided interval of the q-quantile at `confidence`
    has its upper order statistic inside the sample: P(Bin(n, q) <= n - 1) = 1 - q^n >= 1 - (1 - conf) / 2."""
    tail = (1.0 - confidence) / 2.0
    return math.ceil(math.log(tail) / math.log(q))


MIN_RUNG_TURNS = min_turns_for_p90_interval()  # 36


@dataclass(frozen=True)
class Cell:
    """One (rung, replication): its p90 return TTFT (None without one) and the returning turns behind it."""

    sessions: float
    replication: int
    p90_s: float | None
    turns: int


@dataclass
class Crossing:
    """One configuration's crossing: the value, its status, interval, the counted rungs and why not."""

    sessions: float | None
    status: str  # interpolated | censored_high | censored_low | not_enough_evidence
    low: float | None = None
    high: float | None = None
    low_bound: bool = False  # the interval's low end is the lowest rung (draws censored below it)
    high_bound: bool = False  # the interval's high end is the top rung (draws censored above it)
    rungs_counted: list[float] = field(default_factory=list)
    rungs_short: list[float] = field(default_factory=list)  # rungs without the evidence (turns)
    turns_per_cell: list[int] = field(default_factory=list)
    draws: np.ndarray | None = None
    short_beyond: bool = False  # censored on a side where rungs lack the evidence (not beyond the ladder)
    answered_draws: float = 0.0  # share of bootstrap draws that crossed inside the ladder
    no_residuals: bool = False  # the fit passes through every counted cell: low / high are the rungs either side
    fit: list[tuple[float, float]] = field(default_factory=list)  # (sessions, fitted p90) at block centres
    # a censored crossing's 95 % bound: the rung (top for censored_high, lowest for censored_low) when 97.5 %
    # of the bootstrap draws stay beyond it, else the draws' quantile inside the ladder; None when over 2.5 %
    # of them cross beyond the ladder's other end (no 95 % bound)
    bound_95: float | None = None
    # rungs the isotonic fit pooled into one block although their own p90s lie on both sides of the SLO
    # (a non-monotone curve across the SLO: the fit's side of the SLO there is an average, not a measurement)
    pooled_across_slo: list[tuple[float, float]] = field(default_factory=list)  # (sessions, the rung's p90)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "status": self.status, "low": self.low, "high": self.high,
                "low_is_bound": self.low_bound, "high_is_bound": self.high_bound,
                "rungs_counted": self.rungs_counted, "rungs_short_of_evidence": self.rungs_short,
                "turns_per_cell": self.turns_per_cell, "answered_draws": self.answered_draws,
                "censored_by_missing_evidence": self.short_beyond, "no_residuals": self.no_residuals,
                "bound_95": self.bound_95,
                "fit": [{"sessions": n, "p90_s": p} for n, p in self.fit],
                "pooled_across_slo": [{"sessions": n, "p90_s": p} for n, p in self.pooled_across_slo],
                "why": self.why}


def isotonic(y: np.ndarray, w: np.ndarray) -> list[tuple[int, int, float, float]]:
    """Weighted non-decreasing isotonic regression (pool adjacent violators): blocks (start, end exclusive,
    weighted mean, weight) over y in order."""
    blocks: list[list[float]] = []  # [start, end, mean, weight]
    for i, (yi, wi) in enumerate(zip(y.tolist(), w.tolist(), strict=True)):
        blocks.append([i, i + 1, yi, wi])
        while len(blocks) > 1 and blocks[-2][2] > blocks[-1][2]:
            b = blocks.pop()
            a = blocks[-1]
            tot = a[3] + b[3]
            a[2] = (a[2] * a[3] + b[2] * b[3]) / tot
            a[1], a[3] = b[1], tot
    return [(int(a), int(b), m, wt) for a, b, m, wt in blocks]


def fit_curve(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rung-level (x sorted ascending, y, w) -> (block centres x, fitted y there, fitted y at every rung)."""
    blocks = isotonic(y, w)
    cx = np.array([float(np.average(x[a:b], weights=w[a:b])) for a, b, _, _ in blocks])
    cy = np.array([m for _, _, m, _ in blocks])
    at_rungs = np.interp(x, cx, cy) if cx.size > 1 else np.full_like(x, cy[0])
    return cx, cy, at_rungs


def _pchip_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fritsch-Carlson slopes of the monotone cubic (PCHIP) through (x, y): it never overshoots, so a
    non-decreasing y gives a non-decreasing curve, and it follows a curve's bend where straight lines
    between the points would cut its corner (the chord of a convex curve crosses a level early)."""
    h, d = np.diff(x), np.diff(y) / np.diff(x)
    m = np.zeros_like(y)
    if x.size == 2:
        return np.full_like(y, d[0])
    for i in range(1, x.size - 1):
        if d[i - 1] * d[i] > 0:
            w1, w2 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
            m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i])
    for i, (dd, dn, hh, hn) in ((0, (d[0], d[1], h[0], h[1])), (x.size - 1, (d[-1], d[-2], h[-1], h[-2]))):
        e = ((2 * hh + hn) * dd - hh * dn) / (hh + hn)
        if e * dd <= 0:
            e = 0.0
        elif dd * dn <= 0 and abs(e) > abs(3 * dd):
            e = 3 * dd
        m[i] = e
    return m


def _hermite(t: float, y0: float, y1: float, m0: float, m1: float, h: float) -> float:
    return ((2 * t**3 - 3 * t**2 + 1) * y0 + (t**3 - 2 * t**2 + t) * h * m0 + (-2 * t**3 + 3 * t**2) * y1
            + (t**3 - t**2) * h * m1)


def _cross(cx: np.ndarray, cy: np.ndarray, target: float) -> tuple[float, str]:
    """Where the monotone cubic through the block centres (all in logs) reaches `target`, and its status."""
    if cy[0] > target:
        return cx[0], "censored_low"
    if cy[-1] <= target:
        return cx[-1], "censored_high"
    i = int(np.argmax(cy > target))  # the first centre above
    m = _pchip_slopes(cx, cy)
    h = cx[i] - cx[i - 1]
    lo, hi = 0.0, 1.0
    for _ in range(40):  # the segment is monotone: bisect
        mid = (lo + hi) / 2
        if _hermite(mid, cy[i - 1], cy[i], m[i - 1], m[i], h) <= target:
            lo = mid
        else:
            hi = mid
    return cx[i - 1] + (lo + hi) / 2 * h, "interpolated"


@dataclass
class _Prepared:
    rungs: np.ndarray  # counted rungs' sessions, ascending
    rung_of: np.ndarray  # per counted cell: its rung's index
    rep: np.ndarray  # per counted cell: its replication
    y: np.ndarray  # per counted cell: log p90
    t: np.ndarray  # per counted cell: returning turns (its weight)
    short: list[float]
    turns: list[int]

    def means(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rung-level means of y (cells on the last axis), every replication of a rung weighted alike, and the
        rungs' weights (their returning turns) for the fit across rungs. Not turn-weighted within a rung: in a
        closed loop a slower replication completes fewer turns in the same window, so turn weights would lean
        each rung toward its fast replications (p90 1.5 s on 100 turns beside 3.0 s, 3.0 s on 12 each read
        1.71 s, under a 2 s SLO that two of the three replications miss)."""
        per_rung = np.bincount(self.rung_of, minlength=self.rungs.size).astype(float)
        m = np.zeros((self.t.size, self.rungs.size))
        m[np.arange(self.t.size), self.rung_of] = 1.0 / per_rung[self.rung_of]
        w = np.bincount(self.rung_of, weights=self.t, minlength=self.rungs.size)
        return y @ m, w


def turns_needed_per_replication(replications: int) -> int:
    """The fewest returning turns each of `replications` alike needs for its rung to count (rung_has_evidence):
    MIN_CELL_TURNS, and MIN_RUNG_TURNS over the K (K = 1: 36, 2: 18, 3: 12, 5: 10)."""
    return max(MIN_CELL_TURNS, math.ceil(MIN_RUNG_TURNS / max(1, replications)))


def rung_has_evidence(cells: Sequence[Cell], replications: int) -> bool:
    """A rung counts only when each of its `replications` has a p90 on >= MIN_CELL_TURNS returning turns and
    together they have >= MIN_RUNG_TURNS. Every replication, not their total alone: a replication that
    measured too few turns is most likely the slow one (fewer turns complete in a window when each takes
    longer), so a rung standing on its fast replications alone would read low."""
    ok = [c for c in cells if c.p90_s is not None and c.p90_s > 0 and math.isfinite(c.p90_s)
          and c.turns >= MIN_CELL_TURNS]
    reps = {c.replication for c in ok}
    return (len(ok) == len(cells) and len(reps) >= replications
            and sum(c.turns for c in ok) >= MIN_RUNG_TURNS)


def _prepare(cells: Sequence[Cell], replications: int = 1) -> _Prepared:
    by_rung: dict[float, list[Cell]] = {}
    for c in cells:
        by_rung.setdefault(float(c.sessions), []).append(c)
    rungs, rung_of, rep, y, t, short = [], [], [], [], [], []
    for n in sorted(by_rung):
        ok = by_rung[n]
        if not rung_has_evidence(ok, replications):
            short.append(n)
            continue
        for c in ok:
            rung_of.append(len(rungs))
            rep.append(c.replication)
            y.append(math.log(c.p90_s))
            t.append(float(c.turns))
        rungs.append(n)
    return _Prepared(np.array(rungs, dtype=float), np.array(rung_of, dtype=int), np.array(rep, dtype=int),
                     np.array(y), np.array(t), short, [c.turns for c in cells])


def _crossings(p: _Prepared, w: np.ndarray, target: float, yb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit's crossing (log sessions) and status on every bootstrap draw of the cells' log p90 (rows)."""
    ymb, _ = p.means(yb)
    lx = np.log(p.rungs)
    xs, sts = np.empty(yb.shape[0]), np.empty(yb.shape[0], dtype=object)
    for b in range(yb.shape[0]):
        bx, by, _ = fit_curve(lx, ymb[b], w)
        xs[b], sts[b] = _cross(bx, by, target)
    return xs, sts


def _widen(df: int, alpha: float) -> float:
    """t over z at the residual degrees of freedom: the percentile interval's widening for a small sample."""
    return t_quantile(1.0 - alpha, df) / 1.959963984540054


def estimate(configs: Mapping[str, Sequence[Cell]], slo_s: float, seed: int = 0, n_boot: int = N_BOOT,
             confidence: float = CONFIDENCE) -> tuple[dict[str, Crossing], dict[tuple[str, str], dict[str, Any]]]:
    """Every configuration's crossing of p90 = `slo_s` with its interval, and the paired ratio of every pair
    (a, b) of configurations with an interpolated crossing: {(a, b): {estimate, low, high, ...}}."""
    target = math.log(slo_s)
    rng = np.random.default_rng(seed)
    max_rep = 1 + max((c.replication for cells in configs.values() for c in cells), default=0)
    prepared = {name: _prepare(cells, max_rep) for name, cells in configs.items()}
    out: dict[str, Crossing] = {}
    # one draw for every configuration (paired): per (bootstrap, cell position) a source replication and a
    # source position along the ladder (a quantile of the rungs); each configuration takes its own cell of
    # that replication at that position
    n_cells = max((p.t.size for p in prepared.values()), default=1) or 1
    src_rep = rng.integers(0, max_rep, size=(n_boot, n_cells))
    src_pos = rng.random((n_boot, n_cells))
    # and per (bootstrap, replication) the replication whose effect it takes: shared by every configuration too
    src_effect = rng.integers(0, max_rep, size=(n_boot, max_rep))
    draws: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    for name, p in prepared.items():
        if p.rungs.size < 2:
            out[name] = Crossing(None, "not_enough_evidence", rungs_short=p.short, rungs_counted=list(p.rungs),
                                 turns_per_cell=p.turns,
                                 why=f"{p.rungs.size} rung(s) with the evidence a p90 needs (>= {MIN_RUNG_TURNS} "
                                     f"returning turns per rung, >= {MIN_CELL_TURNS} per replication), 2 needed")
            continue
        ym, w = p.means(p.y)
        cx, cy, at = fit_curve(np.log(p.rungs), ym, w)
        x, status = _cross(cx, cy, target)
        value = {"censored_high": float(p.rungs[-1]), "censored_low": float(p.rungs[0])}.get(status, math.exp(x))
        pooled = [(float(p.rungs[i]), math.exp(float(ym[i]))) for a, b, _, _ in isotonic(ym, w) if b - a > 1
                  and (ym[a:b] > target).any() and (ym[a:b] <= target).any() for i in range(a, b)]
        out[name] = Crossing(value, status, rungs_counted=list(p.rungs), rungs_short=p.short,
                             turns_per_cell=p.turns, fit=[(math.exp(a), math.exp(b)) for a, b in zip(cx, cy, strict=True)],
                             pooled_across_slo=pooled)
        # standardized residuals (log p90 - fit) x sqrt(turns), inflated for the blocks the fit used
        fitted = at[p.rung_of]
        r = (p.y - fitted) * np.sqrt(p.t)
        df = max(1, p.t.size - cx.size)
        r = r * math.sqrt(p.t.size / df)
        # the source cell of every draw: (replication, rung) -> its index, else a cell of that rung
        index = {(int(p.rep[j]), int(p.rung_of[j])): j for j in range(p.t.size)}
        by_rung = [np.flatnonzero(p.rung_of == i) for i in range(p.rungs.size)]
        rung_pick = np.minimum((src_pos[:, : p.t.size] * p.rungs.size).astype(int), p.rungs.size - 1)
        rep_pick = src_rep[:, : p.t.size]
        src = np.empty((n_boot, p.t.size), dtype=int)
        for bi in range(n_boot):
            for j in range(p.t.size):
                ri, rp = int(rung_pick[bi, j]), int(rep_pick[bi, j])
                cell = index.get((rp, ri))
                src[bi, j] = cell if cell is not None else by_rung[ri][rp % by_rung[ri].size]
        present = np.unique(p.rep)
        if present.size >= 2:
            # two levels: a replication replays one sample of sessions at every rung, so its effect is shared
            # across the ladder (a heavy sample is slow everywhere); redrawing cells alone averaged it away
            # (coverage 0.74-0.79 with such an effect, benchmarks/slo_fit_coverage.py). Each replication's
            # effect (the mean of its residuals, centred) is redrawn whole, scaled by sqrt(K / (K - 1)); the
            # rest of each residual is redrawn as a cell's
            d, kp = p.y - fitted, present.size
            u = np.zeros(max_rep)
            for k_ in present:
                u[k_] = d[p.rep == k_].mean()
            u[present] -= u[present].mean()
            df_w = max(1, p.t.size - cx.size - (kp - 1))
            r = (d - u[p.rep]) * np.sqrt(p.t) * math.sqrt(p.t.size / df_w)
            effect = u[present[src_effect % kp]][:, p.rep] * math.sqrt(kp / (kp - 1))
            cell_part = r[src] / np.sqrt(p.t)[None, :]
            xs, sts = _crossings(p, w, target, fitted[None, :] + effect + cell_part)
            # the degrees of freedom for the t widening (Satterthwaite): K - 1 for the replications' part of the
            # crossing's variance, the cells' residual df for the rest, each part's variance from its own draws
            # (the first N_COMPONENT_DRAWS: a df needs no more)
            m = min(n_boot, N_COMPONENT_DRAWS)
            v_rep = float(np.var(_crossings(p, w, target, fitted[None, :] + effect[:m])[0]))
            v_cell = float(np.var(_crossings(p, w, target, fitted[None, :] + cell_part[:m])[0]))
            df = (max(1, int((v_rep + v_cell) ** 2 / (v_rep**2 / (kp - 1) + v_cell**2 / df_w)))
                  if v_rep + v_cell > 0 else df_w)
        else:
            xs, sts = _crossings(p, w, target, fitted[None, :] + r[src] / np.sqrt(p.t)[None, :])
        # no residual to redraw (one cell per block: e.g. one replication on a monotone curve): every draw is
        # the fit itself, a zero-width "interval"
        flat = p.t.size <= cx.size or bool(np.allclose(p.y - fitted, 0.0))
        draws[name] = (xs, sts, df, flat)
    alpha = (1.0 - confidence) / 2.0
    for name, (xs, sts, df, flat) in draws.items():
        c = out[name]
        c.draws = np.exp(xs)
        c.answered_draws = float(np.mean(sts == "interpolated"))
        lo_q, hi_q = np.quantile(xs, [alpha, 1.0 - alpha])
        mid, k = math.log(c.sessions), _widen(df, alpha)
        bottom, top = min(c.rungs_counted), max(c.rungs_counted)
        raw_low, raw_high = math.exp(mid - k * (mid - lo_q)), math.exp(mid + k * (hi_q - mid))
        c.low, c.high = max(bottom, raw_low), min(top, raw_high)
        # an interval must hold its own estimate: draws all on one side of it (a bootstrap at odds with the
        # fit, e.g. two records of one rung) widen it to the estimate rather than exclude it
        c.low, c.high = min(c.low, c.sessions), max(c.high, c.sessions)
        # an end at the ladder's end is a bound when draws crossed beyond it, or when the widened interval
        # reached past it and was cut there (16.0 printed as the interval's end where the interval went on)
        c.low_bound = c.low <= bottom * (1 + 1e-9) and (bool(np.any(sts == "censored_low")) or raw_low < bottom)
        c.high_bound = c.high >= top * (1 - 1e-9) and (bool(np.any(sts == "censored_high")) or raw_high > top)
        above = [n for n in c.rungs_short if n > top]
        below = [n for n in c.rungs_short if n < bottom]
        if c.status == "censored_high":
            c.why = (f"the fit stays under the SLO up to the top rung with the evidence ({top:g} sessions): "
                     + (f"the rungs above it ({', '.join(f'{n:g}' for n in above)}) lack the evidence, so the "
                        "crossing lies where nothing was measured well enough; a longer --window" if above else
                        "the crossing lies above the ladder; extend --ladder"))
        elif c.status == "censored_low":
            c.why = (f"the fit is over the SLO already at the lowest rung with the evidence ({bottom:g} sessions): "
                     + (f"the rungs below it ({', '.join(f'{n:g}' for n in below)}) lack the evidence, so the "
                        "crossing lies where nothing was measured well enough; a longer --window" if below else
                        "the crossing lies below the ladder; start --ladder lower"))
        # a bound holds at 95 % only where 97.5 % of the draws stay beyond it: draws crossing inside the ladder
        # move it there ("at least 16" with 35 % of the draws crossing at 6-15 was no 95 % bound)
        # (draws censored the other way put it beyond the other end of the ladder: then no 95 % bound holds)
        beyond = np.where(sts == "censored_high", np.inf, np.where(sts == "censored_low", -np.inf, xs))
        if c.status == "censored_high":
            q = float(np.quantile(beyond, alpha, method="lower"))
            c.bound_95 = (top if q == np.inf else None if q == -np.inf
                          else max(bottom, min(top, math.exp(mid - k * (mid - q)))))
        elif c.status == "censored_low":
            q = float(np.quantile(beyond, 1.0 - alpha, method="higher"))
            c.bound_95 = (bottom if q == -np.inf else None if q == np.inf
                          else min(top, max(bottom, math.exp(mid + k * (q - mid)))))
        c.short_beyond = bool(above) if c.status == "censored_high" else bool(below) if c.status == "censored_low" else False
        if flat and c.status == "interpolated":  # no interval from the data: the counted rungs either side bound it
            c.no_residuals = True
            c.low = max(n for n in c.rungs_counted if n <= c.sessions)
            c.high = min(n for n in c.rungs_counted if n >= c.sessions)
            c.low_bound = c.high_bound = False
            c.why = (f"no interval: the fit passes through every counted cell ({prepared[name].t.size} cells, "
                     f"{len(c.fit)} fitted blocks), so a bootstrap has no residual to redraw; the crossing "
                     f"lies between the counted rungs {c.low:g} and {c.high:g} (--replications 3 or more gives an "
                     "interval)")
    ratios: dict[tuple[str, str], dict[str, Any]] = {}
    for a in draws:
        for b in draws:
            if a == b or out[a].status != "interpolated" or out[b].status != "interpolated":
                continue
            est = out[a].sessions / out[b].sessions
            if out[a].no_residuals or out[b].no_residuals:  # the rungs either side bound the ratio
                ratios[(a, b)] = {"estimate": est, "low": out[a].low / out[b].high, "high": out[a].high / out[b].low,
                                  # the other side's interval end may itself be a bound at its ladder's end
                                  "low_is_bound": bool(out[a].low_bound or out[b].high_bound),
                                  "high_is_bound": bool(out[a].high_bound or out[b].low_bound), "no_residuals": True,
                                  "n": max_rep, "confidence": None,
                                  "method": "bounds from the counted rungs either side of each crossing: a fit "
                                            "through every cell leaves no residual to bootstrap"}
                continue
            lr = draws[a][0] - draws[b][0]
            mid, k = math.log(est), _widen(min(draws[a][2], draws[b][2]), alpha)
            lo_q, hi_q = np.quantile(lr, [alpha, 1.0 - alpha])
            ratios[(a, b)] = {
                "estimate": est, "low": math.exp(mid - k * (mid - lo_q)), "high": math.exp(mid + k * (hi_q - mid)),
                "low_is_bound": bool(out[a].low_bound or out[b].high_bound),
                "high_is_bound": bool(out[a].high_bound or out[b].low_bound),
                "n": max_rep, "bootstrap_draws": n_boot, "confidence": confidence,
                "method": "paired two-level residual bootstrap (each replication's effect redrawn whole, then the "
                          "cells' residuals; the same draws for both configurations), percentile interval widened "
                          "by t/z at Satterthwaite's degrees of freedom"}
    return out, ratios
