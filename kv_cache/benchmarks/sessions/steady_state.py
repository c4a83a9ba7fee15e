"""`--steady-state`: start a rung as a long run would hold it, and detect when its warm-up ended.

The start (`prepare_steady_start`), as a closed loop that has run for a long time holds its slots:
- Sessions are length-biased: a long run is inside a session for as long as that session lasts, so a slot
  is found in a session with probability proportional to its duration. The start draws a pool of
  `POOL_FACTOR` x N sessions (at least `MIN_POOL`) from the rung's supply and picks N of them without
  replacement, with probability proportional to their durations (`session_seconds`: the pauses plus each
  turn's modelled service time, alone on the GPU).
- Positions are uniform in time: a uniform point in the session's duration falls either in the pause
  before turn i (the slot waits the rest of that pause, then issues turn i) or in turn i's service (the
  turn is issued at once). The turns before i are processed: their blocks are keyed as if they had run.
- The contexts are installed in HBM in the order a long run's LRU would hold them (the slot idle longest
  first, the one in service last), so HBM is filled by LRU; blocks that do not stay in HBM are stored in the
  offload tiers before the clock starts (not counted: the window is not open), and lost for `none`.

The warm-up (`StationarityDetector`) lasts at least one *loaded* turn cycle: the largest of the pool's
unloaded cycle (its duration over its turns), the cycle planned from the rung below (its measured cycle x
the ratio of session counts) and the cycle measured so far in the warm-up itself (N slots x elapsed / turns
completed, Little's law). Then it ends when a slope bound on the latest half of the warm-up passes, as fio's
steady-state criterion bounds a rolling mean's slope, with the power a bound needs at few turns: the turns
completed per monitor tick are regressed on time (least squares), the relative change over the span is
r = slope x span / mean, with its standard error from the residuals, and the warm-up is steady only when
|r| + z SE(r) < `SLOPE_BOUND` (0.5: the throughput moves by less than half its mean over the span; z =
`SLOPE_Z`, one-sided 90 %). A 2x ramp over the span is r = 2/3 > 0.5, so it is declared steady at most
P(r_hat < 0.5 - z SE) = Phi(-(1/6 + z SE) / SE) < 10 % of the time whatever the turn count (80 % power at
the least; tests/test_sessions_engine.py simulates it at 16-200 turns), at the price of waiting for the cap
when too few turns can show a steady state (flagged: "no stationary warm-up detected"). A Mann-Kendall test
(two-sided 5 %) on the mean TTFT of `GROUPS` sub-windows, when at least `MIN_TTFT_GROUPS` saw a first token,
must find no trend either. It is capped at max(--warmup, `WARMUP_CAP_CYCLES` loaded turn cycles); the
results say which ended it.

`window_cycles` says how many turn cycles the window held at a rung (measured: N slots x window / turns
completed, by Little's law) and flags a window shorter than `MIN_WINDOW_CYCLES` of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kv_cache.serving.engine import roofline as gpumod
from kv_cache.specs import GPUSpec
from kv_cache.specs.models import ModelConfig

__all__ = ["EVIDENCE_MARGIN", "MAX_PLANNED_WINDOW_FACTOR", "evidence_window", "pilot_enough", "pilot_record", "WARMUP_CAP_CYCLES", "plan_window", "planned_cycle", "relative_slope",
           "slope_steady", "StationarityDetector", "SteadyStart", "mann_kendall_z", "modelled_service", "prepare_steady_start", "session_seconds",
           "stationary_position", "window_cycles", "window_plan_record"]

POOL_FACTOR = 8
MIN_POOL = 64
GROUPS = 8
MIN_TTFT_GROUPS = 6
Z_CRIT = 1.96  # two-sided 5 %
SLOPE_BOUND = 0.5  # the largest relative change of throughput over the tested span called steady
SLOPE_Z = 1.2815515655446004  # one-sided 90 %: the bound must hold at the slope's upper confidence limit
MIN_WINDOW_CYCLES = 3.0
WARMUP_CAP_CYCLES = 2.0  # the warm-up's cap: max(--warmup, this many turn cycles), so the test has time to pass

TurnSeconds = Callable[[Any, int], float]  # (script, turn index) -> modelled service seconds of that turn


def no_service(script: Any, i: int) -> float:
    return 0.0


def modelled_service(gpu: GPUSpec, eff: gpumod.Efficiency, model: ModelConfig, tp: int) -> TurnSeconds:
    """Turn i's modelled service alone on a replica: its prefill after the reused prefix, then its decode (one
    step per output token at the turn's mid-decode context); the steady start's duration weights."""
    memo: list[Any] = [None, None]  # the last script and its contexts (session_seconds walks one at a time)

    def service(script: Any, i: int) -> float:
        if memo[0] is not script:
            memo[0], memo[1] = script, script.contexts()
        reused, inp = memo[1][i]
        out = script.turns[i].output_tokens
        prefill = gpumod.prefill_seconds(gpu, eff, model, inp - reused, reused, tp=tp)
        return prefill + out * gpumod.decode_step_seconds(gpu, eff, model, 1, inp + out / 2, tp=tp)

    return service


def session_seconds(script: Any, service: TurnSeconds = no_service) -> list[tuple[float, float]]:
    """(pause before, service) seconds of each turn of `script` (the first turn has no pause)."""
    return [(float(t.pause_before_s or 0.0), float(service(script, i))) for i, t in enumerate(script.turns)]


def stationary_position(segments: list[tuple[float, float]], u: float) -> tuple[int, float, float]:
    """Where a uniform point `u` in [0, 1) of a session's duration falls: (turn to issue next, seconds until it
    is issued, seconds the slot has been idle). In the pause before turn i: (i, rest of the pause, pause so
    far); in turn i's service: (i, 0, 0)."""
    total = sum(p + s for p, s in segments)
    if total <= 0:
        return 0, 0.0, 0.0
    x = u * total
    for i, (p, s) in enumerate(segments):
        if x < p:
            return i, p - x, x
        x -= p
        if x < s:
            return i, 0.0, 0.0
        x -= s
    return len(segments) - 1, 0.0, 0.0


