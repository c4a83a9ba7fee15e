"""The capacity answer: bisection of the SLO bracket, log-log interpolation, replications' intervals, the
sentence and its flags; the failure-mode flags of a rung that completed no turn (hand-made cells)."""

import copy
import json
import math

import pytest

from kv_cache.benchmarks.sessions.answer import (
    answer,
    crossing,
    next_refinement,
    plateau_and_knee,
    refine_ladder,
)
from kv_cache.benchmarks.sessions.ladder_summary import merge_replications
from kv_cache.benchmarks.sessions.rung_results import FailureInputs, failure_flags
from kv_cache.cli import main
from kv_cache.render.sessions import _fmt_ci


def p90_of(n: int, knee: float, rep: int = 0) -> float:
    """A queue's p90: 1 s at low load, climbing steeply past `knee` sessions (replication jitter +-3 %)."""
    return (1.0 + (n / knee) ** 4) * (1.0 + 0.03 * (rep - 1))


def cell(tiers: str, n: int, knee: float, k: int = 3, thr: float = 100.0) -> dict:
    p90s = [p90_of(n, knee, i) for i in range(k)]
    m = sum(p90s) / k
    return {"tiers": tiers, "sessions": n,
            "throughput_tokens_per_s_per_gpu": {"estimate": thr, "low": thr * 0.95, "high": thr * 1.05, "n": k},
            "ttft": {"return": {"n": 100, "p90_s": {"estimate": m, "low": m * 0.97, "high": m * 1.03, "n": k}}},
            "replications": {"k": k, "ttft_return_p90_s": p90s}}


def test_crossing_is_log_log_interpolated_and_censored_at_either_end():
    # p90 = 1 at 8, 4 at 16: log-log, p90 = 2 at 8 x 2^(1/2)
    assert crossing([(8, 1.0), (16, 4.0)], 2.0) == (pytest.approx(8 * math.sqrt(2)), "interpolated")
    assert crossing([(8, 1.0), (16, 1.5)], 2.0) == (16.0, "censored_high")
    assert crossing([(8, 3.0), (16, 4.0)], 2.0) == (8.0, "censored_low")
    assert crossing([], 2.0)[1] == "no data"
    assert crossing([(8, 1.0), (16, math.inf)], 2.0) == (8.0, "interpolated")  # no p90 above: a lower bound


def test_bisection_narrows_the_bracket_within_the_extra_rung_budget():
    knee = 13.0  # true crossing (p90 = 2 s) at 13 sessions
    rungs = [cell("none", n, knee) for n in (4, 8, 16, 32)]
    ran = []

    def run_cell(tier, n):
        ran.append(n)
        rungs.append(cell(tier, n, knee))
        return rungs[-1]

    added = refine_ladder(rungs, ["none"], 2.0, run_cell)
    assert added == ran == [12, 14, 13]  # bisection of [8, 16]: 12 meets, 14 misses, then 13
    assert [r["sessions"] for r in rungs] == [4, 8, 12, 13, 14, 16, 32]  # sorted after refining
    assert next_refinement(rungs, 2.0) is None  # bracket [13, 14] is max(1, 10 %) wide


def test_bisection_stops_at_its_budget_and_skips_censored_configs():
    rungs = [cell("none", n, 300.0) for n in (10, 1000)] + [cell("dram", n, 5000.0) for n in (10, 1000)]
    added = refine_ladder(rungs, ["none", "dram"], 2.0, lambda t, n: rungs.append(cell(t, n, 300.0)), max_extra=2)
    assert added == [505, 257]  # none: two halvings of [10, 1000]; dram: met at the top, censored, no rung


def test_the_answer_sentence_intervals_ratio_and_plateau():
    rungs = ([cell("none", n, 8.0, thr=t) for n, t in ((4, 60), (8, 100), (12, 102), (16, 99))]
             + [cell("dram+storage", n, 14.0, thr=t) for n, t in ((4, 60), (8, 120), (12, 190), (16, 200))])
    sentence, detail = answer(rungs, 2.0, 1, "h200")
    none, tier = detail["configs"]["none"], detail["configs"]["dram+storage"]
    assert none["status"] == tier["status"] == "interpolated"
    assert 7.5 < none["sessions"] < 8.5 and 13 < tier["sessions"] < 15
    assert tier["sessions_ci"]["low"] < tier["sessions"] < tier["sessions_ci"]["high"]
    ratio = detail["ratios"][0]["sessions_ratio"]
    assert ratio["low"] < ratio["estimate"] < ratio["high"] and ratio["n"] == 3
    assert sentence.startswith("with dram+storage, 1 x H200 hold ")
    assert "sessions at p90 return TTFT <= 2 s; without a tier, " in sentence and f"x{ratio['estimate']:.2f} [" in sentence
    # the baseline's throughput is a plateau over 8-16 sessions: its "peak" is not significant
    assert none["throughput"]["plateau_sessions"] == [8, 12, 16]
    assert any("not significant" in f for f in none["throughput"]["flags"])
    assert 4 < none["throughput"]["knee_sessions"] < 8


def test_answer_flags_censoring_and_an_slo_met_only_within_its_interval():
    rungs = [cell("none", n, 300.0) for n in (4, 8)] + [cell("dram", n, 1.0) for n in (4, 8)]
    sentence, detail = answer(rungs, 2.0, 2, "l40s")
    # dram never meets it (fewer than 4), none always does (at least 8): dram / none is below 4 / 8
    assert "at least 8" in sentence and "fewer than 4" in sentence and "at most x0.50 (censored)" in sentence
    assert detail["ratios"][0]["sessions_ratio"]["bound"] == "upper"
    both_high = [cell("none", n, 300.0) for n in (4, 8)] + [cell("dram", n, 300.0) for n in (4, 8)]
    assert "x? (censored)" in answer(both_high, 2.0, 1, "h200")[0]  # at least 8 over at least 8: unknown
    bounded = [cell("none", n, 8.0) for n in (4, 16)] + [cell("dram", n, 300.0) for n in (4, 16)]
    s2, d2 = answer(bounded, 2.0, 1, "h200")
    assert d2["ratios"][0]["sessions_ratio"]["bound"] == "lower" and "at least x" in s2
    assert any("censored" in f for f in detail["configs"]["none"]["flags"])
    assert any("start --ladder lower" in f for f in detail["configs"]["dram"]["flags"])
    # p90 1.95 [1.8, 2.1] at 8 sessions meets 2 s by its estimate only
    wide = [cell("none", 8, 8.0), cell("none", 16, 8.0)]
    wide[0]["ttft"]["return"]["p90_s"].update(estimate=1.95, low=1.8, high=2.1)
    _, d = answer(wide, 2.0, 1, "h200")
    assert any("SLO met only within its interval" in f for f in d["configs"]["none"]["flags"])


def test_plateau_knee_censored_at_the_lowest_rung():
    t = plateau_and_knee([cell("none", n, 8.0, thr=100.0) for n in (4, 8)])
    assert t["knee_censored"] and t["knee_sessions"] == 4.0


