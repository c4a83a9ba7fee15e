"""The MLPerf tool's own results read by kv-cache (report, merge, compare, --plots), and the Rules' section 6
score of a harness run directory, from small fixtures cut from the published v3.0 files
(tests/fixtures/mlperf_v3/README.md) and from rank documents of ours built by the single-run code."""

import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from kv_cache.cli import main
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.documents import MlperfToolDocument, load
from kv_cache.results.mlperf_tool import is_harness_summary, is_mlperf_tool_file, load_mlperf_rank
from kv_cache.results.rules_score import find_harness_files
from kv_cache.results.samples import latency_samples
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.results.summary import build_summary, harness_keys, request_lists
from kv_cache.results.write import dumps
from kv_cache.storage.base import IOResult
from kv_cache.workload.qos import QOS_LEVELS

RUN = Path(__file__).parent / "fixtures" / "mlperf_v3" / "run"
R0 = RUN / "option_1" / "trial_0" / "rank_0" / "kvcache_results_20260807_155722.json"
R1 = RUN / "option_1" / "trial_0" / "rank_1" / "kvcache_results_20260807_155722.json"
T1R0 = RUN / "option_1" / "trial_1" / "rank_0" / "kvcache_results_20260807_160948.json"


def _cs(path):
    return json.loads(Path(path).read_text())["summary"]["cache_stats"]


def test_a_published_rank_file_is_its_own_document_kind_read_with_meaning():
    data = json.loads(R0.read_text())
    assert is_mlperf_tool_file(data) and not is_harness_summary(data)
    doc = load(R0)
    assert isinstance(doc, MlperfToolDocument) and doc.kind == "mlperf-tool" and doc.rank == 0
    view = load_mlperf_rank(R0)
    assert (view.option, view.trial, view.rank) == (1, 0, 0)
    assert view.read_ops == 2956 and view.write_ops == 575  # counts, as written
    assert view.write_device_p95_ms == pytest.approx(1.0348387062549573)
    assert view.read_gibps == pytest.approx(4.34024068739054) and view.seed == 42 and view.missing == []
    assert not is_mlperf_tool_file({"summary": {}}) and not is_mlperf_tool_file({"schema_version": "x", **data})


def test_report_of_a_published_rank_file_says_what_each_key_is(capsys):
    assert main(["report", str(R0)]) == 0
    out = capsys.readouterr().out
    assert "read operations (a count)                      2,956" in out
    assert "storage write, device = fsync ALONE            1.035 ms" in out
    assert "read bandwidth (bytes / window)                4.340 GiB/s" in out
    assert "mean write size 590.0 MB" in out and "Keys missing from this file: none" in out


def test_a_key_the_file_lacks_is_said_as_missing_never_a_traceback(tmp_path, capsys):
    data = json.loads(R0.read_text())
    del data["summary"]["cache_stats"]["read_iops"], data["summary"]["elapsed_time"]
    short = tmp_path / "rank_0" / "kvcache_results_1.json"
    short.parent.mkdir()
    short.write_text(json.dumps(data))
    assert main(["report", str(short)]) == 0
    out = capsys.readouterr().out
    assert "missing (summary.cache_stats.read_iops)" in out and "missing (summary.elapsed_time)" in out
    assert "Keys missing from this file: summary.elapsed_time, summary.cache_stats.read_iops" in out
    del data["summary"]  # no request completed: the tool writes no summary at all
    short.write_text(json.dumps(data))
    assert main(["report", str(short)]) == 0
    assert "The tool's verdict: missing (summary.cache_stats.storage_health.overall_status)" in capsys.readouterr().out


