"""Runs the load: closed-loop users -> request plans -> a bounded pool of I/O workers -> the cache.

Decides only WHEN things happen. One scheduler (the calling thread) owns a timer heap of user wake-ups
and request completions; a fixed pool of worker threads executes the cache operations (pwritev/preadv
release the GIL, so threads give real I/O parallelism). Simulated token generation is modelled time
that does not hold a worker. No thread per user: 10,000 users cost heap entries, not threads.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import queue
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from kv_cache.cache import MultiTierCache
from kv_cache.metrics import RunMetrics
from kv_cache.storage.base import IOAborted
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.workload.request import Phase, RequestPlan, decode_reads
from kv_cache.workload.users import SyntheticUser

log = logging.getLogger("kv_cache.driver")

# Errors after which continuing would measure nothing meaningful.
FATAL_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


@dataclass(frozen=True)
class DriverOptions:
    duration_s: float
    max_requests: int = 0
    workers: int = 8
    chunk_bytes: int = 16 << 20
    seed: int = 0
    bytes_per_token: int = 1
    tensor_parallel: int = 1
    decode_batch_size: int = 32
    seconds_per_token: float = 0.0
    record_plans: bool = False


@dataclass
class DriverOutcome:
    stop_reason: str
    window_s: float
    requests_issued: int
    requests_completed: int
    requests_abandoned: int
    requests_failed: int
    plans: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    fatal_error: str | None = None


class Driver:
    def __init__(self, users: list[SyntheticUser], cache: MultiTierCache, metrics: RunMetrics,
                 options: DriverOptions, stop: threading.Event) -> None:
        self.users = users
        self._users_by_id = {u.user_id: u for u in users}
        self.cache = cache
        self.metrics = metrics
        self.opt = options
        self.stop = stop
        self._work: queue.PriorityQueue = queue.PriorityQueue()
        self._done: deque = deque()
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._fatal: str | None = None
        self._abandoned = 0
        self._failed = 0
        self._plans: dict[str, list[tuple[str, str, int]]] = defaultdict(list)

    # -- sizes --------------------------------------------------------------------------------
    def entry_bytes(self, tokens: int) -> int:
        return max(1, tokens * self.opt.bytes_per_token // self.opt.tensor_parallel)

    # -- worker side --------------------------------------------------------------------------
    def _worker(self, worker_id: int, ready: threading.Barrier) -> None:
        bufs = WorkerBuffers(self.opt.chunk_bytes, self.opt.seed, worker_id)
        ready.wait()
        try:
            while True:
                plan: RequestPlan | None = self._work.get()[2]
                if plan is None:
                    return
                if self.stop.is_set():
                    with self._cond:
                        self._abandoned += 1
                    continue
                outcome = self._execute(plan, bufs)
                with self._cond:
                    self._done.append((time.perf_counter_ns(), plan, outcome))
                    self._cond.notify()
        finally:
            bufs.close()

    def _execute(self, plan: RequestPlan, bufs: WorkerBuffers):
        """Issue the plan's cache operations. Returns (storage, prefill, decode) ns, or a failure tag."""
        cache, m = self.cache, self.metrics
        plan.start_ns = time.perf_counter_ns()
        storage = 0
        prefill_ns = decode_ns = None
        try:
            if plan.prefix_key is not None:
                tier, ns = cache.access(plan.prefix_key, bufs, "system", cause="prefix")
                storage += ns
                if tier is None:
                    m.count("prefix_misses")
                    _, ns = cache.allocate(plan.prefix_key, plan.prefix_tokens,
                                           self.entry_bytes(plan.prefix_tokens), bufs, cause="prefix")
                    storage += ns
                else:
                    m.count("prefix_hits")
                    m.count("prefix_bytes_saved", plan.prefix_tokens * self.opt.bytes_per_token)
            for key in plan.history_keys:
                tier, ns = cache.access(key, bufs, "multi_turn", cause="history")
                storage += ns
                m.count("multi_turn_cache_hits" if tier is not None else "multi_turn_cache_misses")
            size = self.entry_bytes(plan.context_tokens)
            if plan.phase in (Phase.PREFILL, Phase.PREFILL_DECODE):
                _, ns = cache.allocate(plan.cache_key, plan.context_tokens, size, bufs, cause="prefill")
                storage += ns
                prefill_ns = ns
            if plan.phase in (Phase.DECODE, Phase.PREFILL_DECODE):
                tier, ns = cache.access(plan.cache_key, bufs, "user", cause="decode")
                decode_ns = ns
                if tier is None:
                    _, ns = cache.allocate(plan.cache_key, plan.context_tokens, size, bufs, cause="prefill")
                    storage += ns
                else:
                    for _ in range(decode_reads(plan.generate_tokens, self.opt.decode_batch_size)):
                        if self.stop.is_set():
                            raise IOAborted("stopped", device_bytes=0)
                        _, ns = cache.access(plan.cache_key, bufs, "user", cause="decode")
                        decode_ns += ns
                storage += decode_ns
        except IOAborted:
            return "abandoned"
        except OSError as exc:
            self.metrics.record_error("request", exc)
            if exc.errno in FATAL_ERRNOS:
                with self._cond:
                    if self._fatal is None:
                        self._fatal = f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}"
                    self._cond.notify()
            return "failed"
        except Exception as exc:  # a bug must not silently kill a worker and starve the run
            log.exception("request %s failed", plan.request_id)
            self.metrics.record_error("request", exc)
            return "failed"
        return storage, prefill_ns, decode_ns

    # -- scheduler side -----------------------------------------------------------------------
    def run(self) -> DriverOutcome:
        opt = self.opt
        ready = threading.Barrier(opt.workers + 1)
        threads = [threading.Thread(target=self._worker, args=(i, ready), name=f"kv-io-{i}", daemon=True)
                   for i in range(opt.workers)]
        for t in threads:
            t.start()
        ready.wait()  # buffers allocated and filled before the clock starts

        heap: list[tuple[int, int, str, object]] = []
        t0 = time.perf_counter_ns()
        self.metrics.open_window(t0)
        deadline = t0 + int(opt.duration_s * 1e9)
        for user in self.users:
            heapq.heappush(heap, (t0 + int(user.think_time() * 1e9), next(self._seq), "wake", user))
        issued = completed = 0
        stop_reason = "duration"
        window_end = deadline
        try:
            while True:
                now = time.perf_counter_ns()
                with self._cond:
                    done = list(self._done)
                    self._done.clear()
                    fatal = self._fatal
                for end_ns, plan, outcome in done:
                    if outcome == "abandoned":
                        self._abandoned += 1
                        continue
                    user = self._user_of(plan)
                    if outcome == "failed":
                        self._failed += 1
                        heapq.heappush(heap, (end_ns + int(user.think_time() * 1e9), next(self._seq), "wake", user))
                        continue
                    gen_ns = int(plan.generate_tokens * opt.seconds_per_token * 1e9)
                    heapq.heappush(heap, (end_ns + gen_ns, next(self._seq), "complete", (plan, outcome, gen_ns)))
                if fatal is not None:
                    stop_reason, window_end = "storage error", now
                    break
                while heap and heap[0][0] <= now:
                    when, _, kind, payload = heapq.heappop(heap)
                    if when > deadline:
                        heapq.heappush(heap, (when, 0, kind, payload))
                        break
                    if kind == "wake":
                        plan = payload.next_request()
                        plan.submit_ns = when
                        if opt.record_plans:
                            self._plans[plan.user_id].extend(plan.intended_operations(opt.decode_batch_size))
                        self._work.put((-plan.priority, next(self._seq), plan))
                        issued += 1
                    else:
                        plan, (storage, prefill_ns, decode_ns), gen_ns = payload
                        if self.metrics.record_request(plan.qos_level, when, when - plan.submit_ns, storage, gen_ns,
                                                       prefill_ns, decode_ns, plan.generate_tokens, plan.context_tokens):
                            completed += 1
                        user = self._user_of(plan)
                        heapq.heappush(heap, (when + int(user.think_time() * 1e9), next(self._seq), "wake", user))
                        if opt.max_requests and completed >= opt.max_requests:
                            break
                if opt.max_requests and completed >= opt.max_requests:
                    stop_reason, window_end = "max_requests", time.perf_counter_ns()
                    break
                now = time.perf_counter_ns()
                if now >= deadline:
                    break
                wake_at = min(heap[0][0] if heap else deadline, deadline)
                with self._cond:
                    if not self._done and self._fatal is None:
                        self._cond.wait(max(0.0, (wake_at - now) / 1e9))
        except KeyboardInterrupt:
            stop_reason, window_end = "interrupted", time.perf_counter_ns()
        finally:
            self.metrics.close_window(min(window_end, time.perf_counter_ns()))
            self.stop.set()
            self._drain_and_join(threads)
        return DriverOutcome(
            stop_reason=stop_reason,
            window_s=self.metrics.window_seconds,
            requests_issued=issued,
            requests_completed=completed,
            requests_abandoned=self._abandoned,
            requests_failed=self._failed,
            plans=dict(self._plans),
            fatal_error=self._fatal,
        )

    def _drain_and_join(self, threads: list[threading.Thread]) -> None:
        try:
            while True:
                self._work.get_nowait()
                self._abandoned += 1
        except queue.Empty:
            pass
        for _ in threads:
            self._work.put((1 << 30, next(self._seq), None))
        for t in threads:
            t.join()

    def _user_of(self, plan: RequestPlan) -> SyntheticUser:
        return self._users_by_id[plan.user_id]