def rep(n_turns: int, p90: float | None, seed: int) -> dict:
    ci = {"estimate": p90, "low": p90, "high": p90, "n": n_turns} if p90 is not None else None
    work_ci = {"estimate": 100.0, "low": 90.0, "high": 110.0, "n": n_turns} if n_turns else None
    return {"tiers": "none", "sessions": 4, "seed": seed, "completed_turns": n_turns, "flags": [],
            "throughput_tokens_per_s_per_gpu": {"estimate": 10.0 * n_turns, "low": 0, "high": 0, "n": 5},
            "ttft": {"start": {"n": 0, "p50_s": None, "p90_s": None, "p99_s": None},
                     "return": {"n": n_turns, "p50_s": ci, "p90_s": ci, "p99_s": ci}},
            "work": {"turns_offered": n_turns + 1, "turns_completed": n_turns, "mean_new_tokens_offered": 100.0,
                     "mean_new_tokens_completed": 100.0, "mean_output_tokens_completed": 10.0,
                     "new_tokens_per_turn_ci": work_ci, "context_tokens_per_turn_ci": work_ci,
                     "output_tokens_per_turn_ci": work_ci}}


def test_every_reported_figure_uses_all_replications():
    cell_ = merge_replications([rep(10, 1.0, 0), rep(20, 2.0, 1), rep(30, 3.0, 2)])
    assert cell_["ttft"]["return"]["p90_s"]["estimate"] == pytest.approx(2.0)
    assert cell_["ttft"]["return"]["p90_s"]["n"] == 3 and cell_["ttft"]["return"]["n"] == 60
    assert cell_["ttft_within_run"]["return"]["p90_s"]["estimate"] == 1.0
    assert cell_["completed_turns"] == 60 and cell_["work"]["turns_completed"] == 60
    assert cell_["work"]["new_tokens_per_turn_ci"]["n"] == 60
    assert cell_["work_within_run"]["turns_completed"] == 10
    assert cell_["ttft"]["start"]["p90_s"] is None


def test_replications_few_sample_flags_are_one_line_per_turn_class():
    reps = [rep(10, 1.0, 0), rep(20, 2.0, 1), rep(30, 3.0, 2)]
    reps[0]["flags"] = ["TTFT start: n = 3 < 20, percentiles unreliable", "HBM never filled: x"]
    reps[2]["flags"] = ["TTFT start: n = 0 < 20, percentiles unreliable", "HBM never filled: x"]
    flags = merge_replications(reps)["flags"]
    assert flags == ["TTFT start: n = 3, >=20, 0 in the 3 replications, some < 20: percentiles unreliable",
                     "HBM never filled: x"]


def test_a_rung_without_turns_says_why_and_what_to_change():
    result = {"completed_turns": 0}
    f = FailureInputs(issued_prefill_s=[45.5, 30.0, 50.0], issued_context_tokens=[150_000, 120_000, 160_000],
                      largest_session_tokens=200_000, bytes_per_token=131072,
                      tier_sizes_gib={"cpu_mem_gb": 1.0, "storage_capacity_gb": 19.1}, window_s=20.0, replicas=1,
                      usable_fraction=0.9)
    flags = failure_flags(result, "dram+storage", f)
    assert len(flags) == 2
    assert "no turn completed in the 20 s window" in flags[0] and "45.5 s (median" in flags[0]
    assert "--window >= 136 s" in flags[0]  # 3 x the median, more than the 125.5 s queued
    assert "cannot hold even one session's context" in flags[1] and "24.41 GiB" in flags[1]
    assert "--cpu-mem-gb" in flags[1]
    assert failure_flags(result, "none", f) == flags[:1]
    assert failure_flags({"completed_turns": 3}, "none", f) == []


def test_no_prefill_flag_when_the_prefill_fits_the_window():
    # a tiny model: 10 ms of prefill per turn cannot be why a 1 s window saw no turn ("--window >= 0 s" was
    # the advice); the window being shorter than one turn cycle is (steady_state.window_cycles says so)
    f = FailureInputs(issued_prefill_s=[0.01], issued_context_tokens=[8160], largest_session_tokens=9000,
                      bytes_per_token=1024, tier_sizes_gib={"cpu_mem_gb": 8.0}, window_s=1.0, replicas=1)
    assert failure_flags({"completed_turns": 0}, "dram", f) == []


def test_the_table_formats_a_missing_value_instead_of_crashing():
    assert _fmt_ci({"estimate": None, "low": None, "high": None}) == "-"
    assert _fmt_ci(None) == "-"


BIG = ("sessions:\n  first_turn_tokens_mean: 150000\n  shared_prefix_tokens: 1024\n  new_tokens_mean: 1500\n"
       "  new_tokens_median: 1000\n  output_tokens_mean: 60\n  output_tokens_median: 40\n  turns_mean: 6\n"
       "  max_context_tokens: 200000\n")


@pytest.mark.slow  # runs two 1 s rungs in real time
def test_a_configuration_with_no_completed_turn_prints_its_table_and_says_why(tmp_path, capsys):
    """The L40S failure in miniature: 150k-token contexts need ~46 s of modelled prefill, the window is 1 s,
    and the 0.05 GiB DRAM tier cannot hold one session's ~18 GiB of KV."""
    cfg = tmp_path / "big.yaml"
    cfg.write_text(BIG)
    code = main(["sessions", "--config", str(cfg), "--model", "llama3.1-8b", "--gpu", "l40s", "--gpu-mem-gb", "32",
                 "--ladder", "2", "--window", "1", "--warmup", "0.2", "--subwindows", "2", "--tiers", "none,dram",
                 "--cpu-mem-gb", "0.05", "--pace", "fixed:0.05", "--io-workers", "2", "--io-chunk-mb", "1",
                 "--no-fsync", "--output", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert code == 0 and "Traceback" not in out and "SESSIONS HELD" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert all(r["completed_turns"] == 0 for r in data["rungs"])
    warnings = " | ".join(data["warnings"])
    assert "no turn completed in the 1 s window" in warnings and "of modelled prefill" in warnings
    assert "dram @ 2 sessions: the offload tiers cannot hold even one session's context" in warnings


@pytest.mark.slow  # runs rungs in real time
def test_an_slo_run_refines_replicates_and_ends_with_the_answer(tmp_path, capsys):
    from tests.test_sessions_ladder import SMALL

    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL.replace("sessions:\n", "sessions:\n  human_threshold_s: 0.1\n"))
    code = main(["sessions", "--config", str(cfg), "--model", "micro", "--gpu", "l40s", "--gpu-mem-gb", "0.012",
                 "--ladder", "1,4", "--window", "1.5", "--warmup", "0.3", "--subwindows", "2", "--tiers", "none",
                 "--pace", "human:0.15:0.2", "--slo-ttft-p90", "0.002", "--output", str(tmp_path / "s.json")])
    assert code == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["parameters"]["replications"] == 3  # the default when an answer is asked for
    assert all(r["replications"]["k"] == 3 for r in data["rungs"])
    c = data["answer_detail"]["configs"]["none"]
    # issue 29: with the evidence rule a 1.5 s window may leave the 1-session rung short (then no figure)
    assert c["status"] in ("interpolated", "censored_high", "censored_low", "not_enough_evidence") and "throughput" in c
    head = "not enough evidence: " if c["status"] == "not_enough_evidence" else "without a tier, 1 x L40S hold "
    assert isinstance(data["answer"], str) and data["answer"].startswith(head)
    sessions = [r["sessions"] for r in data["rungs"]]
    assert sessions == sorted(sessions) and len(sessions) <= 2 + 3
    from kv_cache.benchmarks.sessions.answer import next_refinement

    ladder = [r for r in data["rungs"] if r["sessions"] in (1, 4)]
    if c["status"] == "interpolated" and next_refinement(ladder, 0.002) is not None:
        assert len(sessions) > 2  # the ladder's SLO bracket [1, 4] was bisected (a real-time run may leave
        # none: a loaded machine's rung 1 missing the SLO, or short of the evidence, is no bracket)
    # the L40S is checked in FP8 only: the run's warning that the engine model is unvalidated here qualifies
    # the figure, so the sentence carries it too
    assert data["warnings"][0].startswith("engine model unvalidated on this GPU")
    assert "engine model unvalidated on this GPU" in data["answer_detail"]["flags_in_sentence"]
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-3].startswith("Answer: " + head)
    assert "not interpolated: the answer below interpolates and is the figure to quote" in printed


