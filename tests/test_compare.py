"""`kv-cache compare`: workload checks, sub-window rates, ratios and their CIs, the table, the CLI."""

import io
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

from kv_cache.cli import main
from kv_cache.cli.compare_cmd import compare_command
from kv_cache.errors import UsageError
from kv_cache.metrics.stats import mean_ci, ratio_ci
from kv_cache.render.compare import (
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


# --- each side's storage, merged documents, --json and --plots (fixtures from real runs) --------------------
RENDER = Path(__file__).parent / "fixtures" / "render"
EXT4, SHM, MERGED = RENDER / "ext4_direct.json", RENDER / "shm_buffered.json", RENDER / "merged" / "m.json"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_legend_names_each_sides_storage(capsys):
    assert main(["compare", str(EXT4), str(SHM)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"  A = {EXT4}"
    assert out[1].startswith("      storage: ext4 (block device vda) at /tmp/render/cacheA, direct I/O; tiers: GPU absent")
    assert out[2] == f"  B = {SHM}"
    assert out[3].startswith("      storage: tmpfs (RAM-backed) at /dev/shm/kvrender, buffered I/O")
    assert out[-1].startswith("Brackets: 95 % confidence intervals")  # both runs have a time series


def test_merged_documents_compare_their_ranks_workload():
    merged = _load(MERGED)
    assert merged["schema_version"] == "kv-cache-merged/1" and len(merged["rank_parameters"]) == 2
    assert workload_differences([merged, _load(MERGED)]) == []
    other = _load(MERGED)
    for rank in other["rank_parameters"]:
        rank["num_users"] = 3
    assert workload_differences([merged, other]) == ["num_users: A=1 (each of 2 ranks), B=3 (each of 2 ranks)"]
    other["rank_parameters"][1]["duration"] = 9.0
    assert "duration: A=4.0 (each of 2 ranks), B=[4.0, 9.0]" in workload_differences([merged, other])
    # a merged document without the run's totals holds the ranks' shares: never the same as a single run's
    assert any(d.startswith("split_as: A=\"each rank's share of 2 ranks") and d.endswith("B='totals of the whole run'")
               for d in workload_differences([merged, _load(EXT4)]))


def test_a_merged_document_without_its_ranks_parameters_has_an_unknown_workload(tmp_path, capsys):
    old = _load(MERGED)
    del old["rank_parameters"]
    path = tmp_path / "old_merged.json"
    path.write_text(json.dumps(old))
    assert workload_differences([old, _load(MERGED)])[0].startswith("workload: A=unknown")
    assert main(["compare", str(path), str(MERGED)]) == 2
    assert "the workloads differ (workload: A=unknown" in capsys.readouterr().err
    assert main(["compare", str(path), str(MERGED), "--allow-different-workloads"]) == 0


def test_merged_documents_get_intervals_from_their_merged_time_series(capsys):
    """A merge sums the ranks' 1-second rows, so a merged document has the per-second columns that intervals
    are computed from; the footer is printed because intervals were computed, and only then."""
    assert main(["compare", str(MERGED), str(MERGED)]) == 0
    out = capsys.readouterr().out
    table = out.split("metric", 1)[1].split("\n\n")[0]
    assert "storage read GiB/s" in table and "[" in table.split("storage read GiB/s", 1)[1].split("\n")[0]
    assert "Brackets" in out
    rows = {r.label: r for r in standard_rows([_load(MERGED), _load(MERGED)])}
    cs = _load(MERGED)["summary"]["cache_stats"]
    assert rows["storage read GiB/s"].cells[0].value == cs["tier_storage_read_bandwidth_gbps"]
    assert rows["storage write device p95 ms"].cells[0].value == cs["storage_write_device_p95_ms"]


def test_json_to_stdout_holds_storage_metrics_ratios_and_intervals(capsys):
    assert main(["compare", str(EXT4), str(SHM), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # only the JSON on stdout
    assert doc["schema_version"] == "kv-cache-compare/1" and doc["baseline"] == "A"
    a, b = doc["runs"]
    assert (a["path"], a["storage"]["filesystem"], a["storage"]["block_device"], a["storage"]["io_mode"]) == (
        str(EXT4), "ext4", "vda", "direct")
    assert (b["storage"]["filesystem"], b["storage"]["block_device"], b["storage"]["io_mode"],
            b["storage"]["cache_dir"]) == ("tmpfs", None, "buffered", "/dev/shm/kvrender")
    metrics = {m["metric"]: m for m in doc["metrics"]}
    read = metrics["storage read GiB/s"]
    ea, eb = (_load(p)["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] for p in (EXT4, SHM))
    assert [v["value"] for v in read["values"]] == [ea, eb]
    assert math.isclose(read["ratios_to_baseline"][0]["value"], eb / ea)
    assert read["ratios_to_baseline"][0]["label"] == "B/A"
    assert read["values"][0]["ci95"] is not None and read["ratios_to_baseline"][0]["ci95"] is not None
    assert metrics["tokens/s"]["values"][0]["ci95"] is None  # no per-second column behind it
    assert doc["intervals"].startswith("Brackets") and doc["workload_differences"] == []


def test_json_to_a_path_keeps_an_earlier_file_and_still_prints_the_table(tmp_path, capsys):
    target = tmp_path / "cmp.json"
    target.write_text("{}")
    assert main(["compare", str(MERGED), str(MERGED), "--json", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"Comparison written to {target} (an earlier file was kept as {target}.1)" in out and "metric" in out
    doc = json.loads(target.read_text())
    assert doc["intervals"].startswith("Brackets") and (tmp_path / "cmp.json.1").read_text() == "{}"
    assert doc["runs"][0]["storage"]["cache_dir"] == "/tmp/render/cacheM (2 rank dirs)"


def test_bad_json_and_plots_paths_are_one_line_errors_before_anything_is_written(tmp_path, capsys):
    assert main(["compare", str(EXT4), str(SHM), "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"kv-cache compare: error: --json {tmp_path} is a directory")
    afile = tmp_path / "f"
    afile.write_text("x")
    assert main(["compare", str(EXT4), str(SHM), "--plots", str(afile), "--json", str(tmp_path / "c.json")]) == 2
    assert "--plots" in capsys.readouterr().err and not (tmp_path / "c.json").exists()


def test_plots_overlay_the_runs_one_png_per_figure_with_their_storage(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from PIL import Image

    out_dir = tmp_path / "cmp"
    assert main(["compare", str(EXT4), str(SHM), "--plots", str(out_dir)]) == 0
    assert "Plots written to" in capsys.readouterr().out
    names = sorted(p.name for p in out_dir.glob("*.png"))
    assert names == ["latency_cdf_end_to_end.png", "latency_cdf_storage_read.png", "latency_cdf_storage_write.png",
                     "throughput_storage_read.png", "throughput_storage_write.png"]
    for name in names:
        with Image.open(out_dir / name) as img:
            text = img.text["Description"]
        assert f"A = {EXT4}: ext4 (block device vda) at /tmp/render/cacheA, direct I/O" in text
        assert f"B = {SHM}: tmpfs (RAM-backed) at /dev/shm/kvrender, buffered I/O" in text
    page = (out_dir / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 5
    assert "<td>/tmp/render/cacheA</td>" in page and "<td>/dev/shm/kvrender</td>" in page
    assert "<title>kv-cache compare: A: ext4 vda /tmp/render/cacheA direct vs B: tmpfs RAM-backed" in page


def test_plots_of_merged_documents_use_their_percentiles(tmp_path):
    pytest.importorskip("matplotlib")
    from kv_cache.render.compare_plots import draw_compare_plots

    pngs = draw_compare_plots(["m.json", "a.json"], [_load(MERGED), _load(EXT4)], tmp_path)
    # the throughput figures come from the single run only (the merged document has no time series)
    assert [p.name for p in pngs] == ["latency_cdf_storage_read.png", "latency_cdf_storage_write.png",
                                      "latency_cdf_end_to_end.png", "throughput_storage_read.png",
                                      "throughput_storage_write.png"]


def test_sessions_results_compare_and_overlay_their_ladders(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    sessions = RENDER / "sessions.json"
    assert main(["compare", str(sessions), str(sessions), "--plots", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "storage: ext4 (block device vda) at /tmp/render/cacheS, auto I/O; tiers: dram+storage" in out
    assert "dram+storage @ 1 sessions tok/s/GPU" in out and "Brackets" in out
    assert [p.name for p in sorted(tmp_path.glob("*.png"))] == ["ladder.png"]


ROOT = Path(__file__).resolve().parents[1]
SHORT_RUN = ["--model", "tiny-1b", "--num-users", "4", "--duration", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0.1",
             "--generation-mode", "none", "--seed", "3", "--request-rate", "4", "--io-chunk-mb", "16"]


def _real_run(tmp_path: Path, name: str, *extra: str) -> Path:
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "kv-cache.py"), *SHORT_RUN, "--cache-dir", str(tmp_path / name),
                           "--output", str(out), *extra], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # (1: a FAIL verdict of this small run)
    return out


@pytest.mark.slow
def test_one_process_and_two_processes_of_the_same_flags_are_the_same_workload(tmp_path, capsys):
    """Real short runs: the merged document of `--processes 2` carries the run's totals (users, request
    rate, CPU memory, the base seed), so compare takes it as the workload of the one-process run, and
    says how many processes ran each as a note, not a difference."""
    one, two = _real_run(tmp_path, "p1"), _real_run(tmp_path, "p2", "--processes", "2")
    merged = _load(two)
    params = merged["run_parameters"]
    assert (params["num_users"], params["request_rate"], params["cpu_mem_gb"], params["seed"]) == (4, 4.0, 0.1, 3)
    assert params["mpi_world_size"] == 2
    assert [s["num_users"] for s in merged["settings_split"]["rank_shares"]] == [2, 2]
    assert merged["verdict"] in ("PASS", "FAIL") and merged["window_fraction"] == 1.0
    assert merged["ranks_expected"] == 2 and merged["missing_ranks"] == [] and merged["lost_ranks"] == []
    assert workload_differences([_load(one), merged]) == []
    assert main(["compare", str(one), str(two)]) == 0
    captured = capsys.readouterr()
    assert "note: processes: A=1 process, B=2 processes" in captured.err
    # the rank's own document is a share of the run: not the one-process workload
    assert any(d.startswith("num_users") for d in workload_differences([_load(one), _load(tmp_path / "p2_rank0.json")]))
    # the report of the merged document says how it measured
    assert main(["report", str(two)]) == 0
    report = capsys.readouterr().out
    assert "streamed in 16 MiB chunks" in report and "streamed in 0 MiB" not in report
    assert "Storage tier (rank 0): " in report and "Storage tier (rank 1): " in report
    assert "  I/O: " in report
