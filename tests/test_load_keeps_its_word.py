"""The load generator keeps its word ("Drop-in again", issue 27 item 4-5): the event loop hands control
back however many events are due, an open loop faster than the loop can dispatch ends on time and counts
what it could not offer, and a signal that lands once the window is complete changes nothing."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from kv_cache.benchmarks.standard.execute import Timing
from kv_cache.benchmarks.standard.scheduler import LAG_LIMIT_NS, Driver, DriverOptions
from kv_cache.core.events import CLOCK_EVERY, SLICE_NS, EventLoop
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.measurement import offered_load
from kv_cache.workload.arrivals import PoissonArrivals
from kv_cache.workload.request import Phase, RequestPlan

S = 1_000_000_000


class TickingClock:
    """Every read of the clock moves it on by `step` ns: a loop that never looks at it never ends."""

    def __init__(self, step: int) -> None:
        self.t, self.step = 0, step

    def __call__(self) -> int:
        self.t += self.step
        return self.t


class User:
    def __init__(self, uid: str) -> None:
        self.user_id, self.n = uid, 0

    def next_request(self) -> RequestPlan:
        self.n += 1
        return RequestPlan(user_id=self.user_id, request_id=f"{self.user_id}-{self.n}", seq=self.n,
                           qos_level="interactive", priority=1, context_tokens=100, generate_tokens=1,
                           phase=Phase.PREFILL, cache_key=f"{self.user_id}-{self.n}")

    def think_time(self) -> float:
        return 0.0

    def has_next(self) -> bool:
        return True

    def first_wake_s(self) -> float:
        return 0.0

    def restart(self) -> None:
        self.n = 0


class HeldPool:
    """Takes jobs and never runs them (a worker pool stuck behind slow storage)."""

    def __init__(self) -> None:
        self.jobs: list = []

    def submit(self, job, priority: int = 0) -> None:
        self.jobs.append(job)

    def qsize(self) -> int:
        return len(self.jobs)

    def start(self):
        return self

    def drain(self) -> int:
        n, self.jobs = len(self.jobs), []
        return n

    def close(self, cut=None) -> bool:
        return True


def _driver(clock, **opts) -> Driver:
    metrics = RunMetrics()
    d = Driver([User("a"), User("b")], cache=SimpleNamespace(bytes_per_token=1, usage=dict), metrics=metrics,
               options=DriverOptions(**opts), stop=threading.Event(), clock=clock)
    d.pool = HeldPool()
    d.loop.wait = lambda until: setattr(clock, "t", max(clock.t, until))  # sleeping moves the fake clock on
    return d


def test_run_due_hands_control_back_when_handlers_keep_events_due():
    """A handler that schedules another due event each time (an arrival gap floored at 1 ns at a rate of
    1e12/s): run_due used to dispatch them forever. It now returns within about one slice of the clock."""
    clock = TickingClock(1000)
    loop = EventLoop(clock=clock)
    seen = []

    def again(when, _):
        seen.append(when)
        loop.push(when + 1, "again")

    loop.handlers["again"] = again
    loop.push(0, "again")
    assert loop.run_due(now=10 * S, horizon=10 * S) is None
    # the clock is read once every CLOCK_EVERY events: the slice's 2 ms pass after that many reads
    assert len(seen) == CLOCK_EVERY * (SLICE_NS // 1000)
    assert loop.next_time() == len(seen)  # the rest stay queued for the next step


def test_an_open_loop_above_what_the_loop_dispatches_ends_on_time_and_says_what_it_offered():
    """--request-rate 1e12 against a loop whose clock moves 2 us per read: the window ends at its deadline
    (it used to run until killed), the arrivals the loop fell behind by are counted as not offered, and
    the offered rate is what was really offered, not the rate asked."""
    d = _driver(TickingClock(2000), duration_s=0.05, request_rate=1e12, admission_limit=50)
    out = d.run()
    assert out.stop_reason == "duration" and out.window_s == 0.05
    assert out.generator_saturations > 0 and out.arrivals_not_offered > 1e9  # ~5e10 due in 0.05 s
    offered = out.requests_issued + out.requests_rejected
    assert 0 < offered < 1e6 and out.requests_issued == 50  # the admission queue held 50, never ran
    notes: list[str] = []
    load = offered_load(out, 1e12, out.window_s, notes)
    assert load["offered_request_rate"] == offered / 0.05 and load["requested_request_rate"] == 1e12
    assert load["generator_saturated"] and load["arrivals_not_offered"] == out.arrivals_not_offered
    assert len(notes) == 1 and notes[0].startswith("the open-loop generator saturated: --request-rate 1e+12")


def test_an_open_loop_the_loop_keeps_up_with_offers_every_arrival():
    """A rate the loop keeps up with: nothing is counted as not offered (the lag bound is not a cap)."""
    d = _driver(TickingClock(100), duration_s=0.2, request_rate=200.0, admission_limit=10_000)
    out = d.run()
    assert out.arrivals_not_offered == 0 and out.generator_saturations == 0
    ref = PoissonArrivals(200.0, 0)
    t, expected = 0.0, 0
    while True:
        ref.pick(2)
        t += ref.gap_s()
        if t > 0.2:
            break
        expected += 1
    assert out.requests_issued in (expected, expected + 1)  # the seed's arrivals, all offered
    assert offered_load(out, 200.0, out.window_s, [])["generator_saturated"] is False
    assert LAG_LIMIT_NS > 0


def test_poisson_skip_counts_do_not_change_the_seeds_gaps():
    a, b = PoissonArrivals(1e6, 7), PoissonArrivals(1e6, 7)
    assert a.skip(0.5) > 0 and a.skip(0.0) == 0 and a.skip(-1.0) == 0
    assert [a.gap_s() for _ in range(5)] == [b.gap_s() for _ in range(5)]
    assert PoissonArrivals(1e18, 0).skip(10.0) == 10**19  # beyond numpy's Poisson: the mean


def test_a_signal_once_the_window_is_complete_leaves_it_complete():
    """Ctrl-C in the last milliseconds of a window already complete (10.04 s of 10 s) used to give
    "INCOMPLETE: interrupted after 100 %" and exit 130: the window is whole, the run complete."""
    clock = TickingClock(1000)
    d = _driver(clock, duration_s=0.01)
    step = d._step

    def interrupted_after_the_deadline():
        if clock.t >= d.deadline:
            raise KeyboardInterrupt
        return step()

    d._step = interrupted_after_the_deadline
    d._idle_end = lambda: None
    out = d.run()
    assert out.stop_reason == "duration" and out.window_s == 0.01
    assert out.signal_after_window_s is not None and out.signal_after_window_s >= 0.01


def test_a_signal_inside_the_window_still_interrupts_it():
    clock = TickingClock(1000)
    d = _driver(clock, duration_s=10.0)
    calls = []

    def interrupted_at_once():
        calls.append(1)
        raise KeyboardInterrupt

    d._step = interrupted_at_once
    out = d.run()
    assert out.stop_reason == "interrupted" and out.signal_after_window_s is None and out.window_s < 10.0


def test_timing_type_is_the_executors():  # the fake pool never runs plans: nothing else is needed of it
    assert Timing(1, 1, None).storage_ns == 1


# -- long preparation phases say where they are (item 3) -------------------------------------------------
def test_a_preparation_line_has_its_total_rate_and_time_left():
    from kv_cache.benchmarks.standard.phases import progress_line

    gib = 1 << 30
    assert progress_line("prepopulation", 879, int(549.38 * gib), 625 * gib, 298.9) == (
        "prepopulation: 879 entries, 549.38 of 625.00 GiB (87.9 %), 1.84 GiB/s, 41 s left (298.9 s)")
    assert progress_line("fill", 3, 2 * gib, None, 4.0) == "fill: 3 entries, 2.00 GiB, 0.50 GiB/s (4.0 s)"
    assert progress_line("fill", 0, 0, gib, 0.0) == "fill: 0 entries, 0.00 of 1.00 GiB (0.0 %), 0.00 GiB/s (0.0 s)"


def test_a_phase_that_writes_more_than_the_tiers_hold_warns_how_much_is_evicted():
    from kv_cache.benchmarks.standard.phases import over_capacity_warning

    gib = 1 << 30
    tiers = [SimpleNamespace(limit=2 * gib), SimpleNamespace(limit=60.5 * gib)]
    said = over_capacity_warning("pre-population", 625 * gib, tiers)
    assert said == ("WARNING: pre-population writes 625.00 GiB, 10.0x the 62.50 GiB the tiers hold: about 562.50 GiB "
                    "(90 %) of it is evicted as soon as it is written (the window then finds only the last entries "
                    "written)")
    assert over_capacity_warning("pre-population", 62 * gib, tiers) is None
    assert over_capacity_warning("pre-population", 625 * gib, [SimpleNamespace(limit=float("inf"))]) is None


def test_a_ranks_capacity_refusal_advises_the_total_the_flag_takes():
    """Under ranks --storage-capacity-gb is a total the ranks split: the refusal's "give at most" speaks in
    it (2 ranks x 1.5), where it used to give one rank's figure (following it gave half the room)."""
    from kv_cache.benchmarks.standard.processes import rank_settings
    from kv_cache.benchmarks.standard.run import _with_rank_share
    from kv_cache.cli import explain, parse_settings
    from kv_cache.errors import StorageSetupError

    share = rank_settings(parse_settings(["--num-users", "4", "--storage-capacity-gb", "4", "--processes", "2",
                                          "--strict-memory"]), 0, 2)
    exc = StorageSetupError("2 GiB x 2 ranks on that filesystem = 4.000 GiB is more than the 3.000 GiB free ...; "
                            "give at most 1.500, or leave it out").about("storage_capacity_gb")
    exc.most = 1.5
    said = explain(_with_rank_share(exc, share))
    assert "give at most 3.000 in all (2 ranks x 1.500), or leave it out" in said
    assert said.endswith("(under several ranks --storage-capacity-gb 4 is the total: this rank's share is 2)")


