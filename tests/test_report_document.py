"""The results document builder on a hand-made RunRecord: schema version, key set, optional parts."""

import resource
from datetime import datetime
from types import SimpleNamespace

import pytest

from kv_cache.benchmarks.standard.scheduler import DriverOutcome
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.run_document import (
    SCHEMA_VERSION,
    RunRecord,
    build_results,
    interrupted_results,
    results_document,
)
from kv_cache.storage.base import IOResult

TOP_KEYS = {
    "schema_version", "requests_completed", "total_tokens_generated", "total_storage_io_latency",
    "total_generation_latency", "end_to_end_latencies", "storage_latencies", "generation_latencies",
    "throughput_timeline", "prefill_latencies", "decode_latencies", "multi_turn_cache_hits",
    "multi_turn_cache_misses", "seed", "summary", "overall_passed", "total_requests", "avg_latency_ms",
    "p99_latency_ms", "throughput_req_per_sec", "storage_throughput_mbps", "cache_hit_rate", "measurement",
    "integrity", "run_parameters", "stop_reason", "latency_samples", "time_series", "latency_histograms",
    "run_id", "world_size", "recorder", "summary_inputs",  # what a merge of ranks needs (results/merge.py)
}
HARNESS_KEYS = {"overall_passed", "total_requests", "avg_latency_ms", "p99_latency_ms", "throughput_req_per_sec",
                "storage_throughput_mbps", "cache_hit_rate"}
MEASUREMENT_KEYS = {
    "tool", "timed", "device_timer", "run_mode", "io_mode", "direct_io", "chunk_bytes", "fsync", "io_workers", "run_dir",
    "filesystem", "filesystem_kind", "storage_capacity_bytes", "cpu_tier_bytes", "gpu_tier", "storage_gds",
    "window_seconds", "stop_reason",
    "requests_issued", "requests_abandoned_at_stop", "requests_failed", "requests_rejected",
    "offered_request_rate", "final_active_users", "counters", "after_window", "achieved_queue_depth",
    "process_cpu_seconds", "cpu_seconds_per_gib", "peak_rss_mib", "block_device", "entry_size_mib", "errors",
    "errors_by_kind", "first_error", "notes", "storage_errors", "storage_errors_total", "storage_retries_total",
    "storage_error_policy", "verify", "storage_fill", "requests_in_flight_at_stop", "storage_location",
    "requests_finished_after_stop", "censored_latency_ms", "window_wallclock", "process_libraries",
    "window_edge", "process_io", "device_limit",
    "tier_skipped_entries",  # the waterfall's skips per upper tier ({} when none skipped)
}


def metrics(requests: int = 2) -> RunMetrics:
    m = RunMetrics()
    m.open_window(0)
    m.record_io("storage", "write", IOResult(1 << 20, 1 << 20, 2_000_000, 1_500_000, 500_000), 10, "prefill")
    m.count("rag_chunk_hits", 3, end_ns=10)
    for _ in range(requests):
        m.record_request("batch", 10, 5_000_000, 2_000_000, 0, 2_000_000, None, 10, 100)
    m.close_window(1_000_000_000)
    return m


def record(settings, m: RunMetrics, **extra) -> RunRecord:
    outcome = DriverOutcome("duration", 1.0, requests_issued=2, requests_completed=m.requests.completed,
                            requests_abandoned=0, requests_failed=0, timeline=[{"t": 1}])
    store = SimpleNamespace(run_dir="/data/run", fs_type="ext4", io_mode="direct")
    return RunRecord(settings, m, outcome, {"nvme": {"entries": 1, "used_bytes": 1 << 20, "limit_bytes": 1e9}},
                     [1 << 20, 3 << 20], 4, datetime(2026, 1, 2, 3, 4, 5), resource.getrusage(resource.RUSAGE_SELF),
                     ["a note"], file_store=store, **extra)


def test_schema_version_comes_first():
    assert list(results_document({"a": 1, "b": 2})) == ["schema_version", "a", "b"]
    assert SCHEMA_VERSION == "kv-cache-results/1"


def test_standard_document_keys_and_values(quick_settings):
    settings = quick_settings()
    results = build_results(record(settings, metrics()))
    assert next(iter(results)) == "schema_version" and results["schema_version"] == SCHEMA_VERSION
    assert results.keys() == TOP_KEYS  # nothing optional without trace, phases, validation or an I/O trace
    m = results["measurement"]
    assert m.keys() == MEASUREMENT_KEYS
    assert m["io_mode"] == "direct" and m["direct_io"] is True and m["run_dir"] == "/data/run"
    assert m["storage_capacity_bytes"] == 1e9 and m["cpu_tier_bytes"] == 0 and m["io_workers"] == 4
    assert m["block_device"] == {"name": None} and m["notes"] == ["a note"]
    loc = m["storage_location"]  # where the storage was: /data/run does not exist here, its nearest parent does
    assert loc["cache_dir"] == "/data/run" and loc["io_mode"] == "direct" and loc["mount_point"] is not None
    assert m["storage_errors"] == {} and m["storage_errors_total"] == 0 and m["verify"]["enabled"] is False
    fill = m["storage_fill"]  # the record's storage tier never evicted: said so
    assert fill["reached_capacity"] is False and "never reached its capacity" in fill["warning"]
    assert m["entry_size_mib"] == {"count": 2, "min": 1.0, "mean": 2.0, "p95": 2.9, "max": 3.0}
    assert m["run_mode"] == "standard (prefill+decode), closed loop"
    assert results["run_parameters"]["timestamp"] == "2026-01-02T03:04:05"
    assert results["throughput_timeline"] == [{"t": 1}]
    s = results["summary"]
    assert s["total_requests"] == results["total_requests"] == 2
    assert "per_turn" in s and "block_stats" not in s and "rag_stats" not in s
    assert s["autoscaling_summary"] is None


