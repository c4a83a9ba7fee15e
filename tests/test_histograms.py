"""The merged HdrHistograms' stated precision (within 0.1 % of the exact nearest-rank percentile) and the
bounded reservoir lists of the recorder."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kv_cache.metrics import histograms as hg
from kv_cache.metrics.reservoir import LatencySamples


def _nearest_rank(values: np.ndarray, q: float) -> int:
    """The exact value at HdrHistogram's rank for q (round(q / 100 * n), at least 1)."""
    s = np.sort(values)
    return int(s[max(1, int(q / 100 * len(s) + 0.5)) - 1])


@pytest.mark.parametrize("median_ns", [800, 23_000, 150_000, 4_000_000, 900_000_000])
def test_merged_percentiles_are_within_a_tenth_of_a_percent_of_the_exact_union(median_ns):
    rng = np.random.default_rng(median_ns)
    parts = [np.maximum(1, rng.lognormal(math.log(median_ns), 0.4, 20_000)).astype(np.int64) for _ in range(4)]
    merged = hg.decode(hg.merge_encoded(hg.encode(hg.from_values(p.tolist())) for p in parts))
    union = np.concatenate(parts)
    for q in (50.0, 95.0, 99.0, 99.9):
        exact = _nearest_rank(union, q)
        got = merged.get_value_at_percentile(q)
        assert abs(got - exact) / exact <= 0.001, (q, got, exact)
        assert abs(got - exact) / exact <= hg.RELATIVE_PRECISION


_EDGES = [2047, 2048, 2049, 4095, 4096, 4097, 2**20 - 1, 2**20, 2**20 + 1, 2**31, 2**32 + 1]


@pytest.mark.parametrize("name", ["one 1 ns", "one 23 us", "all 1 ns", "many equal", "bucket edges",
                                  "1 ns and 1 h", "log-uniform 1 ns - 1 h", "bimodal 50 ns / 2 s",
                                  "lowest of a top half-bucket", "13 values, ranks split"])
def test_the_percentiles_a_document_reads_hold_the_precision_on_adversarial_values(name):
    """What the documents read (percentiles_ms, after encode and a merge of 4 parts) on values chosen to
    break it: a single sample, 1 ns, bucket edges, the widest relative buckets (1025 x 2^k), 1 ns beside
    1 h, ties; and round(q/100 n) is the rank (13 values: p95 is the 12th, not ceil's 13th)."""
    rng = np.random.default_rng(7)
    values = {
        "one 1 ns": [1], "one 23 us": [23_456], "all 1 ns": [1] * 1000, "many equal": [123_457] * 50_000,
        "bucket edges": [v + d for v in _EDGES for d in (-1, 0, 1) for _ in range(10)],
        "1 ns and 1 h": [1] * 500 + [3_600 * 10**9] * 500,
        "log-uniform 1 ns - 1 h": np.exp(rng.uniform(0, math.log(3.6e12), 50_000)).astype(np.int64).tolist(),
        "bimodal 50 ns / 2 s": [50] * 949 + [2 * 10**9] * 51,
        "lowest of a top half-bucket": [1025 * 2**k for k in range(1, 31) for _ in range(20)],
        "13 values, ranks split": [1000] * 12 + [10**9],
    }[name]
    union = np.asarray(values, dtype=np.int64)
    part = rng.integers(0, 4, len(union))
    merged = hg.decode(hg.merge_encoded(hg.encode(hg.from_values(union[part == i].tolist())) for i in range(4)))
    got = hg.percentiles_ms(merged, (50.0, 95.0, 99.0, 99.9))
    for q, key in ((50.0, "p50"), (95.0, "p95"), (99.0, "p99"), (99.9, "p999")):
        exact = _nearest_rank(union, q)
        assert abs(got[key] * 1e6 - exact) <= exact * hg.RELATIVE_PRECISION, (q, got[key], exact)


