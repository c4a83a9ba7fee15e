"""The merge of per-rank results: the ranks' recorders added up and the single-run summary run on them.

Exact percentiles of the union while every sample is kept, the merged HdrHistograms (precision stated)
when ranks dropped samples, bandwidth over the measured window, one run's complete ranks only."""

import json
import re

import numpy as np
import pytest

from kv_cache.cli import main
from kv_cache.metrics.histograms import SIGNIFICANT_DIGITS
from kv_cache.metrics.recorder import GIB, PERCENTILES, RunMetrics
from kv_cache.metrics.stats import percentiles
from kv_cache.render.console import report_lines
from kv_cache.render.merged_table import merged_table
from kv_cache.results.merge import (
    EXACT,
    FROM_HISTOGRAMS,
    MergeError,
    find_rank_files,
    merge_documents,
)
from kv_cache.results.samples import latency_samples
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.results.summary import build_summary, harness_keys, request_lists
from kv_cache.results.verdict import INCOMPLETE, RANKS_CRITERION, STORAGE_STOP_CRITERION, UNKNOWN_END
from kv_cache.results.write import dumps
from kv_cache.storage.base import IOResult
from kv_cache.workload.qos import QOS_LEVELS

RUN = "run-a"


def _metrics(rng, requests, reads, writes, window_s):
    """A recorder of one rank's window: `requests` requests, `reads` / `writes` storage operations."""
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
        m.count("cache_hits" if i % 4 else "cache_misses", end_ns=end - 1)
    m.close_window(end)
    return m


def _doc(m, rank, world, start, end, run_id=RUN, aligned=True, cap=200_000):
    """A rank's document with the blocks the merge reads, built by the single-run code."""
    summary = build_summary(m, {}, _qos(), "latency", None, 0.0, None, True)
    return {
        "schema_version": "kv-cache-results/1", "run_id": run_id, "world_size": world, **request_lists(m),
        "seed": 10 + rank, "summary": summary, **harness_keys(summary), "stop_reason": "duration",
        "measurement": {"window_seconds": m.window_seconds, "requests_issued": m.requests.completed,
                        "requests_failed": 0, "errors": 0,
                        "window_wallclock": {"start_unix": start, "end_unix": end, "barrier_aligned": aligned}},
        "latency_samples": latency_samples(m, cap), "recorder": m.state(), "time_series": time_series(m),
        "latency_histograms": latency_histograms(m),
        "summary_inputs": {"performance_profile": "latency", "kv_block_tokens": 0},
        "run_parameters": {"mpi_rank": rank, "mpi_world_size": world, "host": f"node{rank}"},
    }


def _qos():
    from kv_cache.settings.sections import BenchConfig

    return dict(BenchConfig().qos_profiles)


SIZES = [(50, 40, 10), (200, 400, 30), (17, 9, 3)]  # very different shapes and sizes per rank


def _ranks(aligned=True, cap=200_000, spans=None, sizes=SIZES):
    rng = np.random.default_rng(7)
    spans = spans or ([(1000.0, 1010.0)] * len(sizes) if aligned else [(1000.0, 1010.0), (1002.0, 1013.0),
                                                                        (1001.0, 1011.0)])
    recorders = [_metrics(rng, *n, window_s=spans[r][1] - spans[r][0]) for r, n in enumerate(sizes)]
    docs = [_doc(m, r, len(sizes), *spans[r], aligned=aligned, cap=cap) for r, m in enumerate(recorders)]
    return docs, recorders


def _union(recorders, get):
    return np.concatenate([get(m).array() for m in recorders]) / 1e6


