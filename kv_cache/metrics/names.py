"""Names of the recorder's counters (``RunMetrics.count``), shared by whoever counts and whoever reads.

The names are also the keys of the results' ``measurement.counters`` block, so they must never change: a
renamed constant value would silently rename a JSON key and zero every reader still using the old one.
"""

from __future__ import annotations

# Multi-tier cache (cache.py): lookups, the kind of entry a hit found, and moves between tiers.
CACHE_HITS = "cache_hits"
CACHE_MISSES = "cache_misses"
SYSTEM_PROMPT_HITS = "system_prompt_hits"
COMMON_PHRASE_HITS = "common_phrase_hits"
MULTI_TURN_HITS = "multi_turn_hits"
USER_CACHE_HITS = "user_cache_hits"
EVICTIONS = "evictions"
OFFLOADS_CPU = "offloads_cpu"
OFFLOADS_STORAGE = "offloads_storage"
STORAGE_TOKENS_PROCESSED = "storage_tokens_processed"

# Request driver (benchmarks/standard/scheduler.py): what each request found in the cache, and admission.
BLOCK_STORES = "block_stores"
BLOCK_HITS = "block_hits"
BLOCK_BYTES_REUSED = "block_bytes_reused"
PREFIX_HITS = "prefix_hits"
PREFIX_MISSES = "prefix_misses"
PREFIX_BYTES_SAVED = "prefix_bytes_saved"
MULTI_TURN_CACHE_HITS = "multi_turn_cache_hits"
MULTI_TURN_CACHE_MISSES = "multi_turn_cache_misses"
RAG_CHUNK_HITS = "rag_chunk_hits"
RAG_CHUNK_MISSES = "rag_chunk_misses"
REQUESTS_REJECTED = "requests_rejected"


def tier_deletions(tier: str) -> str:
    """Entries deleted from one tier (``tier``: its statistics name, "gpu", "cpu" or "storage")."""
    return f"{tier}_deletions"


def tier_skips(tier: str) -> str:
    """New entries that skipped one tier, larger than its share (``tier``: its statistics name)."""
    return f"{tier}_skipped_entries"


def block_hits_in(tier: str) -> str:
    """Block-layout hits served by one tier (``tier``: its statistics name)."""
    return f"block_hits_{tier}"