@dataclass
class SteadyStart:
    """What the steady-state start did (reported per rung)."""

    start_turns: list[int] = field(default_factory=list)
    installed_tokens: list[int] = field(default_factory=list)  # context each slot held at the start
    hbm_occupancy: float = 0.0
    prestored_blocks: int = 0
    prestore_s: float = 0.0
    pool_sessions: int = 0
    turn_cycle_s: float = 0.0  # the pool's duration / its turns

    def to_dict(self) -> dict[str, Any]:
        n = len(self.start_turns)
        return {
            "sessions": n,
            "mean_start_turn": sum(self.start_turns) / n if n else None,
            "started_mid_session": sum(1 for t in self.start_turns if t > 0),
            "hbm_occupancy_at_start": self.hbm_occupancy,
            "prestored_blocks": self.prestored_blocks,
            "prestore_s": self.prestore_s,
            "sampling": "length-biased sessions (weight = duration), positions uniform in time",
            "pool_sessions": self.pool_sessions,
            "mean_installed_context_tokens": sum(self.installed_tokens) / n if n else None,
            "fraction_at_turn_0": sum(1 for t in self.start_turns if t == 0) / n if n else None,
            "turn_cycle_s": self.turn_cycle_s,
        }


def _pick(slots: Sequence[Any], draw: Callable[[], Any], service: TurnSeconds,
          rng: np.random.Generator) -> tuple[list[Any], list[list[tuple[float, float]]], float, int]:
    """N sessions out of a pool, length-biased; with their segments, the turn cycle and the pool size."""
    n = len(slots)
    pool = [draw() for _ in range(max(POOL_FACTOR * n, MIN_POOL))]
    segments = [session_seconds(s, service) for s in pool]
    durations = np.array([sum(p + s for p, s in seg) for seg in segments], dtype=float)
    turns = sum(len(s.turns) for s in pool)
    cycle = float(durations.sum() / turns) if turns else 0.0
    weights = durations if durations.sum() > 0 else np.ones(len(pool))
    chosen = rng.choice(len(pool), size=n, replace=False, p=weights / weights.sum())
    return [pool[int(i)] for i in chosen], [segments[int(i)] for i in chosen], cycle, len(pool)


