"""A results document built in this process holds its per-request and per-operation lists as numpy arrays
(results/summary.py `_seconds`, results/samples.py, the recorder's `state()`), not as Python numbers: both
writers write the same bytes as the lists did, a document's build holds no Python object per value (a
periodic document every 10 s grew Python's small-object arenas: the 1-hour soak's RSS slope), and a merge
reads array-bearing documents as it reads the files."""

from __future__ import annotations

import copy
import gc
import json
import sys

import numpy as np
import pytest
from test_merge import _doc, _metrics, _ranks

from kv_cache.metrics.reservoir import SAMPLE_CAP, LatencySamples
from kv_cache.results.integrity import audit_facts, facts_from_ours
from kv_cache.results.merge import merge_documents
from kv_cache.results.mlperf_tool import rank_view
from kv_cache.results.samples import latency_samples
from kv_cache.results.summary import request_lists
from kv_cache.results.write import dumps, replace_document, write_json_atomic

REQUEST_LISTS = {"end_to_end_latencies": "e2e_ns", "storage_latencies": "storage_ns",
                 "generation_latencies": "generation_ns", "prefill_latencies": "prefill_ns",
                 "decode_latencies": "decode_ns"}
EDGES = [0, 1, 7, 999, 999_999_999, 10**9, 10**9 + 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 + 12345]


def _reservoir(rng, n: int) -> LatencySamples:
    """`n` latencies (ns, 1 us to ~100 s, and the edge values above) in a list of the run's cap: past it,
    a reservoir."""
    s = LatencySamples(SAMPLE_CAP)
    s.extend(EDGES)
    s.extend(rng.lognormal(15, 3, n - len(EDGES)).astype(np.int64).clip(1, 10**14).tolist())
    return s


def _recorder_doc(rng, over_cap: bool = True):
    """A rank's document (tests/test_merge.py `_doc`) whose e2e and storage-read lists hold 200,006 values
    (past the 200,000 cap) when `over_cap`, and the same document as the list path built it."""
    m = _metrics(rng, 300, 200, 50, 5.0)
    if over_cap:
        m.requests.e2e_ns = _reservoir(rng, SAMPLE_CAP + 6)
        m.io[("storage", "read")].device_ns = _reservoir(rng, SAMPLE_CAP + 6)
    doc = _doc(m, 0, 1, 1000.0, 1005.0)
    return doc, _as_lists(doc, m)


