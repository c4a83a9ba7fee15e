"""Pauses between a session's turns, as the user asks for them: one parser for both spellings.

- ThinkTime (`trace` | `fixed:S` | `uniform:A:B`): the trace-replay think time, drawn per pause.
- Pace (`trace` | `human:A:B` | `agentic:A:B` | `fixed:S`): the sessions mode's pause transform, which
  also says what kind of pause it is (a human coming back, or an agent's tool call).

Errors are PaceError, a ValueError and a UsageError at once, with a one-line message that does not name
the flag it came from (the CLI adds that).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kv_cache.errors import UsageError

__all__ = ["PACE_MODES", "Pace", "PaceError", "ThinkTime", "parse_pace", "parse_think_time"]

PACE_MODES = ("trace", "human", "agentic", "fixed")


class PaceError(UsageError, ValueError):
    """A pause specification that cannot be parsed."""


@dataclass(frozen=True)
class ThinkTime:
    """Think time of replayed sessions: trace | fixed:S | uniform:A:B (seconds, before speed-up)."""

    kind: str = "trace"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        return parse_think_time(text)

    def pick(self, recorded: float | None, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return recorded or 0.0


def parse_think_time(text: str) -> ThinkTime:
    """`trace`, `fixed:S` (S >= 0) or `uniform:A:B` (0 <= A <= B); raises PaceError about think_time."""
    parts = text.split(":")
    try:
        if parts == ["trace"]:
            return ThinkTime()
        if parts[0] == "fixed" and len(parts) == 2 and float(parts[1]) >= 0:
            return ThinkTime("fixed", float(parts[1]))
        if parts[0] == "uniform" and len(parts) == 3 and 0 <= float(parts[1]) <= float(parts[2]):
            return ThinkTime("uniform", float(parts[1]), float(parts[2]))
    except ValueError:
        pass
    raise PaceError(f"must be trace, fixed:S or uniform:A:B with 0 <= A <= B, got {text!r}").about("think_time")


@dataclass(frozen=True)
class Pace:
    """How inter-turn pauses are rewritten: ``trace`` (kept), ``human`` / ``agentic`` (uniform in
    [low_s, high_s], that kind), ``fixed`` (exactly low_s, kind unknown)."""

    mode: str
    low_s: float = 0.0
    high_s: float = 0.0

    def __str__(self) -> str:
        if self.mode == "trace":
            return "trace"
        if self.mode == "fixed":
            return f"fixed:{self.low_s:g}"
        return f"{self.mode}:{self.low_s:g}:{self.high_s:g}"


_PACE_HELP = (
    "expected 'trace', 'human:MIN:MAX', 'agentic:MIN:MAX' or 'fixed:SECONDS' (seconds, 0 <= MIN <= MAX)"
)


def parse_pace(text: str) -> Pace:
    """Parse a pace: ``trace`` (pauses unchanged) | ``human:A:B`` (every inter-turn pause := uniform(A, B)
    seconds, kind 'human'; the article used human:30:60) | ``agentic:A:B`` (same, kind 'agentic') |
    ``fixed:S`` (every pause := S seconds, kind unknown, so ``classify_turn`` decides by its length).

    Raises PaceError (a ValueError) with a one-line message for anything else.
    """
    if not isinstance(text, str):
        raise PaceError(f"bad pace {text!r}: {_PACE_HELP}")
    parts = [p.strip() for p in text.strip().lower().split(":")]
    mode = parts[0]
    if mode == "trace" and len(parts) == 1:
        return Pace("trace")
    expected = {"human": 3, "agentic": 3, "fixed": 2}.get(mode)
    if expected is None or len(parts) != expected:
        raise PaceError(f"bad pace {text!r}: {_PACE_HELP}")
    try:
        numbers = [float(p) for p in parts[1:]]
    except ValueError:
        raise PaceError(f"bad pace {text!r}: {_PACE_HELP}") from None
    if not all(math.isfinite(x) and x >= 0 for x in numbers):
        raise PaceError(f"bad pace {text!r}: seconds must be finite and >= 0")
    if mode == "fixed":
        return Pace("fixed", numbers[0], numbers[0])
    low, high = numbers
    if low > high:
        raise PaceError(f"bad pace {text!r}: MIN ({low:g}) must be <= MAX ({high:g})")
    return Pace(mode, low, high)