def test_the_old_one_microsecond_floor_fails_the_same_check():
    """Adversarial: the check above catches the imprecision it replaced (+1.4 % at 23 us)."""
    from hdrh.histogram import HdrHistogram

    rng = np.random.default_rng(1)
    values = np.maximum(1000, rng.lognormal(math.log(23_000), 0.3, 50_000)).astype(np.int64)
    old = HdrHistogram(1000, 3600 * 10**9, 3)
    for v in values.tolist():
        old.record_value(v)
    errors = [abs(old.get_value_at_percentile(q) - _nearest_rank(values, q)) / _nearest_rank(values, q)
              for q in (50.0, 95.0, 99.0)]
    assert max(errors) > 0.001


def test_reservoir_keeps_every_value_while_it_fits_then_a_bounded_uniform_sample():
    s = LatencySamples(cap=1000, histogram=True, recent=64, seed=3)
    for v in range(1, 1001):
        s.append(v)
    assert s.exact and len(s.values) == 1000 and s.percentiles([50.0]) == [500.5]
    for v in range(1001, 100_001):
        s.append(v)
    assert not s.exact and len(s) == 100_000 and len(s.values) == 1000  # bounded
    assert s.sum == 100_000 * 100_001 // 2 and s.max == 100_000 and s.mean() == 50_000.5  # exact
    # the reservoir is uniform over the whole run: its median near the run's, not the first 1000's
    assert 40_000 < float(np.median(s.array())) < 60_000
    # past the cap the percentiles are the histogram's: within 0.1 % of the exact nearest-rank
    assert abs(s.percentiles([95.0])[0] - 95_000) / 95_000 <= 0.001
    assert s.since(100_000 - 10).tolist() == list(range(99_991, 100_001))  # the ring of the last values
    assert len(s.since(0)) == 64


def test_recorder_lists_stop_growing_at_the_cap():
    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.storage.base import IOResult

    m = RunMetrics(sample_cap=500)
    m.open_window(0)
    for i in range(5000):
        res = IOResult(nbytes=10, device_bytes=10, total_ns=1000 + i, device_ns=900 + i, host_ns=100)
        m.record_io("storage", "read", res, 1, "load")
        m.record_request("interactive", 1, 2000 + i, 1000 + i, 500, None, None, 1, 1)
    s = m.tier_op("storage", "read")
    assert (len(s.total_ns), len(s.total_ns.values), s.ops) == (5000, 500, 5000)
    assert ("storage", "read") in m.subsampled  # percentiles now from the histograms
    assert len(m.requests.e2e_ns.values) == 500 and m.requests.e2e_ns.count == 5000
    assert m.requests.storage_ns.sum == sum(1000 + i for i in range(5000))
    p = m.op_percentiles_ms("storage", "read")
    assert abs(p["p50"] - 3.5e-3) / 3.5e-3 <= 0.001  # nearest-rank median of 1000..5999 ns: 3499 ns


def test_time_series_rows_are_bounded_by_joining_neighbours(monkeypatch):
    from kv_cache.metrics import timeseries as ts

    monkeypatch.setattr(ts, "MAX_ROWS", 64)  # the rule, not the production size (12,288 closes took 31 s)
    series = ts.TimeSeries()
    for i in range(3 * ts.MAX_ROWS):
        b = series.swap()
        b.add_io("storage", "read", 1 << 30, 1000 + i)
        b.requests += 1
        series.close(b, i + 1.0, 1.0, {"active_users": 10.0})
    rows = series.rows
    assert len(rows) <= ts.MAX_ROWS
    assert sum(r["storage_read_bytes"] for r in rows) == 3 * ts.MAX_ROWS << 30  # nothing lost
    assert sum(r["requests"] for r in rows) == 3 * ts.MAX_ROWS
    assert sum(r["seconds"] for r in rows) == pytest.approx(3 * ts.MAX_ROWS)
    assert rows[0]["storage_read_gibps"] == pytest.approx(1.0) and rows[0]["active_users"] == 10.0


