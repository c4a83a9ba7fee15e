"""The autoscaler's decisions, fed sequences of interval samples (no run, no clock)."""

from __future__ import annotations

from types import SimpleNamespace

from kv_cache.core.autoscale import Autoscaler, IntervalSample

SCALER = SimpleNamespace(interval_seconds=0.5, min_users=1, max_users=64, scale_up_factor=1.5,
                         scale_down_factor=0.5, consecutive_samples_required=2)
SAT = SimpleNamespace(history_window_size=1, queue_depth_threshold=10, read_latency_p95_threshold_ms=10.0,
                      write_latency_p95_threshold_ms=10.0)


def sample(tokens: float = 0.0, queued: int = 0, read_ms: float | None = None, users: int = 0) -> IntervalSample:
    return IntervalSample(t_s=0.0, users=users, tokens_per_sec=tokens, requests_per_sec=0.0, storage_read_gbps=0.0,
                          storage_write_gbps=0.0, read_p95_ms=read_ms, write_p95_ms=None, queued_requests=queued)


def decisions(scaler: Autoscaler, samples: list[IntervalSample]) -> list[int | None]:
    return [scaler.tick(s) for s in samples]


def test_saturation_is_the_worst_of_latency_and_backlog():
    a = Autoscaler("qos", 0.8, SCALER, SAT, 4)
    assert a.saturation(sample(queued=5, read_ms=20.0)) == 2.0
    assert a.saturation(sample(queued=5)) == 0.5


def test_qos_scales_up_below_target_and_down_after_consecutive_overloads():
    a = Autoscaler("qos", 1.0, SCALER, SAT, 4)
    calm, hot = sample(queued=1), sample(queued=50)
    assert decisions(a, [calm, calm]) == [6, 9]
    assert decisions(a, [hot]) == [9]  # one overloaded sample is not enough
    assert decisions(a, [hot]) == [4]  # the second in a row: scale down
    assert decisions(a, [sample(queued=10)]) == [4]  # within +-10 % of the target: hold
    assert [h["action"] for h in a.history] == ["scale_up", "scale_up", "hold", "scale_down", "hold"]


def test_qos_respects_the_user_bounds():
    a = Autoscaler("qos", 1.0, SimpleNamespace(**{**vars(SCALER), "max_users": 5}), SAT, 4)
    assert decisions(a, [sample(), sample()]) == [5, 5]
    b = Autoscaler("qos", 1.0, SimpleNamespace(**{**vars(SCALER), "consecutive_samples_required": 1}), SAT, 1)
    assert decisions(b, [sample(queued=100)]) == [1]


def test_capacity_holds_until_the_first_completions_then_climbs_and_stops_at_the_peak():
    a = Autoscaler("capacity", 0.8, SCALER, SAT, 2)
    assert decisions(a, [sample(tokens=0.0)]) == [2]  # nothing completed yet: no evidence
    assert decisions(a, [sample(tokens=100.0), sample(tokens=150.0)]) == [3, 4]
    assert decisions(a, [sample(tokens=149.0)]) == [4]  # no gain: first strike
    assert decisions(a, [sample(tokens=150.5)]) == [None]  # within 1 % of the peak: stop
    summary = a.summary()
    assert summary["peak_found"] and summary["peak_user_count"] == 3
    assert summary["peak_throughput_tokens_per_sec"] == 150.0


def test_summary_counts_scale_events():
    a = Autoscaler("qos", 1.0, SCALER, SAT, 4)
    decisions(a, [sample(), sample(queued=10)])
    s = a.summary()
    assert s["total_scale_events"] == 1 and s["final_users"] == 6 and s["samples"] == 2
    assert s["max_users_within_target"] == 0  # the samples' own user counts (0 in these fakes)
