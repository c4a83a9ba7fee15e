"""Time-series bucketing and the bounded-memory histograms (merge = histogram of the union)."""

import random

import numpy as np

from kv_cache.metrics import histograms as H
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.metrics.timeseries import Bucket, bucket_row
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.storage.base import IOResult

MS = 1_000_000


def io(nbytes: int, total_ns: int) -> IOResult:
    return IOResult(nbytes=nbytes, total_ns=total_ns, device_ns=total_ns // 2, host_ns=total_ns // 2,
                    device_bytes=nbytes)


def test_bucket_row_sums_per_tier_and_direction():
    b = Bucket()
    for ms in (1, 2, 3, 4):
        b.add_io("storage", "read", 1 << 20, ms * MS)
    b.add_io("cpu", "write", 512, 5 * MS)
    b.requests = 2
    row = bucket_row(3.0, 0.5, b, {"active_users": 4})
    assert row["storage_read_ops"] == 4 and row["storage_read_bytes"] == 4 << 20
    assert row["storage_read_gibps"] == (4 << 20) / (1 << 30) / 0.5
    assert abs(row["storage_read_p50_ms"] - 2.0) < 0.01 and abs(row["storage_read_p99_ms"] - 4.0) < 0.01
    assert row["cpu_write_ops"] == 1 and "storage_write_ops" not in row
    assert row["requests"] == 2 and row["active_users"] == 4 and row["t_s"] == 3.0


def test_recorder_buckets_operations_by_the_tick_that_closes_them():
    m = RunMetrics()
    m.open_window(0)
    m.record_io("storage", "write", io(100, 2 * MS), end_ns=500 * MS, cause="prefill")
    m.record_io("storage", "write", io(50, 4 * MS), end_ns=900 * MS, cause="prefill")
    first = m.close_bucket(1000 * MS, {"queue_depth": 1})
    m.record_io("storage", "read", io(70, 1 * MS), end_ns=1500 * MS, cause="decode")
    m.record_request("interactive", 1600 * MS, 9 * MS, 1 * MS, 0, None, None, 1, 10)
    second = m.close_bucket(2000 * MS, {"queue_depth": 0})
    empty = m.close_bucket(3000 * MS)
    assert (first["storage_write_ops"], first["storage_write_bytes"], first["requests"]) == (2, 150, 0)
    assert "storage_read_ops" not in first
    assert (second["storage_read_bytes"], second["requests"], "storage_write_ops" in second) == (70, 1, False)
    assert empty == {"t_s": 3.0, "seconds": 1.0, "requests": 0}
    doc = time_series(m)
    assert doc["bucket_seconds"] == 1.0 and [r["t_s"] for r in doc["rows"]] == [1.0, 2.0, 3.0]
    # the bucket totals add up to the window's totals
    assert sum(r.get("storage_write_bytes", 0) for r in doc["rows"]) == m.tier_op("storage", "write").bytes


def test_window_histograms_are_in_the_document_and_decode():
    m = RunMetrics()
    m.open_window(0)
    for ms in range(1, 101):
        m.record_io("storage", "read", io(1, ms * MS), end_ns=ms * MS, cause="decode")
    hist = latency_histograms(m)
    assert set(hist) == {"storage_read_total", "storage_read_device", "storage_read_host"}
    assert hist["storage_read_total"]["count"] == 100
    assert abs(hist["storage_read_total"]["p95"] - 95.0) < 0.1
    assert H.decode(hist["storage_read_total"]["hdr"]).get_total_count() == 100


def test_merge_is_the_histogram_of_the_union_within_precision():
    rng = random.Random(7)
    parts = [[rng.randint(10_000, 5 * 10**9) for _ in range(2000)] for _ in range(3)]
    union = [v for p in parts for v in p]
    merged = H.merge(H.from_values(p) for p in parts)
    direct = H.from_values(union)
    assert merged.get_total_count() == len(union)
    for q in (1, 25, 50, 90, 95, 99, 99.9):
        exact = float(np.percentile(union, q, method="inverted_cdf"))
        assert merged.get_value_at_percentile(q) == direct.get_value_at_percentile(q)
        assert abs(merged.get_value_at_percentile(q) - exact) <= exact * 10 ** -H.SIGNIFICANT_DIGITS
    # and through the encoded form (what ranks exchange and results hold)
    text = H.merge_encoded(H.encode(H.from_values(p)) for p in parts)
    assert H.decode(text).get_value_at_percentile(95) == direct.get_value_at_percentile(95)


def test_memory_is_bounded_whatever_the_count():
    h = H.new_histogram()
    size = len(h.counts)
    for v in range(0, 10**9, 10**4):
        H.record(h, v)
    H.record(h, 10**15)  # beyond the range: clamped, never dropped
    assert len(h.counts) == size and h.get_total_count() == 10**5 + 1
    assert h.get_max_value() <= H.HIGHEST_NS * 1.001


def test_cdf_points_end_at_one():
    xs, ys = H.cdf_points(H.from_values([MS, 2 * MS, 2 * MS, 4 * MS]))
    assert ys[-1] == 1.0 and xs == sorted(xs) and abs(ys[0] - 0.25) < 1e-9
    assert H.cdf_points(H.new_histogram()) == ([], [])
