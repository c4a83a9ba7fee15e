"""End-to-end runs on a temp directory: JSON schema, file ownership, reproducibility, honest windows."""

import json
import os

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli.exits import exit_status
from kv_cache.results.run_document import SCHEMA_VERSION
from kv_cache.workload.users import SyntheticUser, generate_profiles

# Reference keys (spec 12.1, 9.3, 7.9) that must be present with these names.
TOP_KEYS = {
    "requests_completed", "total_tokens_generated", "total_storage_io_latency", "total_generation_latency",
    "end_to_end_latencies", "storage_latencies", "generation_latencies", "throughput_timeline",
    "prefill_latencies", "decode_latencies", "multi_turn_cache_hits", "multi_turn_cache_misses", "seed", "summary",
    "schema_version",
}
HARNESS_KEYS = {"overall_passed", "total_requests", "avg_latency_ms", "p99_latency_ms", "throughput_req_per_sec",
                "storage_throughput_mbps", "cache_hit_rate"}
SUMMARY_KEYS = {
    "total_requests", "total_tokens", "elapsed_time", "avg_throughput_tokens_per_sec", "total_storage_io_time",
    "storage_throughput_tokens_per_sec", "requests_per_second", "end_to_end_latency_ms", "storage_io_latency_ms",
    "generation_latency_ms", "cache_stats", "qos_metrics", "prefix_cache_stats", "autoscaling_stats",
    "autoscaling_summary", "multi_turn_stats",
}
CACHE_STATS_KEYS = {
    "cache_hit_rate", "cache_hits", "cache_misses", "gpu_entries", "cpu_entries", "storage_entries",
    "gpu_memory_used_gb", "cpu_memory_used_gb", "offloads_cpu", "offloads_storage", "storage_health",
    "prefill_writes", "decode_reads", "tier_gpu_kv_bytes_written_gb", "tier_cpu_kv_bytes_written_gb",
    "tier_storage_kv_bytes_written_gb", "tier_gpu_kv_bytes_read_gb", "tier_cpu_kv_bytes_read_gb",
    "tier_storage_kv_bytes_read_gb", "tier_gpu_read_bandwidth_gbps", "tier_gpu_write_bandwidth_gbps",
    "tier_cpu_read_bandwidth_gbps", "tier_cpu_write_bandwidth_gbps", "tier_storage_read_bandwidth_gbps",
    "tier_storage_write_bandwidth_gbps", "system_prompt_hits", "common_phrase_hits", "user_cache_hits",
    "multi_turn_hits", "total_read_bytes", "total_write_bytes", "total_read_gb", "total_write_gb",
    "read_write_ratio", "read_iops", "write_iops", "storage_tokens_processed",
}
LATENCY_KEYS = {"mean", "p50", "p95", "p99", "p999", "p9999"}


@pytest.mark.slow  # a real run (wall clock)
def test_result_json_has_reference_structure(quick_settings, sink, tmp_path):
    settings = quick_settings()
    results, code = execute(settings, sink)
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk.keys() == results.keys()
    assert TOP_KEYS <= on_disk.keys() and HARNESS_KEYS <= on_disk.keys()
    assert next(iter(on_disk)) == "schema_version" and on_disk["schema_version"] == SCHEMA_VERSION
    s = on_disk["summary"]
    assert SUMMARY_KEYS <= s.keys()
    for block in ("end_to_end_latency_ms", "storage_io_latency_ms", "generation_latency_ms"):
        assert s[block].keys() == LATENCY_KEYS
    cs = s["cache_stats"]
    assert CACHE_STATS_KEYS <= cs.keys()
    for op in ("read", "write"):
        for p in ("p50", "p95", "p99", "p999", "p9999"):
            assert f"storage_{op}_{p}_ms" in cs
            assert f"storage_{op}_device_{p}_ms" in cs and f"storage_{op}_host_{p}_ms" in cs
    assert set(s["qos_metrics"]) == {"interactive", "responsive", "batch"}
    assert {"overall_status", "criteria", "passed_count", "total_count"} <= cs["storage_health"].keys()
    m = on_disk["measurement"]
    from kv_cache.storage import FileStore

    probe = FileStore(tmp_path / "probe", m["chunk_bytes"])  # auto mode: what this filesystem allows
    expected_mode = probe.io_mode
    probe.close()
    assert m["io_mode"] == expected_mode and m["direct_io"] is (expected_mode == "direct")
    assert m["fsync"] is True and m["chunk_bytes"] == 1 << 20
    # honest rates: bytes in the window divided by the window's real length, which a run stopped by its
    # duration takes from its deadline (start + --duration), not from when the workers noticed
    assert m["stop_reason"] == "duration" and abs(m["window_seconds"] - settings.driver.duration) < 1e-6
    assert abs(s["requests_per_second"] - s["total_requests"] / m["window_seconds"]) < 1e-9
    expected = cs["tier_storage_kv_bytes_read_gb"] / m["window_seconds"]
    assert abs(cs["tier_storage_read_bandwidth_gbps"] - expected) < 1e-9
    assert on_disk["total_requests"] == s["total_requests"] == on_disk["requests_completed"]
    assert len(on_disk["end_to_end_latencies"]) == s["total_requests"]
    assert exit_status(code) == 0 and on_disk["overall_passed"] == code.passed


