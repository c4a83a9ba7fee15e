"""The scheduler core and each handler of the driver, with fake users, a fake executor and a fake clock:
no I/O, no threads doing work, no timing thresholds."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kv_cache.benchmarks.sessions.session_slots import Slot
from kv_cache.benchmarks.standard.execute import ABANDONED, FAILED, Timing
from kv_cache.benchmarks.standard.scheduler import Driver, DriverOptions
from kv_cache.core.autoscale import ConstantShape
from kv_cache.core.closed_loop import ClosedLoop
from kv_cache.core.events import EventLoop, Stop
from kv_cache.core.pool import Stream, WorkerPool, buffer_id
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.workload.arrivals import PoissonArrivals
from kv_cache.workload.request import Phase, RequestPlan, decode_reads
from kv_cache.workload.users import SyntheticUser, User

S = 1_000_000_000


class Clock:
    def __init__(self, t: int = 0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def plan(user_id: str, seq: int = 1, generate: int = 10, priority: int = 1) -> RequestPlan:
    return RequestPlan(user_id=user_id, request_id=f"{user_id}-{seq}", seq=seq, qos_level="interactive",
                       priority=priority, context_tokens=100, generate_tokens=generate, phase=Phase.PREFILL,
                       cache_key=f"{user_id}-{seq}")


class FakeUser:
    """Requests on demand; `turns` None = endless."""

    def __init__(self, user_id: str, think: float = 1.0, turns: int | None = None, first: float = 0.5) -> None:
        self.user_id = user_id
        self.think = think
        self.turns = turns
        self.first = first
        self.issued = 0
        self.restarts = 0

    def next_request(self) -> RequestPlan:
        self.issued += 1
        return plan(self.user_id, self.issued)

    def think_time(self) -> float:
        return self.think

    def has_next(self) -> bool:
        return self.turns is None or self.issued < self.turns

    def first_wake_s(self) -> float:
        return self.first

    def restart(self) -> None:
        self.issued = 0
        self.restarts += 1


class FakePool:
    """Records submitted jobs instead of running them."""

    def __init__(self) -> None:
        self.jobs: list = []

    def submit(self, job, priority: int = 0) -> None:
        self.jobs.append((priority, job))

    def qsize(self) -> int:
        return len(self.jobs)


def make_driver(users=(), clock=None, shape=None, arrivals=None, make_user=None, trace_speedup=1.0,
                replay_cycles=0, **opts) -> Driver:
    options = DriverOptions(duration_s=opts.pop("duration_s", 100.0), **opts)
    metrics = RunMetrics()
    metrics.open_window(0)
    d = Driver(list(users), cache=SimpleNamespace(bytes_per_token=1, usage=dict), metrics=metrics, options=options,
               stop=threading.Event(), shape=shape, make_user=make_user, arrivals=arrivals,
               trace_speedup=trace_speedup, replay_cycles=replay_cycles, clock=clock or Clock())
    d.pool = FakePool()
    d.deadline = 100 * S
    return d


def events(loop: EventLoop) -> list[tuple[int, str]]:
    return sorted((when, kind) for when, _, kind, _ in loop._heap)


# -- the user protocol ---------------------------------------------------------------------------
def test_every_user_kind_implements_the_protocol():
    for cls in (SyntheticUser, FakeUser, Slot):
        for name in ("next_request", "think_time", "has_next", "first_wake_s", "restart"):
            assert callable(getattr(cls, name)), (cls, name)
    user: User = FakeUser("u")  # type-checks structurally
    assert user.has_next()


# -- event loop ----------------------------------------------------------------------------------
def test_event_loop_dispatches_due_events_in_time_then_submission_order():
    seen = []
    loop = EventLoop({"a": lambda w, p: seen.append(("a", w, p)), "b": lambda w, p: seen.append(("b", w, p))})
    loop.push(5, "b", 1)
    loop.push(3, "a", 2)
    loop.push(5, "a", 3)
    loop.push(9, "a", 4)
    assert loop.run_due(now=6, horizon=100) is None
    assert seen == [("a", 3, 2), ("b", 5, 1), ("a", 5, 3)]
    assert loop.next_time() == 9


def test_event_loop_keeps_events_beyond_the_horizon():
    loop = EventLoop({"a": lambda w, p: pytest.fail("must not run")})
    loop.push(50, "a")
    assert loop.pop_due(now=60, horizon=40) is None
    assert loop.next_time() == 50


def test_event_loop_stops_at_a_handlers_stop():
    loop = EventLoop({"s": lambda w, p: Stop("enough", w), "x": lambda w, p: pytest.fail("after the stop")})
    loop.push(1, "s")
    loop.push(2, "x")
    assert loop.run_due(10, 100) == Stop("enough", 1)


def test_event_loop_completions_and_alarm():
    loop = EventLoop(clock=Clock())
    loop.complete("a")
    loop.complete("b")
    assert loop.take_completions() == ["a", "b"] and loop.take_completions() == []
    loop.raise_alarm("disk full")
    loop.raise_alarm("later")
    assert loop.alarm == "disk full"
    loop.wait(10 * S)  # returns at once: an alarm is pending


# -- closed loop ---------------------------------------------------------------------------------
def test_closed_loop_start_wake_and_think():
    loop = EventLoop()
    issued = []
    users = [FakeUser("a", think=2.0, first=0.5), FakeUser("b", first=1.0)]
    cl = ClosedLoop(loop, users, lambda u, w: issued.append((u.user_id, w)))
    cl.start(10)
    assert events(loop) == [(10 + S // 2, "wake"), (10 + S, "wake")]
    loop.run_due(10 + S, 100 * S)
    assert issued == [("a", 10 + S // 2), ("b", 10 + S)] and not cl.waiting
    cl.after("a", 5 * S)
    assert events(loop) == [(7 * S, "wake")] and cl.waiting == {"a"}
    cl.after("a", 6 * S)  # already waiting: no second wake
    assert len(loop._heap) == 1


def test_closed_loop_inactive_or_finished_users_do_not_issue():
    loop = EventLoop()
    issued = []
    done = FakeUser("done", turns=0)
    cl = ClosedLoop(loop, [FakeUser("a"), done], lambda u, w: issued.append(u.user_id))
    cl.active = 1
    cl.on_wake(1, cl.users[1])  # a stale wake of a user that was stopped
    cl.active = 2
    cl.on_wake(1, done)
    cl.after("done", 2)
    cl.after("unknown", 2)
    assert issued == [] and not loop._heap and cl.all_done() is False


def test_closed_loop_set_active_grows_with_the_factory_and_shrinks():
    loop = EventLoop()
    cl = ClosedLoop(loop, [FakeUser("u0")], lambda u, w: None, make_user=lambda i: FakeUser(f"u{i}", think=1.0))
    cl.set_active(3, now=0)
    assert [u.user_id for u in cl.users] == ["u0", "u1", "u2"] and cl.active == 3
    assert events(loop) == [(S, "wake")] * 2  # u0 was already active (started by the run)
    cl.set_active(1, now=0)
    assert cl.active == 1 and not cl.is_active(cl.users[2])
    cl.set_active(2, now=0, wake=False)  # open loop: users are drawn by arrivals, never woken
    assert cl.active == 2 and len(loop._heap) == 2


def test_closed_loop_restart_replays_every_active_user():
    loop = EventLoop()
    users = [FakeUser("a", turns=1), FakeUser("b", turns=1)]
    cl = ClosedLoop(loop, users, lambda u, w: u.next_request())
    for u in users:
        u.next_request()
    assert cl.all_done()
    cl.restart(100)
    assert [u.restarts for u in users] == [1, 1] and not cl.all_done()
    assert events(loop) == [(100 + S // 2, "wake")] * 2


# -- driver handlers -----------------------------------------------------------------------------
def test_wake_submits_the_users_next_request_with_its_priority():
    d = make_driver([FakeUser("a")], record_plans=True)
    d.loop.dispatch(7, "wake", d.users.users[0])
    assert d.issued == 1 and d.in_flight == 1 and d.pool.jobs[0][0] == 1
    assert d.pool.jobs[0][1].args[0].submit_ns == 7
    assert list(d._plans) == ["a"]


def test_result_handler_models_generation_then_completes():
    d = make_driver([FakeUser("a")], seconds_per_token=0.01)
    p = plan("a", generate=10)
    d.in_flight = 3
    d._on_result(S, p, Timing(5, 1, None))
    assert events(d.loop) == [(S + S // 10, "complete")]
    d._on_result(S, plan("a"), ABANDONED)
    assert d.abandoned == 1 and d.in_flight == 2
    d._on_result(2 * S, plan("a"), FAILED)  # a failed request still lets its user go on
    assert d.failed == 1 and d.in_flight == 1 and (3 * S, "wake") in events(d.loop)


def test_complete_records_the_request_and_the_user_thinks():
    d = make_driver([FakeUser("a", think=2.0)], max_requests=2)
    p = plan("a")
    p.submit_ns = 0
    d.in_flight = 1
    assert d.loop.dispatch(S, "complete", (p, Timing(10, 5, None), 0)) is None
    assert d.completed == 1 and d.in_flight == 0 and d.metrics.requests.completed == 1
    assert events(d.loop) == [(3 * S, "wake")]
    d.in_flight = 1
    assert d.loop.dispatch(2 * S, "complete", (plan("a", 2), Timing(1, None, 1), 0)) == Stop("max_requests")


def test_open_loop_arrival_admits_or_rejects_and_schedules_the_next():
    users = [FakeUser("a"), FakeUser("b")]
    d = make_driver(users, request_rate=10.0, admission_limit=1)
    ref = PoissonArrivals(10.0, 0)
    d.loop.dispatch(S, "arrive", None)
    who = users[ref.pick(2)]
    gap = max(1, int(ref.gap_s() * 1e9))
    assert who.issued == 1 and d.issued == 1
    assert events(d.loop) == [(S + gap, "arrive")]
    d.loop.dispatch(2 * S, "arrive", None)  # queue full (limit 1): rejected, counted, user not asked
    assert d.rejected == 1 and d.issued == 1 and sum(u.issued for u in users) == 1
    d._user_done(plan("a"), 3 * S)
    assert all(k == "arrive" for _, k in events(d.loop))


def test_trace_rows_are_issued_at_their_time_over_the_speedup():
    rows = [(0.0, plan("t", 1)), (4.0, plan("t", 2))]
    d = make_driver(arrivals=rows, trace_speedup=2.0)
    d._start(0)
    assert events(d.loop) == [(0, "trace"), (S, "second"), (10 * S, "monitor")]
    d.loop.run_due(0, 100 * S)
    assert d.issued == 1 and (2 * S, "trace") in events(d.loop)
    d.loop.run_due(2 * S, 100 * S)
    assert d.issued == 2 and d._trace_exhausted


def test_trace_without_pacing_feeds_the_workers_with_back_pressure():
    rows = [(0.0, plan("t", i)) for i in range(10)]
    d = make_driver(arrivals=rows, trace_speedup=0.0, workers=2)
    d._start(0)
    d._feed_backlog()
    assert d.issued == 4 and not d._trace_exhausted  # 2 x workers queued at most
    d.pool.jobs.clear()
    d._feed_backlog()
    d.pool.jobs.clear()
    d._feed_backlog()
    assert d.issued == 10 and d._trace_exhausted


def test_monitor_samples_and_applies_the_load_shape():
    class Shape:
        interval_s = 1.0

        def __init__(self, answers):
            self.answers = list(answers)

        def tick(self, sample):
            return self.answers.pop(0)

    d = make_driver([FakeUser("a")], shape=Shape([3, None]), make_user=lambda i: FakeUser(f"u{i}"))
    mark = d.metrics.mark()
    assert d.loop.dispatch(S, "monitor", mark) is None
    assert d.users.active == 3 and len(d.timeline) == 1 and d.timeline[0]["active_users"] == 1
    assert (2 * S, "monitor") in events(d.loop)
    assert d.loop.dispatch(2 * S, "monitor", mark) == Stop("capacity found", 2 * S)


def test_idle_end_restarts_sessions_then_stops_after_the_cycles():
    users = [FakeUser("s", turns=1)]
    d = make_driver(users, replay_cycles=2)
    users[0].next_request()
    assert d._idle_end() is None and users[0].restarts == 1  # cycle 1 done: replay
    d.users.waiting.clear()
    users[0].next_request()
    assert d._idle_end() == Stop("trace complete")
    synthetic = make_driver([FakeUser("x")])
    assert synthetic._idle_end() is None  # synthetic users never run out


def test_run_end_to_end_with_a_fake_executor():
    clock = Clock()

    class Executor:
        def execute(self, p, bufs):
            clock.t += S // 100
            return Timing(S // 100, S // 100, None)

    class SyncPool(FakePool):
        def submit(self, job, priority=0):
            job(None)

        def start(self):
            return self

        def drain(self):
            return 0

        def close(self):
            pass

    d = make_driver([FakeUser("a", think=0.0, first=0.0), FakeUser("b", think=0.0, first=0.0)], clock=clock,
                    max_requests=5)
    d.pool = SyncPool()
    d.executor = Executor()
    out = d.run()
    assert out.stop_reason == "max_requests" and out.requests_completed == 5
    assert out.requests_issued >= 5 and out.final_active_users == 2


# -- load shapes, arrivals, pools, slots -----------------------------------------------------------
def test_constant_shape_holds():
    assert ConstantShape(4).tick(None) == 4


def test_poisson_retime_uses_the_same_stream_as_the_open_loop():
    rows = [(99.0, "x"), (0.0, "y"), (5.0, "z")]
    ref = PoissonArrivals(3.0, 42)
    expected, t = [], 0.0
    for _, item in rows:
        t += ref.gap_s()
        expected.append((t, item))
    assert list(PoissonArrivals(3.0, 42).retime(rows)) == expected
    with pytest.raises(ValueError):
        PoissonArrivals(0.0, 1)


def test_each_pool_kind_has_its_own_buffer_stream():
    ids = {s: {buffer_id(s, i) for i in range(64)} for s in Stream}
    for a in Stream:
        for b in Stream:
            if a is not b:
                assert not ids[a] & ids[b]


def test_worker_pool_runs_jobs_by_priority_and_reraises_errors():
    with WorkerPool(Stream.REQUESTS, 1, 4096, 1) as pool:
        seen = []
        gate = threading.Event()
        pool.submit(lambda b: gate.wait())  # hold the only worker while jobs queue up
        pool.submit(lambda b: seen.append("low"), priority=0)
        pool.submit(lambda b: seen.append("high"), priority=5)
        gate.set()
        pool.run_on_each(lambda b: seen.append(b.worker_id))
        assert seen == ["high", "low", buffer_id(Stream.REQUESTS, 0)]
        with pytest.raises(RuntimeError):
            pool.run_on_each(lambda b: (_ for _ in ()).throw(RuntimeError("boom")))


def test_slot_replays_sessions_and_pauses_between_turns():
    turns = [SimpleNamespace(new_tokens=10, output_tokens=4, pause_before_s=None, kind="human"),
             SimpleNamespace(new_tokens=5, output_tokens=4, pause_before_s=0.25, kind="human")]
    scripts = iter([SimpleNamespace(session_id=f"s{i}", turns=turns, shared_prefix_tokens=4,
                                    contexts=lambda: [(4, 14), (8, 23)]) for i in range(2)])
    import kv_cache.benchmarks.sessions.session_slots as mod

    slot = Slot(0, block_tokens=4, next_script=lambda: next(scripts))
    original = mod.classify_turn
    mod.classify_turn = lambda turn, threshold: "start"
    try:
        first = slot.next_request()
        assert first.session_id == "s0" and first.turn_index == 0 and slot.outstanding
        assert first.input_keys == ["shared_0", "s0_t0_1", "s0_t0_2"] and first.needed_slots == 5
        assert slot.think_time() == 0.25
        second = slot.next_request()
        assert second.input_keys[:2] == ["shared_0", "s0_t0_1"]  # the reused prefix keeps its keys
        assert slot.think_time() == 0.0  # session over: the next starts at once
        assert slot.next_request().session_id == "s1"
    finally:
        mod.classify_turn = original


# -- the plan executor counts what each hit means -------------------------------------------------
def test_executor_counts_hit_kinds_for_the_workload():
    from kv_cache.benchmarks.standard.execute import PlanExecutor
    from kv_cache.serving.cache import MultiTierCache, Tier
    from kv_cache.settings.sections import EvictionConfig
    from kv_cache.storage.buffers import WorkerBuffers
    from kv_cache.storage.memory import MemoryStore

    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("cpu", MemoryStore(8 << 20, slab_bytes=16 << 10), 8 << 20)], EvictionConfig(),
                           metrics, bytes_per_token=16)
    ex = PlanExecutor(cache, metrics, lambda tokens: tokens * 16, threading.Event(), decode_batch_size=32)
    p = RequestPlan(user_id="u", request_id="r", seq=1, qos_level="interactive", priority=1, context_tokens=64,
                    generate_tokens=1, phase=Phase.PREFILL_DECODE, cache_key="k", history_keys=("h",),
                    prefix_key="sys", prefix_tokens=32)
    with WorkerBuffers(64 << 10, 1, 0) as bufs:
        cache.allocate("h", 8, 128, bufs)
        assert isinstance(ex.execute(p, bufs), Timing)  # prefix missed (stored), history hit, k stored then read
        assert isinstance(ex.execute(p, bufs), Timing)  # now the prefix hits too
    c = metrics.snapshot_counters()
    assert c["system_prompt_hits"] == 1 and c["prefix_misses"] == 1 and c["prefix_hits"] == 1
    assert c["multi_turn_hits"] == 2 and c["multi_turn_cache_hits"] == 2
    assert c["user_cache_hits"] == 2 * (1 + decode_reads(1, 32))  # the decode reads of k
    assert c["cache_hits"] == c["system_prompt_hits"] + c["multi_turn_hits"] + c["user_cache_hits"]
