"""RunMetrics: windowing and honest byte accounting."""

from kv_cache.metrics.recorder import RunMetrics, percentiles_ms
from kv_cache.storage.base import IOResult


def res(nbytes, total_ns):
    return IOResult(nbytes, nbytes, total_ns, total_ns, 0)


def test_only_operations_completed_in_window_are_sampled():
    m = RunMetrics()
    m.open_window(1_000)
    assert m.record_io("storage", "write", res(100, 500), 1_600, "prefill")
    m.close_window(2_000)
    # finished after the window but started inside: bytes count, sample and op count do not
    assert not m.record_io("storage", "write", res(50, 600), 2_400, "prefill")
    # started after the window: nothing counts
    assert not m.record_io("storage", "write", res(70, 100), 2_500, "prefill")
    s = m.tier_op("storage", "write")
    assert s.ops == 1 and list(s.total_ns) == [500]
    assert s.bytes == 100 and s.partial_bytes == 50 and s.window_bytes == 150
    assert m.late["storage_write_ops"] == 2


def test_aborted_bytes_count_for_bandwidth_not_latency():
    m = RunMetrics()
    m.open_window(0)
    m.record_aborted("storage", "read", 4096 * 3)
    s = m.tier_op("storage", "read")
    assert s.window_bytes == 4096 * 3 and s.ops == 0 and len(s.total_ns) == 0


def test_window_seconds_is_real_length():
    m = RunMetrics()
    m.open_window(0)
    m.close_window(2_500_000_000)
    assert m.window_seconds == 2.5


def test_percentiles_linear_like_numpy_reference():
    from array import array

    p = percentiles_ms(array("q", [1_000_000, 2_000_000, 3_000_000, 4_000_000]))
    assert p["p50"] == 2.5 and abs(p["p95"] - 3.85) < 1e-9


def test_counters_outside_window_are_ignored():
    m = RunMetrics()
    m.open_window(0)
    m.count("cache_hits", end_ns=10)
    m.close_window(100)
    m.count("cache_hits", end_ns=200)
    assert m.snapshot_counters()["cache_hits"] == 1
