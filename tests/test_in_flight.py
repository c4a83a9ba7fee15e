"""Requests in flight at the stop are drained from the completion queue, counted, and their latencies
reported as censored (lower bounds), apart from the percentiles."""

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.core.events import EventLoop


def test_remove_takes_only_the_events_of_that_kind():
    loop = EventLoop(clock=lambda: 0)
    for when, kind in ((5, "complete"), (1, "monitor"), (3, "complete"), (2, "wake")):
        loop.push(when, kind, when)
    assert sorted(loop.remove("complete")) == [3, 5]
    assert loop.pop_due(10, 10) == (1, "monitor", 1) and loop.pop_due(10, 10) == (2, "wake", 2)
    assert loop.pop_due(10, 10) is None


@pytest.mark.slow  # a real run (wall clock)
def test_every_issued_request_is_accounted_for(quick_settings, sink):
    # realistic generation: at the stop, requests are both on workers and in modelled generation
    results, _ = execute(quick_settings("--generation-mode", "realistic", "--num-users", "8"), sink)
    m = results["measurement"]
    assert m["requests_in_flight_at_stop"] > 0
    accounted = (results["requests_completed"] + m["requests_abandoned_at_stop"] + m["requests_failed"]
                 + m["requests_finished_after_stop"])
    assert m["requests_issued"] == accounted
    cens = m["censored_latency_ms"]
    assert cens["count"] == m["requests_in_flight_at_stop"] and cens["max"] >= cens["min"] >= 0
    assert "kept out of the latency percentiles" in cens["note"]
    assert "In flight at the stop" in sink.getvalue()
