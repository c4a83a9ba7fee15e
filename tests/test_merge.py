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
from kv_cache.results.merge import (
    EXACT,
    FROM_HISTOGRAMS,
    MergeError,
    find_rank_files,
    merge_documents,
    merged_table,
)
from kv_cache.results.samples import latency_samples
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.results.summary import build_summary, harness_keys, request_lists
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
    return np.concatenate([np.frombuffer(get(m), dtype=np.int64) for m in recorders]) / 1e6


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
    rank_p95 = [np.percentile(np.frombuffer(r.requests.e2e_ns, dtype=np.int64) / 1e6, 95) for r in recs]
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
    assert merged["cache_stats"] == pytest.approx(single["cache_stats"], rel=1e-12)
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
        (folder / f"{stem}_rank{d['run_parameters']['mpi_rank']}.json").write_text(json.dumps(d))


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
        (rank_dir / "kvcache_results_20260102_000000.json").write_text(json.dumps(d))
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
    assert block["count"] == 25 and block["stride"] == 3 and block["values"] == list(range(10, 260, 30))
    assert latency_samples(metrics)["storage_read_device_ns"]["values"] == list(range(1, 26))


def test_nothing_to_merge_raises():
    with pytest.raises(MergeError):
        merge_documents([])
