"""Sessions results from hand-made records: TTFT breakdown, offload I/O rates, cell flags, SLO capacity,
censoring, replications merged (kv_cache.benchmarks.sessions.rung_results, kv_cache.benchmarks.sessions.ladder_summary)."""

import pytest

from kv_cache.benchmarks.sessions.ladder_summary import (
    CENSORED,
    merge_replications,
    rung_warnings,
    slo_capacity,
    summarize,
)
from kv_cache.benchmarks.sessions.rung_results import (
    RungRecord,
    io_rates,
    rung_flags,
    throughput_ci,
    ttft_breakdown,
)
from kv_cache.serving.engine.io_pool import IOCounters
from kv_cache.serving.engine.replica import TurnRequest


def req(cls="return", issue=0.0, admitted=0.1, load=0.2, ttft=0.5, loads=2, block_bytes=10**9):
    r = TurnRequest(slot=0, session_id="s", turn_index=1, turn_class=cls, issue_ns=int(issue * 1e9),
                    input_tokens=100, new_tokens=10, output_tokens=5, input_keys=[], final_keys=[], needed_slots=1)
    r.admitted_ns, r.load_ns, r.ttft_ns = int(admitted * 1e9), int(load * 1e9), int(ttft * 1e9)
    r.load_keys = [f"k{i}" for i in range(loads)]
    r.load_bytes = loads * block_bytes
    return r


def test_ttft_breakdown_parts_add_up_and_load_bandwidth_is_bytes_over_time():
    rec = RungRecord((0.0, 10.0), 4, 1, 10**9, first_tokens=[(1.0, req()), (2.0, req(loads=0, load=0.0)),
                                                              (20.0, req())])  # the last is outside the window
    b = ttft_breakdown(rec)["return"]
    assert b["n"] == 2 and b["turns_loading"] == 1
    assert b["queue_wait_s"]["mean"] == pytest.approx(0.1)
    assert b["load_s"]["mean"] == pytest.approx(0.1)  # (0.2 + 0) / 2
    assert b["prefill_s"]["mean"] == pytest.approx((0.2 + 0.4) / 2)  # ttft - queue - load
    assert b["load_gbps"] == pytest.approx(2 / 0.2) and b["load_gb_per_turn"] == pytest.approx(1.0)
    assert ttft_breakdown(rec)["start"]["n"] == 0 and ttft_breakdown(rec)["start"]["load_gbps"] is None


def test_io_rates_offered_sustained_and_backlog():
    a = {"load": IOCounters(), "store": IOCounters()}
    b = {"load": IOCounters(10, 8, 10 * 10**9, 8 * 10**9), "store": IOCounters(4, 4, 4 * 10**9, 4 * 10**9)}
    rec = RungRecord((0.0, 2.0), 2, 1, 10**9, io_open=a, io_close=b, backlog_samples=[(1.0, 5, 1), (9.0, 50, 0)])
    io = io_rates(rec)
    assert io["load"]["offered_gbps"] == pytest.approx(5.0) and io["load"]["sustained_gbps"] == pytest.approx(4.0)
    assert io["load"]["backlog_ops_end"] == 2 and io["load"]["backlog_ops_max"] == 5  # the tick at 9 s is outside
    assert io["store"]["backlog_ops_end"] == 0 and io["store"]["backlog_ops_max"] == 1
    assert io_rates(RungRecord((0.0, 1.0), 2, 1, 1)) is None


def test_cell_flags():
    result = {"ttft": {"start": {"n": 0}, "return": {"n": 7}, "agentic": {"n": 0}},
              "offload_io_rates": {"load": {"completed_ops": 0}}}
    flags = rung_flags(result, "dram", hbm_filled=False, throughput_samples=[1.0, 2.0, 3.0, 4.0, 5.0])
    text = " | ".join(flags)
    assert "HBM never filled" in text and "never read" in text
    assert "TTFT return: n = 7 < 20" in text and "TTFT start: n = 0" in text and "agentic" not in text
    ok = {"ttft": {"start": {"n": 30}, "return": {"n": 30}, "agentic": {"n": 0}}, "offload_io_rates": None}
    assert rung_flags(ok, "none", hbm_filled=True, throughput_samples=[3.0, 1.0, 3.0, 1.0]) == []