def test_the_joined_rows_are_made_a_pair_at_a_time_and_equal_the_list_join(monkeypatch):
    """coarsened (the series past MAX_ROWS) gives the rows coarsen gives from the list, an odd last row
    kept, into a Rows with a run's reserve, without reading every row out as a dict at once (4,097 such
    dicts raised a soak's resident floor 5.6 MiB for good at 4,096 s)."""
    from kv_cache.metrics import timeseries as ts

    rows = ts.Rows([{"t_s": i + 1.0, "seconds": 1.0, "requests": i, "storage_read_bytes": i << 20,
                     "storage_read_gibps": i / 1024, "storage_read_p95_ms": 1.0 + i % 7, "active_users": i % 3 + 0.5}
                    for i in range(9)])
    read = []
    getitem = ts.Rows.__getitem__
    monkeypatch.setattr(ts.Rows, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("read whole")))
    monkeypatch.setattr(ts.Rows, "__getitem__", lambda self, i: read.append(i) or getitem(self, i))
    joined = ts.coarsened(rows)
    monkeypatch.undo()
    assert isinstance(joined, ts.Rows) and len(joined._vals) >= ts.RESERVED and sorted(read) == list(range(9))
    assert list(joined) == ts.coarsen(list(rows)) and len(joined) == 5 and joined[-1] == rows[-1]


def test_time_series_rows_read_back_as_appended():
    """Rows keeps each row's keys in order, its ints as ints and its floats bit for bit, so the results'
    JSON is the same as from the dicts; a row with another kind of value is kept as it is."""
    import json
    import math

    from kv_cache.metrics.timeseries import Rows

    rows = [
        {"t_s": 1.0, "seconds": 1.0, "requests": 7, "storage_read_ops": 3, "storage_read_bytes": (1 << 52) + 1,
         "storage_read_gibps": 0.1 + 0.2, "storage_read_p50_ms": 1e-300, "queue_depth": 0, "active_users": 32},
        {"t_s": 2.0, "seconds": 1.0, "requests": 0, "queue_depth": -0.0, "active_users": 32},
        {"t_s": 3.0, "seconds": 1.0, "requests": 1, "in_flight": True},  # a bool stays a bool
        {"t_s": 4.0, "seconds": 1.0, "requests": 1 << 60},  # past a double's exact ints: kept as it is
        {"t_s": 5.0, "seconds": 1.0, "requests": 7, "storage_read_ops": 3, "storage_read_bytes": 5,
         "storage_read_gibps": math.inf, "storage_read_p50_ms": 2.5, "queue_depth": 1, "active_users": 31},
        {"t_s": 6.0, "seconds": 1.0, "note": "x", "requests": None},
    ]
    kept = Rows()
    for r in rows:
        kept.append(r)
    assert len(kept) == len(rows) and kept == rows and kept[-1] == rows[-1] and kept[1:3] == rows[1:3]
    assert json.dumps(list(kept)) == json.dumps(rows)
    assert [list(r) for r in kept] == [list(r) for r in rows]  # key order
    assert [[type(v) for v in r.values()] for r in kept] == [[type(v) for v in r.values()] for r in rows]
    assert math.copysign(1, kept[1]["queue_depth"]) == -1
    kept[0]["requests"] = 99  # a row read back is a copy: the series is not changed through it
    assert kept[0]["requests"] == 7


