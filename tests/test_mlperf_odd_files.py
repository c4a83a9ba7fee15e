"""Odd files handed to report / merge / audit: the MLPerf tool's rank files with keys of the wrong type, a
harness summary.json with strings where numbers are, a rank file with no `summary` (no request completed),
and a harness directory of our own runs written under any --output name. Each is read and said, never a
traceback (issue 18 review)."""

import copy
import json
from pathlib import Path

from kv_cache.cli import main
from kv_cache.cli.audit import audit_path
from kv_cache.results.rules_score import find_harness_files

FIXTURES = Path(__file__).parent / "fixtures"
R0 = FIXTURES / "mlperf_v3" / "run" / "option_1" / "trial_0" / "rank_0" / "kvcache_results_20260807_155722.json"


def _rank_dir(root: Path, data: dict, option: int = 1, trial: int = 0, rank: int = 0) -> Path:
    folder = root / f"option_{option}" / f"trial_{trial}" / f"rank_{rank}"
    folder.mkdir(parents=True)
    path = folder / "kvcache_results_20260807_155722.json"
    path.write_text(json.dumps(data))
    return path


def test_merge_of_rank_files_with_keys_of_the_wrong_type(tmp_path, capsys):
    data = json.loads(R0.read_text())
    odd = copy.deepcopy(data)
    odd["storage_latencies"] = "not a list"
    odd["end_to_end_latencies"] = [None, "a", 1.5]
    _rank_dir(tmp_path / "run", odd, rank=0)
    odd = copy.deepcopy(data)
    odd["summary"]["cache_stats"] = "not an object"
    _rank_dir(tmp_path / "run", odd, rank=1)
    assert main(["merge", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "Option 1: 1 trial(s) x 2 rank(s)" in out
    assert "aggregate storage read bandwidth, GiB/s" in out


def test_harness_summary_with_strings_where_numbers_are(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"schema_version": "1.0", "trials_per_option": "2", "total_ranks": None,
                                "options": {"1": {"aggregated_read_bandwidth_gbps": "9.2",
                                                  "aggregated_p95_latency_ms": True, "missing_files": 3},
                                            "2": None}}))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "missing rank(s), 2 trial(s) per option" in out
    assert "aggregated read bandwidth, GiB/s (sum over ranks, mean over trials): not a number ('9.2')" in out
    assert "max per-request storage time P95, ms: not a number (True)" in out


def test_audit_reads_a_rank_file_with_no_summary(tmp_path):
    data = json.loads(R0.read_text())
    del data["summary"]  # what the tool writes when no request completed
    path = tmp_path / "kvcache_results_1.json"
    path.write_text(json.dumps(data))
    [(name, block)] = audit_path(str(path))
    assert block["source"] == "mlperf-tool" and block["verdict"] != "ok"
    assert {c["check"]: c["status"] for c in block["checks"]}["window"] == "unverifiable"
    # and inside a run directory it is audited, not skipped
    _rank_dir(tmp_path / "run", data)
    assert len(audit_path(str(tmp_path / "run"))) == 1


def test_audit_without_bytes_gives_no_corrected_bandwidth(tmp_path):
    data = json.loads(R0.read_text())
    data["summary"]["cache_stats"] = None
    path = tmp_path / "kvcache_results_1.json"
    path.write_text(json.dumps(data))
    [(_name, block)] = audit_path(str(path))
    window = next(c for c in block["checks"] if c["check"] == "window")
    assert "the bytes read are not recorded, so no corrected bandwidth" in window["reason"]
    assert "0.00 GiB/s" not in window["reason"]


def _our_doc(rank: int) -> dict:
    """A rank document of ours, cut to what the score reads (schema_version, seed, summary)."""
    summary = json.loads(R0.read_text())["summary"]
    return {"schema_version": "kv-cache-results/1", "run_id": f"r{rank}", "seed": 42 + rank, "summary": summary}


