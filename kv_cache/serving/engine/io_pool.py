"""The sessions engine's offload I/O: an IOPool moves blocks between a replica's HBM and the offload tiers
(real reads and writes) on an executor's workers, loads ahead of stores, and counts offered and completed
moves per kind (IOCounters). A simulated GPU tier's stand-in memcpy is kept out of every time it records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from kv_cache.metrics import names
from kv_cache.serving.cache import CapacityError, MultiTierCache
from kv_cache.storage.base import DataCorruption, IOAborted
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_sim import standin_ns

__all__ = ["LOAD_PRIORITY", "STORE_PRIORITY", "Executor", "IOCounters", "IOPool"]

_last_standin = threading.local()  # the stand-in ns of the load this I/O thread just finished


class Executor(Protocol):
    """Runs jobs on worker threads, each job given that worker's I/O buffers (the driver's WorkerPool)."""

    def submit(self, job: Callable[[WorkerBuffers], None], priority: int = 0) -> None: ...

    def close(self) -> None: ...


LOAD_PRIORITY, STORE_PRIORITY = 1, 0  # a turn waits on its loads; a store only frees HBM that is already free


@dataclass
class IOCounters:
    """Offered (submitted) and sustained (completed) block moves of one kind, ops and bytes."""

    submitted_ops: int = 0
    completed_ops: int = 0
    submitted_bytes: int = 0
    completed_bytes: int = 0
    busy_ns: int = 0  # summed per-move I/O time (for the tier's measured bandwidth)

    @property
    def backlog_ops(self) -> int:
        return self.submitted_ops - self.completed_ops

    def snapshot(self) -> IOCounters:
        return IOCounters(self.submitted_ops, self.completed_ops, self.submitted_bytes, self.completed_bytes,
                          self.busy_ns)


class IOPool:
    """Moves blocks between the engine and the offload tiers (real reads and writes) on an executor's
    workers; a load reports whether the block was there. Loads run ahead of queued stores (a turn waits
    on its loads). Counts offered and completed moves per kind, and each tier's measured read bandwidth
    (bytes per second of one move, as one worker sees it)."""

    def __init__(self, cache: MultiTierCache, executor: Executor, block_bytes: int, block_tokens: int,
                 stop: threading.Event) -> None:
        self.cache = cache
        self.executor = executor
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.stop = stop
        self.lock = threading.Lock()
        self.counters = {"load": IOCounters(), "store": IOCounters()}
        self.read_bytes_by_tier: dict[str, int] = {}
        self.read_ns_by_tier: dict[str, int] = {}
        self.storing: set[str] = set()  # keys whose store is queued or running (not yet in a tier)

    def load(self, key: str, done: Callable[[str, bool], None]) -> None:
        self._count_submit("load")
        self.executor.submit(partial(self._run, "load", key, done), LOAD_PRIORITY)

    def store(self, key: str) -> None:
        with self.lock:
            self.storing.add(key)
        self._count_submit("store")
        self.executor.submit(partial(self._run, "store", key, None), STORE_PRIORITY)

    def holds_or_queued(self, key: str) -> bool:
        """The block is in an offload tier, or on its way there (a store queued or running)."""
        with self.lock:
            if key in self.storing:
                return True
        return self.cache.contains(key)

    def _count_submit(self, kind: str) -> None:
        with self.lock:
            c = self.counters[kind]
            c.submitted_ops += 1
            c.submitted_bytes += self.block_bytes

    def read_bandwidth(self, tier: str) -> float | None:
        """Measured bytes per second of one block read from `tier` so far (None before the first read)."""
        with self.lock:
            ns = self.read_ns_by_tier.get(tier, 0)
            return self.read_bytes_by_tier[tier] * 1e9 / ns if ns else None

    def snapshot(self) -> dict[str, IOCounters]:
        with self.lock:
            return {k: c.snapshot() for k, c in self.counters.items()}

    def _run(self, kind: str, key: str, done: Callable[[str, bool], None] | None, bufs: WorkerBuffers) -> None:
        ok = False
        t0 = time.perf_counter_ns()
        s0 = standin_ns()
        tier = None
        try:
            if self.stop.is_set():
                raise IOAborted("stopping")
            if kind == "load":
                res = self.cache.read(key, bufs, cause="load")
                tier = res.tier
                ok = tier is not None
                if res.in_window:
                    self.cache.metrics.count(names.USER_CACHE_HITS)
            else:
                self.cache.allocate(key, self.block_tokens, self.block_bytes, bufs, cause="offload")
                ok = True
        except IOAborted:
            ok = False
        except (OSError, DataCorruption, CapacityError) as exc:  # counted; the block is a miss or not stored
            self.cache.metrics.record_error(f"session_{kind}", exc)
        standin = standin_ns() - s0  # a simulated GPU tier's stand-in memcpy: never in a latency
        spent = time.perf_counter_ns() - t0 - standin
        _last_standin.ns = standin
        with self.lock:
            c = self.counters[kind]
            c.completed_ops += 1
            c.busy_ns += spent
            if kind == "store":
                self.storing.discard(key)
            if ok:
                c.completed_bytes += self.block_bytes
            if tier is not None:
                self.read_bytes_by_tier[tier] = self.read_bytes_by_tier.get(tier, 0) + self.block_bytes
                self.read_ns_by_tier[tier] = self.read_ns_by_tier.get(tier, 0) + spent
        if done is not None:
            done(key, ok)

    def tier_of(self, key: str) -> str | None:
        entry = self.cache.entries.get(key)
        return entry.location if entry is not None else None

    def close(self) -> None:
        """Queued moves run (as aborted, once stopping), then the workers end."""
        self.executor.close()
