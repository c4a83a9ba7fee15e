"""Reader options (internal)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    max_conversations: int = 0
    tokenizer: str = "auto"
    lookahead_rows: int = 4096  # aiperf: rows held back while waiting for a session's next turn
    max_context_tokens: int = 0  # rows whose input + output tokens exceed this are rejected (0 = no limit)
    chars_per_token: float = 4.0  # sharegpt: characters per token of the chars tokenizer
    sharegpt_max_context: int = 0  # sharegpt: prompts (full context) truncated to this many tokens (0 = none)
    sharegpt_max_generation: int = 0  # sharegpt: answers truncated to this many tokens (0 = none)