def prepare_steady_start(slots: Sequence[Any], replicas: Sequence[Any], replica_of: Callable[[str], int],
                         seed: int, stagger_cap_s: float, drain: Callable[[], None] | None,
                         draw: Callable[[], Any] | None = None, service: TurnSeconds = no_service) -> SteadyStart:
    """Give every slot a length-biased session at a position uniform in time (module docstring), install the
    contexts in HBM in LRU order, store the overflow in the tiers and wait for those writes (`drain`) before
    the rung's clock starts. `draw`: one session of the rung's supply (default: the first slot's);
    `service`: a turn's modelled service seconds; `stagger_cap_s` is kept for the callers (unused: the
    positions stagger the arrivals)."""
    rng = np.random.default_rng([seed, len(slots), 0x57EAD1])
    out = SteadyStart(start_turns=[0] * len(slots), installed_tokens=[0] * len(slots))
    t0 = time.perf_counter()
    scripts, segments, out.turn_cycle_s, out.pool_sessions = _pick(slots, draw or slots[0].next_script, service, rng)
    idle = []
    for i, slot in enumerate(slots):
        slot.begin(scripts[i])
        start, wake, idle_s = stationary_position(segments[i], float(rng.random()))
        keys = slot.fast_forward(start)
        out.start_turns[i] = start
        out.installed_tokens[i] = slot.contexts[start][0] if start else 0
        slot.first_wake = wake
        idle.append((idle_s, i, keys))
    for _, i, keys in sorted(idle, key=lambda x: (-x[0], x[1])):  # idle longest first: the LRU end
        out.prestored_blocks += replicas[replica_of(slots[i].script.session_id)].install(keys)
    if drain is not None:
        drain()
    out.prestore_s = time.perf_counter() - t0
    out.hbm_occupancy = sum(r.occupancy() for r in replicas) / max(1, len(replicas))
    return out


