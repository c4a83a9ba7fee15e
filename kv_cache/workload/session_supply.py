"""The stream of sessions each rung of the sessions ladder replays: generated, or a trace's.

A trace's sessions are replayed in order and cycled, or, with `resample` (a run with replications), drawn
with replacement from the trace by a generator seeded with the replication's seed: each replication is then
a fresh sample of the trace's sessions (a bootstrap over sessions), so the spread between replications, on
which the answer's interval rests, includes the session-sample variance, the largest one on real traces.
Every configuration and rung of a replication gets the same seed, so the same sessions (paired).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

from kv_cache.workload.sessions import SessionScript, generate_sessions

__all__ = ["script_supply"]


def script_supply(trace_scripts: list[SessionScript] | None, sess_cfg: Any, seed: int,
                  resample: bool = False) -> Callable[[], Iterator[SessionScript]]:
    """A fresh, identical stream of sessions for every rung of a seed (so configs replay the same work):
    generated from `seed`; a trace's in order, cycled; or, with `resample`, a trace's drawn with replacement
    (seeded by `seed`). A session replayed again gets a fresh id (``id#i``)."""

    def make() -> Iterator[SessionScript]:
        if trace_scripts is None:
            return generate_sessions(sess_cfg, seed)
        if resample:
            rng = random.Random(f"session-resample:{seed}")
            return (_redraw(trace_scripts, rng, i) for i in itertools.count())
        return (
            dataclasses.replace(s, session_id=f"{s.session_id}#{i // len(trace_scripts)}")
            for i, s in zip(itertools.count(), itertools.cycle(trace_scripts))
        )

    return make


def _redraw(trace_scripts: list[SessionScript], rng: random.Random, i: int) -> SessionScript:
    """Draw i of a resampled stream: a session of the trace chosen at random, with an id of its own."""
    s = trace_scripts[rng.randrange(len(trace_scripts))]
    return dataclasses.replace(s, session_id=f"{s.session_id}#r{i}")
