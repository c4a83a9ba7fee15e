"""Reader options (internal)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    max_conversations: int = 0
    tokenizer: str = "auto"
    lookahead_rows: int = 4096  # aiperf: rows held back while waiting for a session's next turn