def test_optional_parts(quick_settings):
    settings = quick_settings("--cpu-mem-gb", "0.5")
    autoscaler = SimpleNamespace(history=[{"t_s": 1.0}], summary=lambda: {"mode": "qos"})
    blockdev = SimpleNamespace(name="nvme0n1")
    results = build_results(record(
        settings, metrics(), memory_store=object(), blockdev=blockdev, disk_before=(0, 0),
        disk_after=(4096, 8192), phases={"prepopulation": {"entries": 1, "gib": 0.0, "seconds": 0.1}},
        autoscaler=autoscaler, rag=SimpleNamespace(live=[1, 2]), tracer=SimpleNamespace(path="t.csv", rows=7)))
    s = results["summary"]
    assert s["autoscaling_stats"] == [{"t_s": 1.0}]
    # the shape's own summary, completed to the shape-summary contract (core/autoscale.py SUMMARY_KEYS)
    assert s["autoscaling_summary"] == {"mode": "qos", "initial_users": 4, "final_users": 4, "samples": 1,
                                        "total_scale_events": 0}
    assert s["rag_stats"] == {"documents_retrievable": 2, "chunk_hits": 3, "chunk_misses": 0}
    assert results["phases"]["prepopulation"]["entries"] == 1
    m = results["measurement"]
    assert m["io_trace"] == {"path": "t.csv", "rows": 7}
    assert m["block_device"]["bytes_written"] == 8192 and m["block_device"]["tool_bytes_written"] == 1 << 20
    assert m["cpu_tier_bytes"] == 1 << 29


def test_no_completed_requests_still_has_a_failing_summary(quick_settings):
    results = build_results(record(quick_settings(), metrics(requests=0),
                                   autoscaler=SimpleNamespace(history=[], summary=dict)))
    assert results.keys() == TOP_KEYS and results["schema_version"] == SCHEMA_VERSION
    assert results["overall_passed"] is False and results["total_requests"] == 0
    assert results["stop_reason"] == "duration" and results["summary"]["total_requests"] == 0
    health = results["summary"]["cache_stats"]["storage_health"]
    assert health["overall_status"] == "FAIL"
    assert any(c["name"] == "Requests Completed > 0" and not c["passed"] for c in health["criteria"])


def test_storage_tier_never_exercised_fails_loudly(quick_settings):
    m = RunMetrics()
    m.open_window(0)
    m.record_io("cpu", "write", IOResult(1 << 20, 1 << 20, 2_000_000, 1_500_000, 500_000), 10, "prefill")
    m.record_request("batch", 10, 5_000_000, 2_000_000, 0, 2_000_000, None, 10, 100)
    m.close_window(1_000_000_000)
    results = build_results(record(quick_settings(), m))
    assert results["overall_passed"] is False and results["summary"]["storage_tier_exercised"] is False
    assert any("storage tier never exercised" in n for n in results["measurement"]["notes"])


def test_storage_error_stop_fails(quick_settings):
    rec = record(quick_settings(), metrics())
    rec.outcome.fatal_error = "ENOSPC: [Errno 28] No space left on device"
    results = build_results(rec)
    assert results["overall_passed"] is False
    crit = results["summary"]["cache_stats"]["storage_health"]["criteria"]
    assert any(c["name"] == "Not Stopped By A Storage Error" and "ENOSPC" in c["actual"] for c in crit)


@pytest.mark.parametrize("flags, mode", [
    (("--prefill-only",), "PREFILL-ONLY (writes; no decode reads)"),
    (("--request-rate", "5"), "open loop, Poisson arrivals at 5 req/s"),
])
def test_run_mode_in_measurement(quick_settings, flags, mode):
    results = build_results(record(quick_settings(*flags), metrics()))
    assert mode in results["measurement"]["run_mode"]


def test_interrupted_before_the_window():
    assert interrupted_results({"preconditioning": {"skipped": "x"}}) == {
        "schema_version": SCHEMA_VERSION, "interrupted": True,
        "stop_reason": "interrupted before the measured phase", "phases": {"preconditioning": {"skipped": "x"}}}


def test_interrupted_before_the_window_has_the_same_shape(quick_settings):
    results = interrupted_results({"preconditioning": {"entries": 3}}, quick_settings())
    assert HARNESS_KEYS <= results.keys() and {"summary", "stop_reason", "measurement", "run_parameters"} <= results.keys()
    assert results["overall_passed"] is False and results["stop_reason"] == "interrupted before the measured phase"
    assert results["summary"]["cache_stats"]["storage_health"]["overall_status"] == "FAIL"
    assert results["phases"] == {"preconditioning": {"entries": 3}}


def test_interrupted_report_prints_its_verdict_without_setup_noise(quick_settings):
    from kv_cache.render.console import report_lines

    lines = report_lines(interrupted_results({}, quick_settings()))
    assert "### STORAGE PERFORMANCE ASSESSMENT: FAIL [X] ###" in lines
    assert "  Stop reason: interrupted before the measured phase" in lines
    assert not any("None" in line for line in lines)
