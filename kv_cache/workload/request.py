"""What a simulated inference request asks of the KV cache: a plan of cache operations.

A plan is decided entirely by the issuing user's seeded generator, so the same seed yields the same
(key, size, operation) sequence per user regardless of timing; only the outcome (hit, miss, tier)
depends on the run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    PREFILL_DECODE = "both"


# MLPerf-compatible phase rule: contexts of this many tokens or more are prefill-only (no decode reads).
PREFILL_ONLY_CONTEXT_TOKENS = 10_000


def phase_for_context(context_tokens: int) -> Phase:
    return Phase.PREFILL if context_tokens >= PREFILL_ONLY_CONTEXT_TOKENS else Phase.PREFILL_DECODE


@dataclass(slots=True)
class RequestPlan:
    """One request: identity, QoS and the cache operations it will issue, in order."""

    user_id: str
    request_id: str
    seq: int  # per-user request number, starting at 1
    qos_level: str
    priority: int
    context_tokens: int
    generate_tokens: int
    phase: Phase
    cache_key: str
    conversation_id: str | None = None
    turn_number: int = 1
    history_keys: tuple[str, ...] = ()
    prefix_key: str | None = None
    prefix_tokens: int = 0
    decode_key: str | None = None  # decode-only mode: the pre-populated entry this request reads
    rag_chunks: tuple[tuple[str, int], ...] = ()  # RAG: (chunk key, tokens) read by this request
    blocks: tuple[tuple[str, int], ...] = ()  # --kv-block-tokens > 0: prefix-chain block entries, in order
    # Filled by the driver.
    submit_ns: int = 0
    start_ns: int = 0
    read_bytes: int = 0
    written_bytes: int = 0

    def intended_operations(self, decode_batch_size: int) -> list[tuple[str, str, int]]:
        """The (operation, key, tokens) sequence this plan asks for, independent of cache state."""
        out: list[tuple[str, str, int]] = []
        if self.blocks:
            return [("read-or-write", key, tokens) for key, tokens in self.blocks]
        if self.prefix_key is not None:
            out.append(("read-or-write", self.prefix_key, self.prefix_tokens))
        for key in self.history_keys:
            out.append(("read", key, 0))
        if self.phase in (Phase.PREFILL, Phase.PREFILL_DECODE):
            out.append(("write", self.cache_key, self.context_tokens))
        for key, tokens in self.rag_chunks:
            out.append(("read-or-write", key, tokens))
        if self.phase in (Phase.DECODE, Phase.PREFILL_DECODE):
            out.append(("read", self.cache_key, self.context_tokens))
            out.extend(("read", self.cache_key, self.context_tokens) for _ in range(decode_reads(self.generate_tokens, decode_batch_size)))
        return out


def decode_reads(generate_tokens: int, batch_size: int) -> int:
    """Further full-entry reads after the first decode read: ceil(gen / batch), at least 1 (MLPerf rule)."""
    return max(1, -(-generate_tokens // max(1, batch_size)))
