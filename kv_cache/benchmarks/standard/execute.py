"""Executes one request plan's cache operations on an I/O worker, in the MLPerf tool's order: shared
prefix, earlier turns, prefill write, RAG chunks, decode reads.

The cache says where an entry was found; this module counts what the hit means for the workload (a
system prompt, an earlier turn, a RAG chunk, a KV block), since only the request knows why it read it.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kv_cache.metrics import names
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import STAT_NAMES, CacheRead, CapacityError, EntryTooLarge, MultiTierCache
from kv_cache.storage.base import DataCorruption, IOAborted
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.faults import FATAL_ERRNOS as _FATAL
from kv_cache.storage.faults import StorageFault
from kv_cache.workload.request import Phase, RequestPlan, decode_reads

log = logging.getLogger("kv_cache.driver")

# Errors after which continuing would measure nothing meaningful (storage/faults.py decides which).
FATAL_ERRNOS = _FATAL

# Counter of an in-window hit, by what was read (the MLPerf tool's cache_stats names).
USER_HIT, SYSTEM_HIT, MULTI_TURN_HIT = names.USER_CACHE_HITS, names.SYSTEM_PROMPT_HITS, names.MULTI_TURN_HITS


@dataclass(frozen=True)
class Timing:
    """A completed plan: storage ns on its behalf, and the prefill / decode parts of it (None: none)."""

    storage_ns: int
    prefill_ns: int | None
    decode_ns: int | None


ABANDONED, FAILED = "abandoned", "failed"
Outcome = Timing | str


class PlanExecutor:
    def __init__(self, cache: MultiTierCache, metrics: RunMetrics, entry_bytes: Callable[[int], int],
                 stop: threading.Event, decode_batch_size: int, prefill_only: bool = False,
                 decode_only: bool = False, on_fatal: Callable[[str], None] | None = None) -> None:
        self.cache = cache
        self.metrics = metrics
        self.entry_bytes = entry_bytes
        self.stop = stop
        self.decode_batch_size = decode_batch_size
        self.prefill_only = prefill_only
        self.decode_only = decode_only
        self.on_fatal = on_fatal

    def _read(self, key: str, bufs: WorkerBuffers, hit_counter: str, cause: str, io: list[int]) -> CacheRead:
        res = self.cache.read(key, bufs, cause)
        io[0] += res.ns
        io[1] += res.nbytes
        if res.in_window:
            self.metrics.count(hit_counter)
        return res

    def _store(self, key: str, tokens: int, bufs: WorkerBuffers, cause: str, io: list[int]) -> int:
        size = self.entry_bytes(tokens)
        _, ns, wrote = self.cache.allocate_sized(key, tokens, size, bufs, cause=cause)
        io[0] += ns
        io[2] += size if wrote else 0
        return ns

    def _read_or_write(self, key: str, tokens: int, bufs: WorkerBuffers, hit_counter: str, cause: str,
                       io: list[int]) -> str | None:
        """Read an entry if cached, else compute and store it. Returns the tier it was read from (None:
        stored); adds ns, bytes read, bytes written to `io`."""
        tier = self._read(key, bufs, hit_counter, cause, io).tier
        if tier is None:
            self._store(key, tokens, bufs, cause, io)
        return tier

    def execute(self, plan: RequestPlan, bufs: WorkerBuffers) -> Outcome:
        plan.start_ns = time.perf_counter_ns()
        io = [0, 0, 0]  # storage ns, bytes read, bytes written on behalf of this request
        try:
            prefill_ns, decode_ns = self._operations(plan, bufs, io)
        except IOAborted:
            return ABANDONED
        except DataCorruption as exc:  # --verify: counted and the first ones logged by the cache
            self.metrics.record_error("verify", exc)
            return FAILED
        except CapacityError as exc:  # the storage tier is full (hard limit) or the entry can never fit
            self.metrics.record_error("capacity", exc)
            if isinstance(exc, EntryTooLarge) and self.on_fatal is not None:
                self.on_fatal(str(exc))
            return FAILED
        except OSError as exc:
            self.metrics.record_error("request", exc)
            # a StorageFault was already put to the run's error policy by the cache
            if exc.errno in FATAL_ERRNOS and self.on_fatal is not None and not isinstance(exc, StorageFault):
                self.on_fatal(f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}")
            return FAILED
        except Exception as exc:  # a bug must not silently kill a worker and starve the run
            log.exception("request %s failed", plan.request_id)
            self.metrics.record_error("request", exc)
            return FAILED
        plan.read_bytes, plan.written_bytes = io[1], io[2]
        return Timing(io[0], prefill_ns, decode_ns)

    def _operations(self, plan: RequestPlan, bufs: WorkerBuffers, io: list[int]) -> tuple[int | None, int | None]:
        m = self.metrics
        prefill_ns = None
        for key, tokens in plan.blocks:  # block layout: load what is cached, compute+store the rest
            tier = self._read_or_write(key, tokens, bufs, USER_HIT, "block", io)
            if tier is None:
                m.count(names.BLOCK_STORES)
            else:
                m.count(names.BLOCK_HITS)
                m.count(names.block_hits_in(STAT_NAMES[tier]))
                m.count(names.BLOCK_BYTES_REUSED, self.entry_bytes(tokens))
        if plan.prefix_key is not None:
            tier = self._read_or_write(plan.prefix_key, plan.prefix_tokens, bufs, SYSTEM_HIT, "prefix", io)
            if tier is not None:
                m.count(names.PREFIX_HITS)
                m.count(names.PREFIX_BYTES_SAVED, plan.prefix_tokens * self.cache.bytes_per_token)
            else:
                m.count(names.PREFIX_MISSES)
        if not self.decode_only:
            for key in plan.history_keys:
                tier = self._read(key, bufs, MULTI_TURN_HIT, "history", io).tier
                m.count(names.MULTI_TURN_CACHE_HITS if tier is not None else names.MULTI_TURN_CACHE_MISSES)
            if plan.phase in (Phase.PREFILL, Phase.PREFILL_DECODE) and not plan.blocks:
                prefill_ns = self._store(plan.cache_key, plan.context_tokens, bufs, "prefill", io)
        for key, tokens in plan.rag_chunks:
            tier = self._read_or_write(key, tokens, bufs, USER_HIT, "rag", io)
            m.count(names.RAG_CHUNK_HITS if tier is not None else names.RAG_CHUNK_MISSES)
        decode_ns = None
        if not self.prefill_only and plan.phase in (Phase.DECODE, Phase.PREFILL_DECODE):
            decode_ns = self._decode(plan, bufs, io)
        return prefill_ns, decode_ns

    def _decode(self, plan: RequestPlan, bufs: WorkerBuffers, io: list[int]) -> int:
        key = plan.decode_key if self.decode_only else plan.cache_key
        before = io[0]
        tier = self._read(key, bufs, USER_HIT, "decode", io).tier
        if tier is None and not self.decode_only:
            self._store(key, plan.context_tokens, bufs, "prefill", io)
        elif tier is not None:
            for _ in range(decode_reads(plan.generate_tokens, self.decode_batch_size)):
                if self.stop.is_set():
                    raise IOAborted("stopped", device_bytes=0)
                self._read(key, bufs, USER_HIT, "decode", io)
        return io[0] - before
