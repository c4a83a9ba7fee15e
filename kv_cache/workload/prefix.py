"""Shared system-prompt prefixes: entries that are written once and then really read by every request
that uses the same system prompt."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are an AI assistant helping with coding tasks.",
    "You are a professional writing assistant.",
)


@dataclass(frozen=True, slots=True)
class SystemPrefix:
    key: str
    tokens: int
    text: str


def build_system_prefixes(min_prefix_length: int, max_prefix_entries: int) -> tuple[SystemPrefix, ...]:
    """The catalogue of shared prefixes.

    Key and hash are the MLPerf tool's (`kv_system_<16 hex of sha256("<text[:500]>_<words>")>`); the stored
    size is at least `prefix_cache.min_prefix_length` tokens, since shorter prefixes are not worth
    caching; `max_prefix_entries` caps the catalogue.
    """
    out = []
    for text in SYSTEM_PROMPTS[: max(0, max_prefix_entries)]:
        words = len(text.split())
        digest = hashlib.sha256(f"{text[:500]}_{words}".encode()).hexdigest()[:16]
        out.append(SystemPrefix(key=f"kv_system_{digest}", tokens=max(words, min_prefix_length), text=text))
    return tuple(out)