def test_a_rung_without_returning_turns_is_short_of_evidence_not_a_miss():
    # issue 29: a rung with no returning turn says nothing about the p90 (it was counted as a miss, which
    # placed the crossing at the rung below): it is left out of the fit and flagged
    rungs = [cell("none", 4, 8.0), cell("none", 8, 8.0), cell("none", 16, 8.0)]
    rungs[2]["ttft"]["return"]["p90_s"] = None
    rungs[2]["replications"]["ttft_return_p90_s"] = [None, None, None]
    _, d = answer(rungs, 2.0, 1, "h200")
    c = d["configs"]["none"]
    assert c["status"] == "censored_high" and c["sessions"] == 8.0  # p90 1.0 .. 2.0: met up to 8 sessions
    assert c["fit"]["rungs_short_of_evidence"] == [16.0]
    assert any("rungs short of evidence" in f and "16 sessions" in f for f in c["flags"])
    assert next_refinement(rungs, 2.0) == 12  # the bisection still probes the rung above
    # with one counted rung there is no fit: the sentence says so, gives no figure and a window to use
    one_rung = [dict(r, window_s=20.0) for r in rungs[1:]]
    sentence, d1 = answer(one_rung, 2.0, 1, "h200")
    assert d1["configs"]["none"]["status"] == "not_enough_evidence" and d1["configs"]["none"]["sessions"] is None
    assert sentence.startswith("not enough evidence: 0-33 returning turns per cell") and " hold " not in sentence
    assert "measured no returning turn" in sentence
    few = [dict(copy.deepcopy(r), window_s=8.0) for r in rungs]
    for r in few:
        r["replications"]["ttft_return_n"] = [2, 1, 4]
    sentence, _ = answer(few, 2.0, 1, "h100")  # 8 s windows: p90s of 1-4 turns
    assert sentence.startswith("not enough evidence: 0-4 returning turns per cell (one rung's replication; 12 "
                               "needed, 36 per rung); about --window 50 would give 12")
    both = rungs + [dict(r, tiers="dram") for r in rungs]
    sentence, _ = answer(both, 2.0, 1, "h100")
    # p90 at 8 is 2.0 s +- 3 % against 2 s: the fit meets the SLO up to 8, but draws cross below it, so the
    # 95 % bound lies inside the ladder (it read "at least 8" before; 7.6 before the bootstrap redrew each
    # replication's effect whole: these replications' +-3 % holds at every rung, an effect shared on the ladder)
    assert "hold at least 7.3 (95 %: the fit meets the SLO up to the top rung with the evidence, 8, but " in sentence
    assert "without a tier, at least 7.3 (95 %" in sentence and "x? (censored)" in sentence
    one = [cell("none", n, 8.0, k=1) for n in (4, 8, 16)] + [cell("dram", n, 14.0, k=1) for n in (4, 8, 16)]
    _, d1 = answer(one, 2.0, 1, "h100")
    assert d1["configs"]["dram"]["sessions_ci"]["low"] <= d1["configs"]["dram"]["sessions"]  # exact curve: no residual
    # ... so bounds from the rungs either side, not an interval of zero width
    assert d1["configs"]["dram"]["sessions_ci"]["no_residuals"]
    assert any(f.startswith("no interval: the fit passes through every counted cell") for f in d1["configs"]["dram"]["flags"])
    jitter = copy.deepcopy(one)
    for r in jitter:
        r["ttft"]["return"]["p90_s"]["estimate"] *= 1.3 if r["sessions"] == 8 else 1.0  # off the fitted curve
        r["replications"]["ttft_return_p90_s"] = [r["ttft"]["return"]["p90_s"]["estimate"]]
    jitter[1]["ttft"]["return"]["p90_s"]["estimate"] = jitter[2]["ttft"]["return"]["p90_s"]["estimate"] * 1.5
    jitter[1]["replications"]["ttft_return_p90_s"] = [jitter[1]["ttft"]["return"]["p90_s"]["estimate"]]
    _, d2 = answer(jitter, 2.0, 1, "h100")  # a violator pools two rungs into one block: a residual to redraw
    if d2["configs"]["none"]["status"] == "interpolated" and not d2["configs"]["none"]["sessions_ci"].get("no_residuals"):
        assert any("one replication per rung: the interval rests on the fit's residuals" in f
                   for f in d2["configs"]["none"]["flags"])


def test_failure_inputs_take_the_largest_session_and_the_tiers_in_force():
    from types import SimpleNamespace

    from kv_cache.benchmarks.sessions.rung_results import failure_inputs
    from kv_cache.workload.sessions import SessionScript, Turn

    script = SessionScript("s", (Turn(1000, 100, None, None), Turn(500, 50, 1.0, "human")),
                           block_tokens=512, shared_prefix_tokens=0)
    ls = SimpleNamespace(model=SimpleNamespace(bytes_per_token=1024), window_s=5.0, replicas=2,
                         dram_usable_fraction=0.9)
    f = failure_inputs(ls, [1000, 1600], [SimpleNamespace(script=script), SimpleNamespace(script=None)],
                       {"cpu_mem_gb": {"effective": 1.5}, "gpu_mem_gb": {"effective": 9.0}}, lambda n: n / 100)
    assert f.largest_session_tokens == 1000 + 100 + 500 + 50
    assert f.issued_prefill_s == [10.0, 16.0] and f.tier_sizes_gib == {"cpu_mem_gb": 1.5}


def test_a_configuration_without_any_completed_turn_has_no_capacity_ratio():
    from kv_cache.benchmarks.sessions.ladder_summary import summarize

    rungs = []
    for tiers in ("none", "dram"):
        r = cell(tiers, 16, 8.0, k=1, thr=0.0)
        r.update(completed_turns=0, flags=[], work={"flag_reasons": []})
        rungs.append(r)
    raw = {(r["tiers"], 16): [0.0, 0.0] for r in rungs}
    s = summarize(rungs, raw, None)
    assert any("no rung completed a turn" in f for f in s["configs"]["none"]["flags"])
    assert s["ratios"][0]["effective_capacity_ratio"] is None
    # issue 29: the grid summary printed "effective capacity (sessions): none 2" for such a cell
    from kv_cache.render.sessions import grid_cell_line

    assert s["configs"]["none"]["effective_capacity_sessions"] is None
    line = grid_cell_line({"parameters": {"model": "m", "num_gpus": 2, "gpu": "h100"}, "summary": s})
    assert "none: none measured (no rung completed a turn); dram: none measured" in line and "16" not in line
    # the real grid of issue 29 (`--models llama3.1-8b,llama3.1-70b-instruct --gpus h100,h200 --tensor-parallel 2
    # --num-gpus 2 --ladder 2 --window 4`) ends so in every cell; a cell that measured one says its rung
    s2 = dict(s, configs={"none": {"effective_capacity_sessions": 16}, "dram": s["configs"]["dram"]})
    line = grid_cell_line({"parameters": {"model": "m", "num_gpus": 2, "gpu": "h100"}, "summary": s2})
    assert "effective capacity (sessions): none: 16; dram: none measured" in line


