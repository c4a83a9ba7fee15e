"""`kv-cache compare`: workload checks, sub-window rates, ratios and their CIs, the table, the CLI."""

import io
import json
import math
from argparse import Namespace

import pytest

from kv_cache.cli import main
from kv_cache.cli.compare_cmd import compare_command
from kv_cache.errors import UsageError
from kv_cache.metrics.stats import mean_ci, ratio_ci
from kv_cache.report.compare import (
    CompareError,
    compare_rows,
    format_table,
    number,
    sessions_rows,
    standard_rows,
    window_rates,
    workload_differences,
)

GIB = 1 << 30


def run_doc(per_second_requests: list[int], read_gib: float = 1.0, **params) -> dict:
    rows = [{"t_s": float(i + 1), "seconds": 1.0, "requests": n, "storage_read_bytes": int(read_gib * GIB * (n > 0))}
            for i, n in enumerate(per_second_requests)]
    window = float(len(rows))
    return {"schema_version": "kv-cache-results/1",
            "run_parameters": {"model": "m", "num_users": 4, "duration": window, "seed": 1, **params},
            "summary": {"requests_per_second": sum(per_second_requests) / window,
                        "avg_throughput_tokens_per_sec": 100.0,
                        "end_to_end_latency_ms": {"p50": 10.0, "p95": 20.0},
                        "cache_stats": {"tier_storage_read_bandwidth_gbps": read_gib, "storage_read_p95_ms": 5.0,
                                        "cache_hit_rate": 0.5}},
            "time_series": {"rows": rows}}


def test_window_rates_are_per_second_batch_means():
    doc = run_doc([1, 3] * 10)  # 20 one-second buckets -> 10 sub-windows of 2 s, each 4 requests
    assert window_rates(doc, "requests") == [2.0] * 10
    assert window_rates(run_doc([5, 5, 5]), "requests") == []  # under 4 buckets: no sub-windows
    assert window_rates({"summary": {}}, "requests") == []


def test_ratio_and_its_interval_come_from_the_sub_window_rates():
    a, b = run_doc([2, 4, 3, 5] * 5), run_doc([4, 8, 7, 9] * 5)
    rows = {r.label: r for r in standard_rows([a, b])}
    req = rows["requests/s"]
    ra, rb = window_rates(a, "requests"), window_rates(b, "requests")
    assert req.cells[0].value == 3.5 and req.cells[1].value == 7.0
    assert req.cells[0].ci == mean_ci(ra)
    assert req.ratios[0].value == 2.0 and req.ratios[0].ci == ratio_ci(rb, ra)
    assert req.ratios[0].ci.low < 2.0 < req.ratios[0].ci.high
    # no time series behind a figure: the ratio has no interval
    assert rows["tokens/s"].ratios[0].value == 1.0 and rows["tokens/s"].ratios[0].ci is None


def test_missing_figures_and_zero_baselines_give_no_ratio():
    a, b = run_doc([1, 1, 1, 1]), run_doc([1, 1, 1, 1])
    a["summary"]["cache_stats"]["storage_read_p95_ms"] = 0
    del b["summary"]["end_to_end_latency_ms"]
    rows = {r.label: r for r in standard_rows([a, b])}
    assert rows["storage read p95 ms"].ratios[0].value is None
    assert rows["end-to-end p95 ms"].cells[1].text() == "-"


def test_workloads_must_match():
    a = run_doc([1] * 4)
    assert workload_differences([a, run_doc([2] * 4, read_gib=3.0, cache_dir="/elsewhere")]) == []
    diffs = workload_differences([a, run_doc([1] * 4, num_users=8), run_doc([1] * 4, num_users=8)])
    assert diffs == ["num_users: A=4, B=8, C=8"]
    with pytest.raises(CompareError):
        workload_differences([a, {"rungs": []}])
    with pytest.raises(CompareError):
        compare_rows([a])


def rung(cfg: str, n: int, samples: list[float]) -> dict:
    ci = mean_ci(samples).to_dict()
    return {"tiers": cfg, "sessions": n, "throughput_tokens_per_s_per_gpu": ci,
            "throughput_subwindow_tokens_per_s_per_gpu": samples}


def test_sessions_rungs_compare_with_ratio_cis():
    a = {"rungs": [rung("dram", 4, [10.0, 12.0, 11.0]), rung("dram", 8, [20.0, 22.0, 21.0])], "parameters": {}}
    b = {"rungs": [rung("dram", 4, [20.0, 25.0, 22.0])], "parameters": {}}
    (row,) = sessions_rows([a, b])  # only the rungs both have
    assert row.label == "dram @ 4 sessions tok/s/GPU"
    assert math.isclose(row.ratios[0].value, (67 / 3) / 11.0)
    assert row.ratios[0].ci == ratio_ci([20.0, 25.0, 22.0], [10.0, 12.0, 11.0])


def test_table_and_numbers():
    lines = format_table(["a.json", "b.json"], standard_rows([run_doc([1, 2] * 4), run_doc([2, 4] * 4)]))
    assert lines[:2] == ["  A = a.json", "  B = b.json"]
    assert lines[3].split() == ["metric", "A", "B", "B/A"]
    assert [number(v) for v in (3021.4, 12.345, 0.486, 0, 1e-5)] == ["3,021", "12.3", "0.486", "0", "1.00e-05"]


def test_cli_refuses_different_workloads_unless_told(tmp_path, capsys):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(run_doc([1, 2] * 4)))
    pb.write_text(json.dumps(run_doc([1, 2] * 4, duration=99)))
    assert main(["compare", str(pa), str(pb)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache compare: error: the workloads differ (duration: A=8.0, B=99)")
    out, warn = io.StringIO(), io.StringIO()
    args = Namespace(results=[str(pa), str(pb)], allow_different_workloads=True)
    assert compare_command(args, [], out, warn) == 0
    assert "warning: workloads differ: duration" in warn.getvalue() and "requests/s" in out.getvalue()
    with pytest.raises(UsageError, match="at least two"):
        compare_command(Namespace(results=[str(pa)], allow_different_workloads=False), [], out, warn)