def test_time_series_rows_cost_a_fraction_of_dicts():
    """The memory of 2,000 rows of the shape the recorder writes: Rows against a list of the dicts
    (tracemalloc, deterministic for the same code)."""
    import tracemalloc

    from kv_cache.metrics import timeseries as ts

    def row(i: int) -> dict:
        series = ts.TimeSeries()
        b = series.swap()
        for tier in ("cpu", "storage"):
            for op in ("read", "write"):
                b.add_io(tier, op, 1 << 20 + i % 7, 1000 + i)
        b.requests = i
        return ts.bucket_row(i + 1.0, 1.0, b, {"queue_depth": i % 3, "in_flight": 2, "active_users": 32,
                                               "occupancy_cpu_bytes": i << 20, "occupancy_storage_bytes": i << 21})

    import json

    made = [json.dumps(row(i)) for i in range(2000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        raw = [json.loads(r) for r in made]  # dicts with their own keys and floats, as bucket_row builds them
        dict_bytes = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        compact = ts.Rows(raw)
        rows_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert list(compact) == raw
    assert rows_bytes / 2000 < 400 and rows_bytes * 4 < dict_bytes, (rows_bytes / 2000, dict_bytes / 2000)


def test_a_run_list_takes_its_whole_cap_when_made_and_keeps_what_a_growing_one_keeps(monkeypatch):
    """A recorder's list (cap <= PREALLOC_CAP) holds its memory from the start, so RSS does not rise while it
    fills, and keeps the same values, reservoir and ring as a list that grows (a merge's)."""
    import tracemalloc

    from kv_cache.metrics import reservoir

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s = LatencySamples(cap=1000, recent=16, seed=5)
        made = tracemalloc.get_traced_memory()[0] - before
        for v in range(1000):
            s.append(v)
        filled = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert made >= 8 * 1000 and filled - made < 1000, (made, filled)
    monkeypatch.setattr(reservoir, "PREALLOC_CAP", 0)  # the same list, growing as it fills
    grown = LatencySamples(cap=1000, recent=16, seed=5)
    assert not grown._pre and s._pre
    grown.extend(range(1000))
    for a in (s, grown):
        a.extend(range(1000, 5000))
    assert s.values == grown.values and len(s) == len(grown) == 5000 and not s.exact
    assert s.array().tolist() == grown.array().tolist() and s.since(4990).tolist() == grown.since(4990).tolist()
    assert s[0] == grown[0] and s[-1] == grown[-1] and s[3:7] == grown[3:7] and list(s) == list(grown)
    empty = LatencySamples(cap=10)
    assert len(empty.values) == 0 and empty.array().tolist() == [] and not list(empty)
    with pytest.raises(IndexError):
        empty[0]


def test_time_series_rows_answer_a_reader_of_a_list():
    """A built document's time_series.rows is a Rows: the list operations a reader of the JSON's list uses
    give what the list gives (index, count, in, reversed, + with a list), and it pickles and copies."""
    import copy
    import pickle
    from collections.abc import Sequence

    from kv_cache.metrics.timeseries import Rows

    rows = [{"t_s": float(i), "requests": i % 2} for i in range(5)]
    kept = Rows(rows)
    assert isinstance(kept, Sequence)
    assert kept.index(rows[3]) == 3 and kept.count(rows[1]) == 1 and rows[4] in kept
    assert list(reversed(kept)) == rows[::-1]
    assert kept + rows[:1] == rows + rows[:1] and rows[:1] + kept == rows[:1] + rows and kept + kept == rows * 2
    assert pickle.loads(pickle.dumps(kept)) == rows and copy.deepcopy(kept) == rows


def test_percentile_values_and_clear_give_what_hdrh_s_own_loops_give():
    """percentile_values / clear (numpy cumsum, one memset: issue 30's per-second cost of the time series)
    against hdrh's get_percentile_to_value_dict / reset, on spread, clustered and single values."""
    import random

    rng = random.Random(3)
    qs = [0.0, 1.0, 50.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0, 120.0]
    sets = [[rng.randint(1, 3_600 * 10**9) for _ in range(2000)], [rng.randint(9 * 10**6, 11 * 10**6) for _ in range(500)],
            [1], [hg.HIGHEST_NS] * 3, [5, 5, 5, 7, 10**12]]
    for values in sets:
        h = hg.from_values(values)
        assert hg.percentile_values(h, qs) == h.get_percentile_to_value_dict(list(qs))
        twin = hg.from_values(values)
        hg.clear(h)
        twin.reset()
        assert list(h.counts) == list(twin.counts)
        assert (h.total_count, h.min_value, h.max_value) == (twin.total_count, twin.min_value, twin.max_value)
        assert hg.percentiles_ms(h) == {}
        hg.record(h, 42)
        hg.record(twin, 42)
        assert hg.percentile_values(h, qs) == twin.get_percentile_to_value_dict(list(qs))
    decoded = hg.decode(hg.encode(hg.from_values(sets[1])))
    assert hg.percentile_values(decoded, qs) == decoded.get_percentile_to_value_dict(list(qs))
