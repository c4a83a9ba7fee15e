"""Work done before the measured window: preconditioning, decode-only pre-population, RAG ingestion.

All of it goes through the cache (so entries land where the waterfall puts them) and none of it is
counted in the results' statistics (the metrics are reset when the window opens); each phase reports its
own volume and duration.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from kv_cache.cache import MultiTierCache
from kv_cache.metrics.recorder import GIB
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.workload.rag import RagCorpus, RagDocument

log = logging.getLogger("kv_cache.driver.phases")


def fill(cache: MultiTierCache, items: Iterator[tuple[str, int]], entry_bytes: Callable[[int], int], threads: int,
         chunk_bytes: int, seed: int, stop: threading.Event, label: str, out: TextIO,
         target_bytes: int | None = None) -> dict:
    """Write entries from `items` with `threads` writers until the items or `target_bytes` run out."""
    lock = threading.Lock()
    state = {"bytes": 0, "entries": 0, "next_report": 0}
    report_every = max(GIB, (target_bytes or 0) // 10)
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def work(worker_id: int) -> None:
        bufs = WorkerBuffers(chunk_bytes, seed, 100_000 + worker_id)
        try:
            while not stop.is_set() and not errors:
                with lock:
                    if target_bytes is not None and state["bytes"] >= target_bytes:
                        return
                    try:
                        key, tokens = next(items)
                    except StopIteration:
                        return
                size = entry_bytes(tokens)
                cache.allocate(key, tokens, size, bufs, cause=label)
                with lock:
                    state["bytes"] += size
                    state["entries"] += 1
                    if state["bytes"] >= state["next_report"]:
                        state["next_report"] += report_every
                        total = f" / {target_bytes / GIB:.1f} GiB" if target_bytes else ""
                        out.write(f"  {label}: {state['entries']} entries, {state['bytes'] / GIB:.2f} GiB{total}"
                                  f" ({time.perf_counter() - t0:.1f} s)\n")
                        out.flush()
        except BaseException as exc:  # surfaced to the caller after all writers stopped
            errors.append(exc)
        finally:
            bufs.close()

    pool = [threading.Thread(target=work, args=(i,), name=f"kv-fill-{i}", daemon=True) for i in range(max(1, threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
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
    written = chunks = evicted = 0
    with WorkerBuffers(chunk_bytes, seed, 200_000) as bufs:
        for doc in docs:
            if stop.is_set():
                break
            for key, tokens in doc.chunks:
                cache.allocate(key, tokens, entry_bytes(tokens), bufs, cause="rag")
                written += entry_bytes(tokens)
                chunks += 1
            old = corpus.add(doc)
            if old is not None:
                for key, _ in old.chunks:
                    cache.delete(key)
                evicted += 1
    seconds = time.perf_counter() - t0
    out.write(f"  RAG ingestion: {len(docs)} documents, {chunks} chunks, {written / GIB:.2f} GiB in {seconds:.1f} s"
              f"{f', {evicted} documents evicted (rag.max_documents)' if evicted else ''}\n")
    return {"documents": len(docs), "documents_retrievable": len(corpus.live), "documents_evicted": evicted,
            "chunks": chunks, "bytes": written, "gib": written / GIB, "seconds": seconds}
