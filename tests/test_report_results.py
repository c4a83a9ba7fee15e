"""build_summary and friends on a RunMetrics filled by hand: no I/O, no clock, every figure checkable."""

import numpy as np
import pytest

from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.results.summary import block_stats, build_summary, harness_keys, per_turn_stats, request_lists
from kv_cache.settings.schema import BenchConfig
from kv_cache.storage.base import IOResult

MIB = 1 << 20
MS = 1_000_000  # ns
SUMMARY_KEYS = {
    "total_requests", "total_tokens", "elapsed_time", "avg_throughput_tokens_per_sec", "total_storage_io_time",
    "storage_throughput_tokens_per_sec", "requests_per_second", "end_to_end_latency_ms", "storage_io_latency_ms",
    "generation_latency_ms", "cache_stats", "qos_metrics", "prefix_cache_stats", "autoscaling_stats",
    "autoscaling_summary", "multi_turn_stats",
}


def io(nbytes: int, device_ms: float, host_ms: float) -> IOResult:
    device, host = int(device_ms * MS), int(host_ms * MS)
    return IOResult(nbytes, nbytes, device + host, device, host)


@pytest.fixture
def metrics() -> RunMetrics:
    """A 2-second window: 2 prefill writes, 2 decode reads, 1 demotion, 4 requests, a few counters."""
    m = RunMetrics()
    m.open_window(0)
    t = MS  # every event ends inside the window
    m.record_io("storage", "write", io(1 * MIB, 3, 1), t, "prefill")
    m.record_io("storage", "write", io(2 * MIB, 6, 2), t, "prefill")
    m.record_io("storage", "read", io(4 * MIB, 1, 1), t, "decode")
    m.record_io("storage", "read", io(4 * MIB, 5, 1), t, "decode")
    m.record_io("cpu", "read", io(1 * MIB, 0.5, 0.5), t, "demotion")
    for name, n in (("cache_hits", 3), ("cache_misses", 1), ("multi_turn_cache_hits", 1),
                    ("multi_turn_cache_misses", 1), ("prefix_hits", 2), ("prefix_misses", 1),
                    ("prefix_bytes_saved", 1024), ("block_hits", 3), ("block_stores", 1), ("block_hits_storage", 2),
                    ("block_bytes_reused", 4096)):
        m.count(name, n, end_ns=t)
    for i, level in enumerate(("interactive", "interactive", "batch", "batch"), start=1):
        m.record_request(level, t, e2e_ns=10 * i * MS, storage_ns=i * MS, generation_ns=5 * MS,
                         prefill_ns=i * MS, decode_ns=None, generate_tokens=100, context_tokens=1000 * i,
                         turn=1 + i % 2, read_bytes=2 * MIB, written_bytes=MIB)
    m.close_window(2_000_000_000)
    return m


def summarize(m: RunMetrics, profile: str = "latency", error_rate: float = 0.0) -> dict:
    cfg = BenchConfig()
    return build_summary(m, {"nvme": {"entries": 3, "used_bytes": 3 * MIB, "limit_bytes": float("inf")}},
                         cfg.qos_profiles, profile, cfg.performance_criteria, error_rate)


def test_rates_and_latencies(metrics):
    s = summarize(metrics)
    assert SUMMARY_KEYS <= s.keys()
    assert s["total_requests"] == 4 and s["total_tokens"] == 400
    assert s["elapsed_time"] == 2.0
    assert s["avg_throughput_tokens_per_sec"] == 200.0 and s["requests_per_second"] == 2.0
    assert s["total_storage_io_time"] == pytest.approx(0.010)
    assert s["storage_throughput_tokens_per_sec"] == pytest.approx(400 / 0.010)  # tokens / summed storage time
    e2e = s["end_to_end_latency_ms"]
    assert e2e.keys() == {"mean", "p50", "p95", "p99", "p999", "p9999"}
    assert e2e["mean"] == 25.0 and e2e["p50"] == 25.0
    assert e2e["p95"] == pytest.approx(float(np.percentile([10, 20, 30, 40], 95)))  # linear, as numpy
    assert s["generation_latency_ms"]["p99"] == 5.0


