"""Runs the load: users or arrivals -> request plans -> a bounded pool of I/O workers -> the cache.

Decides only WHEN things happen. The calling thread owns an event loop (core/events.py) of user
wake-ups, open-loop arrivals, trace rows, request completions and monitor ticks, each kind handled by
one small handler; a fixed pool of worker threads executes the cache operations (pwritev/preadv release
the GIL, so threads give real I/O parallelism). Simulated token generation is modelled time that does not
hold a worker. No thread per user: 10,000 users cost heap entries, not threads.

Two ways to offer load:
- closed loop (default): each active user issues its next request only after the previous one completed
  and its think time elapsed;
- open loop (`request_rate > 0`): Poisson arrivals at the given rate, each from a user drawn from the
  seeded arrival generator; an arrival that finds `admission_limit` requests already queued is rejected
  and counted (never silently dropped). When the loop cannot dispatch arrivals as fast as they are due
  (a rate above what one process generates), it does not fall behind without end: arrivals more than
  LAG_LIMIT_NS late, when more than LAG_LIMIT_ARRIVALS fell due meanwhile, are counted as not offered
  (a Poisson count over the lag), the generator jumps to the clock, and the run still ends on time;
  `offered_request_rate` is then the rate really offered. A shorter backlog (a stall of the process) is
  caught up with: its arrivals are offered late.
A load shape (core/autoscale.py) may change the number of active users at every monitor tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from kv_cache.benchmarks.standard.execute import ABANDONED, FAILED, Outcome, PlanExecutor, Timing
from kv_cache.core import pool as pools
from kv_cache.core.autoscale import IntervalSample, LoadShape
from kv_cache.core.closed_loop import ClosedLoop
from kv_cache.core.error_policy import ErrorPolicy
from kv_cache.core.events import EventLoop, Stop
from kv_cache.core.group import GroupBroken, RankGroup
from kv_cache.core.observe import RunObserver, Tick
from kv_cache.core.pool import Stream
from kv_cache.metrics import names
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.metrics.timeseries import Rows
from kv_cache.serving.cache import MultiTierCache
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_sim import standin_ns
from kv_cache.storage.tiername import TierName
from kv_cache.workload.arrivals import PoissonArrivals
from kv_cache.workload.request import RequestPlan
from kv_cache.workload.users import User

log = logging.getLogger("kv_cache")

LAG_LIMIT_NS = 10_000_000  # an open-loop arrival handled later than this behind its time: the generator saturated
# ... when, too, more than this many arrivals fell due in the lag: a stall of the process (a GC pause, a
# descheduled thread on a loaded host: 50 ms at 200 req/s is 10 arrivals) is caught up with, its arrivals
# offered late, not counted as a saturated generator
LAG_LIMIT_ARRIVALS = 1000


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
    max_storage_errors: int = 10  # storage errors (after retries) tolerated before the run stops
    bucket_s: float = 1.0  # time-series bucket and progress tick


@dataclass
class DriverOutcome:
    stop_reason: str
    window_s: float
    requests_issued: int
    requests_completed: int
    requests_abandoned: int
    requests_failed: int
    requests_rejected: int = 0
    # open loop: arrivals the generator could not offer in time (the loop fell more than LAG_LIMIT_NS behind
    # the process's clock), and how many times it jumped to the clock
    arrivals_not_offered: int = 0
    generator_saturations: int = 0
    timeline: list[dict] = field(default_factory=list)
    plans: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    fatal_error: str | None = None
    final_active_users: int = 0
    # requests started on a worker or in modelled generation when the run stopped; each one's latency is
    # only known to exceed stop - submission (a censored observation, kept out of the percentiles)
    requests_in_flight_at_stop: int = 0
    requests_finished_after_stop: int = 0
    censored_ns: list[int] = field(default_factory=list)
    peers_lost: bool = False  # the window's closing barrier broke: another rank ended without closing it
    # a second signal after the window cut the drain short: the requests still on a worker then (stuck in
    # an I/O call) were abandoned, counted in requests_abandoned and censored at the stop like the others
    drain_cut: bool = False
    requests_abandoned_at_cut: int = 0
    signal_after_window_s: float | None = None  # a stop signal that landed after the window was complete


class Driver:
    def __init__(self, users: list[User], cache: MultiTierCache, metrics: RunMetrics, options: DriverOptions,
                 stop: threading.Event, shape: LoadShape | None = None,
                 make_user: Callable[[int], User] | None = None,
                 arrivals: Iterable[tuple[float, RequestPlan]] | None = None, trace_speedup: float = 1.0,
                 replay_cycles: int = 0, clock: Callable[[], int] = time.perf_counter_ns,
                 group: RankGroup | None = None, observers: Sequence[RunObserver] = (),
                 on_window_close: Callable[[], None] | None = None,
                 drain_cut: threading.Event | None = None) -> None:
        """`users`: closed-loop users (synthetic or trace sessions). `arrivals`: a timestamped trace
        replayed open-loop at t / trace_speedup (0 = back-pressured, as fast as the workers go).
        `group`: the other ranks of this run; every rank opens and closes its window between shared barriers.
        `on_window_close`: called the moment the window closes, before the drain (the run's signal handler
        stops raising KeyboardInterrupt then, so nothing after it can lose the window's results).
        `drain_cut`: set (by a second signal) to stop waiting for the workers' requests in flight after the
        window: they are abandoned and the run goes on to its results."""
        self.cache, self.metrics, self.opt, self.stop, self.shape = cache, metrics, options, stop, shape
        self.group = group
        self.on_window_close = on_window_close
        self.drain_cut = drain_cut
        self._running: dict[int, RequestPlan] = {}  # plans on a worker now (id(plan) -> plan), under _lock
        self._cut_plans: list[RequestPlan] = []  # those abandoned when the drain was cut short
        self.peers_lost = False  # the closing barrier broke: another rank never closed its window
        self.observers = list(observers)
        self._speedup = trace_speedup
        self._replay_cycles = replay_cycles
        self.loop = EventLoop(clock=clock)
        self.users = ClosedLoop(self.loop, users, self._issue_user, make_user)
        self.loop.handlers.update({"trace": self._on_trace, "arrive": self._on_arrive,
                                   "complete": self._on_complete, "monitor": self._on_monitor,
                                   "second": self._on_second})
        self.executor = PlanExecutor(cache, metrics, self.entry_bytes, stop, options.decode_batch_size,
                                     options.prefill_only, options.decode_only, on_fatal=self.loop.raise_alarm)
        if getattr(cache, "on_fault", False) is None:  # the run's one storage-error policy stops this loop
            cache.on_fault = ErrorPolicy(options.max_storage_errors, self.loop.raise_alarm)
        self.pool = pools.open_pool(Stream.REQUESTS, options.workers, options.chunk_bytes, options.seed)
        self._trace = iter(arrivals) if arrivals is not None else None
        self._backlog: tuple[float, RequestPlan] | None = None  # next trace row not yet issued
        self._trace_exhausted = False
        self._arrivals = PoissonArrivals(options.request_rate, options.seed) if options.request_rate > 0 else None
        self._lock = threading.Lock()
        self._worker = threading.local()  # per worker: the shift of its last plan's end (_without_standin)
        self.issued = self.completed = self.abandoned = self.failed = self.rejected = self.in_flight = 0
        self.not_offered = self.saturations = 0
        self.signal_after_window_s: float | None = None  # a stop signal that came once the window was complete
        self._cycles_done = 0
        # `throughput_timeline` rows, held compactly (8 bytes a figure, not a dict of floats: ~0.2 MiB an hour)
        self.timeline = Rows()
        self._plans: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        self.t0 = self.deadline = 0

    def entry_bytes(self, tokens: int) -> int:
        return max(1, tokens * self.opt.bytes_per_token // self.opt.tensor_parallel)

    @property
    def interval_ns(self) -> int:
        return int((self.shape.interval_s if self.shape else self.opt.timeline_interval_s) * 1e9)

    # -- executor side (worker threads) ---------------------------------------------------------
    def _work(self, plan: RequestPlan, bufs: WorkerBuffers) -> None:
        if self.stop.is_set():
            with self._lock:
                self.abandoned += 1
            return
        with self._lock:
            self._running[id(plan)] = plan
        start = self.loop.clock()
        standin = standin_ns()
        outcome = self.executor.execute(plan, bufs)
        # a simulated GPU tier's host memcpy stands in for a DMA whose time is modelled: not in a latency
        end = self._without_standin(plan, start, self.loop.clock(), standin_ns() - standin)
        with self._lock:  # a plan the cut drain abandoned has been counted already: its result is dropped
            if self._running.pop(id(plan), None) is not None:
                self.loop.complete((end, plan, outcome))

    def _without_standin(self, plan: RequestPlan, start: int, end: int, standin: int) -> int:
        """The end of `plan` as it would have been had a simulated GPU tier's copies taken their modelled
        time rather than the stand-in memcpys' (`standin`: this plan's memcpy - modelled ns, on this worker).
        Its own stand-ins are taken off, and so is its wait for this worker where the worker was busy with an
        earlier plan's: without them the worker would have been free at that plan's shifted end (`lag` ns
        before its real one), so this plan starts at the latest of its submission, that shifted end and
        (the worker becoming free as it did) its real start less the lag. With no simulated GPU tier every
        shift is 0 and the end is the real one. (One worker's view: another worker that would have been free
        earlier is not looked for.)"""
        state = self._worker
        lag, free = getattr(state, "lag", 0), getattr(state, "free", None)
        if not lag and not standin:
            return end
        began = max(plan.submit_ns, start - max(lag, 0), free if free is not None else plan.submit_ns)
        shifted = end - (start - began) - standin
        state.lag, state.free = end - shifted, shifted
        return shifted

    def _submit(self, plan: RequestPlan, when: int) -> None:
        plan.submit_ns = when
        self.in_flight += 1
        self.issued += 1
        if self.opt.record_plans:
            self._plans[plan.user_id].extend(plan.intended_operations(self.opt.decode_batch_size))
        self.pool.submit(partial(self._work, plan), priority=plan.priority)

    def _admit(self, plan_of: Callable[[], RequestPlan], when: int) -> None:
        """Open loop: queue the arrival unless the admission queue is full (then it is rejected)."""
        if self.pool.qsize() >= self.opt.admission_limit:
            self.rejected += 1
            self.metrics.count(names.REQUESTS_REJECTED, end_ns=when)
        else:
            self._submit(plan_of(), when)

    # -- handlers (scheduler thread) ----------------------------------------------------------
    def _issue_user(self, user: User, when: int) -> None:
        self._submit(user.next_request(), when)

    def _on_trace(self, when: int, row: tuple[float, RequestPlan]) -> None:
        self._admit(lambda: row[1], when)
        nxt = next(self._trace, None)
        if nxt is None:
            self._trace_exhausted = True
        else:
            self.loop.push(self.t0 + int(nxt[0] / self._speedup * 1e9), "trace", nxt)

    def _on_arrive(self, when: int, _: object) -> None:
        user = self.users.users[self._arrivals.pick(self.users.active)]
        self._admit(user.next_request, when)
        nxt = when + max(1, int(self._arrivals.gap_s() * 1e9))
        now = self.loop.clock()
        lag = now - nxt
        if lag > LAG_LIMIT_NS and self._arrivals.rate * lag / 1e9 > LAG_LIMIT_ARRIVALS:
            # the loop fell behind the arrivals, further than it catches up with: those due meanwhile were not offered
            self.not_offered += self._arrivals.skip((now - nxt) / 1e9)
            self.saturations += 1
            nxt = now
        self.loop.push(nxt, "arrive")

    def _on_result(self, end_ns: int, plan: RequestPlan, outcome: Outcome) -> None:
        """A worker finished a plan: its answer is generated (modelled time), then it completes."""
        if outcome == ABANDONED:
            with self._lock:
                self.abandoned += 1
            self.in_flight -= 1
        elif outcome == FAILED:
            self.failed += 1
            self.in_flight -= 1
            self._user_done(plan, end_ns)
        else:
            gen_ns = int(plan.generate_tokens * self.opt.seconds_per_token * 1e9)
            self.loop.push(end_ns + gen_ns, "complete", (plan, outcome, gen_ns))

    def _on_complete(self, when: int, payload: tuple[RequestPlan, Timing, int]) -> Stop | None:
        plan, t, gen_ns = payload
        self.in_flight -= 1
        if self.metrics.record_request(plan.qos_level, when, when - plan.submit_ns, t.storage_ns, gen_ns,
                                       t.prefill_ns, t.decode_ns, plan.generate_tokens, plan.context_tokens,
                                       plan.turn_number, plan.read_bytes, plan.written_bytes):
            self.completed += 1
        self._user_done(plan, when)
        if self.opt.max_requests and self.completed >= self.opt.max_requests:
            return Stop("max_requests")
        return None

    def _user_done(self, plan: RequestPlan, when: int) -> None:
        if self._arrivals is None:  # closed loop: the user thinks, then asks again
            self.users.after(plan.user_id, when)

    def _on_monitor(self, when: int, last: dict[str, int]) -> Stop | None:
        sample, mark = self._sample(last)
        self.timeline.append(timeline_row(sample))
        if self.shape is not None:
            target = self.shape.tick(sample)
            if target is None:
                return Stop("capacity found", when)
            self.users.set_active(target, when, wake=self._arrivals is None)
        self.loop.push(when + self.interval_ns, "monitor", mark)
        return None

    def _on_second(self, when: int, _: object) -> None:
        """Close the time-series bucket (with the gauges only the driver knows) and tell the observers."""
        self._close_bucket(when)
        self.loop.push(when + int(self.opt.bucket_s * 1e9), "second")

    def _close_bucket(self, when: int) -> None:
        gauges: dict[str, float] = {"queue_depth": self.pool.qsize(), "in_flight": self.in_flight,
                                    "active_users": self.users.active}
        for tier, u in self.cache.usage().items():
            gauges[f"occupancy_{TierName.of(tier)}_bytes"] = u["used_bytes"]
        row = self.metrics.close_bucket(when, gauges)
        tick = Tick((when - self.t0) / 1e9, self.opt.duration_s, self.issued, self.completed, row)
        for observer in self.observers:
            observer.tick(tick)

    # -- the run ------------------------------------------------------------------------------
    def _start(self, t0: int) -> None:
        """The first events: trace rows, arrivals or user wake-ups, and the first monitor tick."""
        if self._trace is not None:
            first = next(self._trace, None)
            if first is not None and self._speedup > 0:
                self.loop.push(t0 + int(first[0] / self._speedup * 1e9), "trace", first)
            else:
                self._backlog = first
            self._trace_exhausted = first is None
        elif self._arrivals is not None:
            self.loop.push(t0 + int(self._arrivals.gap_s() * 1e9), "arrive")
        else:
            self.users.start(t0)
        self.loop.push(t0 + self.interval_ns, "monitor", self.metrics.mark())
        self.loop.push(t0 + int(self.opt.bucket_s * 1e9), "second")

    def _feed_backlog(self) -> None:
        """Trace at speed-up 0: keep the workers busy, no pacing, no rejections."""
        while self._backlog is not None and self.pool.qsize() < 2 * self.opt.workers:
            self._submit(self._backlog[1], self.loop.clock())
            self._backlog = next(self._trace, None)
        self._trace_exhausted = self._backlog is None

    def _idle_end(self) -> Stop | None:
        """Nothing in flight and nothing left to issue: next replay cycle, or the end of the trace."""
        if self.in_flight or self.users.waiting:
            return None
        if self._trace is None and (self._arrivals is not None or not self.users.all_done()):
            return None
        if self._trace is not None and not self._trace_exhausted:
            return None
        self._cycles_done += 1
        if self._trace is None and (self._replay_cycles == 0 or self._cycles_done < self._replay_cycles):
            self.users.restart(self.loop.clock())
            return None
        return Stop("trace complete")

    def _step(self) -> Stop | None:
        loop = self.loop
        now = loop.clock()
        for result in loop.take_completions():
            self._on_result(*result)
        if loop.alarm is not None:
            return Stop("storage error", now)
        stop = loop.run_due(now, self.deadline)
        if stop is not None:
            return stop
        if self._trace is not None and self._speedup == 0:
            self._feed_backlog()
        stop = self._idle_end()
        if stop is not None:
            return stop
        if loop.clock() >= self.deadline:
            return Stop("duration", self.deadline)
        loop.wait_next(self.deadline)
        return None

    def run(self) -> DriverOutcome:
        self.pool.start()  # buffers allocated and filled before the clock starts
        if self.group is not None:
            self.group.barrier()  # one common window: every rank opens it when all are ready
        self.t0 = self.loop.clock()
        self.metrics.open_window(self.t0)
        self.deadline = self.t0 + int(self.opt.duration_s * 1e9)
        stop: Stop | None = None
        try:
            self._start(self.t0)
            while stop is None:
                stop = self._step()
        except KeyboardInterrupt:
            now = self.loop.clock()
            if stop is None and now >= self.deadline:  # the window was complete: a late signal changes nothing
                self.signal_after_window_s = (now - self.t0) / 1e9
                stop = Stop("duration", self.deadline)
            elif stop is None:
                stop = Stop("interrupted")
        finally:
            self._window_closing()
            end = stop.at_ns if stop is not None and stop.at_ns is not None else self.loop.clock()
            self.metrics.close_window(min(end, self.loop.clock()))
            self._last_bucket(min(end, self.loop.clock()))
            self.stop.set()
            dropped = self.pool.drain()
            with self._lock:
                self.abandoned += dropped
            if self.drain_cut is None:
                self.pool.close()
            elif not self.pool.close(cut=self.drain_cut):  # a second signal cut the drain short
                self._abandon_running()
            if self.group is not None and stop is not None and stop.reason != "interrupted":
                self._closing_barrier()
            settled = self._settle(end)
        return DriverOutcome(
            stop_reason=stop.reason, window_s=self.metrics.window_seconds, requests_issued=self.issued,
            requests_completed=self.completed, requests_abandoned=self.abandoned, requests_failed=self.failed,
            requests_rejected=self.rejected, arrivals_not_offered=self.not_offered,
            generator_saturations=self.saturations, timeline=list(self.timeline), plans=dict(self._plans),
            fatal_error=self.loop.alarm, final_active_users=self.users.active,
            requests_in_flight_at_stop=len(settled[1]), requests_finished_after_stop=settled[0],
            censored_ns=settled[1], peers_lost=self.peers_lost,
            drain_cut=bool(self._cut_plans), requests_abandoned_at_cut=len(self._cut_plans),
            signal_after_window_s=self.signal_after_window_s,
        )

    def outcome_so_far(self, stop_reason: str) -> DriverOutcome:
        """The window's outcome as it stands (a rank's periodic document, on the scheduler thread at a tick):
        the counts so far, the requests on a worker now as in flight, no censored latencies (their stop has
        not come) and no plans."""
        return DriverOutcome(
            stop_reason=stop_reason, window_s=self.metrics.window_seconds, requests_issued=self.issued,
            requests_completed=self.completed, requests_abandoned=self.abandoned, requests_failed=self.failed,
            requests_rejected=self.rejected, arrivals_not_offered=self.not_offered,
            generator_saturations=self.saturations, timeline=list(self.timeline), fatal_error=self.loop.alarm,
            final_active_users=self.users.active, requests_in_flight_at_stop=self.in_flight)

    def _window_closing(self) -> None:
        """Tell the run the window is over; a KeyboardInterrupt landing just before that is the same stop
        (the run's handler raises at most one, so the retry cannot loop)."""
        if self.on_window_close is None:
            return
        try:
            self.on_window_close()
        except KeyboardInterrupt:
            self.on_window_close()

    def _abandon_running(self) -> None:
        """The drain was cut short: the plans still on a worker are abandoned (their late results dropped)."""
        with self._lock:
            self._cut_plans = list(self._running.values())
            self._running.clear()
            self.abandoned += len(self._cut_plans)
        log.warning("the drain was cut short: %d request(s) still in flight abandoned", len(self._cut_plans))

    def _closing_barrier(self) -> None:
        """No rank cleans up (or starts other I/O) while another still measures. A rank that died in the
        window breaks the barrier: this rank's window is whole, so its results stand (peers_lost)."""
        try:
            self.group.barrier()
        except GroupBroken as exc:
            self.peers_lost = True
            log.warning("the closing barrier broke (%s): this rank's results are kept; the merge names the "
                        "missing rank(s)", exc)

    def _settle(self, stop_ns: int) -> tuple[int, list[int]]:
        """The requests in flight at the stop, read from the completion queue and the generation events
        once the workers are gone: abandoned and failed ones are counted as such, and every one's
        latency is censored at the stop. Returns (finished after the stop, censored latencies ns)."""
        censored: list[int] = []
        finished = 0
        for _, plan, outcome in self.loop.take_completions():
            censored.append(max(0, stop_ns - plan.submit_ns))
            if outcome == ABANDONED:
                self.abandoned += 1
            elif outcome == FAILED:
                self.failed += 1
            else:
                finished += 1
        for plan, _, _ in self.loop.remove("complete"):  # storage done, modelled generation still going
            censored.append(max(0, stop_ns - plan.submit_ns))
            finished += 1
        censored.extend(max(0, stop_ns - plan.submit_ns) for plan in self._cut_plans)  # abandoned at the cut
        self.in_flight = 0
        return finished, censored

    def _last_bucket(self, end: int) -> None:
        """The partial bucket at the end of the window (a tenth of a bucket or more), then the observers stop."""
        rows = self.metrics.series.rows
        last_t = self.t0 + int(rows[-1]["t_s"] * 1e9) if rows else self.t0
        if end - last_t >= self.opt.bucket_s * 1e8:
            self._close_bucket(end)
        for observer in self.observers:
            observer.done()

    def _sample(self, last: dict[str, int]) -> tuple[IntervalSample, dict[str, int]]:
        mark = self.metrics.mark()
        dt = max(1e-9, (mark["t_ns"] - last["t_ns"]) / 1e9)
        sample = IntervalSample(
            t_s=(mark["t_ns"] - self.t0) / 1e9,
            users=self.users.active,
            tokens_per_sec=(mark["tokens"] - last["tokens"]) / dt,
            requests_per_sec=(mark["requests"] - last["requests"]) / dt,
            storage_read_gbps=(mark["read_bytes"] - last["read_bytes"]) / GIB / dt,
            storage_write_gbps=(mark["write_bytes"] - last["write_bytes"]) / GIB / dt,
            read_p95_ms=self.metrics.p95_ms_since(TierName.STORAGE, "read", last["read_n"]),
            write_p95_ms=self.metrics.p95_ms_since(TierName.STORAGE, "write", last["write_n"]),
            queued_requests=self.pool.qsize(),
        )
        return sample, mark


def timeline_row(s: IntervalSample) -> dict:
    """One `throughput_timeline` entry of the results."""
    return {"timestamp": s.t_s, "throughput_tokens_per_sec": s.tokens_per_sec, "requests_per_sec": s.requests_per_sec,
            "active_users": s.users, "storage_read_gbps": s.storage_read_gbps,
            "storage_write_gbps": s.storage_write_gbps, "storage_read_p95_ms": s.read_p95_ms,
            "storage_write_p95_ms": s.write_p95_ms, "queued_requests": s.queued_requests}