def test_merged_percentiles_are_those_of_the_union():
    docs, recs = _ranks()
    m = merge_documents(docs)
    union_e2e = _union(recs, lambda r: r.requests.e2e_ns)
    union_read = _union(recs, lambda r: r.tier_op("storage", "read").device_ns)
    want = dict(zip(PERCENTILES, percentiles(union_e2e, list(PERCENTILES.values())), strict=True))
    got = m["latency_ms"]["end_to_end"]
    assert {k: got[k] for k in PERCENTILES} == pytest.approx(want, rel=1e-12)
    assert got["count"] == len(union_e2e) and got["mean"] == pytest.approx(union_e2e.mean())
    assert m["latency_ms"]["storage_read_device"]["p99"] == pytest.approx(np.percentile(union_read, 99))
    assert m["latency_ms"]["storage_read_device"]["method"] == EXACT
    assert m["summary"]["cache_stats"]["storage_read_device_p95_ms"] == pytest.approx(np.percentile(union_read, 95))
    assert m["summary"]["end_to_end_latency_ms"]["p95"] == pytest.approx(want["p95"])
    # not an average (nor a max) of the ranks' percentiles
    rank_p95 = [np.percentile(r.requests.e2e_ns.array() / 1e6, 95) for r in recs]
    assert got["p95"] != pytest.approx(np.mean(rank_p95))
    assert m["max_of_rank_p95_ms"]["end_to_end_latency"] == pytest.approx(max(rank_p95))


def test_the_merged_summary_is_the_single_run_summary_of_the_union():
    """One recorder holding every rank's operations gives the same summary as the merge of the ranks."""
    docs, recs = _ranks()
    merged = merge_documents(docs)["summary"]
    one = RunMetrics()
    one.open_window(0)
    for r in recs:
        one.absorb_state(r.state())
        for part in ("total", "device", "host"):
            for op in ("read", "write"):
                one.absorb_samples("storage", op, part, getattr(r.tier_op("storage", op), f"{part}_ns"))
        for name in ("e2e", "storage", "generation", "prefill", "decode"):
            one.absorb_request_samples(name, getattr(r.requests, f"{name}_ns"))
    one.close_window(int(10e9))
    single = build_summary(one, {}, _qos(), "latency", None, 0.0, None, True)
    health = merged["cache_stats"].pop("storage_health"), single["cache_stats"].pop("storage_health")
    assert merged["cache_stats"].keys() == single["cache_stats"].keys()
    numbers = {k for k, v in single["cache_stats"].items() if isinstance(v, (int, float))}
    assert {k: merged["cache_stats"][k] for k in numbers} == pytest.approx(
        {k: single["cache_stats"][k] for k in numbers}, rel=1e-12)
    assert {k: v for k, v in merged["cache_stats"].items() if k not in numbers} == {
        k: v for k, v in single["cache_stats"].items() if k not in numbers}  # e.g. rates_undefined_reason (None)
    assert health[0] == health[1]
    assert merged["qos_metrics"] == single["qos_metrics"]
    assert merged["total_requests"] == single["total_requests"] == 267


def test_ranks_that_dropped_samples_give_histogram_percentiles_with_their_precision():
    """cap=25: every rank keeps every k-th storage sample. The merge must not concatenate those
    subsamples (unequal strides weigh the ranks wrongly): its percentiles are the merged HdrHistograms',
    within their stated precision of the exact union."""
    docs, recs = _ranks(cap=25)
    assert {d["latency_samples"]["storage_read_device_ns"]["stride"] for d in docs} == {2, 16, 1}
    m = merge_documents(docs)
    block = m["latency_ms"]["storage_read_device"]
    assert block["method"] == FROM_HISTOGRAMS and f"{SIGNIFICANT_DIGITS} significant digits" in block["precision"]
    assert m["percentile_method"]["storage_read_device"] == FROM_HISTOGRAMS
    union = _union(recs, lambda r: r.tier_op("storage", "read").device_ns)
    assert block["count"] == len(union) == 449
    exact = dict(zip(PERCENTILES, percentiles(union, list(PERCENTILES.values())), strict=True))
    for key in ("p50", "p95", "p99"):
        nearest = union[np.argmin(np.abs(union - exact[key]))]  # HdrHistogram reports a recorded value's bucket
        assert block[key] == pytest.approx(nearest, rel=2 * 10.0 ** -SIGNIFICANT_DIGITS, abs=0.01)
    cs = m["summary"]["cache_stats"]
    assert cs["storage_read_device_p95_ms"] == pytest.approx(block["p95"])
    # the unweighted concatenation of the subsamples is visibly off: what the merge must not do
    subsample = np.concatenate([np.asarray(d["latency_samples"]["storage_read_device_ns"]["values"]) for d in docs])
    assert abs(np.percentile(subsample / 1e6, 95) - exact["p95"]) > 5 * abs(block["p95"] - exact["p95"])
    # the request lists are whole in every document: still exact
    assert m["latency_ms"]["end_to_end"]["method"] == EXACT
    assert "HdrHistograms" in merged_table(m)


