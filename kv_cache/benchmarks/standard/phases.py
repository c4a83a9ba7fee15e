"""Work done before the measured window: preconditioning, decode-only pre-population, RAG ingestion.

All of it runs on the driver's worker pool (core/pool.py) and goes through the cache (so entries land
where the waterfall puts them); none of it is counted in the results' statistics (the metrics are reset
when the window opens); each phase reports its own volume and duration.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from kv_cache.core import pool as pools
from kv_cache.core.pool import Stream
from kv_cache.metrics.recorder import GIB
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.workload.rag import RagCorpus, RagDocument

log = logging.getLogger("kv_cache.benchmarks.standard.phases")


REPORT_EVERY_S = 10.0  # a progress line at least this often (when an entry completes), whatever the volume


def fill(cache: MultiTierCache, items: Iterator[tuple[str, int]], entry_bytes: Callable[[int], int], threads: int,
         chunk_bytes: int, seed: int, stop: threading.Event, label: str, out: TextIO,
         target_bytes: int | None = None, total_bytes: int | None = None) -> dict:
    """Write entries from `items` with `threads` writers until the items or `target_bytes` run out.

    Progress: a line every tenth of the volume (at least 1 GiB) or every REPORT_EVERY_S, with the total
    (`target_bytes`, or `total_bytes` when the items are a known set), the rate so far and, once the rate is
    known, the time left."""
    lock = threading.Lock()
    total = target_bytes or total_bytes
    state = {"bytes": 0, "entries": 0, "next_report": 0, "last_report": 0.0, "failed": False}
    report_every = max(GIB, (total or 0) // 10)
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
            now = time.perf_counter() - t0
            if state["bytes"] >= state["next_report"] or now - state["last_report"] >= REPORT_EVERY_S:
                while state["next_report"] <= state["bytes"]:
                    state["next_report"] += report_every
                state["last_report"] = now
                out.write(f"  {progress_line(label, state['entries'], state['bytes'], total, now)}\n")
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


def progress_line(label: str, entries: int, done: int, total: int | None, seconds: float) -> str:
    """`prepopulation: 879 entries, 549.38 of 625.00 GiB (87.9 %), 1.84 GiB/s, 41 s left (298.9 s)`."""
    rate = done / GIB / seconds if seconds > 0 else 0.0
    if not total:
        return f"{label}: {entries} entries, {done / GIB:.2f} GiB, {rate:.2f} GiB/s ({seconds:.1f} s)"
    left = f", {max(0.0, (total - done) / GIB / rate):.0f} s left" if rate > 0 else ""
    return (f"{label}: {entries} entries, {done / GIB:.2f} of {total / GIB:.2f} GiB ({min(100.0, 100 * done / total):.1f} %), "
            f"{rate:.2f} GiB/s{left} ({seconds:.1f} s)")


def over_capacity_warning(label: str, total: int, tiers: list[Tier]) -> str | None:
    """The start-of-phase warning when a phase writes more than the tiers can hold: that much of it is
    evicted (deleted from the last tier) as soon as it is written. None when it fits or a tier is unbounded."""
    room = sum(t.limit for t in tiers)
    if math.isinf(room) or total <= room:
        return None
    over = total - room
    return (f"WARNING: {label} writes {total / GIB:.2f} GiB, {total / max(room, 1):.1f}x the {room / GIB:.2f} GiB the "
            f"tiers hold: about {over / GIB:.2f} GiB ({100 * over / total:.0f} %) of it is evicted as soon as it is "
            "written (the window then finds only the last entries written)")


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
