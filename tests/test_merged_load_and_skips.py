"""A merged document keeps what its ranks said of the load they offered and of the tiers their entries
skipped (issue 27 review): `--processes 2 --request-rate 1e12` wrote each rank's arrivals_not_offered and
saturation note, but the merged document had neither (offered_request_rate 33,510/s beside no word that
1e12 was asked), and `tier_skipped_entries` with its notes was in the rank files only."""

from __future__ import annotations

import json
from types import SimpleNamespace

from test_merge import _ranks  # (tests/ is on the path: rank documents built by the single-run code)

from kv_cache.results.measurement import merged_offered_load, merged_tier_skips, offered_load
from kv_cache.results.merge import merge_documents


def _load(rate, offered, missed):
    return {"requested_request_rate": rate, "arrivals_offered": offered, "arrivals_not_offered": missed,
            "generator_saturated": missed > 0}


def test_the_merged_open_loop_sums_the_ranks_and_says_the_generator_saturated():
    notes: list[str] = []
    out = merged_offered_load([(0, _load(5e11, 34775, 1_011_385_923_514)), (1, _load(5e11, 32246, 0))], 2.0, notes)
    assert out == {"requested_request_rate": 1e12, "arrivals_offered": 67021,
                   "arrivals_not_offered": 1_011_385_923_514, "generator_saturated": True}
    assert len(notes) == 1 and "saturated on rank(s) 0:" in notes[0] and "--request-rate 1e+12" in notes[0]


def test_a_merged_count_beyond_2_53_is_a_float_every_json_reader_holds():
    big = 2**52 + 1  # each rank's below 2^53 (an int), their sum above
    out = merged_offered_load([(0, _load(1e15, 1, big)), (1, _load(1e15, 1, big))], 1.0, [])
    assert isinstance(out["arrivals_not_offered"], float)
    assert json.loads(json.dumps(out))["arrivals_not_offered"] == float(2 * big)


def test_a_closed_loop_merge_has_no_open_loop_figures():
    closed = {"requested_request_rate": None, "arrivals_offered": None}
    assert merged_offered_load([(0, closed), (1, {})], 2.0, []) == {}


def test_merged_tier_skips_sum_per_tier_and_name_each_rank():
    counts, notes = merged_tier_skips([(0, {"gpu": 2, "cpu": 1}), (1, {"gpu": 3}), (2, None)])
    assert counts == {"gpu": 5, "cpu": 1}
    assert notes[0].startswith("the GPU tier was skipped by 5 entries") and "rank 0: 2, rank 1: 3" in notes[0]
    assert notes[1].startswith("the CPU tier was skipped by 1 entry ") and "rank 0: 1)" in notes[1]
    assert merged_tier_skips([(0, {}), (1, None)]) == ({}, [])


def test_a_rank_note_names_its_share_of_the_flag_total():
    """Under ranks --request-rate is the total the ranks split: a rank's note says its share of it."""
    out = SimpleNamespace(requests_issued=10, requests_rejected=0, arrivals_not_offered=5)
    notes: list[str] = []
    offered_load(out, 5e11, 1.0, notes, total_rate=1e12)
    assert "this rank's share (5e+11/s) of --request-rate 1e+12 asked for" in notes[0]
    alone: list[str] = []
    offered_load(out, 5e11, 1.0, alone)
    assert "--request-rate 5e+11 asked for" in alone[0]


def test_merge_documents_carries_the_ranks_skips_and_offered_load():
    docs, _ = _ranks()
    for r, d in enumerate(docs):
        d["measurement"].update(tier_skipped_entries={"gpu": r + 1}, **_load(50.0, 100, 7 * r))
    merged = merge_documents(docs)
    m = merged["measurement"]
    assert m["tier_skipped_entries"] == {"gpu": sum(range(1, len(docs) + 1))}
    assert m["requested_request_rate"] == 50.0 * len(docs) and m["arrivals_offered"] == 100 * len(docs)
    assert m["arrivals_not_offered"] == 7 * sum(range(len(docs))) and m["generator_saturated"] is True
    assert any("GPU tier was skipped" in n for n in m["notes"])
    assert any("generator saturated on rank(s) 1" in n for n in m["notes"])


def test_the_run_mode_of_a_rank_says_the_rate_of_the_whole_run():
    """The merged report's 'Mode:' line is its ranks' run_mode: it said 'Poisson arrivals at 5e+11 req/s'
    for a --request-rate 1e12 run over 2 ranks."""
    from kv_cache.results.parameters import run_mode

    def settings(rate, totals=None, per_rank=False, world=2):
        return SimpleNamespace(driver=SimpleNamespace(prefill_only=False, decode_only=False, request_rate=rate,
                                                      enable_autoscaling=False),
                               outputs=SimpleNamespace(io_trace_log=None), rank_totals=totals,
                               flags_per_rank=per_rank, mpi_world_size=world)

    assert run_mode(settings(5e11, {"request_rate": 1e12})).endswith(
        "Poisson arrivals at 1e+12 req/s in all (5e+11 per rank of 2)")
    assert run_mode(settings(5e11, {"request_rate": 1e12}, per_rank=True)).endswith("Poisson arrivals at 5e+11 req/s")
    assert run_mode(settings(5.0, None, world=1)).endswith("Poisson arrivals at 5 req/s")


def test_compare_notes_a_run_whose_generator_saturated():
    """Two runs of the same --request-rate 1e12: one offered 3.35e4/s, the other 7.9e4/s; compare's workload
    check (the flags) saw no difference and said nothing of it."""
    from kv_cache.render.compare import offered_load_notes

    def doc(offered, saturated):
        return {"measurement": {"requested_request_rate": 1e12, "offered_request_rate": offered,
                                "generator_saturated": saturated}}

    notes = offered_load_notes([doc(33510.5, True), doc(78941.0, True)])
    assert notes == ["offered load: A=3.351e+04/s of 1e+12 asked (generator saturated), B=7.894e+04/s of 1e+12 "
                     "asked (generator saturated) (an open-loop generator saturated: the runs were not offered the "
                     "load asked, so the comparison is of the loads really offered)"]
    assert offered_load_notes([doc(10.0, False), doc(9.9, False)]) == []
    assert offered_load_notes([{"measurement": {"offered_request_rate": None}}, doc(5.0, False)]) == []
