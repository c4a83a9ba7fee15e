"""Every run mode of the reference does what the seed README says (issue 4)."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli import parse_settings
from kv_cache.cli.exits import exit_status
from kv_cache.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def with_config(tmp_path, quick_settings):
    """quick_settings plus extra config sections appended to the micro-model config."""

    def make(extra_yaml: str, *argv: str, **kw):
        quick_settings()  # writes micro.yaml
        cfg = tmp_path / "micro.yaml"
        cfg.write_text(cfg.read_text() + extra_yaml)
        return quick_settings(*argv, **kw)

    return make


def trace_rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_open_loop_counts_rejected_arrivals(with_config, sink):
    settings = with_config("driver:\n  admission_queue_limit: 1\n", "--request-rate", "200", "--io-workers", "1",
                           "--duration", "2")
    results, _ = execute(settings, sink)
    m = results["measurement"]
    # the rate asked, and the rate really offered (admitted or rejected arrivals over the window)
    assert m["requested_request_rate"] == 200 and m["generator_saturated"] is False
    assert m["offered_request_rate"] == (m["requests_issued"] + m["requests_rejected"]) / m["window_seconds"]
    assert m["requests_rejected"] > 0  # the queue was full: counted, not silently dropped
    # Poisson at 200/s for 2 s: every arrival is either admitted or rejected
    assert 250 < m["requests_issued"] + m["requests_rejected"] < 560
    assert "open loop" in m["run_mode"]


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_open_loop_offers_load_independent_of_completions(quick_settings, sink):
    results, _ = execute(quick_settings("--request-rate", "30", "--duration", "2", "--num-users", "2"), sink)
    # closed loop with 2 users and think time >= 0.1 s could never issue ~60 requests in 2 s
    assert results["measurement"]["requests_issued"] + results["measurement"]["requests_rejected"] > 30


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["capacity", "qos"])
@pytest.mark.slow  # a real run (wall clock)
def test_autoscaler_really_changes_active_users(with_config, sink, mode):
    settings = with_config("autoscaler:\n  interval_seconds: 0.5\n  consecutive_samples_required: 50\n"
                           "saturation_detection:\n  read_latency_p95_threshold_ms: 100000\n"
                           "  write_latency_p95_threshold_ms: 100000\n  queue_depth_threshold: 100000\n",
                           "--enable-autoscaling", "--autoscaler-mode", mode, "--duration", "3",
                           "--num-users", "2", "--io-workers", "2")
    results, _ = execute(settings, sink)
    s = results["summary"]
    history = s["autoscaling_stats"]
    assert len(history) >= 4
    assert history[0]["users"] == 2 and any(h["action"] == "scale_up" for h in history)
    final = s["autoscaling_summary"]["final_users"]
    assert final > 2
    # the driver applied the decision: that many users are active at the end
    assert results["measurement"]["final_active_users"] == final
    assert {"t_s", "users", "tokens_per_sec", "read_p95_ms", "saturation_level", "action"} <= history[0].keys()
    assert len(results["throughput_timeline"]) == len(history)


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_capacity_mode_stops_at_peak(with_config, sink):
    settings = with_config("autoscaler:\n  interval_seconds: 0.3\n  consecutive_samples_required: 1\n"
                           "  max_users: 3\n",
                           "--enable-autoscaling", "--autoscaler-mode", "capacity", "--duration", "20",
                           "--num-users", "2", "--io-workers", "2")
    results, _ = execute(settings, sink)
    auto = results["summary"]["autoscaling_summary"]
    assert results["measurement"]["stop_reason"] == "capacity found"
    assert auto["peak_found"] and auto["peak_user_count"] in (2, 3)
    assert results["measurement"]["window_seconds"] < 20


@pytest.mark.slow  # a real run (wall clock)
def test_precondition_fills_before_window_and_is_not_counted(quick_settings, sink, tmp_path):
    trace = tmp_path / "t.csv"
    results, _ = execute(quick_settings("--precondition", "--precondition-size-gb", "0.01", "--precondition-threads",
                                        "2", "--io-trace-log", str(trace)), sink)
    pre = results["phases"]["preconditioning"]
    assert pre["bytes"] >= 0.01 * 2**30 and pre["entries"] > 0
    rows = trace_rows(trace)
    assert any(r["Key"].startswith("precond_") for r in rows)
    # statistics were reset: only the requests' own writes are in the window
    window_writes = results["summary"]["cache_stats"]["write_iops"]
    assert window_writes < len([r for r in rows if r["Operation"] == "Write"])


@pytest.mark.slow  # a real run (wall clock)
def test_prefill_only_issues_no_reads(quick_settings, sink):
    results, _ = execute(quick_settings("--prefill-only", "--disable-multi-turn", "--disable-prefix-caching"), sink)
    cs = results["summary"]["cache_stats"]
    assert cs["decode_reads"] == 0 and cs["total_read_bytes"] == 0 and cs["total_write_bytes"] > 0


@pytest.mark.slow  # a real run (wall clock)
def test_decode_only_reads_prepopulated_entries(quick_settings, sink, tmp_path):
    trace = tmp_path / "t.csv"
    results, _ = execute(quick_settings("--decode-only", "--disable-prefix-caching", "--io-trace-log", str(trace)),
                         sink)
    assert results["phases"]["prepopulation"]["entries"] == 4 * 10
    cs = results["summary"]["cache_stats"]
    assert cs["total_write_bytes"] == 0 and cs["decode_reads"] > 0
    reads = [r["Key"] for r in trace_rows(trace) if r["Operation"] == "Read"]
    assert reads and all(k.startswith("prepop_") for k in reads)


@pytest.mark.slow  # a real run (wall clock)
def test_rag_reads_the_ingested_chunks(with_config, sink, tmp_path):
    trace = tmp_path / "t.csv"
    settings = with_config("rag:\n  request_probability: 1.0\n  top_k_chunks: 2\n", "--enable-rag",
                           "--rag-num-docs", "3", "--disable-prefix-caching", "--io-trace-log", str(trace))
    results, _ = execute(settings, sink)
    assert results["phases"]["rag_ingestion"]["documents"] == 3
    rows = trace_rows(trace)
    written = {r["Key"] for r in rows if r["Operation"] == "Write" and r["Key"].startswith("rag_")}
    read = {r["Key"] for r in rows if r["Operation"] == "Read" and r["Key"].startswith("rag_")}
    assert read and read <= written  # retrieval reads exactly the chunks that ingestion stored
    assert results["summary"]["rag_stats"]["chunk_hits"] > 0


@pytest.mark.slow  # a real run (wall clock)
def test_rag_max_documents_evicts_oldest(with_config, sink):
    settings = with_config("rag:\n  max_documents: 2\n", "--enable-rag", "--rag-num-docs", "5",
                           "--io-trace-log", os.devnull)
    results, _ = execute(settings, sink)
    ing = results["phases"]["rag_ingestion"]
    assert ing["documents_evicted"] == 3 and ing["documents_retrievable"] == 2


@pytest.mark.slow  # a real run (wall clock)
def test_io_trace_log_does_no_io(quick_settings, sink, tmp_path):
    trace = tmp_path / "t.csv"
    results, _ = execute(quick_settings("--io-trace-log", str(trace), "--cpu-mem-gb", "0.001"), sink)
    assert not (tmp_path / "cache").exists()  # no storage tier directory at all
    rows = trace_rows(trace)
    assert list(rows[0]) == ["Timestamp", "Operation", "Object_Size_Bytes", "Tier", "Key", "Phase"]
    assert {r["Tier"] for r in rows} <= {"Tier-0", "Tier-1", "Tier-2"}
    assert {r["Phase"] for r in rows} <= {"Prefill", "Decode", "Evict"}
    assert any(r["Phase"] == "Evict" for r in rows)
    assert results["measurement"]["io_trace"]["rows"] == len(rows)
    assert results["measurement"]["io_mode"].startswith("trace")


@pytest.mark.slow  # a real run (wall clock)
def test_io_trace_log_zst(quick_settings, sink, tmp_path):
    zstandard = pytest.importorskip("zstandard")
    trace = tmp_path / "t.csv.zst"
    execute(quick_settings("--io-trace-log", str(trace)), sink)
    with open(trace, "rb") as fh:
        text = zstandard.ZstdDecompressor().stream_reader(fh).read().decode()
    assert text.startswith("Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase\n") and text.count("\n") > 2


@pytest.mark.slow  # a real run (wall clock)
def test_xlsx_output_has_reference_sheets(quick_settings, sink, tmp_path):
    openpyxl = pytest.importorskip("openpyxl")
    path = tmp_path / "r.xlsx"
    execute(quick_settings("--xlsx-output", str(path)), sink)
    wb = openpyxl.load_workbook(path)
    assert {"Summary", "Run Parameters", "Performance Metrics"} <= set(wb.sheetnames)
    header = [c.value for c in wb["Summary"][1]]
    assert {"Model", "Avg Throughput (tok/s)", "Storage Throughput (tok/s)", "Tier Storage Read Bandwidth (GiB/s)",
            "Storage Tier Read Device P95 (ms)"} <= set(header)
    assert wb["Summary"][2][header.index("Model")].value == "micro"


@pytest.mark.slow  # a real run (wall clock)
def test_xlsx_falls_back_to_csv_without_openpyxl(quick_settings, sink, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_openpyxl(name, *a, **kw):
        if name == "openpyxl":
            raise ImportError("no openpyxl")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_openpyxl)
    execute(quick_settings("--xlsx-output", str(tmp_path / "r.xlsx")), sink)
    rows = list(csv.reader(open(tmp_path / "r.csv")))
    assert len(rows) == 2 and "Avg Throughput (tok/s)" in rows[0]


@pytest.mark.slow  # a real run (wall clock)
def test_throughput_profile_uses_configured_floor(with_config, sink):
    settings = with_config("performance_criteria:\n  min_storage_read_gbps: 1000000\n"
                           "  min_storage_write_gbps: 1000000\n", "--performance-profile", "throughput")
    results, code = execute(settings, sink)
    health = results["summary"]["cache_stats"]["storage_health"]
    assert exit_status(code) == 0 and health["overall_status"] == "FAIL" and results["overall_passed"] is False
    assert any("Bandwidth >= 1e+06 GiB/s" in c["name"] and not c["passed"] for c in health["criteria"])


@pytest.mark.slow  # a real run (wall clock)
def test_throughput_profile_passes_when_floor_met(with_config, sink):
    settings = with_config("performance_criteria:\n  min_storage_read_gbps: 0\n  min_storage_write_gbps: 0\n",
                           "--performance-profile", "throughput")
    results, code = execute(settings, sink)
    assert exit_status(code) == 0 and results["overall_passed"] is True


@pytest.mark.slow  # a real run (wall clock)
def test_latency_profile_thresholds_from_config(with_config, sink):
    settings = with_config("performance_criteria:\n  storage_write_device_p95_ms: 0.000001\n", "--fail-exit-code")
    results, code = execute(settings, sink)
    crit = results["summary"]["cache_stats"]["storage_health"]["criteria"]
    assert exit_status(code) == 1 and results["overall_passed"] is False and any(c["name"].startswith("Storage Tier Write Device P95 < 1e-06ms") for c in crit)


@pytest.mark.slow  # a real run (wall clock)
def test_validation_trace_compares_hit_rate(quick_settings, sink, tmp_path):
    entry = {"timestamp": 0.0, "request_id": "r", "user_id": "u", "context_tokens": 100, "generation_tokens": 10,
             "phase": "prefill", "cache_hit": True, "cache_tier": "cpu", "read_bytes": 10, "write_bytes": 1,
             "read_latency_ms": 1.0, "write_latency_ms": 1.0, "model_name": "m"}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([entry, {**entry, "cache_hit": False, "timestamp": 5.0}]))
    results, _ = execute(quick_settings("--validation-trace", str(path)), sink)
    v = results["validation"]
    assert v["trace_stats"]["cache_hit_rate"] == 0.5
    assert v["comparison"]["cache_hit_rate"]["benchmark"] == results["summary"]["cache_stats"]["cache_hit_rate"]
    assert v["passed"] == (v["avg_error_pct"] <= 5)


@pytest.mark.parametrize("content", ["not json", "[]", '[{"timestamp": 1}]', '{"a": 1}'])
def test_bad_validation_trace_fails_before_the_run(tmp_path, content):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(UsageError, match="--validation-trace"):
        parse_settings(["--validation-trace", str(path)])
    with pytest.raises(UsageError, match="no such file"):
        parse_settings(["--validation-trace", str(tmp_path / "missing.json")])


def test_mpi_ranks_get_their_own_cache_dir_and_output(tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    s = parse_settings(["--cache-dir", str(tmp_path), "--output", str(tmp_path / "res.json")])
    assert s.tiers.cache_dir == str(tmp_path / "rank1") and s.outputs.output == str(tmp_path / "res_rank1.json")
    assert s.mpi_rank == 1 and s.mpi_world_size == 2


def test_single_mpi_rank_keeps_names(tmp_path, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")
    s = parse_settings(["--cache-dir", str(tmp_path), "--output", str(tmp_path / "res.json")])
    assert s.tiers.cache_dir == str(tmp_path) and s.outputs.output == str(tmp_path / "res.json")


@pytest.mark.slow  # a real run (wall clock)
def test_harness_command_line_runs_unchanged(tmp_path):
    """The exact command shape mlpstorage builds (spec 13.2), with the harness's float rendering."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = run_dir / "kvcache_results_20261130_000000.json"
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--model", "tiny-1b", "--num-users", "2", "--duration", "2",
           "--gpu-mem-gb", "0.0", "--cpu-mem-gb", "0.0", "--generation-mode", "none", "--performance-profile",
           "throughput", "--cache-dir", str(run_dir / "kvcache_data"), "--output", str(out),
           "--disable-multi-turn", "--disable-prefix-caching", "--seed", "42"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(out.read_text())
    for key in ("overall_passed", "total_requests", "avg_latency_ms", "p99_latency_ms", "throughput_req_per_sec",
                "storage_throughput_mbps", "cache_hit_rate"):
        assert key in data
    assert data["total_requests"] > 0 and data["storage_throughput_mbps"] > 0


@pytest.mark.slow  # a real run (wall clock)
def test_report_sections_for_modes(with_config, tmp_path):
    out = io.StringIO()
    settings = with_config("autoscaler:\n  interval_seconds: 0.5\n", "--enable-autoscaling", "--duration", "2")
    execute(settings, out)
    text = out.getvalue()
    assert "### AUTOSCALING (qos mode) ###" in text and "Mode: standard (prefill+decode), closed loop, autoscaling" in text