def test_merge_of_a_published_harness_directory_gives_the_section_6_score(tmp_path, capsys):
    deep = tmp_path / "closed" / "HPE" / "results" / "run"
    shutil.copytree(RUN, deep)
    assert len(find_harness_files(str(tmp_path))) == 8  # found at any depth
    assert main(["merge", str(tmp_path), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)["score"]
    o1, o2 = score["options"]["1"], score["options"]["2"]
    t0 = _cs(R0)["tier_storage_read_bandwidth_gbps"] + _cs(R1)["tier_storage_read_bandwidth_gbps"]
    t1 = sum(_cs(p)["tier_storage_read_bandwidth_gbps"] for p in (RUN / "option_1" / "trial_1").glob("rank_*/*.json"))
    assert o1["read_gibps"] == pytest.approx(statistics.fmean([t0, t1]))  # sum within a trial, mean over trials
    assert o1["read_gibps_spread"]["per_trial"] == pytest.approx([t0, t1])
    assert o1["read_device_p95_ms"] == pytest.approx(64512.846158770844)  # the max over ranks and trials
    assert o1["write_device_p95_ms"] == pytest.approx(1.0348387062549573)
    assert o2["write_device_p95_ms"] == pytest.approx(0.7823065854609009)
    assert o1["trials"] == 2 and o1["ranks_expected"] == 2 and o1["formats"] == ["mlperf-tool"]
    assert o1["pooled"]["mlperf_tool_requests_pooled"] == 12 and o1["seeds"] == [42, 43]
    assert main(["merge", str(deep)]) == 0
    out = capsys.readouterr().out
    assert "Option 1: 2 trial(s) x 2 rank(s)" in out and "Option 2: 2 trial(s) x 2 rank(s)" in out
    assert "aggregate device write P95, ms (max)" in out and "(MLPerf tool: fsync alone)" in out
    assert not list(tmp_path.rglob("kvcache_merged.json"))  # nothing written without --output


def test_a_missing_rank_is_named_not_averaged_as_zero(tmp_path, capsys):
    shutil.copytree(RUN, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "option_1" / "trial_1" / "rank_1")
    out = tmp_path / "score.json"
    assert main(["merge", str(tmp_path), "--output", str(out)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "trial 1:" in ln and "GiB/s" in ln)
    assert line.strip().startswith("trial 1: 1 rank(s)") and line.endswith("missing rank(s) 1")
    o1 = json.loads(out.read_text())["options"]["1"]
    assert o1["per_trial"]["1"]["missing_ranks"] == [1]
    assert o1["trials_left_out"] == [1] and o1["trials_counted"] == [0] and not o1["no_complete_trial"]
    assert o1["incomplete"]  # a rank is missing: the score says INCOMPLETE even with a complete trial scored
    t0 = _cs(R0)["tier_storage_read_bandwidth_gbps"] + _cs(R1)["tier_storage_read_bandwidth_gbps"]
    assert o1["read_gibps"] == pytest.approx(t0)  # the complete trial alone, not a short sum averaged in


def _metrics(rng, requests, reads, writes, window_s):
    m = RunMetrics()
    m.open_window(0)
    end = int(window_s * 1e9)
    for _ in range(reads):
        device = int(rng.lognormal(16, 1))
        m.record_io("storage", "read", IOResult(1 << 20, 1 << 20, device + 5000, device, 5000), end - 1, "decode")
    for _ in range(writes):
        device = int(rng.lognormal(17, 0.5))
        m.record_io("storage", "write", IOResult(1 << 21, 1 << 21, device + 7000, device, 7000), end - 1, "prefill")
    for i in range(requests):
        e2e = int(rng.lognormal(18, 1))
        m.record_request(QOS_LEVELS[i % 3], end - 1, e2e, e2e // 2, 0, e2e // 4, e2e // 4, 100, 1000, turn=i % 3)
    m.close_window(end)
    return m


def _ours(rank, world, run_id, rng):
    from kv_cache.settings.sections import BenchConfig

    m = _metrics(rng, 40 + 10 * rank, 30 + rank, 10, 10.0)
    summary = build_summary(m, {}, dict(BenchConfig().qos_profiles), "latency", None, 0.0, None, True)
    return {"schema_version": "kv-cache-results/1", "run_id": run_id, "world_size": world, **request_lists(m),
            "seed": 42 + rank, "summary": summary, **harness_keys(summary), "stop_reason": "duration",
            "measurement": {"window_seconds": m.window_seconds, "requests_issued": m.requests.completed,
                            "requests_failed": 0, "errors": 0,
                            "window_wallclock": {"start_unix": 1000.0, "end_unix": 1010.0, "barrier_aligned": True}},
            "latency_samples": latency_samples(m, 200_000), "recorder": m.state(), "time_series": time_series(m),
            "latency_histograms": latency_histograms(m),
            "summary_inputs": {"performance_profile": "latency", "kv_block_tokens": 0},
            "run_parameters": {"mpi_rank": rank, "mpi_world_size": world, "host": f"node{rank}"}}


def test_merge_of_a_harness_directory_in_both_formats_with_our_pooled_figures(tmp_path, capsys):
    rng = np.random.default_rng(11)
    shutil.copytree(RUN / "option_2", tmp_path / "run" / "option_2")  # the MLPerf tool's files
    ours = {}
    for trial in range(2):
        for rank in range(3):
            d = _ours(rank, 3, f"trial-{trial}", rng)
            ours[(trial, rank)] = d
            p = tmp_path / "run" / "option_1" / f"trial_{trial}" / f"rank_{rank}" / "kvcache_results_20260101_000000.json"
            p.parent.mkdir(parents=True)
            p.write_text(dumps(d))
    assert main(["merge", str(tmp_path / "run"), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)["score"]
    o1 = score["options"]["1"]
    sums = [sum(ours[(t, r)]["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] for r in range(3))
            for t in range(2)]
    assert o1["formats"] == ["kv-cache"] and o1["ranks_expected"] == 3
    assert o1["read_gibps"] == pytest.approx(statistics.fmean(sums))
    assert o1["read_device_p95_ms"] == pytest.approx(max(d["summary"]["cache_stats"]["storage_read_device_p95_ms"]
                                                         for d in ours.values()))
    pooled = o1["pooled"]["kv_cache_merged_per_trial"]
    assert set(pooled) == {"0", "1"} and all(v["read_device_p95_ms"] > 0 for v in pooled.values())
    assert score["options"]["2"]["formats"] == ["mlperf-tool"]
    assert main(["merge", str(tmp_path / "run")]) == 0
    assert "pooled (our recorders merged), trial 0: device read P95" in capsys.readouterr().out


def test_compare_of_two_rank_files_flags_different_seeds(capsys):
    assert main(["compare", str(R0), str(R1)]) == 2
    err = capsys.readouterr().err
    assert "the seeds differ (seed: A=42, B=43)" in err and err.count("\n") == 1
    assert main(["compare", str(R0), str(R1), "--allow-different-workloads"]) == 0
    captured = capsys.readouterr()
    assert "warning: workloads differ: seed: A=42, B=43" in captured.err and "read_gibps" in captured.out
    assert main(["compare", str(R0), str(T1R0), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["rows"] if r["metric"] == "read_ops")
    assert row["values"] == [2956, 3119] and doc["differences"] == []


def test_plots_of_a_published_rank_file(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["report", str(R0), "--plots", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "latency_cdf.png").stat().st_size > 0
    assert "Plots written to" in capsys.readouterr().out
    assert main(["compare", str(R0), str(T1R0), "--plots", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "compare_latency_cdf.png").exists()


def _harness_summary(folder):
    """A summary.json in the shape the harness writes (mlpstorage kvcache `_write_run_summary`)."""
    summary = {"schema_version": "1.0", "run_datetime": "20260807_155647", "npernode": 1, "host_count": 2,
               "total_ranks": 2, "trials_per_option": 2, "partial_failure": False, "trial_failures": {},
               "options": {"1": {"option": 1, "aggregated_read_bandwidth_gbps": 9.2, "aggregated_write_bandwidth_gbps":
                                 2.3, "aggregated_avg_throughput_tokens_per_sec": 530.7,
                                 "aggregated_storage_throughput_tokens_per_sec": 2.47,
                                 "aggregated_p95_latency_ms": 386686.2, "aggregated_storage_read_p95_ms": 64893.7,
                                 "rank_count": 2, "trial_count": 2, "partial_failure": False, "missing_files": [],
                                 "cpu_tier_ranks": []}}}
    path = folder / "summary.json"
    path.write_text(json.dumps(summary))
    return path


def test_report_and_merge_of_the_harness_summary(tmp_path, capsys):
    shutil.copytree(RUN, tmp_path / "run")
    path = _harness_summary(tmp_path / "run")
    assert load(path).kind == "mlperf-harness-summary"
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "aggregated read bandwidth, GiB/s (sum over ranks, mean over trials): 9.200" in out
    assert main(["merge", str(path)]) == 0  # its figures, and ours from the rank files beside it
    out = capsys.readouterr().out
    assert "mlpstorage harness summary" in out and "MLPerf Storage Rules section 6 score" in out


def test_expected_ranks_and_trials_come_from_the_harness_summary_too(tmp_path, capsys):
    """One published rank file beside a summary.json that says 32 ranks and 3 trials (no metadata): every
    missing rank and trial is named, and the score says INCOMPLETE."""
    run = tmp_path / "run"
    (run / "option_1" / "trial_0" / "rank_0").mkdir(parents=True)
    shutil.copy(next((RUN / "option_1" / "trial_0" / "rank_0").glob("*.json")), run / "option_1" / "trial_0" / "rank_0")
    (run / "summary.json").write_text(json.dumps({"schema_version": "1.0", "total_ranks": 32, "trials_per_option": 3,
                                                 "options": {"1": {"rank_count": 32, "trial_count": 3}}}))
    out = tmp_path / "score.json"
    assert main(["merge", str(run), "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Option 1: 1 of 3 trial(s) x 32 rank(s)" in text and "INCOMPLETE" in text
    assert "trial(s) 1, 2: no rank file at all" in text
    assert "missing rank(s) " + ", ".join(map(str, range(1, 32))) in text
    o1 = json.loads(out.read_text())["options"]["1"]
    assert o1["incomplete"] and o1["per_trial"]["0"]["missing_ranks"] == list(range(1, 32))