def test_a_censored_replication_is_named_and_the_figure_is_shown_beside_the_replications():
    import io

    from kv_cache.render.sessions import _answer

    rungs = [cell("none", n, 8.0) for n in (4, 8, 16)] + [cell("dram+storage", n, 14.0) for n in (4, 8, 16)]
    low = rungs[0]["replications"]["ttft_return_p90_s"]
    low[1] = 3.0  # replication 2 misses the SLO already at 4 sessions: its crossing is censored (the mean meets it)
    rungs[0]["ttft"]["return"]["p90_s"]["estimate"] = sum(low) / 3
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    assert detail["configs"]["none"]["per_replication_status"][1] == "censored_low"
    # issue 29: one censored replication no longer removes the interval of the baseline and of the ratio
    # (it did: "5.8: x1.45" bare): the fit over every cell crosses, and its bootstrap gives both intervals
    ratio = detail["ratios"][0]["sessions_ratio"]
    assert detail["configs"]["none"]["status"] == "interpolated" and detail["configs"]["none"]["sessions_ci"]
    assert ratio["low"] < ratio["estimate"] < ratio["high"] and "paired" in ratio["method"]
    out = io.StringIO()
    _answer({"answer": sentence, "answer_detail": detail}, out)
    line = next(x for x in out.getvalue().splitlines() if x.strip().startswith("dram+storage"))
    tier = detail["configs"]["dram+storage"]
    assert "mean curve between 8 and 16; replications " in line
    assert ", ".join(f"{v:.1f}" for v in tier["per_replication"]) in line
    none_line = next(x for x in out.getvalue().splitlines() if x.strip().startswith("none"))
    assert ", <4, " in none_line  # the censored replication as the bound it is, not "4.0"


def test_no_figure_in_the_sentence_goes_without_its_interval_or_a_bound():
    # issue 29 item 3: "with dram, 1 x H100 hold 6.7 sessions ...; without a tier, 6.8: x1.00" printed bare
    # figures from 1-2 turns; every figure now carries its interval or says it is a bound
    import re

    scenarios = [
        [cell("none", n, 8.0) for n in (4, 8, 12, 16)] + [cell("dram", n, 14.0) for n in (4, 8, 12, 16)],
        [cell("none", n, 300.0) for n in (4, 8)] + [cell("dram", n, 1.0) for n in (4, 8)],
        [cell("none", n, 8.0) for n in (4, 8, 12, 16)] + [cell("dram", n, 300.0) for n in (4, 8, 12, 16)],
        [cell("none", n, 8.0, k=1) for n in (4, 8, 12)] + [cell("dram", n, 10.0, k=1) for n in (4, 8, 12)],
    ]
    short = copy.deepcopy(scenarios[0])
    for r in short:
        r["replications"]["ttft_return_n"] = [1, 2, 1]
        r["window_s"] = 8.0
    scenarios.append(short)
    for rungs in scenarios:
        sentence = answer(rungs, 2.0, 1, "h100")[0].split(" [flags:")[0]
        sentence = re.sub(r" \[[^\]]*\]", " []", sentence)  # an interval
        # bounds where a fit through every cell leaves no residual to bootstrap (one replication)
        sentence = re.sub(r" \(between x?[\d.]+ and x?[\d.]+: no interval\)", " []", sentence)
        for fixed in (r"\d+ x H100", r"p90", r"<= \d+ s", r"--window \d+", r"\d+ needed", r"\d+ per rung",
                      r"[\d-]+ returning turns", r"would give \d+"):
            sentence = re.sub(fixed, "#", sentence)  # the GPUs, the SLO, the evidence: not figures
        for m in re.finditer(r"x?\d+(\.\d+)?", sentence):
            bounded = re.search(r"(at least|fewer than|at most) $", sentence[: m.start()]) is not None
            assert bounded or sentence[m.end():].startswith(" []") or sentence[m.end():].startswith(" sessions []"), \
                (m.group(), sentence)


def test_a_bound_whose_far_side_lacks_evidence_says_so_with_a_window():
    # the 8 s run: 4 sessions had 4-5 returning turns per replication, 8 and 16 (planned 32 s windows) had
    # enough and missed the SLO: "fewer than 8" is a bound, but because of the evidence, not the ladder
    rungs = [dict(cell("none", n, 4.0, k=2), window_s=w) for n, w in ((4, 8.0), (8, 32.0), (16, 32.0))]
    rungs[0]["replications"]["ttft_return_n"] = [5, 4]
    sentence, d = answer(rungs, 2.0, 1, "h100")
    c = d["configs"]["none"]
    assert c["status"] == "censored_low" and c["fit"]["censored_by_missing_evidence"]
    assert "the rungs below it (4) lack the evidence" in c["flags"][0]
    assert "fewer than 8" in sentence and "beyond the bound: not enough evidence: 4-5 returning turns per cell" in sentence
    assert "about --window 40 would give 18" in sentence


class _Recorded(Exception):
    pass


@pytest.mark.parametrize(("plan", "expected"), [("planned", 32.0), ("fixed", 8.0)])
def test_window_plan_fixed_holds_every_window_at_the_flag(monkeypatch, plan, expected):
    # issue 29: --window-plan fixed is what makes "a run with 8 s windows" one; planned stretches the window to
    # 3 loaded cycles (here 3 x 13.3 s x 8/4, capped at 4 x --window = 32 s); both keep the warm-up's cycle
    import dataclasses
    import io

    from kv_cache.benchmarks.sessions import run as runmod

    seen = {}

    class FakeRung:
        def __init__(self, ls, tier, n, supply, planned_cycle_s=None):
            seen.update(window=ls.window_s, cycle=planned_cycle_s)

        def run(self):
            raise _Recorded

    monkeypatch.setattr(runmod, "RungRun", FakeRung)
    ls = dataclasses.make_dataclass("LS", [("window_s", float), ("seed", int), ("warmup_s", float)])(8.0, 1, 1.0)
    below = [{"tiers": "none", "sessions": 4, "turn_cycle_s": 13.3}]
    with pytest.raises(_Recorded):
        runmod._run_cell(ls, "none", 8, lambda seed: None, io.StringIO(), 2, {}, runmod.RungProgress(ls, 4),
                         below, plan=True, window_plan=plan)
    assert seen == {"window": expected, "cycle": pytest.approx(26.6)}


