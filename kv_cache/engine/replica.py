"""A modelled inference engine (one replica = `tp` GPUs) with REAL offload I/O behind its HBM.

What is modelled (time that elapses in real time, no GPU needed):
- HBM holds the model weights and a block-level prefix cache of KV (LRU over unpinned blocks);
- continuous batching: every iteration runs a chunk of prefill tokens and one decode token for every
  running request, and lasts the roofline time of that batch (compute- or bandwidth-bound);
What is real: blocks evicted from HBM are written to the offload tiers (CPU DRAM arena, files under the
cache directory) by I/O workers, and blocks found there are read back before prefill, with the I/O time
delaying that request (the GPU keeps serving the others meanwhile).

Per turn: full blocks already in HBM are free; the longest prefix continuing into the offload tiers is
loaded; everything after it, plus the new prompt, is recomputed in prefill. Only full blocks are cached
(as vLLM does); keys are prefix-chained: shared-prefix blocks are global, the rest belong to the session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from kv_cache.cache import MultiTierCache
from kv_cache.metrics import names
from kv_cache.storage.base import IOAborted
from kv_cache.storage.buffers import WorkerBuffers

log = logging.getLogger("kv_cache.sessions")

MAX_DECODE_MACRO_STEP_S = 0.02  # several decode tokens are simulated in one sleep when nothing else changes


@dataclass(eq=False)
class TurnRequest:
    """One turn of one session inside the engine."""

    slot: int
    session_id: str
    turn_index: int
    turn_class: str  # start | return | agentic
    issue_ns: int
    input_tokens: int  # full context of this turn (history + new prompt)
    new_tokens: int
    output_tokens: int
    input_keys: list[str]  # full blocks of the input
    final_keys: list[str]  # full blocks of input + output (what stays cached after the turn)
    needed_slots: int  # HBM blocks this turn occupies while it runs
    # filled by the engine
    pinned: list[str] = field(default_factory=list)
    reserved: int = 0
    hbm_hit_blocks: int = 0
    load_keys: list[str] = field(default_factory=list)
    loads_pending: int = 0
    loaded_blocks: int = 0
    cached_tokens: int = 0
    prefill_left: int = 0
    prefill_done: int = 0
    recomputed_tokens: int = 0
    decode_left: int = 0
    ttft_ns: int = 0
    admitted_ns: int = 0
    load_ns: int = 0
    oversized: bool = False


class Executor(Protocol):
    """Runs jobs on worker threads, each job given that worker's I/O buffers (the driver's WorkerPool)."""

    def submit(self, job: Callable[[WorkerBuffers], None], priority: int = 0) -> None: ...

    def close(self) -> None: ...


class IOPool:
    """Moves blocks between the engine and the offload tiers (real reads and writes) on an executor's
    workers; a load reports whether the block was there."""

    def __init__(self, cache: MultiTierCache, executor: Executor, block_bytes: int, block_tokens: int,
                 stop: threading.Event) -> None:
        self.cache = cache
        self.executor = executor
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.stop = stop

    def load(self, key: str, done: Callable[[str, bool], None]) -> None:
        self.executor.submit(partial(self._run, "load", key, done))

    def store(self, key: str) -> None:
        self.executor.submit(partial(self._run, "store", key, None))

    def _run(self, kind: str, key: str, done: Callable[[str, bool], None] | None, bufs: WorkerBuffers) -> None:
        ok = False
        try:
            if self.stop.is_set():
                raise IOAborted("stopping")
            if kind == "load":
                res = self.cache.read(key, bufs, cause="load")
                ok = res.tier is not None
                if res.in_window:
                    self.cache.metrics.count(names.USER_CACHE_HITS)
            else:
                self.cache.allocate(key, self.block_tokens, self.block_bytes, bufs, cause="offload")
                ok = True
        except IOAborted:
            ok = False
        except OSError as exc:
            self.cache.metrics.record_error(f"session_{kind}", exc)
        if done is not None:
            done(key, ok)

    def close(self) -> None:
        """Queued moves run (as aborted, once stopping), then the workers end."""
        self.executor.close()


class Replica:
    """One model replica: HBM prefix cache + continuous-batching loop on modelled time."""

    def __init__(
        self,
        index: int,
        capacity_blocks: int,
        block_tokens: int,
        iteration_seconds: Callable,
        io: IOPool | None,
        on_first_token: Callable,
        on_done: Callable,
        on_iteration: Callable,
        prefill_chunk_tokens: int,
        stop: threading.Event,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError("HBM holds no KV block after the weights: use a bigger GPU or a smaller model")
        self.index = index
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self.iteration_seconds = iteration_seconds
        self.io = io
        self.on_first_token = on_first_token
        self.on_done = on_done
        self.on_iteration = on_iteration
        self.chunk = prefill_chunk_tokens
        self.stop = stop
        self.hbm: OrderedDict[str, int] = OrderedDict()  # resident block -> pin count; LRU first
        self.reserved = 0  # slots promised to running turns, not yet materialized as resident blocks
        self.waiting: deque[TurnRequest] = deque()
        self.prefill: deque[TurnRequest] = deque()
        self.decoding: list[TurnRequest] = []
        self.cond = threading.Condition()
        self.evictions = 0
        self.thread = threading.Thread(target=self._loop, name=f"kv-replica-{index}", daemon=True)
        self.thread.start()

    # -- admission (scheduler thread) ---------------------------------------------------------
    def submit(self, req: TurnRequest) -> None:
        with self.cond:
            self.waiting.append(req)
            self._admit_waiting()
            self.cond.notify_all()

    def _admit_waiting(self) -> None:
        """FIFO admission: a turn starts when HBM can hold its whole context (lock held)."""
        while self.waiting and self._try_admit(self.waiting[0]):
            self.waiting.popleft()

    def _try_admit(self, req: TurnRequest) -> bool:
        resident = [k for k in dict.fromkeys(req.final_keys) if k in self.hbm]
        new_slots = max(0, req.needed_slots - len(resident))
        evictable = sum(1 for k, pins in self.hbm.items() if pins == 0 and k not in resident)
        free = self.capacity - len(self.hbm) - self.reserved
        if free + evictable < new_slots:
            if self.reserved:
                return False  # running turns will release space
            # Nothing else holds HBM and the context still does not fit: run it with what there is (its
            # overflow is recomputed each time) instead of deadlocking the session; counted as oversized.
            new_slots = free + evictable
            req.needed_slots = len(resident) + new_slots
            req.oversized = True
        for k in resident:
            self.hbm[k] += 1
            self.hbm.move_to_end(k)
        req.pinned = resident
        while self.capacity - len(self.hbm) - self.reserved < new_slots:
            self._evict_one(exclude=set(resident))
        self.reserved += new_slots
        req.reserved = new_slots
        req.admitted_ns = time.perf_counter_ns()
        # Longest cached prefix: HBM hits are free, offload hits are loaded, the rest is recomputed.
        offload = self.io.cache if self.io is not None else None
        hits = loads = 0
        load_keys = []
        for key in req.input_keys:
            if key in self.hbm:
                hits += 1
            elif offload is not None and offload.contains(key):
                load_keys.append(key)
                loads += 1
            else:
                break
        req.hbm_hit_blocks = hits
        req.load_keys = load_keys
        if load_keys:
            req.loads_pending = len(load_keys)
            req.loaded_blocks = 0
            t0 = time.perf_counter_ns()
            for key in load_keys:
                self.io.load(key, lambda k, ok, r=req, t=t0: self._loaded(r, k, ok, t))
        else:
            self._to_prefill(req)
        return True

    def _evict_one(self, exclude: set[str]) -> None:
        for key, pins in self.hbm.items():
            if pins == 0 and key not in exclude:
                del self.hbm[key]
                self.evictions += 1
                if self.io is not None and not self.io.cache.contains(key):
                    self.io.store(key)  # evicted blocks go down the tiers (real writes, asynchronous)
                return
        raise RuntimeError("no evictable HBM block")  # guarded by _try_admit

    def _loaded(self, req: TurnRequest, key: str, ok: bool, t0: int) -> None:
        with self.cond:
            req.loads_pending -= 1
            if ok:
                req.loaded_blocks += 1
            else:
                req.load_keys = (
                    req.load_keys[: req.load_keys.index(key)] if key in req.load_keys else req.load_keys
                )
            if req.loads_pending == 0:
                req.load_ns = time.perf_counter_ns() - t0
                req.loaded_blocks = min(req.loaded_blocks, len(req.load_keys))
                self._to_prefill(req)
                self.cond.notify_all()

    def _to_prefill(self, req: TurnRequest) -> None:
        cached_blocks = req.hbm_hit_blocks + len(req.load_keys)
        req.cached_tokens = cached_blocks * self.block_tokens
        req.prefill_left = max(1, req.input_tokens - req.cached_tokens)
        req.recomputed_tokens = req.prefill_left
        self.prefill.append(req)

    # -- the batching loop (engine thread) --------------------------------------------------
    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.cond:
                while not self.prefill and not self.decoding and not self.stop.is_set():
                    self.cond.wait(0.1)
                if self.stop.is_set():
                    return
                chunk: list[tuple[TurnRequest, int, int]] = []  # (request, new tokens now, cached before)
                budget = self.chunk
                for req in self.prefill:
                    if budget <= 0:
                        break
                    n = min(req.prefill_left, budget)
                    chunk.append((req, n, req.cached_tokens + req.prefill_done))
                    budget -= n
                batch = list(self.decoding)
            context = sum(r.input_tokens + (r.output_tokens - r.decode_left) for r in batch)
            step = self.iteration_seconds([(n, c) for _, n, c in chunk], len(batch), context)
            steps = 1
            if not chunk and batch:
                steps = max(
                    1, min(min(r.decode_left for r in batch), int(MAX_DECODE_MACRO_STEP_S / max(step, 1e-9)))
                )
            seconds = step * steps
            if self.stop.wait(seconds):
                return
            now = time.perf_counter_ns()
            finished = []
            with self.cond:
                for req, n, _ in chunk:
                    req.prefill_left -= n
                    req.prefill_done += n
                    if req.prefill_left == 0:
                        self.prefill.remove(req)
                        req.ttft_ns = now - req.issue_ns
                        req.decode_left = max(0, req.output_tokens - 1)  # prefill emits the first token
                        self.on_first_token(req, now)
                        if req.decode_left:
                            self.decoding.append(req)
                        else:
                            finished.append(req)
                for req in batch:
                    req.decode_left -= steps
                    if req.decode_left <= 0:
                        self.decoding.remove(req)
                        finished.append(req)
                for req in finished:
                    self._complete(req)
                if finished:
                    self._admit_waiting()
            self.on_iteration(now, sum(n for _, n, _ in chunk), len(batch) * steps, self.index)
            for req in finished:
                self.on_done(req, now)

    def _complete(self, req: TurnRequest) -> None:
        """The turn's full blocks stay cached (unpinned, most recent); spare reservation is released."""
        for k in req.pinned:
            if k in self.hbm:
                self.hbm[k] -= 1
        materialized = 0
        for k in dict.fromkeys(req.final_keys):
            if k in self.hbm:
                self.hbm.move_to_end(k)
            elif materialized < req.reserved:
                self.hbm[k] = 0
                materialized += 1
        self.reserved -= req.reserved

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        self.thread.join()
