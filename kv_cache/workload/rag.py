"""RAG documents: ingested into fixed-size chunk entries, and retrievals that read those very chunk
entries (same keys)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from kv_cache.specs.models import ModelConfig

RETRIEVAL_DISTRIBUTIONS = ("zipfian", "uniform", "random")


@dataclass(frozen=True, slots=True)
class RagDocument:
    doc_id: str
    tokens: int
    chunks: tuple[tuple[str, int], ...]  # (cache key, tokens)


def chunk_tokens(rag_cfg, model: ModelConfig) -> int:
    """MLPerf-compatible chunk size: max(1, min(chunk_size_tokens, max_chunk_bytes // bytes_per_token))."""
    return max(1, min(rag_cfg.chunk_size_tokens, rag_cfg.max_chunk_bytes // model.bytes_per_token))


def build_documents(num_docs: int, rag_cfg, model: ModelConfig, seed: int) -> list[RagDocument]:
    """Documents doc_0000.. with sizes from the large/small model ranges, split into chunk entries."""
    rng = random.Random(f"kv-cache-rag:{seed}")
    if model.is_large_model:
        lo, hi = rag_cfg.large_model_doc_tokens_min, rag_cfg.large_model_doc_tokens_max
    else:
        lo, hi = rag_cfg.small_model_doc_tokens_min, rag_cfg.small_model_doc_tokens_max
    size = chunk_tokens(rag_cfg, model)
    docs = []
    for i in range(num_docs):
        doc_id = f"doc_{i:04d}"
        tokens = rng.randint(lo, hi)
        chunks = []
        for j, start in enumerate(range(0, tokens, size)):
            chunks.append((f"rag_{doc_id}_chunk_{j}", min(size, tokens - start)))
        docs.append(RagDocument(doc_id, tokens, tuple(chunks)))
    return docs


class RagCorpus:
    """The documents currently retrievable (at most `rag.max_documents` when > 0, newest kept)."""

    def __init__(self, rag_cfg) -> None:
        self.cfg = rag_cfg
        self.max_documents = rag_cfg.max_documents
        self.live: deque[RagDocument] = deque()

    def add(self, doc: RagDocument) -> RagDocument | None:
        """Make a document retrievable; returns the document that must be evicted, if any."""
        self.live.append(doc)
        if self.max_documents and len(self.live) > self.max_documents:
            return self.live.popleft()
        return None

    def retrieve(self, rng: random.Random) -> tuple[tuple[str, int], ...]:
        """Chunks one query reads: a uniform document, top_k distinct chunks by the configured distribution."""
        if not self.live:
            return ()
        doc = self.live[rng.randrange(len(self.live))]
        n = len(doc.chunks)
        k = min(self.cfg.top_k_chunks, n)
        if self.cfg.retrieval_distribution == "zipfian":
            weights = [1.0 / (i + 1) for i in range(n)]
            picked: list[int] = []
            candidates = list(range(n))
            for _ in range(k):
                i = rng.choices(range(len(candidates)), weights=[weights[c] for c in candidates])[0]
                picked.append(candidates.pop(i))
        else:
            picked = rng.sample(range(n), k)
        return tuple(doc.chunks[i] for i in picked)