def _as_lists(doc, m):
    """`doc` with every array replaced by what the list path made of the same recorder."""
    old = copy.deepcopy(doc)
    for key, name in REQUEST_LISTS.items():
        old[key] = [x / 1e9 for x in getattr(m.requests, name).values]
    for key, block in old["latency_samples"].items():
        if isinstance(block, dict):
            tier, op, part, _ = key.split("_")
            held = getattr(m.tier_op(tier, op), f"{part}_ns").values
            step = max(1, -(-len(held) // old["latency_samples"]["cap"]))
            block["values"] = held[::step].tolist() if step > 1 else held.tolist()
    old["recorder"]["qos_e2e_ns"] = {level: v.values.tolist() for level, v in sorted(m.qos_e2e_ns.items())}
    if isinstance(old.get("time_series"), dict):  # the list path made a list of dicts
        old["time_series"]["rows"] = list(old["time_series"]["rows"])
    assert not _arrays(old)
    return old


def _arrays(node) -> list:
    if isinstance(node, np.ndarray):
        return [node]
    if isinstance(node, dict):
        return [a for v in node.values() for a in _arrays(v)]
    if isinstance(node, list):
        return [a for v in node for a in _arrays(v)]
    return []


def test_the_lists_are_arrays_of_the_values_the_lists_held():
    doc, old = _recorder_doc(np.random.default_rng(1))
    for key in REQUEST_LISTS:
        assert isinstance(doc[key], np.ndarray) and doc[key].dtype == np.float64
        assert doc[key].tolist() == old[key]
    assert len(doc["end_to_end_latencies"]) == SAMPLE_CAP
    assert doc["latency_samples"]["storage_read_device_ns"]["values"].dtype == np.int64
    assert len(_arrays(doc)) >= len(REQUEST_LISTS) + 6 + 3  # the request lists, the op lists, the QoS lists


@pytest.mark.parametrize("over_cap", [True, False])
def test_both_writers_write_the_bytes_of_the_list_path(tmp_path, over_cap):
    """The final writer (json, indented) and the periodic one (orjson): the document with arrays and the
    same document with the lists the old code made give the same file, byte for byte."""
    doc, old = _recorder_doc(np.random.default_rng(2), over_cap)
    for write in (write_json_atomic, replace_document):
        a, b = tmp_path / f"{write.__name__}_arrays.json", tmp_path / f"{write.__name__}_lists.json"
        write(a, doc)
        write(b, old)
        assert a.read_bytes() == b.read_bytes(), write.__name__
    assert dumps(doc) == json.dumps(old, allow_nan=False)
    back = json.loads((tmp_path / "replace_document_arrays.json").read_bytes())
    assert back["end_to_end_latencies"] == old["end_to_end_latencies"]  # (every float round-trips)


def test_an_empty_run_writes_empty_lists(tmp_path):
    from kv_cache.metrics.recorder import RunMetrics

    lists = request_lists(RunMetrics())
    for write in (write_json_atomic, replace_document):
        write(tmp_path / "e.json", lists)
        back = json.loads((tmp_path / "e.json").read_text())
        assert all(back[k] == [] for k in REQUEST_LISTS)


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


def test_a_documents_lists_hold_no_python_object_per_value(tmp_path):
    """The blocks of Python's small-object allocator that a built document holds, and those left after N
    builds and writes, do not grow with its lists' lengths (the list path held one float or int per value:
    about 200,000 blocks here)."""
    rng = np.random.default_rng(3)
    m = _metrics(rng, 20_000, 20_000, 5_000, 5.0)

    def build():
        return {**request_lists(m), "latency_samples": latency_samples(m), "recorder": m.state()}

    build()  # (first-call caches)
    before = _blocks()
    doc = build()
    held = _blocks() - before
    assert held < 2_000, held
    old = _as_lists(doc, m)
    assert _blocks() - before > 100_000  # the measure sees the list path's numbers (of 255,000 values)
    del old, doc
    before = _blocks()
    for i in range(10):
        d = build()
        replace_document(tmp_path / "p.json", d)
        if i % 5 == 0:
            write_json_atomic(tmp_path / "f.json", d)
        del d
    assert abs(_blocks() - before) < 500


def test_a_merge_of_documents_with_arrays_is_the_merge_of_their_files():
    docs, _ = _ranks()
    assert _arrays(docs[0])
    from_files = [json.loads(dumps(d)) for d in docs]
    assert not _arrays(from_files[0])
    assert json.loads(dumps(merge_documents(docs))) == json.loads(dumps(merge_documents(from_files)))


def test_the_readers_of_the_lists_take_an_array_as_the_list_it_stands_for():
    doc, old = _recorder_doc(np.random.default_rng(4), over_cap=False)
    facts, facts_old = facts_from_ours(doc), facts_from_ours(json.loads(json.dumps(old)))
    assert facts.e2e_max_s == facts_old.e2e_max_s == max(old["end_to_end_latencies"])
    assert audit_facts(facts) == audit_facts(facts_old)
    bare = {k: doc[k] for k in ("requests_completed", "total_storage_io_latency", "end_to_end_latencies",
                                "storage_latencies")}
    assert rank_view(bare).latencies_s("storage_latencies") == old["storage_latencies"]


def test_reserved_rows_and_their_copy_read_back_as_appended_past_the_reserve_too():
    """A run's time series allocates its rows' figures up front (metrics/timeseries.py RESERVED) and a
    snapshot copies them compactly (no dict per row): both read back the rows appended, in order, ints as
    ints, a row that does not fit kept as it is."""
    from kv_cache.metrics.timeseries import Rows, TimeSeries

    rng = np.random.default_rng(5)
    rows = [{"t_s": float(i), "seconds": 1.0, "requests": int(i), "storage_read_gibps": float(rng.random()),
             **({"extra": 3} if i % 7 == 0 else {})} for i in range(300)]
    rows[11]["storage_read_p95_ms"] = None  # (an odd row, kept as it is)
    for reserve in (0, 10, 4 * 300, 10_000):
        kept = Rows(reserve=reserve)
        for i, row in enumerate(rows):
            kept.append(row)
            if i == 150:
                half = kept.copy()
        assert list(kept) == rows and list(half) == rows[:151] and json.dumps(list(kept)) == json.dumps(rows)
        half.append(rows[0])  # a copy is its own
        assert len(kept) == len(rows) and list(half)[-1] == rows[0]
    series = TimeSeries()
    for row in rows[:20]:
        series.rows.append(row)
    snap = series.snapshot()
    series.rows.append(rows[20])
    assert isinstance(snap.rows, Rows) and list(snap.rows) == rows[:20] and len(series.rows) == 21


def test_a_built_document_holds_copies_and_the_lists_go_on_growing():
    """The arrays are the document's own: a list that grows as it fills (a merge's, past the run's cap)
    can still be appended to while a document built from it lives, and the document does not change."""
    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.storage.base import IOResult

    m = RunMetrics(sample_cap=SAMPLE_CAP * 2)  # (not allocated whole: it grows)
    m.open_window(0)
    for i in range(50):
        m.record_request("interactive", 1, 1000 + i, 10, 0, None, None, 1, 1)
        m.record_io("storage", "read", IOResult(4096, 4096, 100 + i, 90 + i, 10), 1, "decode")
    doc = {**request_lists(m), "latency_samples": latency_samples(m), "recorder": m.state()}
    text = dumps(doc)
    for i in range(50):
        m.record_request("interactive", 1, 5000 + i, 10, 0, None, None, 1, 1)
        m.record_io("storage", "read", IOResult(4096, 4096, 500 + i, 490 + i, 10), 1, "decode")
    assert dumps(doc) == text and len(m.requests.e2e_ns) == 100


def test_the_periodic_writer_writes_its_large_arrays_one_at_a_time_with_the_bytes_of_one_dump(tmp_path):
    """replace_document serialises each large array apart (results/write.py `_orjson_pieces`): the file is
    the bytes of one orjson.dumps of the whole, whatever the arrays' place, size, dtype or layout, and the
    caller's document is left as it was."""
    import orjson

    from kv_cache.results.write import PIECE_VALUES, _orjson_pieces

    rng = np.random.default_rng(6)
    big = rng.random(PIECE_VALUES * 3)
    doc = {"a": big, "small": rng.random(5), "n": {"deep": {"ints": np.arange(PIECE_VALUES, dtype=np.int64),
                                                             "x": 1}, "rows": [{"t": 1.5}]},
           "strided": np.arange(PIECE_VALUES * 4, dtype=np.int64)[::2], "empty": np.zeros(0), "s": "@kv-cache-array-"}
    before = {k: v for k, v in doc.items()}
    want = orjson.dumps({**doc, "strided": doc["strided"].tolist()}, option=orjson.OPT_SERIALIZE_NUMPY
                        | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    assert len(_orjson_pieces(doc)) == 2 * 3 + 1  # (a, deep ints, strided)
    n = replace_document(tmp_path / "p.json", doc)
    assert (tmp_path / "p.json").read_bytes() == want and n == len(want)
    assert doc.keys() == before.keys() and all(doc[k] is before[k] for k in doc)
    assert doc["n"]["deep"]["ints"] is before["n"]["deep"]["ints"]


def test_a_time_series_is_written_a_slice_of_rows_at_a_time_with_the_bytes_of_its_list(tmp_path, monkeypatch):
    """The time series' rows (a compact Rows, results/series.py) are serialised PIECE_ROWS at a time by the
    periodic writer, and both writers give the bytes of the list of dicts the old code held: more rows than
    a slice, two row shapes, an odd row (a non-number) and a row after it."""
    from kv_cache.metrics.timeseries import Rows
    from kv_cache.results import write as write_mod

    rng = np.random.default_rng(5)
    rows_list = []
    for i in range(2 * write_mod.PIECE_ROWS + 37):
        row = {"t_s": float(i + 1), "seconds": 1.0, "requests": int(rng.integers(0, 500)),
               "storage_read_bytes": int(rng.integers(0, 1 << 40)), "storage_read_gibps": float(rng.random())}
        if i % 3 == 0:
            row["storage_read_p95_ms"] = float(rng.random() * 10)
        if i == 300:
            row["note"] = "odd"
        rows_list.append(row)
    doc = {"schema_version": "x", "time_series": {"bucket_seconds": 1.0, "rows": Rows(rows_list)}, "z": [1, 2]}
    listed = {**doc, "time_series": {"bucket_seconds": 1.0, "rows": rows_list}}
    sizes = []
    real = Rows.__getitem__
    monkeypatch.setattr(Rows, "__getitem__", lambda self, i: sizes.append(len(real(self, i))) or real(self, i)
                        if isinstance(i, slice) else real(self, i))
    for write in (write_json_atomic, replace_document):
        a, b = tmp_path / f"{write.__name__}_rows.json", tmp_path / f"{write.__name__}_list.json"
        write(a, doc)
        write(b, listed)
        assert a.read_bytes() == b.read_bytes(), write.__name__
    assert sizes and max(sizes) <= write_mod.PIECE_ROWS  # the periodic writer's slices
    assert dumps(doc) == json.dumps(listed, allow_nan=False)
    empty = {"time_series": {"rows": Rows()}}
    replace_document(tmp_path / "e.json", empty)
    assert json.loads((tmp_path / "e.json").read_bytes()) == {"time_series": {"rows": []}}
