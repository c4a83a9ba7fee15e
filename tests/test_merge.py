"""The merge of per-rank results: exact percentiles of the union, bandwidth over the common window, the table."""

import json

import numpy as np
import pytest

from kv_cache.cli import main
from kv_cache.metrics.recorder import GIB, PERCENTILES, RunMetrics
from kv_cache.metrics.stats import percentiles
from kv_cache.report.merge import MergeError, find_rank_files, merge_documents, merged_table
from kv_cache.report.samples import latency_samples
from kv_cache.storage.base import IOResult


def _doc(rank, e2e_s, read_ns, read_gib, write_gib, start, end, aligned=True, p95=None):
    """A per-rank document with just the keys the merge reads."""
    window = end - start
    return {
        "schema_version": "kv-cache-results/1", "seed": 10 + rank, "requests_completed": len(e2e_s),
        "total_tokens_generated": 100 * len(e2e_s), "total_storage_io_latency": float(sum(e2e_s)) / 2,
        "end_to_end_latencies": [float(x) for x in e2e_s], "storage_latencies": [float(x) / 2 for x in e2e_s],
        "generation_latencies": [0.0] * len(e2e_s), "overall_passed": rank != 1,
        "latency_samples": {"unit": "ns", "storage_read_device_ns": {"values": [int(x) for x in read_ns], "count": len(read_ns),
                                                                      "stride": 1}},
        "summary": {"avg_throughput_tokens_per_sec": 100 * len(e2e_s) / window,
                    "storage_throughput_tokens_per_sec": 1.0,
                    "end_to_end_latency_ms": {"p95": p95 if p95 is not None else float(np.percentile(e2e_s, 95)) * 1e3},
                    "storage_io_latency_ms": {"p95": 1.0 + rank},
                    "cache_stats": {"tier_storage_kv_bytes_read_gb": read_gib, "tier_storage_kv_bytes_written_gb": write_gib,
                                    "tier_storage_read_bandwidth_gbps": read_gib / window,
                                    "tier_storage_write_bandwidth_gbps": write_gib / window,
                                    "storage_read_device_p95_ms": float(np.percentile(read_ns, 95)) / 1e6,
                                    "cache_hits": 3, "cache_misses": 1}},
        "measurement": {"window_seconds": window, "requests_issued": len(e2e_s), "requests_failed": 0, "errors": 0,
                        "window_wallclock": {"start_unix": start, "end_unix": end, "barrier_aligned": aligned}},
        "run_parameters": {"mpi_rank": rank, "host": f"node{rank}"},
    }


def _ranks(aligned=True):
    rng = np.random.default_rng(7)
    e2e = [rng.lognormal(-3, 1, n) for n in (50, 200, 17)]  # very different shapes and sizes
    reads = [rng.integers(1_000_000, 90_000_000, n) for n in (40, 400, 9)]
    spans = [(1000.0, 1010.0), (1000.0, 1010.0), (1000.0, 1010.0)] if aligned else \
            [(1000.0, 1010.0), (1002.0, 1013.0), (1001.0, 1011.0)]
    docs = [_doc(r, e2e[r], reads[r], 1.0 + r, 0.5, *spans[r], aligned=aligned) for r in range(3)]
    return docs, e2e, reads


def test_merged_percentiles_are_those_of_the_union():
    docs, e2e, reads = _ranks()
    m = merge_documents(docs)
    union_e2e = np.concatenate(e2e) * 1e3
    union_read = np.concatenate(reads) / 1e6
    want = dict(zip(PERCENTILES, percentiles(union_e2e, list(PERCENTILES.values())), strict=True))
    got = m["latency_ms"]["end_to_end"]
    assert {k: got[k] for k in PERCENTILES} == pytest.approx(want, rel=1e-12)
    assert got["count"] == len(union_e2e) and got["mean"] == pytest.approx(union_e2e.mean())
    assert m["latency_ms"]["storage_read_device"]["p99"] == pytest.approx(np.percentile(union_read, 99))
    assert m["summary"]["cache_stats"]["storage_read_device_p95_ms"] == pytest.approx(np.percentile(union_read, 95))
    # not an average (nor a max) of the ranks' percentiles
    rank_p95 = [np.percentile(x * 1e3, 95) for x in e2e]
    assert got["p95"] != pytest.approx(np.mean(rank_p95))
    assert m["max_of_rank_p95_ms"]["end_to_end_latency"] == pytest.approx(max(rank_p95))
    assert m["max_of_rank_p95_ms"]["storage_io_latency"] == 3.0