def test_the_sentence_says_when_the_planning_lengthened_the_windows():
    rungs = [cell("none", n, 8.0) for n in (4, 8, 16)]
    for r, w in zip(rungs, (8.0, 24.0, 32.0), strict=True):
        r["window_plan"] = {"mode": "planned", "requested_window_s": 8.0, "window_s": w}
    sentence, d = answer(rungs, 2.0, 1, "h100")
    assert "windows planned to 24-32 s at 2 of 3 rungs (--window 8; --window-plan fixed holds it)" in sentence
    for r in rungs:
        r["window_plan"]["window_s"] = 8.0  # fixed
    sentence, _ = answer(rungs, 2.0, 1, "h100")
    assert "windows planned" not in sentence


def test_the_8_s_window_run_answers_not_enough_evidence_and_shows_no_crossing():
    # the returning turns of the real `--window 8 --replications 2 --window-plan fixed` run of the README's
    # laptop example (issue 29 done-when): 4-15 per cell, a first-miss bracket [6, 7] for dram+storage
    import io

    from kv_cache.render.sessions import _answer

    turns = {("none", 4): [5, 4], ("none", 8): [9, 6], ("none", 16): [8, 8],
             ("dram+storage", 4): [5, 6], ("dram+storage", 6): [8, 7], ("dram+storage", 7): [8, 6],
             ("dram+storage", 8): [10, 8], ("dram+storage", 16): [12, 15]}
    rungs = []
    for (tiers, n), ns in turns.items():
        r = cell(tiers, n, 6.5 if tiers == "dram+storage" else 3.0, k=2)
        r["replications"]["ttft_return_n"] = ns
        r["window_s"] = 8.0
        r["window_plan"] = {"mode": "fixed", "requested_window_s": 8.0, "window_s": 8.0}
        rungs.append(r)
    sentence, d = answer(rungs, 2.0, 1, "h100")
    assert sentence.startswith("not enough evidence: 4-15 returning turns per cell (one rung's replication; 18 "
                               "needed, 36 per rung); about --window 20 would give 18")
    assert " hold " not in sentence and "SLO met only" not in sentence and "not significant" not in sentence
    assert all(c["status"] == "not_enough_evidence" and c["sessions"] is None for c in d["configs"].values())
    out = io.StringIO()
    _answer({"answer": sentence, "answer_detail": d}, out)
    table = out.getvalue()
    assert "mean curve between" not in table and "first-miss crossings" not in table
    assert "dram+storage  - sessions (not_enough_evidence)" in table


def test_one_replication_through_every_cell_prints_bounds_not_a_point_interval():
    rungs = [cell("none", n, 6.0, k=1) for n in (4, 8)]
    sentence, d = answer(rungs, 2.0, 1, "l40s")
    c = d["configs"]["none"]
    assert c["status"] == "interpolated" and c["sessions_ci"]["no_residuals"]
    assert "hold 6.0 (between 4 and 8: no interval) sessions" in sentence or \
        " (between 4 and 8: no interval) sessions" in sentence
    assert "none no interval" in sentence and "[6." not in sentence


def test_bracket_flags_never_quote_a_rung_short_of_the_evidence():
    # a real --window-plan fixed run flagged "SLO met only within its interval at 1 sessions" where the
    # 1-session rung had 9 returning turns per replication and was left out of the fit
    rungs = [cell("none", n, 4.05) for n in (4, 8, 12)]
    rungs[0]["replications"]["ttft_return_n"] = [3, 3, 3]
    assert rungs[0]["ttft"]["return"]["p90_s"]["high"] > 2.0 > rungs[0]["ttft"]["return"]["p90_s"]["estimate"]
    sentence, d = answer(rungs, 2.0, 1, "h100")
    c = d["configs"]["none"]
    assert c["bracket"] == [4, 8] and 4.0 in c["fit"]["rungs_short_of_evidence"]
    assert not any(f.startswith("SLO met only within its interval") for f in c["flags"])
    assert "SLO met only" not in sentence


def test_a_censored_ratio_bound_holds_over_the_other_sides_interval():
    # the real planned --window 8 run: dram+storage 7.9 [6.6, 11.8], none "fewer than 8": the sentence said
    # "at least x0.98" (7.9 / 8), a bound at the point estimate; over the interval it is 6.6 / 8
    from kv_cache.benchmarks.sessions.answer import _fmt_ratio, _ratio

    a = {"status": "interpolated", "sessions": 7.9, "sessions_ci": {"low": 6.6, "high": 11.8}}
    b = {"status": "censored_low", "sessions": 8.0, "sessions_ci": None}
    r = _ratio(a, b, None)
    assert r["bound"] == "lower" and r["estimate"] == pytest.approx(6.6 / 8)
    assert _fmt_ratio(r) == "at least x0.82 (censored)"
    # the other way round: an upper bound over the interval's high end; two censored sides: their bounds
    assert _ratio(b, a, None)["estimate"] == pytest.approx(8 / 6.6) and _ratio(b, a, None)["bound"] == "upper"
    top = {"status": "censored_high", "sessions": 16.0, "sessions_ci": None}
    assert _ratio(top, a, None)["estimate"] == pytest.approx(16 / 11.8)
    assert _ratio(top, b, None)["estimate"] == pytest.approx(16 / 8)


def turns_rung(tiers: str, n: int, p90s: list, turns: list) -> dict:
    """A rung with every replication's p90 and returning turns (the adversarial review's cells)."""
    fin = [p for p in p90s if p is not None and math.isfinite(p) and p > 0]
    m = math.exp(sum(map(math.log, fin)) / len(fin)) if fin else None
    return {"tiers": tiers, "sessions": n, "window_s": 10.0,
            "throughput_tokens_per_s_per_gpu": {"estimate": 100.0, "low": 95.0, "high": 105.0, "n": len(p90s)},
            "ttft": {"return": {"n": sum(turns), "p90_s": {"estimate": m, "low": m * 0.9, "high": m * 1.1,
                                                          "n": len(p90s)} if m else None}},
            "replications": {"k": len(p90s), "ttft_return_p90_s": p90s, "ttft_return_n": turns}}


def test_a_censored_ratio_gives_no_bound_when_the_other_interval_ends_in_a_bound():
    # dram meets the SLO to its top rung ("at least 16"); none's interval reaches its top rung ("above 16"):
    # none may hold more than 16, so "at least x1.00" was not supported; the ratio says it has no bound
    rungs = ([turns_rung("none", n, [p * 1.3, p, p * 0.7], [20] * 3) for n, p in ((4, 1.0), (8, 1.9), (16, 2.2))]
             + [turns_rung("dram", n, [p * 1.05, p, p * 0.95], [20] * 3) for n, p in ((4, 1.0), (8, 1.1), (16, 1.3))])
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    assert detail["configs"]["none"]["sessions_ci"]["high_is_bound"] and detail["configs"]["dram"]["status"] == "censored_high"
    assert detail["ratios"][0]["sessions_ratio"] is None
    assert "x? (censored; no 95 % bound: an interval or bound involved reaches beyond its ladder)" in sentence
    assert "at least x" not in sentence


