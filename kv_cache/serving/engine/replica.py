"""A modelled inference engine (one replica = `tp` GPUs) with REAL offload I/O behind its HBM.

What is modelled (time that elapses in real time, no GPU needed):
- HBM holds the model weights and a block-level prefix cache of KV (LRU over unpinned blocks);
- continuous batching: every iteration runs a chunk of prefill tokens and one decode token for every
  running request, and lasts the roofline time of that batch (its linear layers', then its attention's,
  each compute- or bandwidth-bound: roofline.iteration_cost);
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

from kv_cache.metrics.reservoir import LatencySamples
from kv_cache.serving.engine.io_pool import IOPool, _last_standin
from kv_cache.settings.sessions import LOAD_POLICIES

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
    standin_ns: int = 0  # the longest simulated-GPU stand-in memcpy of one of its loads (taken off load_ns)
    load_bytes: int = 0
    prefill_start_ns: int = 0  # when the turn joined the prefill queue (after its loads)
    skipped_load_blocks: int = 0  # offload hits recomputed instead (--load-policy cost)
    queued_store_miss: bool = False  # its prefix stopped at a block evicted from HBM whose store was still queued
    oversized: bool = False


class Replica:
    """One model replica: HBM prefix cache + continuous-batching loop on modelled time.

    HBM eviction follows vLLM: a finished turn's blocks return to the free queue tail first (the last block
    of a context is evicted before its prefix), and across turns the least recently used go first.
    Modelled time runs on absolute deadlines (each iteration ends `seconds` after the previous one's
    deadline, not after the thread woke up), so scheduling delays do not add up; the lateness of each
    wake-up is kept (`late_ns`) to report the drift that remained.
    `load_policy`: "always" loads every offload hit; "cost" recomputes a hit prefix instead when reading it
    at the tier's measured bandwidth would take longer than prefilling it (`prefill_seconds(new, cached)`).
    `write_through`: every block a turn computes is stored to the offload tiers when the turn completes
    (inclusive, as vLLM's CPU offloading connector does), not only when HBM evicts it; an eviction then
    writes nothing (the block is already there, or its store is queued).
    """

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
        load_policy: str = "always",
        prefill_seconds: Callable[[int, int], float] | None = None,
        write_through: bool = False,
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
        if load_policy not in LOAD_POLICIES or (load_policy == "cost" and prefill_seconds is None):
            raise ValueError(f"load policy must be one of {LOAD_POLICIES} (cost needs prefill_seconds)")
        self.load_policy = load_policy
        self.prefill_seconds = prefill_seconds
        self.write_through = write_through and io is not None
        self.max_occupied = 0  # most HBM blocks resident or reserved at once
        # per iteration: wake-up time - modelled deadline; count, sum and max of all, the values while they fit
        # (a list grew by one int an iteration for as long as the rung ran)
        self.late_ns = LatencySamples(histogram=True)
        self.modelled_ns = 0  # sum of modelled iteration time
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
        for k in reversed(resident):  # the prefix ends most recent: evicted last
            self.hbm[k] += 1
            self.hbm.move_to_end(k)
        req.pinned = resident
        while self.capacity - len(self.hbm) - self.reserved < new_slots:
            self._evict_one(exclude=set(resident))
        self.reserved += new_slots
        self.max_occupied = max(self.max_occupied, len(self.hbm) + self.reserved)
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
                # a block evicted from HBM whose store has not reached a tier yet: recomputed (counted)
                req.queued_store_miss = key in getattr(self.io, "storing", ())
                break
        req.hbm_hit_blocks = hits
        if load_keys and self.load_policy == "cost" and not self._worth_loading(hits, load_keys):
            req.skipped_load_blocks = len(load_keys)
            load_keys = []
        req.load_keys = load_keys
        req.load_bytes = len(load_keys) * self.io.block_bytes if load_keys else 0
        if load_keys:
            req.loads_pending = len(load_keys)
            req.loaded_blocks = 0
            t0 = time.perf_counter_ns()
            for key in load_keys:
                self.io.load(key, lambda k, ok, r=req, t=t0: self._loaded(r, k, ok, t))
        else:
            self._to_prefill(req)
        return True

    def install(self, keys: list[str]) -> int:
        """Before the run: make `keys` (one session's processed context) resident as a finished turn would
        leave them, evicting LRU blocks; blocks evicted, and those of a context longer than HBM, are stored
        in the offload tiers (when there are any). Returns how many blocks were stored."""
        stored = 0
        with self.cond:
            keys = list(dict.fromkeys(keys))
            kept, overflow = keys[: self.capacity], keys[self.capacity:]
            for k in kept:
                if k not in self.hbm:
                    if len(self.hbm) + self.reserved >= self.capacity:
                        stored += self._evict_one(exclude=set(kept))
                    self.hbm[k] = 0
            for k in reversed(kept):
                self.hbm.move_to_end(k)
            if self.io is not None:
                for k in overflow:
                    self.io.store(k)
                stored += len(overflow) if self.io is not None else 0
            self.max_occupied = max(self.max_occupied, len(self.hbm) + self.reserved)
        return stored

    def occupancy(self) -> float:
        """Share of the HBM's KV blocks resident or reserved."""
        with self.cond:
            return (len(self.hbm) + self.reserved) / self.capacity

    def _worth_loading(self, hits: int, load_keys: list[str]) -> bool:
        """Cost policy: load when reading the blocks at each tier's measured bandwidth takes no longer than
        the modelled prefill of their tokens (after the HBM hits); no measurement yet: load."""
        seconds = 0.0
        for key in load_keys:
            bw = self.io.read_bandwidth(self.io.tier_of(key) or "")
            if bw is None:
                return True
            seconds += self.io.block_bytes / bw
        tokens = len(load_keys) * self.block_tokens
        return seconds <= self.prefill_seconds(tokens, hits * self.block_tokens)

    def _evict_one(self, exclude: set[str]) -> bool:
        """Evict the least recently used unpinned block; True when it was sent down to the tiers."""
        for key, pins in self.hbm.items():
            if pins == 0 and key not in exclude:
                del self.hbm[key]
                self.evictions += 1
                there = self.io is not None and (
                    self.io.holds_or_queued(key) if self.write_through else self.io.cache.contains(key))
                if self.io is not None and not there:
                    self.io.store(key)  # evicted blocks go down the tiers (real writes, asynchronous)
                    return True
                return False
        raise RuntimeError("no evictable HBM block")  # guarded by _try_admit

    def _loaded(self, req: TurnRequest, key: str, ok: bool, t0: int) -> None:
        with self.cond:
            req.standin_ns = max(req.standin_ns, getattr(_last_standin, "ns", 0))
            req.loads_pending -= 1
            if ok:
                req.loaded_blocks += 1
            else:
                req.load_keys = (
                    req.load_keys[: req.load_keys.index(key)] if key in req.load_keys else req.load_keys
                )
            if req.loads_pending == 0:
                req.load_ns = max(0, time.perf_counter_ns() - t0 - req.standin_ns)
                req.loaded_blocks = min(req.loaded_blocks, len(req.load_keys))
                self._to_prefill(req)
                self.cond.notify_all()

    def _to_prefill(self, req: TurnRequest) -> None:
        req.prefill_start_ns = time.perf_counter_ns()
        cached_blocks = req.hbm_hit_blocks + len(req.load_keys)
        req.cached_tokens = cached_blocks * self.block_tokens
        req.prefill_left = max(1, req.input_tokens - req.cached_tokens)
        req.recomputed_tokens = req.prefill_left
        self.prefill.append(req)

    # -- the batching loop (engine thread) --------------------------------------------------
    def _loop(self) -> None:
        deadline = 0  # modelled end of the last iteration (absolute, perf_counter ns)
        while not self.stop.is_set():
            with self.cond:
                idle = not self.prefill and not self.decoding
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
            start = time.perf_counter_ns()
            if idle or deadline == 0:
                deadline = start  # an idle GPU starts its next iteration when the work arrives
            seconds_ns = int(step * steps * 1e9)
            deadline += seconds_ns
            self.modelled_ns += seconds_ns
            if self.stop.wait(max(0, deadline - start) / 1e9):
                return
            self.late_ns.append(time.perf_counter_ns() - deadline)
            self._finish_iteration(deadline, chunk, batch, steps)

    def _finish_iteration(self, now: int, chunk: list[tuple[TurnRequest, int, int]], batch: list[TurnRequest],
                          steps: int) -> None:
        """Apply one iteration's progress at its modelled end `now`; first tokens, completions, admissions."""
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
        keep = []
        for k in dict.fromkeys(req.final_keys):
            if k in self.hbm:
                keep.append(k)
            elif materialized < req.reserved:
                self.hbm[k] = 0
                keep.append(k)
                materialized += 1
                if self.write_through and not self.io.holds_or_queued(k):
                    self.io.store(k)  # inclusive offload: written down on compute, not on eviction
        for k in reversed(keep):  # tail first into the LRU order: the prefix is evicted last
            self.hbm.move_to_end(k)
        self.reserved -= req.reserved

    def close(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        self.thread.join()