def test_bandwidth_is_merged_bytes_over_the_common_window():
    docs, _, _ = _ranks(aligned=True)
    m = merge_documents(docs)
    assert m["window"]["kind"] == "common (barrier-aligned)" and m["window"]["seconds"] == pytest.approx(10.0)
    assert m["totals"]["storage_read_bytes"] == int(6.0 * GIB)
    assert m["bandwidth_gibps"]["storage_read"] == pytest.approx(0.6)
    assert m["bandwidth_gibps"]["storage_write"] == pytest.approx(0.15)
    assert m["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(0.6)
    assert m["storage_throughput_mbps"] == pytest.approx(0.75 * GIB / 1e6)
    assert m["sum_of_ranks"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(0.6)  # aligned: the same


def test_unaligned_windows_use_their_union_and_say_so():
    docs, _, _ = _ranks(aligned=False)
    m = merge_documents(docs)
    assert m["window"]["kind"] == "union of the ranks' windows"
    assert m["window"]["seconds"] == pytest.approx(13.0)  # 1000 .. 1013
    assert m["bandwidth_gibps"]["storage_read"] == pytest.approx(6.0 / 13.0)
    # the harness's sum of rates over different windows overstates it
    assert m["sum_of_ranks"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(1 / 10 + 2 / 11 + 3 / 10)


def test_per_rank_table_and_harness_keys():
    docs, e2e, _ = _ranks()
    m = merge_documents(list(reversed(docs)))
    assert [r["rank"] for r in m["per_rank"]] == [0, 1, 2]
    assert [r["requests"] for r in m["per_rank"]] == [50, 200, 17]
    assert [r["seed"] for r in m["per_rank"]] == [10, 11, 12]
    assert [r["host"] for r in m["per_rank"]] == ["node0", "node1", "node2"]  # which host each rank ran on
    assert "node2:" in merged_table(m)
    assert m["per_rank"][2]["storage_read_gibps"] == pytest.approx(0.3)
    assert m["total_requests"] == 267 and m["overall_passed"] is False  # rank 1 failed
    assert m["cache_hit_rate"] == pytest.approx(0.75)
    assert m["p99_latency_ms"] == pytest.approx(np.percentile(np.concatenate(e2e) * 1e3, 99))


def test_latency_samples_are_bounded_and_say_their_stride():
    metrics = RunMetrics()
    metrics.open_window(0)
    for i in range(1, 26):
        metrics.record_io("storage", "read", IOResult(4096, 4096, i * 10, i, i * 9), 1, "decode")
    s = latency_samples(metrics, cap=10)
    block = s["storage_read_total_ns"]
    assert block["count"] == 25 and block["stride"] == 3 and block["values"] == list(range(10, 260, 30))
    assert latency_samples(metrics)["storage_read_device_ns"]["values"] == list(range(1, 26))


def test_merge_reads_the_harness_layout_and_writes_one_document(tmp_path, capsys):
    docs, _, _ = _ranks()
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
    assert main(["merge", str(tmp_path)]) == 0  # a second merge does not take the first one in
    assert json.loads((tmp_path / "kvcache_merged.json").read_text())["ranks"] == 3


@pytest.mark.parametrize("content", [None, "not json", "[1]"])
def test_merge_bad_input_is_one_line_exit_2(tmp_path, capsys, content):
    path = tmp_path / "x_rank0.json"
    if content is not None:
        path.write_text(content)
    assert main(["merge", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache merge: error:") and err.count("\n") == 1


def test_nothing_to_merge_raises():
    with pytest.raises(MergeError):
        merge_documents([])