def test_a_curve_falling_across_the_slo_is_flagged_not_read_as_met():
    # 3 s at 4 sessions (60 turns: a miss with the evidence), 1 s at 8: the isotonic fit pools them below 2 s
    rungs = [turns_rung("none", n, [p * 1.01, p, p * 0.99], [20] * 3) for n, p in ((4, 3.0), (8, 1.0))]
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    assert detail["configs"]["none"]["status"] == "censored_high"
    assert "none non-monotone across the SLO" in sentence
    assert [c["sessions"] for c in detail["configs"]["none"]["fit"]["pooled_across_slo"]] == [4.0, 8.0]
    # a monotone curve carries no such flag
    mono = [turns_rung("none", n, [p * 1.01, p, p * 0.99], [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 4.0))]
    assert "non-monotone" not in answer(mono, 2.0, 1, "h100")[0]


def test_not_enough_evidence_with_enough_turns_names_the_real_cause():
    # one rung, 120 turns: the window is not the problem, the ladder is (before: "measured no returning turn")
    one = answer([turns_rung("none", 4, [1.0, 1.1, 0.9], [40] * 3)], 2.0, 1, "h100")[0]
    assert one.startswith("not enough evidence: 40 returning turns per cell")
    assert "1 rung(s) with the evidence, and the fit needs 2" in one and "measured no returning turn" not in one
    # turns but a NaN / zero p90 in a replication at every rung
    for bad in (math.nan, 0.0):
        s = answer([turns_rung("none", n, [p, bad, p], [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 4.0))],
                   2.0, 1, "h100")[0]
        assert "3 cell(s) with returning turns have no finite positive p90" in s and "measured no returning" not in s


def test_one_rung_recorded_twice_neither_crashes_nor_excludes_its_estimate():
    rungs = [turns_rung("none", 4, [1.0, 1.1, 0.9], [20] * 3), turns_rung("none", 4, [3.0, 3.1, 2.9], [20] * 3),
             turns_rung("none", 8, [4.0] * 3, [20] * 3)]
    _, detail = answer(rungs, 2.0, 1, "h100")  # was ZeroDivisionError in the first-miss crossing
    ci = detail["configs"]["none"]["sessions_ci"]
    assert ci["low"] <= ci["estimate"] <= ci["high"]


def test_a_ladder_repeating_a_rung_exits_2_before_anything_runs(capsys):
    assert main(["sessions", "--ladder", "4,4", "--window", "1", "--slo-ttft-p90", "2"]) == 2
    assert "--ladder repeats a session count" in capsys.readouterr().err
    for slo in ("0", "-1", "nan", "inf"):
        assert main(["sessions", "--ladder", "4", "--window", "1", "--slo-ttft-p90", slo]) == 2


def test_an_interval_narrower_than_a_decimal_is_printed_with_its_width():
    rungs = [turns_rung("none", n, [p * 1.0001, p, p * 0.9999], [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 4.0))]
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    ci = detail["configs"]["none"]["sessions_ci"]
    shown = sentence.split("hold ")[1].split(" sessions")[0]  # e.g. "10.412 [10.411, 10.413]"
    lo, hi = shown.split("[")[1].rstrip("]").split(", ")
    assert lo != hi and float(lo) == pytest.approx(ci["low"], abs=1e-3) and float(hi) == pytest.approx(ci["high"], abs=1e-3)


def test_no_bisection_from_a_met_rung_short_of_the_evidence():
    # a real --window 3 run: 1 returning turn (0.098 s) at 2 sessions, none at 4, so the first-miss bracket
    # [2, 4] and a rung 3 for every configuration; a "met" on one turn brackets nothing
    rungs = [turns_rung("none", 2, [None, 0.098], [0, 1]), turns_rung("none", 4, [None, None], [0, 0])]
    assert next_refinement(rungs, 2.0) is None
    rungs = [turns_rung("none", 2, [0.1, 0.098], [20, 20]), turns_rung("none", 4, [None, None], [0, 0])]
    assert next_refinement(rungs, 2.0) == 3  # the met end has the evidence: the bracket stands


def test_without_the_evidence_the_json_gives_no_bracket_nor_per_replication_crossing():
    # the real --window 3 run's cells: answer_detail carried bracket [2, 4] and a crossing 2.0 from one turn
    rungs = [turns_rung("none", 2, [None, 0.098], [0, 1]), turns_rung("none", 4, [None, None], [0, 0])]
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    c = detail["configs"]["none"]
    assert sentence.startswith("not enough evidence") and c["bracket"] is None
    assert c["per_replication"] == [None, None] and set(c["per_replication_status"]) == {"not_enough_evidence"}


def test_a_no_interval_ratio_keeps_the_other_sides_bound():
    # none: identical replications (no residual: "between 8 and 16"); dram: "10.4 [5.6, above 16]". The
    # ratio's upper end 16 / 8 = x2.00 rests on dram's "above 16": it is a bound, not an end
    rungs = ([turns_rung("none", n, [p] * 3, [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 4.0))]
             + [turns_rung("dram", n, [p * 1.3, p, p * 0.7], [20] * 3) for n, p in ((4, 1.0), (8, 1.9), (16, 2.2))])
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    r = detail["ratios"][0]["sessions_ratio"]
    assert r["no_residuals"] and r["high_is_bound"]
    # dram's +-30 % replications are one effect at every rung: at K = 3 its interval reaches below 4 too, and
    # the ratio's lower end (4 / 16) is then a bound as well
    assert r["low_is_bound"] == detail["configs"]["dram"]["sessions_ci"]["low_is_bound"]
    assert "and >x2.00: no interval)" in sentence


def test_a_censored_bound_holds_at_95_percent_or_moves_inside_the_ladder():
    # p90 1.9 s at the top rung (16) with +-30 % replications against 2 s: the fit meets the SLO up to 16,
    # yet 35 % of the bootstrap draws cross inside the ladder; "at least 16" was no 95 % bound
    rungs = [turns_rung("none", n, [p * 1.3, p, p * 0.75], [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 1.9))]
    sentence, detail = answer(rungs, 2.0, 1, "h100")
    fit = detail["configs"]["none"]["fit"]
    assert detail["configs"]["none"]["status"] == "censored_high" and 4 <= fit["bound_95"] < 16
    assert f"hold at least {fit['bound_95']:.1f} (95 %: the fit meets the SLO up to the top rung" in sentence
    low = [turns_rung("none", n, [p * 1.3, p, p * 0.75], [20] * 3) for n, p in ((4, 2.1), (8, 2.5), (16, 3.0))]
    sentence, detail = answer(low, 2.0, 1, "h100")
    b = detail["configs"]["none"]["fit"]["bound_95"]
    assert 4 < b <= 16 and f"hold fewer than {b:.1f} (95 %" in sentence
    # far from the SLO the bound stays the rung
    far = [turns_rung("none", n, [p * 1.05, p, p * 0.95], [20] * 3) for n, p in ((4, 1.0), (8, 1.1), (16, 1.2))]
    assert "hold at least 16 (the SLO is met up to the top rung" in answer(far, 2.0, 1, "h100")[0]


def test_a_bound_from_one_replication_per_rung_says_so():
    rungs = [turns_rung("none", n, [p], [40]) for n, p in ((4, 1.0), (8, 1.5), (16, 1.95))]
    sentence, _ = answer(rungs, 2.0, 1, "h100")
    assert "hold at least 16" in sentence and "none one replication per rung" in sentence