# -- every end of a run is the same end (item 5) -------------------------------------------------------
MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")


def test_stop_signals_from_results_written_to_the_exit_change_nothing(tmp_path):
    """SIGINT after "Results written" (the run removing its files, the interpreter shutting down) ended 3
    of 7 finished runs with status -2. Here SIGINT comes every few milliseconds from that line to the exit:
    the status is the run's own (0) and its files are gone."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "micro.yaml").write_text(MICRO)
    cmd = [sys.executable, str(root / "kv-cache.py"), "--config", str(tmp_path / "micro.yaml"), "--model", "micro",
           "--num-users", "4", "--duration", "1", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode",
           "none", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "r.json"), "--io-chunk-mb", "1"]
    # Whether a signal lands between that line and the exit is the scheduler's (a loaded host can leave this
    # process off the CPU until the run has gone): a run that got none exercised nothing, so it is run again
    # (at most 4 runs; every run's outcome is checked).
    for _attempt in range(4):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        sent = 0
        try:
            for line in proc.stdout:
                if line.startswith("Results written to"):
                    break
            while proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGINT)
                    sent += 1
                except ProcessLookupError:
                    break
                time.sleep(0.002)
            proc.wait(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0
        assert json.loads((tmp_path / "r.json").read_text())["measurement"]["stop_reason"] == "duration"
        assert not list((tmp_path / "cache").glob("kv-cache-run-*"))
        if sent >= 1:
            break
    assert sent >= 1, "no SIGINT landed between 'Results written' and the exit in 4 runs"


class StallClock(TickingClock):
    """A ticking clock that jumps once by `stall` ns (the process descheduled, a GC pause)."""

    def __init__(self, step: int, stall_at: int, stall: int) -> None:
        super().__init__(step)
        self.stall_at, self.stall, self.stalled = stall_at, stall, False

    def __call__(self) -> int:
        self.t += self.step
        if not self.stalled and self.t >= self.stall_at:
            self.stalled = True
            self.t += self.stall
        return self.t


def test_a_stall_of_the_process_at_a_modest_rate_is_caught_up_not_called_saturation():
    """200 req/s and one 50 ms stall: the ~10 arrivals due in it are offered late (a burst), not counted as
    not offered with a 'generator saturated' note (the 10 ms bound alone dropped 3 of them here)."""
    d = _driver(StallClock(100, S // 10, 50_000_000), duration_s=1.0, request_rate=200.0, admission_limit=10_000)
    out = d.run()
    assert out.arrivals_not_offered == 0 and out.generator_saturations == 0
    assert offered_load(out, 200.0, out.window_s, [])["generator_saturated"] is False


def test_an_in_process_run_that_saw_a_signal_leaves_no_signal_ignored(quick_settings, sink, monkeypatch):
    """A run called in-process (a library, the tests) that was stopped by a signal must not leave the stop
    signals at SIG_IGN: that disposition is inherited by every program the caller starts later, and a
    --processes parent started so took a SIGHUP for nohup's and ran its whole window (the suite's
    test_sigterm_to_the_parent...[SIGHUP] failed after an in-process signal test)."""
    import signal

    from kv_cache.benchmarks.standard import run as app
    from kv_cache.benchmarks.standard.scheduler import Driver

    real = Driver._close_bucket

    def once(self, when):
        if not getattr(once, "sent", False):
            once.sent = True
            signal.raise_signal(signal.SIGINT)
        return real(self, when)

    monkeypatch.setattr(Driver, "_close_bucket", once)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        outcome = app.run_benchmark(quick_settings("--duration", "3"), sink)
        assert outcome.interrupted
        for sig in before:
            assert signal.getsignal(sig) != signal.SIG_IGN
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
