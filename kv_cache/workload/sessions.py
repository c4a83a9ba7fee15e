"""Session scripts: what each simulated session does, turn by turn, before any timing is simulated.

A ``SessionScript`` is a list of ``Turn`` s. The context a turn sees is built append-only::

    input(0)     = shared_prefix_tokens + new(0)
    input(i)     = base(i) + new(i),    base(i) = input(i-1) + output(i-1)   (the whole previous context)
                                           or = kept_tokens(i) when the history was rewritten (a trace's
                                              compaction / truncation: only that prefix of it is reused)
    after(i)     = input(i) + output(i)

``shared_prefix_tokens`` is a prefix (system prompt + tools) identical in every session of the workload,
so a prefix cache can share it between sessions; everything else is private to the session.

Sources: ``generate_sessions`` (the built-in AIPerf-agentic-code-like generator, config ``sessions:``),
``sessions_from_trace`` (a real trace). ``apply_pace`` rewrites every inter-turn pause (the article's
human-pace transform), ``classify_turn`` tells session starts, human returns and agentic turns apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kv_cache.hashing import stable_id
from kv_cache.settings.pacing import PACE_MODES, Pace, parse_pace
from kv_cache.workload.grouping import SessionRows, complete_ids, group_sessions

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.schema import SessionsConfig
    from kv_cache.workload.traces import TraceRequest, TraceSource

__all__ = [
    "PACE_MODES",
    "PAUSE_KINDS",
    "TURN_CLASSES",
    "Pace",
    "SessionScript",
    "Turn",
    "apply_pace",
    "classify_turn",
    "generate_session",
    "generate_sessions",
    "lognormal_params",
    "parse_pace",
    "sessions_from_trace",
]

PAUSE_KINDS = ("agentic", "human")
TURN_CLASSES = ("start", "return", "agentic")

_SEED_MASK = (1 << 64) - 1
_GENERATOR_TAG = 0x5E5510  # separates the generator's streams from the pace transform's
_PACE_TAG = 0x9ACE


@dataclass(frozen=True)
class Turn:
    """One request of a session.

    - ``new_tokens``: prompt tokens not in the reused context (user text, tool results, ...);
    - ``output_tokens``: tokens generated;
    - ``pause_before_s``: idle seconds between the previous turn's last token and this request; ``None``
      for a session's first turn;
    - ``pause_kind``: what the pause was: ``'agentic'`` (a tool round trip), ``'human'`` (a person), or
      ``None`` (first turn, or not known: ``classify_turn`` then decides by its length);
    - ``kept_tokens``: ``None`` = this turn reuses its session's whole previous context (input + output of
      the previous turn); an int = only that many leading tokens of it (the history was rewritten).
    """

    new_tokens: int
    output_tokens: int
    pause_before_s: float | None
    pause_kind: str | None
    kept_tokens: int | None = None


@dataclass(frozen=True)
class SessionScript:
    """A session: its turns in order, the KV block size its token counts refer to, and how many leading
    tokens (before turn 1's ``new_tokens``) are shared by every session of the workload."""

    session_id: str
    turns: tuple[Turn, ...]
    block_tokens: int
    shared_prefix_tokens: int = 0

    def contexts(self) -> list[tuple[int, int]]:
        """``(reused_prefix_tokens, input_tokens)`` per turn (module docstring): the prefix of the input
        that was this session's context before (the shared prefix for turn 1), and the full input."""
        out: list[tuple[int, int]] = []
        after = self.shared_prefix_tokens
        for i, turn in enumerate(self.turns):
            base = after if i == 0 or turn.kept_tokens is None else min(after, turn.kept_tokens)
            inp = base + turn.new_tokens
            out.append((base, inp))
            after = inp + turn.output_tokens
        return out

    def input_tokens(self, i: int) -> int:
        """Full input (context) tokens of turn ``i``."""
        return self.contexts()[i][1]

    @property
    def max_context_tokens(self) -> int:
        """The largest ``input + output`` of any turn (0 for a session without turns)."""
        return max(
            (inp + t.output_tokens for (_, inp), t in zip(self.contexts(), self.turns, strict=True)),
            default=0,
        )


# --------------------------------------------------------------------------------------------------
# Built-in generator
# --------------------------------------------------------------------------------------------------


def lognormal_params(mean: float, median: float) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal with that mean and median: ``mu = ln(median)``,
    ``sigma = sqrt(2 ln(mean / median))`` (mean = exp(mu + sigma^2 / 2)); needs 0 < median <= mean."""
    if not (median > 0 and mean >= median):
        raise ValueError(f"a lognormal needs 0 < median <= mean, got mean {mean}, median {median}")
    return math.log(median), math.sqrt(2.0 * math.log(mean / median))


def _session_rng(seed: int | None, *parts: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed or 0) & _SEED_MASK, *parts]))


def generate_session(cfg: SessionsConfig, seed: int | None, index: int) -> SessionScript:
    """Session number ``index`` of the built-in generator: a function of (cfg, seed, index) only.

    - turns wanted: geometric with mean ``turns_mean`` (>= 1);
    - turn 1: ``new = shared-prefix-free part of the first prompt``, lognormal with mean
      ``first_turn_tokens_mean - shared_prefix_tokens`` and the sigma of the later turns' distribution;
    - later turns: new tokens lognormal(``new_tokens_mean``, ``new_tokens_median``) (``lognormal_params``);
      pause: human with probability ``human_pause_probability`` (lognormal, ``human_pause_mean_s`` /
      ``human_pause_median_s``) else agentic (lognormal, ``agentic_pause_mean_s`` / ``agentic_pause_median_s``),
      AIPerf agentic-code's two-component mixture;
    - every turn: output tokens lognormal(``output_tokens_mean``, ``output_tokens_median``);
    - token counts are rounded and at least 1; the session ends before the turn whose ``input + output``
      would exceed ``max_context_tokens`` (turn 1 is shortened to fit instead).
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"session index must be an integer >= 0, got {index!r}")
    shared = int(cfg.shared_prefix_tokens)
    limit = int(cfg.max_context_tokens)
    if limit - shared < 2:
        raise ValueError(
            f"sessions.max_context_tokens ({limit}) must exceed sessions.shared_prefix_tokens ({shared}) by >= 2"
        )
    mu_new, sigma_new = lognormal_params(cfg.new_tokens_mean, cfg.new_tokens_median)
    mu_out, sigma_out = lognormal_params(cfg.output_tokens_mean, cfg.output_tokens_median)
    pause_params = {True: lognormal_params(cfg.human_pause_mean_s, cfg.human_pause_median_s),
                    False: lognormal_params(cfg.agentic_pause_mean_s, cfg.agentic_pause_median_s)}
    first_mean = max(1.0, cfg.first_turn_tokens_mean - shared)
    mu_first = math.log(first_mean) - sigma_new * sigma_new / 2.0
    rng = _session_rng(seed, _GENERATOR_TAG, index)

    wanted = int(rng.geometric(1.0 / cfg.turns_mean))
    new = min(max(1, round(rng.lognormal(mu_first, sigma_new))), limit - shared - 1)
    out = min(max(1, round(rng.lognormal(mu_out, sigma_out))), limit - shared - new)
    turns = [Turn(new, out, None, None)]
    context = shared + new + out
    for _ in range(wanted - 1):
        human = rng.random() < cfg.human_pause_probability
        pause = float(rng.lognormal(*pause_params[human]))
        new = max(1, round(rng.lognormal(mu_new, sigma_new)))
        out = max(1, round(rng.lognormal(mu_out, sigma_out)))
        if context + new + out > limit:
            break
        turns.append(Turn(new, out, pause, "human" if human else "agentic"))
        context += new + out
    return SessionScript(f"session-{index:06d}", tuple(turns), int(cfg.block_tokens), shared)