def test_cache_stats(metrics):
    cs = summarize(metrics)["cache_stats"]
    assert cs["cache_hits"] == 3 and cs["cache_misses"] == 1 and cs["cache_hit_rate"] == 0.75
    assert cs["storage_entries"] == 3 and cs["storage_memory_used_gb"] == 3 * MIB / GIB
    assert cs["prefill_writes"] == 2 and cs["decode_reads"] == 2
    # request-level traffic leaves the demotion out; the tier figures keep it
    assert cs["total_read_bytes"] == 8 * MIB and cs["total_write_bytes"] == 3 * MIB
    assert cs["read_write_ratio"] == pytest.approx(8 / 3)
    assert cs["read_iops"] == 2 and cs["write_iops"] == 2  # counts, as the reference
    assert cs["read_ops_per_sec"] == 1.0 and cs["write_ops_per_sec"] == 1.0
    assert cs["tier_storage_read_bandwidth_gbps"] == pytest.approx(8 * MIB / GIB / 2)
    assert cs["tier_cpu_kv_bytes_read_gb"] == MIB / GIB and cs["tier_cpu_demotion_read_gb"] == MIB / GIB
    assert cs["tier_cpu_demotion_read_ops"] == 1 and cs["tier_storage_demotion_read_ops"] == 0
    assert cs["storage_write_device_p50_ms"] == 4.5 and cs["storage_write_host_p50_ms"] == 1.5
    assert cs["storage_read_p50_ms"] == 4.0
    assert "gpu_read_p50_ms" not in cs  # no samples, no percentile


def test_hit_rates_and_qos(metrics):
    s = summarize(metrics)
    assert s["multi_turn_stats"] == {"cache_hits": 1, "cache_misses": 1, "hit_rate": 0.5}
    assert s["prefix_cache_stats"]["prefix_hits"] == 2 and s["prefix_cache_stats"]["bytes_saved"] == 1024
    q = s["qos_metrics"]
    assert q["responsive"] == {"no_data": True}
    assert q["interactive"]["total_requests"] == 2 and q["interactive"]["latency_ms"]["max"] == 20.0
    assert q["batch"]["latency_ms"]["p50"] == 35.0 and q["batch"]["sla"]["met"] is True


def test_storage_health_by_profile(metrics):
    latency = summarize(metrics)["cache_stats"]["storage_health"]
    names = [c["name"] for c in latency["criteria"]]
    assert names == ["Storage Tier Write Device P95 < 500ms", "Storage Tier Read Device P95 < 200ms",
                     "CPU RAM P95 < 150ms", "Cache Hit Rate > 30%", "Requests Completed > 0",
                     "Failed Requests <= 0%", "Not Stopped By A Storage Error"]
    assert latency["overall_status"] == "PASS" and latency["passed_count"] == 7
    throughput = summarize(metrics, "throughput", error_rate=0.25)["cache_stats"]["storage_health"]
    # 4 MiB/s < 0.1 GiB/s floor in both directions; 25 % failed requests > 0 %
    assert [c["passed"] for c in throughput["criteria"]] == [False, False, True, False, True]
    assert throughput["overall_status"] == "FAIL" and throughput["criteria"][3]["actual"] == 0.25


def test_harness_keys(metrics):
    s = summarize(metrics)
    h = harness_keys(s)
    assert h["overall_passed"] is True and h["total_requests"] == 4 and h["cache_hit_rate"] == 0.75
    assert h["avg_latency_ms"] == 25.0
    assert h["storage_throughput_mbps"] == pytest.approx(11 * MIB / 2 / 1e6)
    assert harness_keys(None) == {"overall_passed": False, "total_requests": 0, "avg_latency_ms": 0.0,
                                  "p99_latency_ms": 0.0, "throughput_req_per_sec": 0.0,
                                  "storage_throughput_mbps": 0.0, "cache_hit_rate": 0.0}


def test_request_lists_in_seconds(metrics):
    r = request_lists(metrics)
    assert r["requests_completed"] == 4 and r["total_tokens_generated"] == 400
    assert r["end_to_end_latencies"].tolist() == [0.01, 0.02, 0.03, 0.04]
    assert r["decode_latencies"].tolist() == [] and len(r["prefill_latencies"]) == 4
    assert r["multi_turn_cache_hits"] == 1 and r["throughput_timeline"] == []


def test_per_turn_and_block_stats(metrics):
    turns = per_turn_stats(metrics)
    assert [t["turn"] for t in turns] == [1, 2]
    assert turns[0] == {"turn": 1, "requests": 2, "mean_context_tokens": 3000.0,
                        "mean_bytes_read": 2 * MIB, "mean_bytes_written": MIB}
    b = block_stats(metrics, 16)
    assert b["blocks"] == 4 and b["loads"] == 3 and b["block_hit_rate"] == 0.75
    assert b["hit_rate_by_tier"] == {"gpu": 0.0, "cpu": 0.0, "storage": 0.5}
    assert b["bytes_saved_by_reuse"] == 4096


def test_empty_window():
    m = RunMetrics()
    m.open_window(0)
    m.close_window(1_000_000_000)
    s = summarize(m)
    assert s["total_requests"] == 0 and s["storage_throughput_tokens_per_sec"] == 0.0
    assert s["end_to_end_latency_ms"]["p99"] == 0.0 and s["cache_stats"]["cache_hit_rate"] == 0.0
    assert block_stats(m, 16)["block_hit_rate"] == 0.0 and per_turn_stats(m) == []