def test_harness_directory_of_our_runs_under_any_output_name(tmp_path, capsys):
    for trial in (0, 1):
        for rank in (0, 1):
            folder = tmp_path / "run" / "option_1" / f"trial_{trial}" / f"rank_{rank}"
            folder.mkdir(parents=True)
            (folder / "r.json").write_text(json.dumps(_our_doc(rank)))
    places = find_harness_files(str(tmp_path / "run"))
    assert [(o, t, r) for o, t, r, _f in places] == [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert main(["merge", str(tmp_path / "run")]) == 0
    assert "Option 1: 2 trial(s) x 2 rank(s); files: kv-cache" in capsys.readouterr().out


def test_nan_written_by_pythons_json_is_read_and_said_as_missing(tmp_path, capsys):
    data = json.loads(R0.read_text())
    data["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] = float("nan")
    path = _rank_dir(tmp_path / "run", data)
    path.write_text(json.dumps(data))  # json.dump writes NaN, as the MLPerf tool's json.dump would
    assert b"NaN" in path.read_bytes()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "read bandwidth (bytes / window)                missing" in out
    assert "Keys that are not numbers (read as missing): summary.cache_stats.tier_storage_read_bandwidth_gbps" in out
    assert main(["merge", str(tmp_path / "run"), "--json"]) == 0
    option = json.loads(capsys.readouterr().out)["score"]["options"]["1"]
    assert option["read_gibps"] is None and option["write_gibps"] is not None


def test_strings_where_numbers_are_are_named(tmp_path, capsys):
    data = json.loads(R0.read_text())
    data["summary"]["cache_stats"]["read_iops"] = "2956"
    path = tmp_path / "kvcache_results_1.json"
    path.write_text(json.dumps(data))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "read operations (a count)                      missing (summary.cache_stats.read_iops)" in out
    assert "Keys that are not numbers (read as missing): summary.cache_stats.read_iops" in out


def test_mixed_formats_name_what_the_write_device_p95_covers_and_ranks_not_to_average(tmp_path, capsys):
    _rank_dir(tmp_path / "run", json.loads(R0.read_text()), rank=0)  # the MLPerf tool's
    ours = _our_doc(1)
    ours["summary"]["cache_stats"]["storage_write_device_p95_ms"] = 150.0  # ours times the whole write
    ours |= {"rank_status": "failed", "rank_status_reason": "verdict FAIL: Requests Completed > 0"}
    _rank_dir(tmp_path / "run", ours, rank=1)
    no_summary = json.loads(R0.read_text())
    del no_summary["summary"]
    _rank_dir(tmp_path / "run", no_summary, trial=1, rank=0)
    assert main(["merge", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "150.000   (mixed: the MLPerf tool's ranks time the fsync alone, ours the whole write)" in out
    assert "not to average (its rank_status): trial 0 rank 1 failed: verdict FAIL: Requests Completed > 0" in out
    assert "the files' own verdicts: FAIL x2, no verdict x1" in out and "None x0" not in out
    assert main(["merge", str(tmp_path / "run"), "--json"]) == 0
    option = json.loads(capsys.readouterr().out)["score"]["options"]["1"]
    assert option["ranks_not_to_average"] == [{"trial": 0, "rank": 1, "status": "failed",
                                               "reason": "verdict FAIL: Requests Completed > 0"}]
    assert option["tool_status"] == {"FAIL": 2, "no verdict": 1}


def test_audit_of_a_merge_names_its_block_device_instead_of_saying_there_is_none():
    from kv_cache.results import integrity as integ  # noqa: PLC0415

    merged = {"measurement": {"block_device": {"name": "vda"}, "window_seconds": 5.0}, "summary": {"cache_stats": {}}}
    finding = integ.check_page_cache(integ.facts_from_ours(merged))
    assert finding["status"] == "unverifiable" and finding["reason"].startswith("block device vda: no counters")
    merged["merged_from"] = ["r0.json", "r1.json"]  # a merge: its ranks' documents check the counters
    finding = integ.check_page_cache(integ.facts_from_ours(merged))
    assert finding["status"] == "n/a" and finding["reason"].startswith("block device vda: a merge holds no counters")
    bare = integ.check_page_cache(integ.facts_from_ours({"measurement": {}, "summary": {"cache_stats": {}}}))
    assert bare["status"] == "unverifiable" and bare["reason"] == "no block-device, process or cgroup counters recorded"


def test_audit_says_what_a_sessions_document_or_a_harness_summary_is(tmp_path, capsys):
    sessions = tmp_path / "s.json"
    sessions.write_text(json.dumps({"schema_version": "kv-cache-sessions/1", "rungs": [], "summary": {}}))
    assert main(["audit", str(sessions)]) == 2
    assert "a sessions document holds no per-run storage figures to audit" in capsys.readouterr().err
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"schema_version": "1.0", "trials_per_option": 1, "options": {}}))
    assert main(["audit", str(summary)]) == 2
    assert "the harness's summary.json holds sums, not the rank files' figures: audit its run directory" in \
        capsys.readouterr().err


def _summary(path: Path, read: float, extra: dict | None = None) -> Path:
    options = {"1": {"aggregated_read_bandwidth_gbps": read, "aggregated_write_bandwidth_gbps": 2.3,
                     "rank_count": 2, "trial_count": 2}, **(extra or {})}
    path.write_text(json.dumps({"schema_version": "1.0", "trials_per_option": 2, "total_ranks": 2,
                                "options": options}))
    return path


def test_compare_of_two_harness_summaries(tmp_path, capsys):
    a = _summary(tmp_path / "a.json", 9.2)
    b = _summary(tmp_path / "b.json", 4.6, {"2": {"aggregated_read_bandwidth_gbps": "x"}})
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "1 aggregated_read_bandwidth_gbps" in out and "0.500" in out
    line = next(x for x in out.splitlines() if x.startswith("2 aggregated_read_bandwidth_gbps"))
    assert line.split()[2:] == ["missing", "missing", "-"]
    assert main(["compare", str(a), str(b), "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    first = next(r for r in rows if r["option"] == "1" and r["metric"] == "aggregated_read_bandwidth_gbps")
    assert first["values"] == [9.2, 4.6] and first["ratio_to_a"] == [1.0, 0.5]
    assert main(["compare", str(a), str(b), "--plots", str(tmp_path / "p")]) == 2
    assert "nothing to plot" in capsys.readouterr().err
    assert main(["compare", str(a), str(R0)]) == 2  # a summary beside a rank file: refused, said why
    assert "harness summary.json files with each other" in capsys.readouterr().err


def test_a_sessions_document_carries_the_interposer_check_and_audit_reads_it(tmp_path, capsys):
    from kv_cache.results.integrity import sessions_integrity  # noqa: PLC0415

    shim = {"recorded": True, "ld_preload": ["/tmp/libnofsync.so"],
            "interposers": [{"path": "/tmp/libnofsync.so", "symbols": ["fdatasync", "fsync"]}]}
    block = sessions_integrity(shim)
    assert block["verdict"] == "invalid" and block["source"] == "kv-cache sessions"
    assert "interposes fdatasync, fsync" in block["reasons"][0] and "interposers only" in block["scope"]
    assert sessions_integrity({"recorded": True, "ld_preload": [], "interposers": []})["verdict"] == "ok"
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"schema_version": "kv-cache-sessions/1", "rungs": [], "summary": {},
                                "integrity": block}))
    assert main(["audit", str(path)]) == 1
    assert "INVALID (kv-cache sessions)" in capsys.readouterr().out


def test_a_rank_or_trial_with_no_file_at_all_is_named_from_world_size_and_metadata(tmp_path, capsys):
    run = tmp_path / "run"
    doc = _our_doc(0) | {"world_size": 2}  # rank 1 wrote nothing in any trial
    _rank_dir(run, doc, option=1, trial=0, rank=0)
    assert main(["merge", str(run), "--json"]) == 0
    option = json.loads(capsys.readouterr().out)["score"]["options"]["1"]
    assert option["ranks_expected"] == 2 and option["incomplete"]
    assert option["per_trial"]["0"]["missing_ranks"] == [1]
    (run / "kv_cache_20260807_155647_metadata.json").write_text(json.dumps({"args": {"num_processes": 3,
                                                                                        "trials": 2}}))
    assert main(["merge", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Option 1: 1 of 2 trial(s) x 3 rank(s)" in out and "missing rank(s) 1, 2" in out
    assert "trial(s) 1: no rank file at all (not in the score)" in out
