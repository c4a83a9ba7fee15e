"""Runs the load: users or arrivals -> request plans -> a bounded pool of I/O workers -> the cache.

Decides only WHEN things happen. One scheduler (the calling thread) owns a timer heap of user wake-ups,
open-loop arrivals, request completions and monitor samples; a fixed pool of worker threads executes
the cache operations (pwritev/preadv release the GIL, so threads give real I/O parallelism). Simulated
token generation is modelled time that does not hold a worker. No thread per user: 10,000 users cost
heap entries, not threads.

Two ways to offer load:
- closed loop (default): each active user issues its next request only after the previous one completed
  and its think time elapsed;
- open loop (`request_rate > 0`): Poisson arrivals at the given rate, each from a user drawn from the
  seeded arrival generator; an arrival that finds `admission_limit` requests already queued is rejected
  and counted (never silently dropped).
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kv_cache.cache import STAT_NAMES, MultiTierCache
from kv_cache.driver.autoscale import Autoscaler, IntervalSample
from kv_cache.metrics import names
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.storage.base import IOAborted
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.workload.request import Phase, RequestPlan, decode_reads
from kv_cache.workload.users import SyntheticUser

log = logging.getLogger("kv_cache.driver")


def _always() -> bool:
    return True

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
    request_rate: float = 0.0  # > 0: open loop, Poisson arrivals per second
    admission_limit: int = 1000
    prefill_only: bool = False
    decode_only: bool = False
    timeline_interval_s: float = 10.0


@dataclass
class DriverOutcome:
    stop_reason: str
    window_s: float
    requests_issued: int
    requests_completed: int
    requests_abandoned: int
    requests_failed: int
    requests_rejected: int = 0
    timeline: list[dict] = field(default_factory=list)
    plans: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    fatal_error: str | None = None
    final_active_users: int = 0


class Driver:
    def __init__(self, users: list[SyntheticUser], cache: MultiTierCache, metrics: RunMetrics,
                 options: DriverOptions, stop: threading.Event, autoscaler: Autoscaler | None = None,
                 make_user: Callable[[int], SyntheticUser] | None = None,
                 arrivals: Iterable[tuple[float, RequestPlan]] | None = None, trace_speedup: float = 1.0,
                 replay_cycles: int = 0) -> None:
        """`users`: closed-loop users (synthetic or trace sessions). `arrivals`: a timestamped trace
        replayed open-loop at t / trace_speedup (0 = back-pressured, as fast as the workers go)."""
        self.cache = cache
        self.metrics = metrics
        self.opt = options
        self.stop = stop
        self.autoscaler = autoscaler
        self._make_user = make_user
        self._arrivals = arrivals
        self._speedup = trace_speedup
        self._replay_cycles = replay_cycles
        self._all_users: list[SyntheticUser] = list(users)  # index i = user i; grows when scaling up
        self._active = len(users)
        self._by_id = {u.user_id: u for u in users}
        self._work: queue.PriorityQueue = queue.PriorityQueue()
        self._done: deque = deque()
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._fatal: str | None = None
        self._abandoned = 0
        self._failed = 0
        self._rejected = 0
        self._in_flight = 0
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

    def _read_or_write(self, key: str, tokens: int, bufs: WorkerBuffers, cache_type: str, cause: str,
                       io: list[int]) -> str | None:
        """Read an entry if cached, else compute and store it. Returns the tier it was read from (None:
        stored); adds ns, bytes read, bytes written to `io`."""
        tier, ns, nbytes = self.cache.access_sized(key, bufs, cache_type, cause=cause)
        io[0] += ns
        if tier is not None:
            io[1] += nbytes
            return tier
        size = self.entry_bytes(tokens)
        _, wns, wrote = self.cache.allocate_sized(key, tokens, size, bufs, cause=cause)
        io[0] += wns
        if wrote:
            io[2] += size
        return None

    def _execute(self, plan: RequestPlan, bufs: WorkerBuffers):
        """Issue the plan's cache operations (reference order, spec 8.9).

        Returns (storage, prefill, decode) ns, or "abandoned" / "failed".
        """
        cache, m, opt = self.cache, self.metrics, self.opt
        plan.start_ns = time.perf_counter_ns()
        io = [0, 0, 0]  # storage ns, bytes read, bytes written on behalf of this request
        prefill_ns = decode_ns = None
        try:
            for key, tokens in plan.blocks:  # block layout: load what is cached, compute+store the rest
                tier = self._read_or_write(key, tokens, bufs, "user", "block", io)
                if tier is None:
                    m.count(names.BLOCK_STORES)
                else:
                    m.count(names.BLOCK_HITS)
                    m.count(names.block_hits_in(STAT_NAMES[tier]))
                    m.count(names.BLOCK_BYTES_REUSED, self.entry_bytes(tokens))
            if plan.prefix_key is not None:
                tier = self._read_or_write(plan.prefix_key, plan.prefix_tokens, bufs, "system", "prefix", io)
                if tier is not None:
                    m.count(names.PREFIX_HITS)
                    m.count(names.PREFIX_BYTES_SAVED, plan.prefix_tokens * opt.bytes_per_token)
                else:
                    m.count(names.PREFIX_MISSES)
            if not opt.decode_only:
                for key in plan.history_keys:
                    tier, ns, nbytes = cache.access_sized(key, bufs, "multi_turn", cause="history")
                    io[0] += ns
                    io[1] += nbytes
                    m.count(names.MULTI_TURN_CACHE_HITS if tier is not None else names.MULTI_TURN_CACHE_MISSES)
                if plan.phase in (Phase.PREFILL, Phase.PREFILL_DECODE) and not plan.blocks:
                    size = self.entry_bytes(plan.context_tokens)
                    _, ns, wrote = cache.allocate_sized(plan.cache_key, plan.context_tokens, size, bufs, cause="prefill")
                    io[0] += ns
                    io[2] += size if wrote else 0
                    prefill_ns = ns
            for key, tokens in plan.rag_chunks:
                tier = self._read_or_write(key, tokens, bufs, "user", "rag", io)
                m.count(names.RAG_CHUNK_HITS if tier is not None else names.RAG_CHUNK_MISSES)
            if not opt.prefill_only and plan.phase in (Phase.DECODE, Phase.PREFILL_DECODE):
                key = plan.decode_key if opt.decode_only else plan.cache_key
                before = io[0]
                tier, ns, nbytes = cache.access_sized(key, bufs, "user", cause="decode")
                io[0] += ns
                io[1] += nbytes
                if tier is None and not opt.decode_only:
                    size = self.entry_bytes(plan.context_tokens)
                    _, ns, wrote = cache.allocate_sized(key, plan.context_tokens, size, bufs, cause="prefill")
                    io[0] += ns
                    io[2] += size if wrote else 0
                elif tier is not None:
                    for _ in range(decode_reads(plan.generate_tokens, opt.decode_batch_size)):
                        if self.stop.is_set():
                            raise IOAborted("stopped", device_bytes=0)
                        _, ns, nbytes = cache.access_sized(key, bufs, "user", cause="decode")
                        io[0] += ns
                        io[1] += nbytes
                decode_ns = io[0] - before
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
        plan.read_bytes, plan.written_bytes = io[1], io[2]
        return io[0], prefill_ns, decode_ns

    # -- scheduler side -----------------------------------------------------------------------
    def _push(self, heap: list, when: int, kind: str, payload: object) -> None:
        heapq.heappush(heap, (when, next(self._seq), kind, payload))

    def _submit(self, plan: RequestPlan, when: int) -> None:
        plan.submit_ns = when
        self._in_flight += 1
        if self.opt.record_plans:
            self._plans[plan.user_id].extend(plan.intended_operations(self.opt.decode_batch_size))
        self._work.put((-plan.priority, next(self._seq), plan))

    def _is_active(self, user: SyntheticUser) -> bool:
        return self._index[user.user_id] < self._active

    def _set_active(self, heap: list, target: int, now: int) -> None:
        """Start or stop users so that `target` are active (the autoscaler's decision, applied)."""
        while len(self._all_users) < target and self._make_user is not None:
            user = self._make_user(len(self._all_users))
            self._all_users.append(user)
            self._by_id[user.user_id] = user
            self._index[user.user_id] = len(self._all_users) - 1
        target = min(target, len(self._all_users))
        if target > self._active and not self.opt.request_rate:
            for user in self._all_users[self._active:target]:
                if user.user_id not in self._waiting:
                    self._waiting.add(user.user_id)
                    self._push(heap, now + int(user.think_time() * 1e9), "wake", user)
        self._active = target

    def run(self) -> DriverOutcome:
        opt = self.opt
        ready = threading.Barrier(opt.workers + 1)
        threads = [threading.Thread(target=self._worker, args=(i, ready), name=f"kv-io-{i}", daemon=True)
                   for i in range(opt.workers)]
        for t in threads:
            t.start()
        ready.wait()  # buffers allocated and filled before the clock starts

        self._index = {u.user_id: i for i, u in enumerate(self._all_users)}
        self._waiting: set[str] = set()  # users with a pending wake (closed loop)
        heap: list = []
        t0 = time.perf_counter_ns()
        self.metrics.open_window(t0)
        deadline = t0 + int(opt.duration_s * 1e9)
        arrivals = random.Random(f"kv-cache-arrivals:{opt.seed}")
        trace = iter(self._arrivals) if self._arrivals is not None else None
        backlog = next(trace, None) if trace is not None else None  # next trace row not yet issued
        if trace is not None:
            if backlog is not None and self._speedup > 0:
                self._push(heap, t0 + int(backlog[0] / self._speedup * 1e9), "trace", backlog)
                backlog = None
        elif opt.request_rate > 0:
            self._push(heap, t0 + int(arrivals.expovariate(opt.request_rate) * 1e9), "arrive", None)
        else:
            for user in self._all_users[:self._active]:
                self._waiting.add(user.user_id)
                first = user.first_wake_s() if hasattr(user, "first_wake_s") else user.think_time()
                self._push(heap, t0 + int(first * 1e9), "wake", user)
        trace_exhausted = trace is not None and backlog is None and not any(k == "trace" for _, _, k, _ in heap)
        cycles_done = 0
        interval_ns = int((self.autoscaler.cfg.interval_seconds if self.autoscaler else opt.timeline_interval_s) * 1e9)
        self._push(heap, t0 + interval_ns, "monitor", None)
        last_mark = self.metrics.mark()
        timeline: list[dict] = []

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
                        self._in_flight -= 1
                        continue
                    if outcome == "failed":
                        self._failed += 1
                        self._in_flight -= 1
                        self._schedule_next(heap, plan, end_ns)
                        continue
                    gen_ns = int(plan.generate_tokens * opt.seconds_per_token * 1e9)
                    self._push(heap, end_ns + gen_ns, "complete", (plan, outcome, gen_ns))
                if fatal is not None:
                    stop_reason, window_end = "storage error", now
                    break
                finished = False
                while heap and heap[0][0] <= now:
                    when, _, kind, payload = heapq.heappop(heap)
                    if when > deadline:
                        heapq.heappush(heap, (when, 0, kind, payload))
                        break
                    if kind == "wake":
                        self._waiting.discard(payload.user_id)
                        if self._is_active(payload) and getattr(payload, "has_next", _always)():
                            self._submit(payload.next_request(), when)
                            issued += 1
                    elif kind == "trace":
                        _, plan = payload
                        if self._work.qsize() >= opt.admission_limit:
                            self._rejected += 1
                            self.metrics.count(names.REQUESTS_REJECTED, end_ns=when)
                        else:
                            self._submit(plan, when)
                            issued += 1
                        nxt = next(trace, None)
                        if nxt is None:
                            trace_exhausted = True
                        else:
                            self._push(heap, t0 + int(nxt[0] / self._speedup * 1e9), "trace", nxt)
                    elif kind == "arrive":
                        user = self._all_users[arrivals.randrange(self._active)]
                        if self._work.qsize() >= opt.admission_limit:
                            self._rejected += 1
                            self.metrics.count(names.REQUESTS_REJECTED, end_ns=when)
                        else:
                            self._submit(user.next_request(), when)
                            issued += 1
                        self._push(heap, when + max(1, int(arrivals.expovariate(opt.request_rate) * 1e9)), "arrive", None)
                    elif kind == "complete":
                        plan, (storage, prefill_ns, decode_ns), gen_ns = payload
                        self._in_flight -= 1
                        if self.metrics.record_request(plan.qos_level, when, when - plan.submit_ns, storage, gen_ns,
                                                       prefill_ns, decode_ns, plan.generate_tokens, plan.context_tokens,
                                                       plan.turn_number, plan.read_bytes, plan.written_bytes):
                            completed += 1
                        self._schedule_next(heap, plan, when)
                        if opt.max_requests and completed >= opt.max_requests:
                            finished = True
                            break
                    elif kind == "monitor":
                        sample, last_mark = self._sample(last_mark, t0)
                        timeline.append({"timestamp": sample.t_s, "throughput_tokens_per_sec": sample.tokens_per_sec,
                                         "requests_per_sec": sample.requests_per_sec, "active_users": sample.users,
                                         "storage_read_gbps": sample.storage_read_gbps,
                                         "storage_write_gbps": sample.storage_write_gbps,
                                         "storage_read_p95_ms": sample.read_p95_ms,
                                         "storage_write_p95_ms": sample.write_p95_ms,
                                         "queued_requests": sample.queued_requests})
                        if self.autoscaler is not None:
                            target = self.autoscaler.decide(sample)
                            if target is None:
                                stop_reason, window_end, finished = "capacity found", when, True
                                break
                            self._set_active(heap, target, when)
                        self._push(heap, when + interval_ns, "monitor", None)
                if finished and stop_reason != "capacity found":
                    stop_reason, window_end = "max_requests", time.perf_counter_ns()
                if finished:
                    break
                if trace is not None and self._speedup == 0:  # back-pressure: keep the workers busy
                    while backlog is not None and self._work.qsize() < 2 * opt.workers:
                        self._submit(backlog[1], time.perf_counter_ns())
                        issued += 1
                        backlog = next(trace, None)
                    trace_exhausted = backlog is None
                if self._in_flight == 0 and not self._waiting and (
                        trace_exhausted or (trace is None and opt.request_rate == 0 and self._sessions_done())):
                    cycles_done += 1
                    if trace is None and (self._replay_cycles == 0 or cycles_done < self._replay_cycles):
                        self._restart_sessions(heap, time.perf_counter_ns())
                    else:
                        stop_reason, window_end = "trace complete", time.perf_counter_ns()
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
            requests_rejected=self._rejected,
            timeline=timeline,
            plans=dict(self._plans),
            fatal_error=self._fatal,
            final_active_users=self._active,
        )

    def _sessions_done(self) -> bool:
        """Trace sessions all replayed (synthetic users never run out)."""
        return all(not getattr(u, "has_next", _always)() for u in self._all_users[:self._active])

    def _restart_sessions(self, heap: list, now: int) -> None:
        """Next replay cycle: every session starts again (same keys, as the reference's cycles)."""
        for user in self._all_users[:self._active]:
            user.cursor, user.cycle = 0, user.cycle + 1
            self._waiting.add(user.user_id)
            self._push(heap, now + int(user.first_wake_s() * 1e9), "wake", user)

    def _schedule_next(self, heap: list, plan: RequestPlan, when: int) -> None:
        """Closed loop: the user thinks, then issues its next request (if it is still active)."""
        if self.opt.request_rate > 0 or plan.user_id not in self._by_id:
            return
        user = self._by_id[plan.user_id]
        if not getattr(user, "has_next", _always)():
            return
        if self._is_active(user) and user.user_id not in self._waiting:
            self._waiting.add(user.user_id)
            self._push(heap, when + int(user.think_time() * 1e9), "wake", user)

    def _sample(self, last: dict[str, int], t0: int) -> tuple[IntervalSample, dict[str, int]]:
        mark = self.metrics.mark()
        dt = max(1e-9, (mark["t_ns"] - last["t_ns"]) / 1e9)
        sample = IntervalSample(
            t_s=(mark["t_ns"] - t0) / 1e9,
            users=self._active,
            tokens_per_sec=(mark["tokens"] - last["tokens"]) / dt,
            requests_per_sec=(mark["requests"] - last["requests"]) / dt,
            storage_read_gbps=(mark["read_bytes"] - last["read_bytes"]) / GIB / dt,
            storage_write_gbps=(mark["write_bytes"] - last["write_bytes"]) / GIB / dt,
            read_p95_ms=self.metrics.p95_ms_since("storage", "read", last["read_n"]),
            write_p95_ms=self.metrics.p95_ms_since("storage", "write", last["write_n"]),
            queued_requests=self._work.qsize(),
        )
        return sample, mark

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
