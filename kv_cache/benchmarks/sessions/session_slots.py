"""A session slot of the sessions ladder: a closed-loop user that replays one session script after another.

Its requests are engine turns: each turn's context is the session so far, stored as prefix-chained
blocks; when a session ends, the slot's next request starts a new session (cold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kv_cache.serving.engine.replica import TurnRequest
from kv_cache.workload.sessions import SessionScript, classify_turn


@dataclass
class Slot:
    """A `kv_cache.workload.users.User` whose requests are `TurnRequest`s (issue time set by the caller)."""

    index: int
    block_tokens: int = 1
    human_threshold_s: float = 0.0
    next_script: Callable[[], SessionScript] | None = None
    script: SessionScript | None = None
    contexts: list[tuple[int, int]] = field(default_factory=list)  # (reused prefix, input) per turn
    turn: int = 0
    keys: list[str] = field(default_factory=list)  # keys of the session's cached full blocks, in order
    outstanding: bool = False
    first_wake: float = 0.0  # seconds before the first turn (steady-state start: staggered)

    @property
    def user_id(self) -> str:
        return f"slot_{self.index}"

    def has_next(self) -> bool:
        return True  # a slot starts the next session when one ends

    def first_wake_s(self) -> float:
        return self.first_wake

    def think_time(self) -> float:
        """The pause before the session's next turn; none when it ended (the next session starts now)."""
        if self.script is not None and self.turn < len(self.script.turns):
            return self.script.turns[self.turn].pause_before_s or 0.0
        return 0.0

    def restart(self) -> None:
        """Nothing to replay: the slot's supply of sessions continues."""

    def fast_forward(self, start_turn: int) -> list[str]:
        """Mark the first `start_turn` turns of the current session (a new one if none) as already processed
        (a steady-state start): their blocks are keyed as if they had run; returns the keys of the context
        they left behind."""
        if self.script is None:
            self._start_session()
        start_turn = max(0, min(start_turn, len(self.script.turns) - 1))
        for _ in range(start_turn):
            self.next_request()
        self.outstanding = False
        return list(self.keys)

    def _start_session(self) -> None:
        self.begin(self.next_script())

    def begin(self, script: SessionScript) -> None:
        """Make `script` the slot's current session, at its first turn (the steady-state start picks it)."""
        self.script, self.turn = script, 0
        self.contexts = self.script.contexts()
        self.keys = [f"shared_{j}" for j in range(self.script.shared_prefix_tokens // self.block_tokens)]

    def next_request(self) -> TurnRequest:
        if self.script is None or self.turn >= len(self.script.turns):
            self._start_session()
        B = self.block_tokens
        script = self.script
        turn = script.turns[self.turn]
        reused, input_tokens = self.contexts[self.turn]
        final_tokens = input_tokens + turn.output_tokens
        sid = script.session_id
        # Prefix-chained keys: the reused prefix keeps its blocks' keys; every block after it is new content
        # (a rewritten history must not hit stale blocks), tagged with the turn that creates it.
        kept = self.keys[: reused // B]
        fresh = [f"{sid}_t{self.turn}_{j}" for j in range(len(kept), final_tokens // B)]
        final_keys = kept + fresh
        req = TurnRequest(
            slot=self.index,
            session_id=sid,
            turn_index=self.turn,
            turn_class=classify_turn(turn, self.human_threshold_s),
            issue_ns=0,
            input_tokens=input_tokens,
            new_tokens=turn.new_tokens,
            output_tokens=turn.output_tokens,
            input_keys=final_keys[: input_tokens // B],
            final_keys=final_keys,
            needed_slots=-(-final_tokens // B),
        )
        self.keys = final_keys
        self.outstanding = True
        self.turn += 1
        return req