def test_a_rung_missing_a_replication_is_named_as_the_cause():
    # the run has K = 3; rung 16 holds 2 replications (20 turns each): it is short because a replication is
    # missing, not because the fit lacks rungs (before: "1 rung(s) with the evidence, and the fit needs 2")
    rungs = ([turns_rung("none", n, [p * 1.05, p, p * 0.95], [20] * 3) for n, p in ((4, 1.0), (8, 1.5))]
             + [turns_rung("none", 16, [4.0, 4.1], [20, 20])])
    sentence = answer(rungs, 2.0, 1, "h100")[0]
    assert "(none, beyond the bound: not enough evidence: 20 returning turns per cell (one rung's replication; 12 " \
           "needed, 36 per rung); 1 rung(s) lack a replication (each needs all 3))" in sentence
    # a configuration with K = 2 beside one with K = 3
    both = ([turns_rung("none", n, [p * 1.05, p, p * 0.95], [20] * 3) for n, p in ((4, 1.0), (8, 1.5), (16, 4.0))]
            + [turns_rung("dram", n, [p * 1.05, p * 0.95], [30, 30]) for n, p in ((4, 1.0), (8, 1.2), (16, 3.0))])
    sentence = answer(both, 2.0, 1, "h100")[0]
    assert "3 rung(s) lack a replication (each needs all 3)" in sentence and "the fit needs 2" not in sentence
    assert sentence.startswith("with dram, 1 x H100 hold: not enough evidence at p90 return TTFT <= 2 s; ")


def test_the_sentence_carries_the_rung_flags_that_qualify_what_it_measured():
    # review of issue 29 item 3 ("the sentence carries every flag"): a storage tier on tmpfs, an HBM that never
    # filled, an offload tier never read, a tier faster than the host link and unequal work per turn were in
    # the table only; the sentence named none of them (the real 8 s run's "offload tier never read" at one rung)
    rungs = [cell("none", n, 8.0) for n in (4, 8, 12, 16)] + [cell("dram+storage", n, 14.0) for n in (4, 8, 12, 16)]
    clean = answer(copy.deepcopy(rungs), 2.0, 1, "h100")[0]
    for r in rungs:
        r["flags"] = ["HBM never filled: contexts fit in GPU memory, the offload tier cannot matter here"]
        if r["tiers"] != "none":
            r["flags"] += ["the offload tier was never read in the window",
                           "the storage tier is on tmpfs (RAM), unshaped: it is host memory, not a storage device; "
                           "give --tier-bandwidth (and --tier-latency) to ask about a real tier",
                           "the storage tier (measured 80.0 GB/s) is faster than the GPU's host link (64 GB/s per "
                           "replica): a real deployment's loads would be bound by the link"]
    rungs[5]["work"] = {"turns_completed": 40, "flagged": True, "flag_reasons": ["new tokens per completed turn"]}
    sentence, detail = answer(rungs, 2.0, 1, "h100", ["engine model unvalidated on this GPU"])
    assert sentence.split(" [flags:")[0] == clean.split(" [flags:")[0]  # the figures do not change
    for tag in ("HBM never filled (the offload tier cannot matter) at 8 of 8 rungs",
                "offload tier never read at 4 of 8 rungs", "storage tier in RAM, unshaped at 4 of 8 rungs",
                "a tier faster than the GPU's host link at 4 of 8 rungs",
                "work per turn differs from the other configurations' at 1 of 8 rungs",
                "engine model unvalidated on this GPU"):
        assert tag in sentence and tag in detail["flags_in_sentence"], tag
    # flags that do not qualify the figure (a tier that held every block) stay in the table only
    quiet = copy.deepcopy(rungs[:4])
    for r in quiet:
        r["flags"] = ["the cpu tier never filled nor evicted (peak 0.20 of 0.25 GiB): it held every block offered"]
    assert "never filled nor evicted" not in answer(quiet, 2.0, 1, "h100")[0]


@pytest.mark.parametrize(("plan", "window_plan", "turns_per_s", "calls", "window", "pilot"), [
    (True, "planned", 0.5, 4, 30.0, {"window_s": 20.0, "returning_turns": 10}),  # 10 of 12: again at 30 s
    (True, "planned", 0.75, 3, 20.0, None),  # 15 of 12 x 1.25: the evidence with a margin, no pilot
    (True, "planned", 0.6, 4, 25.0, {"window_s": 20.0, "returning_turns": 12}),  # 12 of 12: the other two replications would be even odds short
    (True, "planned", 0.05, 4, 80.0, {"window_s": 20.0, "returning_turns": 1}),  # capped at 4 x --window
    (True, "planned", 0.0, 3, 20.0, None),  # no returning turn: no rate to plan from, nothing run again
    (True, "fixed", 0.5, 3, 20.0, None),  # --window-plan fixed holds every window
    (False, "planned", 0.5, 3, 20.0, None),  # no SLO: no plan
])
def test_a_first_replication_short_of_the_evidence_is_a_pilot_and_every_replication_runs_longer(
        monkeypatch, plan, window_plan, turns_per_s, calls, window, pilot):
    # issue 29 item 8: the lowest rung has no rung below to plan from, so at 20 s windows seed 7's 4-session
    # baseline measured 10-12 returning turns per replication (12 needed with K = 3) and the answer was a
    # bound. A first replication short of the evidence is now a pilot, left out of the cell; every replication
    # runs at the window that would give 1.25 x the turns needed, in proportion, within 4 x --window
    import dataclasses
    import io

    from kv_cache.benchmarks.sessions import run as runmod

    windows = []

    class FakeRung:
        def __init__(self, ls, tier, n, supply, planned_cycle_s=None):
            self.ls = ls
            self.throughput_samples = [1.0]

        def run(self):
            windows.append(self.ls.window_s)
            return {"ttft": {"return": {"n": int(turns_per_s * self.ls.window_s)}}, "completed_turns": 1,
                    "throughput_tokens_per_s_per_gpu": {"estimate": 1.0}}

    monkeypatch.setattr(runmod, "RungRun", FakeRung)
    monkeypatch.setattr(runmod, "merge_replications", lambda reps: {"reps": reps, "replications": {
        "throughput_tokens_per_s_per_gpu": [1.0] * len(reps)}})
    ls = dataclasses.make_dataclass("LS", [("window_s", float), ("seed", int), ("warmup_s", float)])(20.0, 1, 1.0)
    rungs: list = []
    cell = runmod._run_cell(ls, "none", 4, lambda seed: None, io.StringIO(), 3, {}, runmod.RungProgress(ls, 3),
                            rungs, plan=plan, window_plan=window_plan)
    assert len(windows) == calls and windows[-3:] == [pytest.approx(window)] * 3
    assert len(cell["reps"]) == 3 and all(r["ttft"]["return"]["n"] == int(turns_per_s * window) for r in cell["reps"])
    got = cell["window_plan"]["evidence_pilot"]
    assert (got and {k: got[k] for k in pilot}) == pilot and cell["window_plan"]["window_s"] == pytest.approx(window)
    if pilot:  # what was left out, for a reader of the document
        assert got["left_out"] and got["needed_returning_turns"] == 12 and got["wanted_returning_turns"] == 15
        assert got["rerun_window_s"] == pytest.approx(window)
    assert rungs == [cell]