def test_throughput_interval_is_never_negative():
    ci = throughput_ci([0.0, 0.0, 50.0, 0.0])
    assert ci.low == 0.0 and "clamped" in ci.method


def rung(tiers, n, thr, p90, reps=None):
    r = {"tiers": tiers, "sessions": n, "seed": 1, "completed_turns": 10, "flags": [],
         "throughput_tokens_per_s_per_gpu": {"estimate": thr, "low": thr, "high": thr, "n": 4, "method": "x",
                                             "confidence": 0.95},
         "ttft": {"return": {"n": 30, "p90_s": None if p90 is None else {"estimate": p90}}},
         "work": {"flag_reasons": []}}
    if reps:
        r["replications"] = {"k": len(reps), "throughput_tokens_per_s_per_gpu": [x for x, _ in reps],
                             "ttft_return_p90_s": [y for _, y in reps]}
    return r


def test_slo_capacity_is_the_largest_session_count_meeting_it():
    assert slo_capacity([(2, 0.5), (4, 0.9), (8, 2.0), (16, 0.7)], 1.0) == 16
    assert slo_capacity([(2, 1.5), (4, None)], 1.0) == 0


def test_summary_capacity_from_the_slo_peak_separately_and_censoring():
    rungs = [rung("none", 2, 100, 0.5), rung("none", 4, 150, 1.5), rung("none", 8, 120, 3.0),
             rung("dram", 2, 100, 0.4), rung("dram", 4, 160, 0.8), rung("dram", 8, 200, 0.9)]
    raw = {(r["tiers"], r["sessions"]): [r["throughput_tokens_per_s_per_gpu"]["estimate"]] * 2 for r in rungs}
    s = summarize(rungs, raw, slo_ttft_p90_s=1.0)
    none, dram = s["configs"]["none"], s["configs"]["dram"]
    assert none["effective_capacity_sessions"] == 2 and none["peak_throughput_sessions"] == 4
    assert none["flags"] == []
    assert dram["effective_capacity_sessions"] == 8 and dram["peak_throughput_sessions"] == 8
    assert any(CENSORED in f for f in dram["flags"])
    ratio = s["ratios"][0]
    assert ratio["effective_capacity_ratio"] == 4.0 and ratio["censored"]
    warnings = rung_warnings(rungs, s)
    assert any(w.startswith("dram:") and CENSORED in w for w in warnings)
    # without an SLO the capacity is the throughput peak, as before
    assert summarize(rungs, raw)["configs"]["none"]["effective_capacity_sessions"] == 4


def test_replications_merge_into_a_t_interval_and_give_capacity_cis():
    reps = [rung("none", 4, x, p) for x, p in ((100, 1.0), (110, 1.2), (90, 0.8))]
    for i, r in enumerate(reps):
        r["seed"] = i
    cell = merge_replications(reps)
    assert cell["throughput_tokens_per_s_per_gpu"]["estimate"] == pytest.approx(100)
    assert cell["throughput_tokens_per_s_per_gpu"]["n"] == 3 and cell["replications"]["seeds"] == [0, 1, 2]
    assert cell["replications"]["ttft_return_p90_ci"]["estimate"] == pytest.approx(1.0)
    assert merge_replications(reps[:1]) is reps[0]
    rungs = [rung("none", 2, 100, 0.5, reps=[(100, 0.5), (90, 0.6)]), rung("none", 4, 90, 2.0, reps=[(80, 2.0), (95, 0.9)]),
             rung("dram", 2, 100, 0.5, reps=[(100, 0.5), (90, 0.6)]), rung("dram", 4, 150, 0.9, reps=[(150, 0.9), (140, 0.8)])]
    raw = {(r["tiers"], r["sessions"]): r["replications"]["throughput_tokens_per_s_per_gpu"] for r in rungs}
    s = summarize(rungs, raw, slo_ttft_p90_s=1.0)
    assert s["configs"]["none"]["slo_capacity_sessions_ci"]["estimate"] == pytest.approx(3.0)  # caps 2 and 4
    assert s["configs"]["dram"]["slo_capacity_sessions_ci"]["estimate"] == pytest.approx(4.0)
    assert s["ratios"][0]["effective_capacity_ratio_ci"]["n"] == 2


