"""Every rate key of a results document is a number, even for a window under a second (the harness's
aggregator adds them up: one null killed the whole run). An undefined rate is 0.0 and
`rates_undefined_reason` says why."""

from __future__ import annotations

import json

from test_merge import _ranks

from kv_cache.results.merge import merge_documents
from kv_cache.results.write import dumps

RATE_SUFFIXES = ("_gbps", "_gibps", "_mbps", "_per_sec", "_per_second", "_req_per_sec")


def _rate_values(node, path=""):
    """(path, value) of every rate key anywhere in `node` (bandwidths, throughputs, per-second rates)."""
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{path}.{k}"
            if isinstance(k, str) and k.endswith(RATE_SUFFIXES) and not isinstance(v, (dict, list)):
                yield where, v
            yield from _rate_values(v, where)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _rate_values(v, f"{path}[{i}]")


def _short_ranks():
    return _ranks(spans=[(1000.0, 1000.4)] * 3)[0]


def test_rank_documents_of_a_short_window_hold_numbers():
    for doc in _short_ranks():
        found = dict(_rate_values(json.loads(dumps(doc))))
        assert len(found) > 15
        assert {p: v for p, v in found.items() if not isinstance(v, (int, float)) or isinstance(v, bool)} == {}
        assert doc["summary"]["rates_undefined_reason"].startswith("window 0.4 s is under 1 s")
        assert doc["throughput_req_per_sec"] == 0.0 and doc["storage_throughput_mbps"] == 0.0


def test_the_merge_of_short_windows_holds_numbers_and_says_why():
    merged = json.loads(json.dumps(merge_documents(_short_ranks())))
    found = dict(_rate_values(merged))
    assert {p: v for p, v in found.items() if not isinstance(v, (int, float)) or isinstance(v, bool)} == {}
    assert merged["summary"]["rates_undefined_reason"].startswith("window 0.4 s is under 1 s")
    assert merged["summary"]["cache_stats"]["rates_undefined_reason"] == merged["summary"]["rates_undefined_reason"]


def test_a_long_window_has_no_reason():
    docs, _ = _ranks()
    assert merge_documents(docs)["summary"]["rates_undefined_reason"] is None