def test_an_exact_cap_on_the_union_switches_to_the_histograms():
    docs, _ = _ranks()
    m = merge_documents(docs, exact_cap=100)
    assert m["latency_ms"]["storage_read_total"]["method"] == FROM_HISTOGRAMS
    assert m["latency_ms"]["storage_write_total"]["method"] == EXACT  # 43 writes: under the cap


def test_bandwidth_is_merged_bytes_over_the_common_window():
    docs, recs = _ranks(aligned=True)
    m = merge_documents(docs)
    w = m["window"]
    assert w["kind"] == "common (barrier-aligned)" and w["seconds"] == pytest.approx(10.0)
    assert w["start_spread_s"] == 0.0 and w["end_spread_s"] == 0.0 and w["overlap_seconds"] == pytest.approx(10.0)
    read_bytes = sum(r.tier_op("storage", "read").bytes for r in recs)
    assert m["totals"]["storage_read_bytes"] == read_bytes == 449 << 20
    assert m["bandwidth_gibps"]["storage_read"] == pytest.approx(read_bytes / GIB / 10)
    assert m["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(read_bytes / GIB / 10)
    assert m["sum_of_ranks"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(read_bytes / GIB / 10)


def test_unaligned_windows_use_their_union_and_say_so():
    docs, recs = _ranks(aligned=False)
    m = merge_documents(docs)
    w = m["window"]
    assert w["kind"] == "union of the ranks' windows" and w["seconds"] == pytest.approx(13.0)  # 1000 .. 1013
    assert w["start_spread_s"] == pytest.approx(2.0) and w["end_spread_s"] == pytest.approx(3.0)
    assert w["overlap_seconds"] == pytest.approx(8.0)


def test_barriers_do_not_make_far_apart_windows_common():
    """Barrier-aligned in each document, yet 30 s apart: not one common window, and it says so."""
    docs, _ = _ranks(spans=[(1000.0, 1010.0), (1030.0, 1040.0), (1060.0, 1070.0)])
    w = merge_documents(docs)["window"]
    assert w["kind"].startswith("union of the ranks' windows, which do not overlap") and w["seconds"] == 70.0


def test_per_rank_table_and_harness_keys():
    docs, recs = _ranks()
    m = merge_documents(list(reversed(docs)))
    assert [r["rank"] for r in m["per_rank"]] == [0, 1, 2]
    assert [r["requests"] for r in m["per_rank"]] == [50, 200, 17]
    assert [r["seed"] for r in m["per_rank"]] == [10, 11, 12]
    assert [r["host"] for r in m["per_rank"]] == ["node0", "node1", "node2"]
    assert "node2:" in merged_table(m)
    assert m["total_requests"] == 267 and m["run_id"] == RUN and m["world_size"] == 3
    assert m["p99_latency_ms"] == pytest.approx(np.percentile(_union(recs, lambda r: r.requests.e2e_ns), 99))
    assert len(m["time_series"]["rows"]) == 0 and m["missing_ranks"] == []


@pytest.mark.parametrize("change, words", [
    (lambda docs: docs[1].update(run_id="run-b"), "2 different runs (run run-a: "),
    (lambda docs: docs[2]["run_parameters"].update(mpi_rank=1), "rank 1 twice"),
    (lambda docs: docs.pop(1), "rank(s) 1 of 3 missing"),
    (lambda docs: docs[0].pop("recorder"), "no `recorder` block"),
])
def test_a_merge_refuses_ranks_that_are_not_one_complete_run(change, words):
    docs, _ = _ranks()
    change(docs)
    with pytest.raises(MergeError, match=re.escape(words)):
        merge_documents(docs)


def test_a_lost_rank_can_be_merged_when_asked_and_the_verdict_says_so():
    docs, _ = _ranks()
    m = merge_documents([docs[0], docs[2]], allow_missing=True)
    assert m["missing_ranks"] == [1] and m["overall_passed"] is False and m["ranks"] == 2
    assert "MISSING rank(s): 1" in merged_table(m)


def _write_ranks(folder, docs, stem="x"):
    for d in docs:
        (folder / f"{stem}_rank{d['run_parameters']['mpi_rank']}.json").write_text(dumps(d))


def test_merge_of_a_folder_with_three_runs_refuses_naming_them(tmp_path, capsys):
    for run in ("r1", "r2", "r3"):
        docs, _ = _ranks(sizes=SIZES[:2])
        for d in docs:
            d["run_id"] = run
        _write_ranks(tmp_path, docs, stem=run)
    assert main(["merge", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3 different runs" in err and all(f"run {r}:" in err for r in ("r1", "r2", "r3"))
    assert not (tmp_path / "kvcache_merged.json").exists()


def test_merge_reads_the_harness_layout_and_keeps_an_earlier_merge(tmp_path, capsys):
    docs, _ = _ranks()
    for d in docs:
        rank_dir = tmp_path / f"rank_{d['run_parameters']['mpi_rank']}"
        rank_dir.mkdir()
        (rank_dir / "kvcache_results_20260101_000000.json").write_text("{}")  # an older run: the newest wins
        (rank_dir / "kvcache_results_20260102_000000.json").write_text(dumps(d))
    files = find_rank_files([str(tmp_path)])
    assert [f.split("/")[-2] for f in files] == ["rank_0", "rank_1", "rank_2"]
    assert main(["merge", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "kvcache_merged.json").read_text())
    assert merged["schema_version"] == "kv-cache-merged/1" and merged["ranks"] == 3
    assert "rank" in capsys.readouterr().out
    assert main(["merge", str(tmp_path)]) == 0  # a second merge does not take the first one in ...
    assert json.loads((tmp_path / "kvcache_merged.json").read_text())["ranks"] == 3
    kept = json.loads((tmp_path / "kvcache_merged.json.1").read_text())  # ... and keeps it
    assert kept["ranks"] == 3 and "kept as" in capsys.readouterr().out


def test_merge_json_output_for_scripts(tmp_path, capsys):
    docs, _ = _ranks()
    _write_ranks(tmp_path, docs)
    out = tmp_path / "m.json"
    assert main(["merge", str(tmp_path), "--output", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == str(out) and printed["ranks"] == 3 and printed["run_id"] == RUN
    assert printed["summary"]["total_requests"] == 267 and len(printed["per_rank"]) == 3
    assert printed["percentile_method"]["end_to_end"] == EXACT


def test_report_of_a_merged_document_prints_the_report_and_the_rank_table(tmp_path, capsys):
    docs, _ = _ranks()
    path = tmp_path / "m.json"
    path.write_text(json.dumps(merge_documents(docs)))
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr()
    assert "STORAGE PERFORMANCE ASSESSMENT" in out.out and "Merged 3 rank(s)" in out.out
    assert "node1:" in out.out and "Traceback" not in out.err


@pytest.mark.parametrize("content", [None, "not json", "[1]", '{"summary": {}}'])
def test_merge_bad_input_is_one_line_exit_2(tmp_path, capsys, content):
    path = tmp_path / "x_rank0.json"
    if content is not None:
        path.write_text(content)
    assert main(["merge", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache merge: error:") and err.count("\n") == 1


def test_latency_samples_are_bounded_and_say_their_stride():
    metrics = RunMetrics()
    metrics.open_window(0)
    for i in range(1, 26):
        metrics.record_io("storage", "read", IOResult(4096, 4096, i * 10, i, i * 9), 1, "decode")
    s = latency_samples(metrics, cap=10)
    block = s["storage_read_total_ns"]
    assert block["count"] == 25 and block["stride"] == 3 and block["values"].tolist() == list(range(10, 260, 30))
    assert latency_samples(metrics)["storage_read_device_ns"]["values"].tolist() == list(range(1, 26))


def test_nothing_to_merge_raises():
    with pytest.raises(MergeError):
        merge_documents([])


# --- one shape for every writer of a merged document ---------------------------------------------------

def _criteria(m):
    return {c["name"]: c for c in m["summary"]["cache_stats"]["storage_health"]["criteria"]}


def test_every_merged_document_carries_the_verdict_keys():
    docs, _ = _ranks()
    m = merge_documents(docs)
    assert m["verdict"] in ("PASS", "FAIL") and m["verdict"] == ("PASS" if m["overall_passed"] else "FAIL")
    assert m["window_fraction"] == 1.0 and m["ranks_expected"] == 3
    assert m["missing_ranks"] == [] and m["lost_ranks"] == []


def test_a_missing_rank_is_incomplete_and_its_own_criterion_not_a_storage_error():
    docs, _ = _ranks()
    m = merge_documents([docs[0], docs[2]], allow_missing=True)
    assert m["verdict"] == INCOMPLETE and m["overall_passed"] is False
    assert m["missing_ranks"] == [1] and m["ranks_expected"] == 3
    assert m["lost_ranks"] == [{"rank": 1, "ended": UNKNOWN_END}]
    criteria = _criteria(m)
    assert criteria[STORAGE_STOP_CRITERION]["passed"] and criteria[STORAGE_STOP_CRITERION]["actual"] == "none"
    assert criteria[RANKS_CRITERION]["passed"] is False and "lost: [1]" in criteria[RANKS_CRITERION]["actual"]
    assert m["summary"]["cache_stats"]["storage_health"]["overall_status"] == INCOMPLETE
    # the writer says how each missing rank ended where it knows it
    told = merge_documents([docs[0], docs[2]], allow_missing=True, ended={1: "killed by SIGKILL"})
    assert told["lost_ranks"] == [{"rank": 1, "ended": "killed by SIGKILL"}]


def test_a_rank_cut_short_makes_the_merge_incomplete_with_the_lowest_fraction():
    docs, _ = _ranks()
    docs[1].update(verdict=INCOMPLETE, window_fraction=0.25, overall_passed=False)
    docs[0].update(verdict="PASS", window_fraction=1.0)
    m = merge_documents(docs)
    assert m["verdict"] == INCOMPLETE and m["window_fraction"] == 0.25 and m["missing_ranks"] == []
    assert _criteria(m)["Measured Window Completed"]["passed"] is False
    assert [r["verdict"] for r in m["per_rank"]] == ["PASS", INCOMPLETE, None]


def test_a_window_is_common_only_when_barriers_opened_and_closed_every_ranks_window():
    docs, _ = _ranks()
    docs[0]["measurement"]["notes"] = ["another rank ended before the window's closing barrier (lost): ..."]
    w = merge_documents([docs[0], docs[2]], allow_missing=True)["window"]
    assert not w["kind"].startswith("common")
    assert "rank(s) 1 missing" in w["kind"] and "closing barrier broke on rank(s) 0" in w["kind"]
    assert w["barriers"] == {"opened_and_closed_every_window": False, "closing_broke_on": [0],
                             "not_barrier_aligned": []}
    docs, _ = _ranks()
    assert not merge_documents(docs[:2], allow_missing=True)["window"]["kind"].startswith("common")
    assert merge_documents(docs)["window"]["barriers"]["opened_and_closed_every_window"] is True


def _split(rank, world, totals):
    shares = {k: v / world if isinstance(v, float) else v // world for k, v in totals.items()}
    return {"flags_given_as": "totals", "ranks": world, "host_ranks": world, "totals": totals,
            "rank_share": {**shares, "seed": totals["seed"] + rank}}


def test_merged_run_parameters_are_the_runs_totals_with_the_shares_under_settings_split():
    docs, _ = _ranks(sizes=SIZES[:2])
    totals = {"num_users": 4, "request_rate": 2.0, "cpu_mem_gb": 1000.0, "gpu_mem_gb": 0.0,
              "storage_capacity_gb": 0.0, "max_requests": 0, "precondition_size_gb": 0.0, "rag_num_docs": 10,
              "seed": 42}
    for r, d in enumerate(docs):
        d["run_parameters"].update(num_users=2, request_rate=1.0, cpu_mem_gb=500.0, seed=42 + r, rag_num_docs=None,
                                   cpu_mem_gb_effective=20.0, settings_split=_split(r, 2, totals))
    m = merge_documents(docs)
    p = m["run_parameters"]
    assert (p["num_users"], p["request_rate"], p["cpu_mem_gb"], p["seed"]) == (4, 2.0, 1000.0, 42)
    assert p["mpi_world_size"] == 2 and p["cpu_mem_gb_effective"] == 40.0
    assert p["rag_num_docs"] is None  # (RAG off: no number to total)
    assert m["settings_split"]["totals"] == totals
    assert [s["num_users"] for s in m["settings_split"]["rank_shares"]] == [2, 2]


def test_the_merged_measurement_carries_the_ranks_facts_and_the_report_prints_them():
    docs, _ = _ranks(sizes=SIZES[:2])
    for r, d in enumerate(docs):
        d["measurement"].update(run_dir=f"/data/rank{r}/run", filesystem="xfs", filesystem_kind="block device",
                                io_mode="direct", chunk_bytes=4 << 20, fsync=True, io_workers=8, timed="syscalls",
                                block_device={"name": "nvme0n1", "bytes_read": 1, "tool_bytes_read": 1,
                                              "bytes_written": 1, "tool_bytes_written": 1},
                                process_cpu_seconds=1.5, achieved_queue_depth={"read": 2.0, "write": 1.0})
    m = merge_documents(docs)
    meas = m["measurement"]
    assert meas["chunk_bytes"] == 4 << 20 and meas["io_mode"] == "direct" and meas["filesystem"] == "xfs"
    assert meas["run_dir"] is None and [r["run_dir"] for r in meas["per_rank"]] == ["/data/rank0/run",
                                                                                  "/data/rank1/run"]
    assert meas["block_device"] == {"name": "nvme0n1"} and meas["process_cpu_seconds"] == 3.0
    assert meas["achieved_queue_depth"] == {"read": 4.0, "write": 2.0}
    text = "\n".join(report_lines(m))
    assert "streamed in 4 MiB chunks" in text
    assert "Storage tier (rank 0): /data/rank0/run on xfs (block device filesystem; block device: nvme0n1)" in text
    assert "Storage tier (rank 1): /data/rank1/run on xfs" in text
    assert "  I/O: direct (O_DIRECT), 4 MiB chunks, fdatasync per entry: True, 8 I/O workers" in text
    docs[1]["measurement"]["io_mode"] = "buffered"
    text = "\n".join(report_lines(merge_documents(docs)))
    assert "  I/O (rank 0): direct (O_DIRECT)" in text and "  I/O (rank 1): buffered" in text


def test_merge_allow_missing_ranks_says_incomplete(tmp_path, capsys):
    docs, _ = _ranks()
    _write_ranks(tmp_path, [docs[0], docs[2]])
    assert main(["merge", str(tmp_path), "--allow-missing-ranks", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"] == INCOMPLETE and printed["missing_ranks"] == [1] and printed["ranks_expected"] == 3
    assert printed["lost_ranks"] == [{"rank": 1, "ended": UNKNOWN_END}]
    assert main(["merge", "--help"]) == 0
    assert "verdict INCOMPLETE" in " ".join(capsys.readouterr().out.split())


def test_merge_of_one_merged_document_shows_it_and_of_disjoint_merges_merges_their_ranks(tmp_path, capsys):
    docs, _ = _ranks()
    _write_ranks(tmp_path, docs)
    rank = [str(tmp_path / f"x_rank{r}.json") for r in range(3)]
    assert main(["merge", rank[0], rank[1], "--allow-missing-ranks", "--output", str(tmp_path / "a.json")]) == 0
    assert main(["merge", rank[2], "--allow-missing-ranks", "--output", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    # one merged document alone: shown as it is, nothing written
    assert main(["merge", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Merged 2 rank(s)") and "MISSING rank(s): 2" in out
    assert not (tmp_path / "kvcache_merged.json").exists()
    assert main(["merge", str(tmp_path / "a.json"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(tmp_path / "a.json") and shown["verdict"] == INCOMPLETE
    # merges of disjoint rank sets of one run: merged again from their rank files, complete
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["ranks"] == 3 and both["missing_ranks"] == [] and both["verdict"] != INCOMPLETE
    whole = json.loads((tmp_path / "kvcache_merged.json").read_text())
    assert whole["summary"] == merge_documents(docs)["summary"]
    # merges that name the same rank files take each file once; a rank file that is gone is named
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "kvcache_merged.json")]) == 0
    (tmp_path / "x_rank2.json").unlink()
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "x_rank2.json is gone" in capsys.readouterr().err