@pytest.mark.slow  # a real run (wall clock)
def test_run_removes_only_its_own_files(quick_settings, sink, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    foreign = cache / "precious.npy"  # the reference deleted every *.npy in --cache-dir
    foreign.write_bytes(b"keep me")
    execute(quick_settings(), sink)
    assert foreign.read_bytes() == b"keep me"
    assert sorted(os.listdir(cache)) == ["precious.npy"]


@pytest.mark.slow  # a real run (wall clock)
def test_files_removed_and_results_written_when_storage_fails(quick_settings, sink, tmp_path, monkeypatch):
    from kv_cache.storage import files

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "foreign.txt").write_text("x")
    real_write = files.FileStore.write
    calls = {"n": 0}

    def failing_write(self, key, nbytes, bufs, stop=None):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(28, "No space left on device")
        return real_write(self, key, nbytes, bufs, stop)

    monkeypatch.setattr(files.FileStore, "write", failing_write)
    results, code = execute(quick_settings(), sink)
    assert exit_status(code) == 3
    assert results["measurement"]["stop_reason"] == "storage error"
    assert "No space left" in results["measurement"]["first_error"]
    assert (tmp_path / "r.json").exists()
    assert sorted(os.listdir(cache)) == ["foreign.txt"]


@pytest.mark.slow  # a real run (wall clock)
def test_same_seed_same_per_user_operation_sequences(quick_settings, sink, tmp_path):
    runs = []
    for i in range(2):
        settings = quick_settings("--max-requests", "200", "--duration", "60", "--cpu-mem-gb", "0.05", "--num-users", "20",
                                  output=str(tmp_path / f"r{i}.json"))
        results, _ = execute(settings, sink, record_plans=True)
        runs.append((results, settings))
    plans = [r[0]["_plans"] for r in runs]
    assert runs[0][0]["measurement"]["stop_reason"] == "max_requests"
    assert runs[0][0]["requests_completed"] == 200
    assert plans[0].keys() == plans[1].keys()
    compared = 0
    for user in plans[0]:
        a, b = plans[0][user], plans[1][user]
        n = min(len(a), len(b))
        assert n > 0 and a[:n] == b[:n]
        compared += n
    # every one of the 20 users compared at least its first operations (how the 200 requests split between
    # users depends on scheduling, so the total compared is not asserted beyond that)
    assert len(plans[0]) == 20 and compared >= 20


def test_user_plans_do_not_depend_on_timing_or_other_users(quick_settings):
    settings = quick_settings()
    cfg = settings.config

    def sequence(num_users):
        users = [SyntheticUser(p, 42, None, 0.2, (), 0.0) for p in generate_profiles(num_users, cfg, 42)]
        return [(u.think_time(), u.next_request()) for u in users[:3] for _ in range(20)]

    a, b = sequence(3), sequence(50)
    assert [(t, r.cache_key, r.context_tokens, r.generate_tokens) for t, r in a] == \
           [(t, r.cache_key, r.context_tokens, r.generate_tokens) for t, r in b]


@pytest.mark.slow  # a real run (wall clock)
def test_cpu_tier_demotions_show_in_storage_tier(quick_settings, sink):
    # a count of requests, not a 3 s window: at a load of 39 a 3 s window completed 3 requests, too few to
    # fill the 20 MiB RAM tier (--max-requests ends the run at 40, --duration only bounds it)
    results, _ = execute(quick_settings("--cpu-mem-gb", "0.02", "--duration", "60", "--max-requests", "40"), sink)
    cs = results["summary"]["cache_stats"]
    assert results["requests_completed"] >= 40
    assert cs["offloads_storage"] > 0
    assert cs["tier_storage_demotion_write_gb"] > 0
    assert cs["tier_storage_kv_bytes_written_gb"] >= cs["tier_storage_demotion_write_gb"]
    assert "storage_write_p95_ms" in cs


@pytest.mark.slow  # a real run (wall clock)
def test_buffered_mode_is_reported(quick_settings, sink):
    results, _ = execute(quick_settings("--io-mode", "buffered"), sink)
    assert results["measurement"]["io_mode"] == "buffered"
    assert results["measurement"]["direct_io"] is False


@pytest.mark.slow  # a real run (wall clock)
def test_malloc_trims_are_reported(quick_settings, sink):
    """--malloc-trim-interval 1 over a 3 s window: the run trims at its ticks and says so (glibc), or says
    why it changed nothing (another malloc)."""
    results, _ = execute(quick_settings("--duration", "3", "--malloc-trim-interval", "1"), sink)
    rec = results["measurement"]["malloc"]
    if rec["allocator"] is None:
        assert rec["note"]
        return
    assert rec["trims"] >= 1 and rec["trim_interval_s"] == 1.0 and rec["trim_returned_bytes"] >= 0
    assert rec["trim_seconds_max"] <= rec["trim_seconds_total"]
