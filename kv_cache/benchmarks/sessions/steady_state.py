"""`--steady-state`: start a rung as a long run would have left it, and detect when its warm-up ended.

- Each slot's first session starts at a seeded random turn, with its earlier turns already processed (their
  blocks keyed as if they had run); the slots' contexts are installed in HBM in a seeded order (the last one
  is the most recently used), so HBM is filled by LRU; blocks that do not stay in HBM are stored in the
  offload tiers before the clock starts (not counted: the measured window is not open), and lost for `none`.
- Arrivals are staggered: a slot's first turn comes after uniform(0, its pause) seconds (a start turn:
  uniform(0, the warm-up cap)), so the slots do not all return at once and later start turns spread over the
  window.
- The warm-up ends when occupancy is steady: HBM occupancy and the turns in the engine, sampled every
  `interval_s`, varied less than the tolerances over the last `ticks` samples; never later than the cap
  (`--warmup`), and the results say which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SteadyStart", "WarmupDetector", "prepare_steady_start"]


@dataclass
class SteadyStart:
    """What the steady-state start did (reported per rung)."""

    start_turns: list[int] = field(default_factory=list)
    hbm_occupancy: float = 0.0
    prestored_blocks: int = 0
    prestore_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        n = len(self.start_turns)
        return {
            "sessions": n,
            "mean_start_turn": sum(self.start_turns) / n if n else None,
            "started_mid_session": sum(1 for t in self.start_turns if t > 0),
            "hbm_occupancy_at_start": self.hbm_occupancy,
            "prestored_blocks": self.prestored_blocks,
            "prestore_s": self.prestore_s,
        }


def prepare_steady_start(slots: Sequence[Any], replicas: Sequence[Any], replica_of: Callable[[str], int],
                         seed: int, stagger_cap_s: float, drain: Callable[[], None] | None) -> SteadyStart:
    """Fast-forward every slot to a seeded random turn, install the contexts in HBM in a seeded LRU order,
    store the overflow in the tiers and wait for those writes (`drain`) before the rung's clock starts."""
    rng = np.random.default_rng([seed, len(slots), 0x57EAD1])
    out = SteadyStart(start_turns=[0] * len(slots))
    t0 = time.perf_counter()
    for i in rng.permutation(len(slots)):
        slot = slots[int(i)]
        slot._start_session()
        turns = slot.script.turns
        start = int(rng.integers(0, len(turns)))
        keys = slot.fast_forward(start)
        out.start_turns[int(i)] = start
        out.prestored_blocks += replicas[replica_of(slot.script.session_id)].install(keys)
        pause = turns[start].pause_before_s if start else None
        slot.first_wake = float(rng.uniform(0.0, pause if pause else max(stagger_cap_s, 0.0)))
    if drain is not None:
        drain()
    out.prestore_s = time.perf_counter() - t0
    out.hbm_occupancy = sum(r.occupancy() for r in replicas) / max(1, len(replicas))
    return out


@dataclass
class WarmupDetector:
    """Steady when the last `ticks` samples of HBM occupancy span less than `hbm_tolerance` and those of the
    turns in the engine less than max(1, `turns_tolerance` x their mean)."""

    ticks: int = 4
    hbm_tolerance: float = 0.05
    turns_tolerance: float = 0.25
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (t s, occupancy, turns in engine)

    def add(self, t_s: float, occupancy: float, in_engine: int) -> bool:
        self.samples.append((t_s, occupancy, in_engine))
        if len(self.samples) < self.ticks:
            return False
        last = self.samples[-self.ticks:]
        occ = [s[1] for s in last]
        turns = [s[2] for s in last]
        mean_turns = sum(turns) / len(turns)
        return (max(occ) - min(occ) < self.hbm_tolerance
                and max(turns) - min(turns) <= max(1.0, self.turns_tolerance * mean_turns))