def test_evidence_window_refuses_what_it_cannot_plan_from():
    from kv_cache.benchmarks.sessions.steady_state import evidence_window

    assert evidence_window(20.0, 20.0, 12, 12) is None  # enough, with no other replication to come
    assert evidence_window(20.0, 20.0, 12, 12, replications=3) == pytest.approx(25.0)  # the others may fall short
    assert evidence_window(20.0, 20.0, 15, 12, replications=3) is None  # 1.25 x 12
    assert evidence_window(20.0, 20.0, 36, 36, replications=1) is None
    assert evidence_window(20.0, 20.0, 0, 12) is None  # no rate
    assert evidence_window(20.0, 20.0, -3, 12) is None
    assert evidence_window(0.0, 20.0, 3, 12) is None
    assert evidence_window(80.0, 20.0, 3, 12) is None  # already at the cap
    assert evidence_window(20.0, 20.0, 11, 12) == pytest.approx(20.0 * 12 * 1.25 / 11)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_pilot_needs_what_the_answer_counts_per_replication(k):
    # the run's pilot and evidence_text share turns_needed_per_replication: K replications at that many turns
    # each give a rung the evidence (rung_has_evidence), and one turn fewer in one of them does not
    from kv_cache.metrics.slo_fit import Cell, rung_has_evidence, turns_needed_per_replication

    need = turns_needed_per_replication(k)
    assert need == {1: 36, 2: 18, 3: 12, 5: 10}[k]
    assert rung_has_evidence([Cell(4, i, 1.0, need) for i in range(k)], k)
    assert not rung_has_evidence([Cell(4, 0, 1.0, need - 1)] + [Cell(4, i, 1.0, need) for i in range(1, k)], k)


def test_a_pilot_counts_as_one_more_run_in_the_progress_and_its_samples_are_not_the_cells(monkeypatch):
    # the pilot ran (its time is in the elapsed): "rung i of n" counts it, so the label never passes its total
    # and the ETA never goes negative; the cell's throughput samples (raw) are the kept replication's
    import dataclasses
    import io

    from kv_cache.benchmarks.sessions import run as runmod

    calls = []

    class FakeRung:
        def __init__(self, ls, tier, n, supply, planned_cycle_s=None):
            self.ls = ls
            self.throughput_samples = [float(len(calls) + 1)]

        def run(self):
            calls.append(self.ls.window_s)
            return {"ttft": {"return": {"n": int(0.5 * self.ls.window_s)}}, "completed_turns": 1, "seed": self.ls.seed,
                    "throughput_tokens_per_s_per_gpu": {"estimate": float(len(calls))}}

    monkeypatch.setattr(runmod, "RungRun", FakeRung)
    ls = dataclasses.make_dataclass("LS", [("window_s", float), ("seed", int), ("warmup_s", float)])(20.0, 1, 1.0)
    out, raw, rungs = io.StringIO(), {}, []
    progress = runmod.RungProgress(ls, 2)
    for n in (4, 8):
        runmod._run_cell(ls, "none", n, lambda seed: None, out, 1, raw, progress, rungs, plan=True,
                         window_plan="planned")
    assert len(calls) == 4 and progress.total == 4 and progress.done == 4
    assert "of 2" not in out.getvalue().split("\n")[-1] and "ETA -" not in out.getvalue()
    assert raw[("none", 4)] == [2.0] and raw[("none", 8)] == [4.0]  # the kept runs', not the pilots'
    assert [r["window_plan"]["evidence_pilot"]["throughput_tokens_per_s_per_gpu"] for r in rungs] == [1.0, 3.0]
    assert [r["throughput_tokens_per_s_per_gpu"]["estimate"] for r in rungs] == [2.0, 4.0]


def test_the_sentence_says_how_many_rungs_ran_again_after_a_pilot():
    rungs = [cell("none", n, 8.0) for n in (4, 8, 16)]
    for r, w in zip(rungs, (30.0, 8.0, 32.0), strict=True):
        r["window_plan"] = {"mode": "planned", "requested_window_s": 8.0, "window_s": w, "evidence_pilot": None}
    rungs[0]["window_plan"]["evidence_pilot"] = {"window_s": 8.0, "returning_turns": 6}
    sentence, _ = answer(rungs, 2.0, 1, "h100")
    assert ("windows planned to 30-32 s at 2 of 3 rungs, 1 run again after a pilot short of the evidence, left out "
            "(--window 8; --window-plan fixed holds it)") in sentence


def test_an_interrupt_inside_a_rung_after_its_pilot_says_what_was_left_out(monkeypatch, capsys):
    # Ctrl-C in the run after a pilot: the finished rungs are kept, and the document (unfinished_rung) and the
    # console say which rung it stopped in, how many of its replications had finished and that a pilot ran
    import dataclasses
    import io

    from kv_cache.benchmarks.sessions import run as runmod

    calls = []

    class FakeRung:
        def __init__(self, ls, tier, n, supply, planned_cycle_s=None):
            self.ls, self.n = ls, n
            self.throughput_samples = [1.0]

        def run(self):
            calls.append((self.n, self.ls.window_s))
            if self.n == 8 and len([c for c in calls if c[0] == 8]) == 3:  # 8 sessions: pilot, rep 1, then stop
                raise KeyboardInterrupt
            return {"ttft": {"return": {"n": int(0.5 * self.ls.window_s), "p90_s": {"estimate": 0.5}}},
                    "completed_turns": 1, "seed": self.ls.seed, "throughput_tokens_per_s_per_gpu": {"estimate": 1.0}}

    monkeypatch.setattr(runmod, "RungRun", FakeRung)
    monkeypatch.setattr(runmod, "merge_replications", lambda reps: {"tiers": "none", "sessions": 0, "replications": {
        "throughput_tokens_per_s_per_gpu": [1.0] * len(reps)}})
    monkeypatch.setattr(runmod, "refine_ladder", lambda *a: None)
    monkeypatch.setattr(runmod, "print_banner", lambda *a: None)
    monkeypatch.setattr(runmod, "plan_window", lambda w, c: w)
    ls = dataclasses.make_dataclass("LS", [("window_s", float), ("seed", int), ("warmup_s", float)])(20.0, 1, 1.0)
    s = dataclasses.make_dataclass("S", [("ladder", list), ("tiers", list), ("sessions", int), ("replications", int),
                                         ("slo_ttft_p90_s", float), ("ladder_auto_start", int), ("window_plan", str)])(
        [4, 8], ["none"], 4, 2, 2.0, 0, "planned")
    monkeypatch.setattr(runmod, "engine_gpu_warning", lambda ls: [])
    monkeypatch.setattr(runmod, "flag_work_equivalence", lambda rungs: None)
    monkeypatch.setattr(runmod, "rung_warnings", lambda rungs, summary: [])
    done: list = []
    body, interrupted, error = runmod._climb(s, ls, None, io.StringIO(), done)
    assert interrupted and error is None and len(done) == 1  # the 4-session rung is kept
    u = body["unfinished_rung"]
    assert (u["tiers"], u["sessions"], u["replications"], u["replications_finished"]) == ("none", 8, 2, 1)
    assert u["evidence_pilot"]["returning_turns"] == 10 and u["window_s"] == pytest.approx(45.0)
    assert u["ttft_return_n"] == [22] and u["ttft_return_p90_s"] == [0.5]
    assert "none at 8 sessions left out: 1 of 2 replications finished, after a pilot" in capsys.readouterr().err
