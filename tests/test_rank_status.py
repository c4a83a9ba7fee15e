"""Each rank's document says whether it counts (`rank_status`: complete / incomplete / failed, with
`rank_status_reason`), and a merged document lists the ranks that should not be averaged."""

from __future__ import annotations

import json

import pytest
from test_merge import _ranks

from kv_cache.benchmarks.standard.run import execute
from kv_cache.results.merge import merge_documents
from kv_cache.results.verdict import (
    STORAGE_STOP_CRITERION,
    WINDOW_CRITERION,
    mark_incomplete,
    mark_missing_ranks,
    mark_storage_stop,
    rank_status,
)


def _doc(passed=True, criteria=()):
    return {"overall_passed": passed, "verdict": "PASS" if passed else "FAIL", "window_fraction": 1.0,
            "summary": {"cache_stats": {"storage_health": {"criteria": [
                {"name": STORAGE_STOP_CRITERION, "actual": "none", "passed": True}, *criteria]}}}}


def test_a_passing_whole_window_is_complete():
    assert rank_status(_doc()) == ("complete", "window measured to its end, verdict PASS")


def test_a_fail_verdict_is_failed_naming_the_criteria():
    doc = _doc(False, [{"name": "Storage Read Device P95 < 500 ms", "passed": False}])
    assert rank_status(doc) == ("failed", "verdict FAIL: Storage Read Device P95 < 500 ms")


def test_a_cut_window_is_incomplete_with_the_fraction():
    doc = _doc()
    mark_incomplete(doc, 0.25, "interrupted")
    status, reason = rank_status(doc)
    assert status == "incomplete" and reason == "measured window incomplete: 25% (interrupted)"
    assert any(c["name"] == WINDOW_CRITERION for c in doc["summary"]["cache_stats"]["storage_health"]["criteria"])


def test_a_storage_stop_is_failed_even_when_incomplete():
    doc = _doc()
    mark_storage_stop(doc, "ENOSPC writing entry x")
    mark_incomplete(doc, 0.0, "storage error before the window")
    assert rank_status(doc) == ("failed", "stopped by a storage error: ENOSPC writing entry x")


def _statuses(docs, statuses):
    for doc, st in zip(docs, statuses, strict=True):
        doc["rank_status"], doc["rank_status_reason"] = st
    return docs


def test_the_merge_lists_the_ranks_not_to_average():
    docs, _ = _ranks()
    _statuses(docs, [("complete", "ok"), ("failed", "verdict FAIL: x"), ("incomplete", "measured window incomplete")])
    merged = json.loads(json.dumps(merge_documents(docs)))
    assert merged["ranks_not_to_average"] == [
        {"rank": 1, "status": "failed", "reason": "verdict FAIL: x"},
        {"rank": 2, "status": "incomplete", "reason": "measured window incomplete"}]
    assert [r["rank_status"] for r in merged["per_rank"]] == ["complete", "failed", "incomplete"]


def test_missing_ranks_are_not_to_average_with_how_they_ended():
    docs, _ = _ranks()
    _statuses(docs, [("complete", "ok")] * 3)
    merged = merge_documents([docs[0], docs[2]], allow_missing=True)
    assert [(x["rank"], x["status"]) for x in merged["ranks_not_to_average"]] == [(1, "missing")]
    mark_missing_ranks(merged, [1], 3, {1: "killed by SIGKILL"})
    assert merged["ranks_not_to_average"] == [{"rank": 1, "status": "missing",
                                               "reason": "no results document: killed by SIGKILL"}]


def test_documents_before_rank_status_get_it_from_their_verdict():
    docs, _ = _ranks()
    for d in docs:
        d.pop("rank_status", None)
    merged = merge_documents(docs)
    assert {r["rank_status"] for r in merged["per_rank"]} <= {"complete", "failed"}
    assert all(("rank" in x and x["status"] != "complete") for x in merged["ranks_not_to_average"])


@pytest.mark.slow  # a real run (wall clock)
def test_a_real_rank_document_says_whether_it_counts(quick_settings, sink, tmp_path):
    execute(quick_settings(), out=sink)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["rank_status"] in ("complete", "failed") and doc["rank_status_reason"]
    assert (doc["rank_status"] == "complete") == (doc["verdict"] == "PASS")


def test_the_merged_table_says_which_ranks_not_to_average():
    from kv_cache.render.merged_table import merged_table  # noqa: PLC0415

    docs, _ = _ranks()
    _statuses(docs, [("complete", "ok"), ("failed", "verdict FAIL: x"), ("complete", "ok")])
    text = merged_table(merge_documents(docs))
    assert text.rstrip().splitlines()[-1] == "  not to average: rank 1 failed: verdict FAIL: x"
    _statuses(docs, [("complete", "ok")] * 3)
    assert "not to average" not in merged_table(merge_documents(docs))