def generate_sessions(
    cfg_sessions: SessionsConfig, seed: int | None, start_index: int = 0
) -> Iterator[SessionScript]:
    """Endless stream of ``generate_session(cfg_sessions, seed, i)`` for i = start_index, start_index+1, ...

    Session i depends only on (config, seed, i): not on how many sessions were drawn before it.
    """
    index = start_index
    while True:
        yield generate_session(cfg_sessions, seed, index)
        index += 1


# --------------------------------------------------------------------------------------------------
# Real traces
# --------------------------------------------------------------------------------------------------

_ROW_PAUSE_KIND = {"human": "human", "agentic": "agentic", "subagent": "agentic"}
class _Building:
    __slots__ = ("sid", "rows", "bases", "first_ids")

    def __init__(self, sid: str, first_ids: tuple[int, ...]) -> None:
        self.sid = sid
        self.rows: list[TraceRequest] = []
        self.bases: list[int] = []  # per row: tokens of its input that were the session's context before
        self.first_ids = first_ids


def _common_prefix_len(seqs: list[tuple[int, ...]]) -> int:
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        x = first[i]
        if any(s[i] != x for s in seqs):
            return i
    return n


def sessions_from_trace(
    source: TraceSource | Any, max_sessions: int = 0, default_block_tokens: int = 512
) -> list[SessionScript]:
    """Session scripts from a trace (any iterable of ``TraceRequest``; ``open_trace`` gives one).

    Rows WITH a session id (WEKA agentic-coding, including its sub-agent child sessions; AIPerf; Bailian;
    BurstGPT / ShareGPT with sessions): a session's rows in trace order are its turns. ``new_tokens`` and
    ``output_tokens`` come from the row (each at least 1); ``kept_tokens = input - new`` when that is less
    than the previous turn's input + output (the history was rewritten), else ``None``.

    Rows WITHOUT a session id (Mooncake, which has none) are grouped into sessions by their hash-id
    prefixes (``kv_cache.workload.grouping``, shared with trace replay). A continuation's new tokens are
    ``input - (previous input + output)`` when the input is at least that long (the whole previous context
    kept), else ``input - matched blocks x block`` (only the matched prefix kept). Rows without hash ids are
    one-turn sessions.

    Pauses: ``pause_before_s`` of turn i = the previous row's ``think_time_s``; where the trace has none,
    the gap between the two rows' arrivals (an upper bound: it includes the previous turn's service time),
    else 0. ``pause_kind`` = the previous row's ``kind`` ('human' / 'agentic'; WEKA sub-agent requests are
    tool loops: 'agentic'; anything else: ``None``).

    ``shared_prefix_tokens`` of every script = the complete blocks that ALL sessions' first rows share (as
    with Mooncake's common system-prompt block), capped so every first turn keeps >= 1 new token; turn 1's
    ``new_tokens`` exclude it. ``max_sessions``: keep the first N sessions (by first row; 0 = all).
    """
    fallback_block = int(getattr(source, "block_tokens", None) or default_block_tokens)
    grouped = group_sessions(source, infer_sessionless=True, max_sessions=max_sessions,
                             fmt=str(getattr(source, "format", "trace")), default_block_tokens=fallback_block)
    order = [_building(g, fallback_block) for g in grouped.sessions]
    seen_block = grouped.block_tokens
    block = seen_block or int(getattr(source, "block_tokens", None) or default_block_tokens)
    shared = 0
    if len(order) >= 2:
        shared = _common_prefix_len([b.first_ids for b in order]) * block
        if shared:
            shortest = min(b.rows[0].input_tokens for b in order)
            shared = min(shared, ((shortest - 1) // block) * block)
    return [_script(b, block, shared) for b in order]


def _building(group: SessionRows, fallback_block: int) -> _Building:
    """A grouped session with, per row, how much of its input was the session's context before it."""
    first = group.rows[0]
    b = _Building(group.key, complete_ids(first, first.block_tokens or fallback_block))
    b.rows = list(group.rows)
    for i, (req, matched) in enumerate(zip(group.rows, group.matched, strict=True)):
        if i == 0:
            b.bases.append(0)
        elif matched is None:  # a session id: the row says how many of its tokens are new
            b.bases.append(max(0, req.input_tokens - req.new_tokens))
        else:  # inferred: the whole previous context when the input covers it, else the matched prefix
            prev = group.rows[i - 1]
            prev_ctx = prev.input_tokens + prev.output_tokens
            row_block = req.block_tokens or fallback_block
            b.bases.append(prev_ctx if req.input_tokens >= prev_ctx else min(req.input_tokens, matched * row_block))
    return b


def _pause(prev: TraceRequest, cur: TraceRequest) -> float:
    if prev.think_time_s is not None:
        return max(0.0, float(prev.think_time_s))
    if prev.arrival_s is not None and cur.arrival_s is not None:
        return max(0.0, float(cur.arrival_s - prev.arrival_s))
    return 0.0


def _script(b: _Building, block: int, shared: int) -> SessionScript:
    """Turns whose inputs equal the trace rows' inputs exactly: a turn with no new token gets one (the last
    token of a fully reused prompt is recomputed, as engines do) taken from its reused prefix, and
    ``kept_tokens`` is set wherever the reused prefix is not the script's whole previous context."""
    turns = []
    after = 0
    for i, req in enumerate(b.rows):
        out = max(1, req.output_tokens)
        if i == 0:
            turn = Turn(req.input_tokens - shared, out, None, None)
        else:
            base = min(b.bases[i], req.input_tokens - 1)
            prev = b.rows[i - 1]
            kept = None if base == after else base
            turn = Turn(req.input_tokens - base, out, _pause(prev, req), _ROW_PAUSE_KIND.get(prev.kind), kept)
        turns.append(turn)
        after = req.input_tokens + out
    return SessionScript(b.sid, tuple(turns), block, shared)


# --------------------------------------------------------------------------------------------------
# Pace transform and turn classes
# --------------------------------------------------------------------------------------------------


def apply_pace(script: SessionScript, pace: Pace, seed: int | None) -> SessionScript:
    """The script with every inter-turn pause (turns 2..n) rewritten by ``pace``; ``trace`` returns it
    unchanged, the first turn is never touched. The pause of turn i is a function of (seed, session_id, i)
    only (a generator seeded from the three)."""
    if pace.mode == "trace" or len(script.turns) < 2:
        return script
    if pace.mode not in PACE_MODES:
        raise ValueError(f"unknown pace mode {pace.mode!r} (expected one of {', '.join(PACE_MODES)})")
    n = len(script.turns) - 1
    if pace.mode == "fixed":
        pauses = [pace.low_s] * n
        kind = None
    else:
        rng = _session_rng(seed, _PACE_TAG, stable_id(script.session_id))
        pauses = (
            rng.uniform(pace.low_s, pace.high_s, size=n).tolist()
            if pace.high_s > pace.low_s
            else [pace.low_s] * n
        )
        kind = pace.mode
    turns = [script.turns[0]] + [
        replace(turn, pause_before_s=float(p), pause_kind=kind)
        for turn, p in zip(script.turns[1:], pauses, strict=True)
    ]
    return replace(script, turns=tuple(turns))


def classify_turn(turn: Turn, human_threshold_s: float) -> str:
    """``'start'`` (a session's first turn: no pause before it) | ``'return'`` (a human pause, or a pause of
    unknown kind of at least ``human_threshold_s``) | ``'agentic'`` (an agentic pause, or a shorter one of
    unknown kind)."""
    if turn.pause_before_s is None:
        return "start"
    if turn.pause_kind == "human":
        return "return"
    if turn.pause_kind == "agentic":
        return "agentic"
    return "return" if turn.pause_before_s >= human_threshold_s else "agentic"