def test_auto_ladder_doubles_until_throughput_has_peaked():
    from kv_cache.benchmarks.sessions.ladder_summary import auto_next_rung

    assert auto_next_rung([], 2) == 2
    assert auto_next_rung([(2, 10.0)], 2) == 4
    assert auto_next_rung([(2, 10.0), (4, 20.0), (8, 15.0)], 2) == 16  # one lower rung may be noise
    assert auto_next_rung([(2, 10.0), (4, 20.0), (8, 15.0), (16, 12.0)], 2) is None  # peaked at 4
    assert auto_next_rung([(2 ** i, float(i)) for i in range(1, 4)], 2, max_rungs=3) is None  # capped: censored


def test_ladder_auto_flag_parses():
    from kv_cache.cli import parse_sessions_settings
    from kv_cache.errors import UsageError

    assert parse_sessions_settings(["--ladder", "auto"]).ladder_auto_start == 2
    assert parse_sessions_settings(["--ladder", "auto:8"]).ladder_auto_start == 8
    assert parse_sessions_settings(["--ladder", "4,8"]).ladder_auto_start == 0
    with pytest.raises(UsageError):
        parse_sessions_settings(["--ladder", "auto:0"])


def test_work_equivalence_compares_context_and_output_tokens_too():
    from kv_cache.benchmarks.sessions.ladder_summary import flag_work_equivalence

    def work(new, ctx, out):
        ci = lambda m: {"estimate": m, "low": m * 0.99, "high": m * 1.01, "n": 50, "method": "t",  # noqa: E731
                        "confidence": 0.95}
        return {"turns_completed": 50, "mean_new_tokens_completed": new, "new_tokens_per_turn_ci": ci(new),
                "context_tokens_per_turn_ci": ci(ctx), "output_tokens_per_turn_ci": ci(out)}

    rungs = [{"sessions": 4, "work": work(1000, 20000, 100)}, {"sessions": 4, "work": work(1000, 20000, 100)},
             {"sessions": 4, "work": work(1000, 40000, 100)}]
    flag_work_equivalence(rungs)
    assert [r["work"]["flagged"] for r in rungs] == [False, False, True]
    assert "context tokens" in rungs[2]["work"]["flag_reasons"][0]


def test_table_marks_clamped_intervals_flags_and_prints_the_breakdown():
    import io

    from kv_cache.metrics.stats import CLAMP_MARK
    from kv_cache.render.sessions import print_table

    r = rung("dram", 4, 100.0, 0.5)
    r["throughput_tokens_per_s_per_gpu"].update(low=0.0, high=300.0, method=f"t; {CLAMP_MARK}")
    r["ttft"]["start"] = {"n": 0, "p90_s": None}
    r["work"]["flagged"] = False
    r["flags"] = ["HBM never filled"]
    part = {"mean": 0.1, "p90": 0.2}
    r["ttft_breakdown"] = {"return": {"n": 30, "queue_wait_s": part, "load_s": part, "prefill_s": part,
                                      "turns_loading": 12, "load_gb_per_turn": 0.3, "load_gbps": 2.5}}
    results = {"rungs": [r], "summary": summarize([r], {("dram", 4): [100.0, 100.0]}), "method": "m",
               "warnings": ["dram @ 4 sessions: HBM never filled"]}
    out = io.StringIO()
    print_table(results, out)
    text = out.getvalue()
    assert "100.0 [0.0*, 300.0]" in text and " !" in text
    assert "TTFT of returning turns, broken down" in text and "2.50" in text
    assert "Warnings (1" in text and "HBM never filled" in text
