"""The normalized request model that every trace format is parsed into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kv_cache.errors import UsageError


class TraceError(UsageError):
    """A trace that cannot be used at all (missing, unreadable, empty, unknown format, no valid row).

    The message is one line that names the file.
    """

    def __init__(self, path: object, reason: str | None = None) -> None:
        self.path = None if reason is None else str(path)
        text = str(path) if reason is None else f"{path}: {reason}"
        super().__init__(" ".join(text.split()))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, whatever its format.

    - ``index``: row order in the trace (0-based, after skipping malformed rows).
    - ``session_id``: conversation/session, ``None`` for sessionless rows (Mooncake, BurstGPT without
      ``Session ID``).
    - ``turn``: 1-based turn within the session (1 for sessionless rows).
    - ``arrival_s``: seconds since the trace's own zero, where the trace records arrival times (open-loop
      replay); ``None`` where it does not (AIPerf later turns, ShareGPT).
    - ``think_time_s``: the recorded pause AFTER this request's response before the same session's next
      request (closed-loop replay), ``None`` if not recorded or this is the session's last request.
    - ``input_tokens``: the FULL context of this request (history + new).
    - ``new_tokens``: tokens not already present in the previous turn's context (prompt + response);
      ``== input_tokens`` for turn 1 and sessionless rows.
    - ``output_tokens``: generated tokens.
    - ``hash_ids``: one id per ``block_tokens`` block of the FULL input in prefix order, where the trace has
      them. Equal ids = identical block content (and, in every supported format, identical prefix).
      Mooncake/AIPerf/Bailian list ``ceil(input/block)`` ids (the last may cover a partial block); the WEKA
      agentic-coding traces list only the ``floor(input/block)`` complete blocks.
    - ``block_tokens``: the trace's block size for ``hash_ids``.
    - ``kind``: ``"request"``; WEKA: ``"subagent"`` for sub-agent requests, else the class of the pause that
      follows (``"agentic"``: the next request carries a tool result, ``"human"``: it carries user text).
    """

    index: int
    session_id: str | None
    turn: int
    arrival_s: float | None
    think_time_s: float | None
    input_tokens: int
    new_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None
    block_tokens: int | None
    kind: str = "request"


# Why rows were skipped, by kind: a reason (TraceStats.skipped_reasons) belongs to the first kind whose
# test holds; every other reason counted as malformed is "malformed", any other "other".
SKIP_KINDS: tuple[tuple[str, str], ...] = (
    ("absurd", "absurd_value:"),  # a token count no request could have (over 1e9)
    ("beyond_context_window", "beyond_context_window"),  # input + output over max_trace_context_tokens
    ("beyond_max_conversations", "beyond_max_conversations"),  # the conversation limit
    ("failed_request", "failed_request"),  # BurstGPT rows of failed requests
)


def skip_kind(reason: str, malformed: bool) -> str:
    """The kind of a skip reason: absurd, beyond_context_window, ..., else malformed (or other)."""
    for kind, prefix in SKIP_KINDS:
        if reason.startswith(prefix):
            return kind
    return "malformed" if malformed else "other"


@dataclass
class TraceStats:
    """What a pass over a trace saw; filled while the source is iterated (reset at each new pass)."""

    format: str = ""
    path: str = ""
    rows: int = 0
    skipped_malformed: int = 0
    skipped_other: int = 0  # well-formed rows left out on purpose (failed requests, session limit)
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    sessions: int = 0
    turns_max: int = 0
    total_input_tokens: int = 0
    total_new_tokens: int = 0
    total_output_tokens: int = 0
    max_input_tokens: int = 0
    total_hash_blocks: int = 0
    first_arrival_s: float | None = None
    last_arrival_s: float | None = None
    block_tokens: int | None = None
    tokenizer: str | None = None  # sharegpt: "tiktoken-cl100k_base" | "chars/4"
    files: int = 0  # weka: conversation files read
    subagents: int = 0  # weka: sub-agent entries flattened into child sessions
    think_time_unknown: int = 0  # aiperf: think times dropped because the next turn was too far ahead
    complete: bool = False  # the whole trace was read (not stopped by max_rows / an early break)
    stopped_at: str | None = None  # a limit that ended the reading before the end of the file (sharegpt:
    # "max_conversations"), the pass then complete
    skipped_by_kind: dict[str, int] = field(default_factory=dict)  # skip_kind of each skipped row

    def skip(self, reason: str, malformed: bool = True) -> None:
        self.skipped_reasons[reason] = self.skipped_reasons.get(reason, 0) + 1
        kind = skip_kind(reason, malformed)
        self.skipped_by_kind[kind] = self.skipped_by_kind.get(kind, 0) + 1
        if malformed:
            self.skipped_malformed += 1
        else:
            self.skipped_other += 1

    @property
    def read(self) -> int:
        """Rows read: used plus skipped."""
        return self.rows + self.skipped

    @property
    def skipped(self) -> int:
        return self.skipped_malformed + self.skipped_other

    @property
    def duration_s(self) -> float | None:
        if self.first_arrival_s is None or self.last_arrival_s is None:
            return None
        return self.last_arrival_s - self.first_arrival_s

    @property
    def mean_input_tokens(self) -> float:
        return self.total_input_tokens / self.rows if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": self.path,
            "rows": self.rows,
            "skipped_malformed": self.skipped_malformed,
            "skipped_other": self.skipped_other,
            "skipped_reasons": dict(sorted(self.skipped_reasons.items())),
            "skipped_by_kind": {kind: self.skipped_by_kind.get(kind, 0)
                                for kind in ("malformed", *(k for k, _ in SKIP_KINDS), "other")},
            "sessions": self.sessions,
            "turns_max": self.turns_max,
            "total_input_tokens": self.total_input_tokens,
            "total_new_tokens": self.total_new_tokens,
            "total_output_tokens": self.total_output_tokens,
            "mean_input_tokens": self.mean_input_tokens,
            "max_input_tokens": self.max_input_tokens,
            "total_hash_blocks": self.total_hash_blocks,
            "duration_s": self.duration_s,
            "block_tokens": self.block_tokens,
            "tokenizer": self.tokenizer,
            "files": self.files,
            "subagents": self.subagents,
            "think_time_unknown": self.think_time_unknown,
            "complete": self.complete,
            "stopped_at": self.stopped_at,
        }


@dataclass
class ReplayTally:
    """What the run replayed of one trace file, over every pass (`--replay-cycles`): the rows it sent to
    the load generator, the passes it started and the passes it sent to their end. (The file's own rows and
    skips are its TraceStats: one pass, the whole file.)"""

    rows: int = 0  # rows of this file sent to the run, all passes together
    passes: int = 0  # passes over the file started
    passes_complete: int = 0  # passes whose every row was sent
    sessions: int = 0  # closed-loop replay: the sessions of this file (one user each)
    _done: dict[int, int] = field(default_factory=dict)  # pass -> sessions that sent their last turn in it

    def session_turn(self, cycle: int, first: bool, last: bool) -> None:
        """A closed-loop session of this file sent a turn of pass `cycle` (its first / last of the pass)."""
        self.rows += 1
        if first:
            self.passes = max(self.passes, cycle + 1)
        if last:
            done = self._done[cycle] = self._done.get(cycle, 0) + 1
            if done >= self.sessions:
                self.passes_complete += 1
                del self._done[cycle]

    def to_dict(self) -> dict[str, Any]:
        return {"rows_sent": self.rows, "passes": self.passes, "passes_complete": self.passes_complete}