def mann_kendall_z(values: Sequence[float]) -> float:
    """The Mann-Kendall trend statistic of `values` in time order, as a z score (normal approximation with
    continuity correction, no tie correction); 0 for fewer than 3 values."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 3:
        return 0.0
    s = float(np.sign(x[None, :] - x[:, None])[np.triu_indices(n, 1)].sum())
    var = n * (n - 1) * (2 * n + 5) / 18.0
    return 0.0 if s == 0 else (s - math.copysign(1.0, s)) / math.sqrt(var)


def relative_slope(times: Sequence[float], counts: Sequence[float]) -> tuple[float, float]:
    """(r, SE(r)): the least-squares slope of counts on times, times the span, over the mean count (the
    relative change over the span), and its standard error from the residuals; (inf, inf) when it cannot be
    told (fewer than 4 points, no count)."""
    x, y = np.asarray(times, dtype=float), np.asarray(counts, dtype=float)
    if x.size < 4 or y.mean() <= 0 or np.ptp(x) <= 0:
        return math.inf, math.inf
    xc = x - x.mean()
    sxx = float(xc @ xc)
    b = float(xc @ (y - y.mean())) / sxx
    resid = y - y.mean() - b * xc
    sigma2 = float(resid @ resid) / (x.size - 2)
    span = float(np.ptp(x)) + float(np.median(np.diff(x)))
    scale = span / float(y.mean())
    return b * scale, math.sqrt(sigma2 / sxx) * scale


def slope_steady(times: Sequence[float], counts: Sequence[float]) -> tuple[bool, float, float]:
    """The warm-up's slope bound on per-tick turn counts: (steady, r, SE(r)), steady when |r| + z SE(r) <
    SLOPE_BOUND (module docstring)."""
    r, se = relative_slope(times, counts)
    return bool(abs(r) + SLOPE_Z * se < SLOPE_BOUND), r, se


@dataclass
class StationarityDetector:
    """The warm-up's end (module docstring): `add` one monitor tick's completed tokens, turns and first-token
    TTFTs; True once the warm-up is at least one loaded turn cycle long (`min_s`, and `sessions` x elapsed /
    turns so far) and the latest half of it passes the slope bound (and shows no TTFT trend)."""

    min_s: float = 0.0
    groups: int = GROUPS
    sessions: int = 0
    ticks: list[tuple[float, float, list[float], float]] = field(default_factory=list)  # (t, tokens, TTFTs, turns)
    last: dict[str, Any] = field(default_factory=dict)  # the last test's figures

    def loaded_cycle_s(self, t_s: float) -> float:
        """The turn cycle measured so far (Little's law: slots x elapsed / turns); 0 without sessions or turns."""
        turns = sum(x[3] for x in self.ticks)
        return self.sessions * t_s / turns if self.sessions and turns else 0.0

    def add(self, t_s: float, tokens: float, ttfts: Sequence[float], turns: float | None = None) -> bool:
        self.ticks.append((t_s, float(tokens), list(ttfts), float(tokens if turns is None else turns)))
        cycle = self.loaded_cycle_s(t_s) if turns is not None else 0.0
        if t_s < max(self.min_s, cycle) or (turns is not None and self.sessions and cycle == 0.0):
            return False
        recent = [x for x in self.ticks if x[0] > t_s / 2]
        if len(recent) < self.groups:
            return False
        steady, r, se = slope_steady([x[0] for x in recent], [x[3] for x in recent])
        parts = np.array_split(np.arange(len(recent)), self.groups)
        ttft = [float(np.mean(v)) for p in parts if (v := [y for j in p for y in recent[j][2]])]
        z_f = mann_kendall_z(ttft) if len(ttft) >= MIN_TTFT_GROUPS else None
        self.last = {"relative_slope": r if math.isfinite(r) else None, "relative_slope_se": se if math.isfinite(se) else None,
                     "slope_bound": SLOPE_BOUND, "ttft_z": z_f, "groups": self.groups, "at_s": t_s,
                     "loaded_cycle_s": cycle or None}
        return steady and (z_f is None or abs(z_f) < Z_CRIT)

    def rule(self, cap_s: float) -> str:
        return (f"at least one loaded turn cycle (>= {self.min_s:.1f} s, and slots x elapsed / turns), then the "
                f"throughput's relative change over the latest half of the warm-up |r| + {SLOPE_Z:.2f} SE < "
                f"{SLOPE_BOUND:g} (least squares on turns per tick) and no Mann-Kendall trend (|z| < {Z_CRIT}) in "
                f"the mean TTFT of {self.groups} sub-windows; cap {cap_s:g} s (max of --warmup and "
                f"{WARMUP_CAP_CYCLES:g} loaded turn cycles)")


MAX_PLANNED_WINDOW_FACTOR = 4.0  # a planned window is at most this many times --window (the run time stays bounded)


def planned_cycle(rungs: Sequence[dict[str, Any]], tiers: str, sessions: int) -> tuple[float | None, int | None]:
    """The loaded turn cycle expected at `sessions` for configuration `tiers`, from the highest rung below it
    already run: its measured cycle x sessions / its sessions (a saturated closed loop's cycle grows with the
    slots; below saturation this over-plans, never under). (None, None) without such a rung."""
    below = [r for r in rungs if r.get("tiers") == tiers and r["sessions"] < sessions and r.get("turn_cycle_s")]
    if not below:
        return None, None
    r = max(below, key=lambda x: x["sessions"])
    return float(r["turn_cycle_s"]) * sessions / r["sessions"], int(r["sessions"])


def plan_window(window_s: float, cycle_s: float | None) -> float:
    """A rung's window: at least `MIN_WINDOW_CYCLES` planned loaded turn cycles, never shorter than --window
    nor longer than `MAX_PLANNED_WINDOW_FACTOR` times it."""
    if not cycle_s:
        return window_s
    return min(MAX_PLANNED_WINDOW_FACTOR * window_s, max(window_s, MIN_WINDOW_CYCLES * cycle_s))


EVIDENCE_MARGIN = 1.25  # an evidence-planned window aims this much above the turns it needs (turns are noisy)


def pilot_enough(need: int, replications: int) -> int:
    """The returning turns a first replication needs to stand (not a pilot): `need` alone, or with other
    replications to come (each must have `need`) EVIDENCE_MARGIN x `need`."""
    return need if replications <= 1 else math.ceil(EVIDENCE_MARGIN * need)


def evidence_window(window_s: float, requested_s: float, returning_turns: int, need: int,
                    replications: int = 1) -> float | None:
    """The window a rung needs for `need` returning turns per replication, from a pilot replication that
    measured `returning_turns` in `window_s` (returning turns grow with the window in proportion once it
    holds a few turn cycles), with EVIDENCE_MARGIN, within [window_s, MAX_PLANNED_WINDOW_FACTOR x
    `requested_s` (--window)]. With `replications` > 1 the pilot needs EVIDENCE_MARGIN x `need` to stand:
    the rung counts only when every replication has `need`, and a first one at exactly `need` leaves each
    other about even odds of falling short. None when the pilot had that, measured no returning turn (no
    rate to plan from), or the cap leaves the window as it was."""
    if returning_turns >= pilot_enough(need, replications) or returning_turns <= 0 or window_s <= 0:
        return None
    wanted = min(MAX_PLANNED_WINDOW_FACTOR * requested_s, window_s * need * EVIDENCE_MARGIN / returning_turns)
    return wanted if wanted > window_s * 1.001 else None


def pilot_record(result: dict[str, Any], window_s: float, rerun_window_s: float, need: int,
                 wanted: int) -> dict[str, Any]:
    """What a pilot (a first replication short of the evidence, left out of its cell) measured, for a reader
    of the document to see what was left out: its window and returning turns, the turns needed per
    replication (and wanted of a first one, pilot_enough), the window every replication ran at instead, and
    its own figures."""
    p90 = (result["ttft"]["return"].get("p90_s") or {}).get("estimate")
    thr = (result.get("throughput_tokens_per_s_per_gpu") or {}).get("estimate")
    return {"window_s": window_s, "returning_turns": int(result["ttft"]["return"].get("n") or 0),
            "needed_returning_turns": need, "wanted_returning_turns": wanted, "rerun_window_s": rerun_window_s, "seed": result.get("seed"),
            "completed_turns": result.get("completed_turns"), "ttft_return_p90_s": p90,
            "throughput_tokens_per_s_per_gpu": thr, "left_out": True}


def window_plan_record(mode: str, requested_s: float, window_s: float, cycle_s: float | None,
                       from_rung: int | None, pilot: dict[str, Any] | None, need: int) -> dict[str, Any]:
    """A cell's `window_plan`: how its window was sized (`mode` planned or fixed), from what, and the rule."""
    return {"mode": mode, "requested_window_s": requested_s, "window_s": window_s, "planned_cycle_s": cycle_s,
            "planned_from_rung": from_rung, "evidence_pilot": pilot,
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


def window_cycles(sessions: int, window_s: float, completed_turns: int) -> tuple[float | None, str | None]:
    """(turn cycle seconds measured in the window, or None without a completed turn; a flag when the window
    held fewer than MIN_WINDOW_CYCLES of them)."""
    if completed_turns <= 0:
        return None, (f"no turn completed in the {window_s:g} s window: it is shorter than one turn cycle at "
                      f"{sessions} sessions; use a longer --window")
    cycle = sessions * window_s / completed_turns
    if window_s < MIN_WINDOW_CYCLES * cycle:
        return cycle, (f"the window ({window_s:g} s) holds {window_s / cycle:.1f} turn cycles "
                       f"(cycle {cycle:.1f} s = sessions x window / turns) < {MIN_WINDOW_CYCLES:g}: "
                       "each slot returned too few times for a steady figure; use a longer --window")
    return cycle, None
