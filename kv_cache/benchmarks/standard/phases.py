"""Work done before the measured window: preconditioning, decode-only pre-population, RAG ingestion.

All of it runs on the driver's worker pool (core/pool.py) and goes through the cache (so entries land
where the waterfall puts them); none of it is counted in the results' statistics (the metrics are reset
when the window opens); each phase reports its own volume and duration.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from kv_cache.core import pool as pools
from kv_cache.core.pool import Stream
from kv_cache.metrics.recorder import GIB
from kv_cache.serving.cache import MultiTierCache
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.workload.rag import RagCorpus, RagDocument

log = logging.getLogger("kv_cache.benchmarks.standard.phases")


def fill(cache: MultiTierCache, items: Iterator[tuple[str, int]], entry_bytes: Callable[[int], int], threads: int,
         chunk_bytes: int, seed: int, stop: threading.Event, label: str, out: TextIO,
         target_bytes: int | None = None) -> dict:
    """Write entries from `items` with `threads` writers until the items or `target_bytes` run out."""
    lock = threading.Lock()
    state = {"bytes": 0, "entries": 0, "next_report": 0, "failed": False}
    report_every = max(GIB, (target_bytes or 0) // 10)
    t0 = time.perf_counter()

    def next_item() -> tuple[str, int] | None:
        with lock:
            if target_bytes is not None and state["bytes"] >= target_bytes:
                return None
            return next(items, None)

    def written(size: int) -> None:
        with lock:
            state["bytes"] += size
            state["entries"] += 1
            if state["bytes"] >= state["next_report"]:
                state["next_report"] += report_every
                total = f" / {target_bytes / GIB:.1f} GiB" if target_bytes else ""
                out.write(f"  {label}: {state['entries']} entries, {state['bytes'] / GIB:.2f} GiB{total}"
                          f" ({time.perf_counter() - t0:.1f} s)\n")
                out.flush()

    def writer(bufs: WorkerBuffers) -> None:
        try:
            while not stop.is_set() and not state["failed"]:
                item = next_item()
                if item is None:
                    return
                size = entry_bytes(item[1])
                cache.allocate(item[0], item[1], size, bufs, cause=label)
                written(size)
        except BaseException:
            state["failed"] = True  # the other writers stop too; the pool re-raises the first error
            raise

    with pools.open_pool(Stream.FILL, threads, chunk_bytes, seed) as pool:
        pool.run_on_each(writer)
    seconds = time.perf_counter() - t0
    return {"entries": state["entries"], "bytes": state["bytes"], "gib": state["bytes"] / GIB, "seconds": seconds,
            "gib_per_sec": state["bytes"] / GIB / seconds if seconds > 0 else 0.0}


def precondition_items() -> Iterator[tuple[str, int]]:
    return ((f"precond_{n}", 2048) for n in itertools.count())


def prepopulation_items(count: int) -> Iterator[tuple[str, int]]:
    return iter([(f"prepop_{n}", 2048) for n in range(count)])


def ingest_rag(cache: MultiTierCache, corpus: RagCorpus, docs: list[RagDocument], entry_bytes: Callable[[int], int],
               chunk_bytes: int, seed: int, stop: threading.Event, out: TextIO) -> dict:
    """Ingest documents in order; beyond `rag.max_documents` the oldest document's chunks are deleted."""
    t0 = time.perf_counter()
    tally = {"written": 0, "chunks": 0, "evicted": 0}

    def ingest(bufs: WorkerBuffers) -> None:  # one writer: documents become retrievable in order
        for doc in docs:
            if stop.is_set():
                break
            for key, tokens in doc.chunks:
                cache.allocate(key, tokens, entry_bytes(tokens), bufs, cause="rag")
                tally["written"] += entry_bytes(tokens)
                tally["chunks"] += 1
            old = corpus.add(doc)
            if old is not None:
                for key, _ in old.chunks:
                    cache.delete(key)
                tally["evicted"] += 1

    with pools.open_pool(Stream.RAG_INGEST, 1, chunk_bytes, seed) as pool:
        pool.run_on_each(ingest)
    written, chunks, evicted = tally["written"], tally["chunks"], tally["evicted"]
    seconds = time.perf_counter() - t0
    out.write(f"  RAG ingestion: {len(docs)} documents, {chunks} chunks, {written / GIB:.2f} GiB in {seconds:.1f} s"
              f"{f', {evicted} documents evicted (rag.max_documents)' if evicted else ''}\n")
    return {"documents": len(docs), "documents_retrievable": len(corpus.live), "documents_evicted": evicted,
            "chunks": chunks, "bytes": written, "gib": written / GIB, "seconds": seconds}
