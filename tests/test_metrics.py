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


def test_latency_helpers_in_ms_and_empty_cases():
    from array import array

    from kv_cache.metrics.recorder import mean_ms

    ns = array("q", [1_000_000, 2_000_000, 6_000_000])
    assert mean_ms(ns) == 3.0 and mean_ms(array("q")) == 0.0
    assert percentiles_ms(array("q")) == {}
    assert percentiles_ms([2_000_000, 4_000_000], {"median": 50.0}) == {"median": 3.0}
    assert list(percentiles_ms(ns)) == ["p50", "p95", "p99", "p999", "p9999"]


def test_p95_since_a_mark_sees_only_later_operations():
    m = RunMetrics()
    m.open_window(0)
    for i, ns in enumerate((9_000_000, 1_000_000, 2_000_000)):
        m.record_io("storage", "read", res(10, ns), 10 + i, "decode")
    assert m.p95_ms_since("storage", "read", 1) == 1.95
    assert m.p95_ms_since("storage", "read", 3) is None
    assert m.p95_ms_since("cpu", "read", 0) is None


def test_counter_names_are_the_results_keys():
    # the names are JSON keys of measurement.counters: pinned, whatever the constants are called
    from kv_cache.metrics import names

    constants = {k: v for k, v in vars(names).items() if k.isupper()}
    assert all(v == k.lower() for k, v in constants.items())
    assert set(constants.values()) == {
        "cache_hits", "cache_misses", "system_prompt_hits", "common_phrase_hits", "multi_turn_hits",
        "user_cache_hits", "evictions", "offloads_cpu", "offloads_storage", "storage_tokens_processed",
        "block_stores", "block_hits", "block_bytes_reused", "prefix_hits", "prefix_misses", "prefix_bytes_saved",
        "multi_turn_cache_hits", "multi_turn_cache_misses", "rag_chunk_hits", "rag_chunk_misses",
        "requests_rejected",
    }
    assert names.tier_deletions("storage") == "storage_deletions"
    assert names.block_hits_in("cpu") == "block_hits_cpu"
    m = RunMetrics()
    m.open_window(0)
    m.count(names.PREFIX_BYTES_SAVED, 4096, end_ns=5)
    m.count(names.PREFIX_BYTES_SAVED, 4096, end_ns=6)
    assert m.snapshot_counters() == {"prefix_bytes_saved": 8192}


def test_a_dropped_recorder_snapshot_and_histograms_are_freed_without_the_cyclic_collector():
    """No reference cycle holds a snapshot (a periodic document's, every 10 s) or a histogram: with the
    cyclic collector off, each is freed when its last reference goes. Before, RunMetrics.io's defaultdict
    held the recorder through a bound method and hdrh's encoder held its histogram: a soak's snapshots
    waited for a full collection, RSS +450 MiB in 15 min."""
    import gc  # noqa: PLC0415
    import weakref  # noqa: PLC0415

    from kv_cache.metrics import histograms  # noqa: PLC0415

    m = RunMetrics()
    m.open_window(0)
    for i in range(50):
        m.record_io("storage", "write", res(4096, 1_000 + i), 2_000 + i, "prefill")
        m.record_io("cpu", "read", res(4096, 500 + i), 2_000 + i, "decode")
        m.record_request("interactive", 3_000 + i, 900, 500, 0, 300, 200, 4, 64)
    was = gc.isenabled()
    gc.disable()
    try:
        snap = m.snapshot(at_ns=10_000)
        h = snap.tier_op("storage", "write").total_ns.hist or histograms.merge([histograms.new_histogram()])
        decoded = histograms.decode(histograms.encode(histograms.from_values([1_000, 2_000])))
        refs = [weakref.ref(o) for o in (snap, h, decoded, snap.io[("storage", "write")], histograms.merge([decoded]))]
        del snap, h, decoded
        assert [r() is None for r in refs] == [True] * len(refs)
        fresh = RunMetrics()  # (a new recorder too: its own io factory does not hold it)
        ref = weakref.ref(fresh)
        fresh.tier_op("gpu", "read")
        del fresh
        assert ref() is None
    finally:
        if was:
            gc.enable()
