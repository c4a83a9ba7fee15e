"""The stream of sessions each rung of the sessions ladder replays: generated, or a trace's, cycled."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from kv_cache.workload.sessions import SessionScript, generate_sessions

__all__ = ["script_supply"]


def script_supply(trace_scripts: list[SessionScript] | None, sess_cfg: Any,
                  seed: int) -> Callable[[], Iterator[SessionScript]]:
    """A fresh, identical stream of sessions for every rung (so configs replay the same work)."""

    def make() -> Iterator[SessionScript]:
        if trace_scripts is None:
            return generate_sessions(sess_cfg, seed)
        return (
            dataclasses.replace(s, session_id=f"{s.session_id}#{i // len(trace_scripts)}")
            for i, s in zip(itertools.count(), itertools.cycle(trace_scripts))
        )

    return make
