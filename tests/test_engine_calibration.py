"""The roofline against published throughputs (kv_cache/specs/calibration.yaml): vidur's per-layer
profiles, vLLM's benchmark results and MLPerf Inference results; and the closed loop the end-to-end
entries are modelled with (kv_cache/serving/engine/closed_loop.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kv_cache.benchmarks.sessions.run import engine_line
from kv_cache.serving.engine import roofline
from kv_cache.serving.engine.calibration import (
    EndToEndEntry,
    calibration_entries,
    calibration_errors,
    constants,
    end_to_end_tokens_per_s,
    fit_fp8_compute_efficiency,
    fp8_compute_efficiency,
    gpu_checks,
)
from kv_cache.serving.engine.closed_loop import closed_loop
from kv_cache.settings.sections import InferenceModelConfig
from kv_cache.specs import gpu_specs
from kv_cache.specs.models import MODEL_CONFIGS

ENTRIES = calibration_entries()
ROWS = calibration_errors(InferenceModelConfig())
LAYERS = [r for r in ROWS if r["kind"] == "layer_profile"]
WHOLE = [r for r in ROWS if r["kind"] == "end_to_end"]
STEPS = [r for r in ROWS if r["kind"] == "decode_step"]


def _id(row):
    tail = f"-{row['context_tokens']}" if row["kind"] == "decode_step" else ""
    return f"{row['source_kind'].split(' ')[0]}-{row['kind']}-{row['gpu']}-{row.get('measured_model', row['model'])}{tail}"


def test_at_least_three_gpu_model_pairs_each_with_a_source():
    pairs = {(e.gpu, e.model) for e in ENTRIES}
    assert len(pairs) >= 3
    assert all(e.source.startswith("https://") for e in ENTRIES)


def test_the_three_source_kinds_the_issue_names_are_in_the_table():
    kinds = {e.source_kind for e in ENTRIES}
    assert kinds == {"vidur profiling data", "vLLM benchmark results", "MLPerf Inference results"}
    assert {r["source_kind"] for r in WHOLE} == {"vLLM benchmark results", "MLPerf Inference results"}


@pytest.mark.parametrize("row", LAYERS, ids=_id)
def test_roofline_within_20_percent_of_each_published_per_layer_figure(row):
    assert abs(row["prefill_error"]) <= 0.20, row
    assert abs(row["decode_error"]) <= 0.20, row


@pytest.mark.parametrize("row", WHOLE + STEPS, ids=_id)
def test_each_end_to_end_and_decode_step_entry_is_where_the_table_says(row):
    # an entry the table holds within 20 % is; one it records outside (the L40S FP8 run) is outside, so the
    # claim in calibration.yaml and README stays true either way
    if row["held_within_20pct"]:
        assert abs(row["error"]) <= 0.20, row
    else:
        assert abs(row["error"]) > 0.20, row
    assert row["within_20pct"] == row["held_within_20pct"]


def test_the_vllm_entries_are_held_within_20_percent():
    vllm = [r for r in WHOLE + STEPS if r["source_kind"] == "vLLM benchmark results"]
    assert {r["kind"] for r in vllm} == {"end_to_end", "decode_step"}
    assert all(r["held_within_20pct"] and abs(r["error"]) <= 0.20 for r in vllm)


def test_the_mlperf_entries_but_the_l40s_fp8_and_the_bf16_one_are_held_within_20_percent():
    mlperf = [r for r in WHOLE if r["source_kind"] == "MLPerf Inference results"]
    assert len(mlperf) == 5
    outside = [(r["gpu"], r["measured_model"], r["dtype"]) for r in mlperf if not r["held_within_20pct"]]
    assert outside == [("l40s", "llama3.1-8b", "fp8"), ("h100", "deepseek-r1-distill-llama-8b", "bf16")]
    assert all(abs(r["error"]) <= 0.20 for r in mlperf if r["held_within_20pct"])


BF16_MLPERF = "mlperf-v5.0-open-flexai-h100-deepseek-r1-distill-llama-8b"


def test_the_bf16_mlperf_run_is_an_independent_check_of_the_bf16_constants():
    # the one MLPerf run in BF16 (FlexAI, open division, Server): costed at prefill_mfu 0.65 and
    # decode_hbm_efficiency 0.70 as `kv-cache sessions` runs, in no fit, and recorded outside 20 % (+36 %)
    import re

    from kv_cache.serving.engine.calibration import _yaml

    e = next(x for x in ENTRIES if isinstance(x, EndToEndEntry) and x.id == BF16_MLPERF)
    row = next(r for r in WHOLE if r["source"] == e.source)
    assert e.dtype == "bf16" and row["compute_efficiency"] == EFF.prefill_mfu == 0.65
    c = constants()["fp8_compute_efficiency"]
    assert e.id not in c.fitted_on + c.held_out
    assert row["error"] == 0.3626 and not row["within_20pct"]
    # its concurrency is Little's law on the run's own summary: completed samples/s x mean latency
    note = next(x["note"] for x in _yaml() if x.get("id") == BF16_MLPERF)
    samples = float(re.search(r"Samples per second ([\d.]+)", note).group(1))
    latency_s = int(re.search(r"Mean latency \(ns\) (\d+)", note).group(1)) / 1e9
    assert round(samples * latency_s) == e.concurrency == 22
    # the mapping's free choices do not bring it into the band: one request fewer in flight, a larger chunk
    for variant in (dataclasses.replace(e, concurrency=21, requests=126),
                    dataclasses.replace(e, prefill_chunk_tokens=8192)):
        assert end_to_end_tokens_per_s(variant, EFF)[0] / e.published_tokens_per_s - 1 > 0.20


def test_bf16_errors_are_those_of_the_bf16_calibration():
    # the FP8 constant leaves every BF16 figure as it was (prefill_mfu 0.65, decode_hbm_efficiency 0.70)
    errors = [(r["prefill_error"], r["decode_error"]) for r in LAYERS]
    assert errors == [(-0.0197, 0.0187), (-0.0389, 0.0165), (-0.1521, -0.0245), (-0.0713, 0.0706)]
    assert [r["error"] for r in STEPS] == [-0.06, -0.1397]
    bf16 = [r for r in WHOLE if r["dtype"] == "bf16"]
    assert [r["error"] for r in bf16] == [-0.0596, 0.3626]
    assert all(r["compute_efficiency"] == 0.65 for r in bf16)


def test_the_fp8_compute_efficiency_is_the_fit_the_yaml_describes():
    # recompute it: each fitted entry's exact efficiency by bisection, then their geometric mean
    c = constants()["fp8_compute_efficiency"]
    fit, exact = fit_fp8_compute_efficiency(EFF)
    assert fit == c.value == fp8_compute_efficiency() == 0.426
    ids = {e.id for e in ENTRIES if isinstance(e, EndToEndEntry)}
    assert set(c.fitted_on) | set(c.held_out) <= ids and not set(c.fitted_on) & set(c.held_out)
    # the fit is on NVIDIA's TensorRT-LLM runs only; the vLLM runs are held out
    assert all("nvidia" in i for i in c.fitted_on) and all("redhat" in i for i in c.held_out)
    fp8 = {r["source"]: r for r in WHOLE if r["dtype"] == "fp8"}
    assert all(r["compute_efficiency"] == 0.426 for r in fp8.values())
    for e in ENTRIES:
        if isinstance(e, EndToEndEntry) and e.id in exact:
            # at its exact efficiency the entry reproduces; the table's error follows from the ratio
            at, _ = end_to_end_tokens_per_s(e, EFF, exact[e.id])
            assert at == pytest.approx(e.published_tokens_per_s, rel=1e-6)
    assert exact["mlperf-v5.1-redhat-l40s-llama3.1-8b"] < 0.8 * c.value  # why the L40S run is outside


def test_no_single_fp8_efficiency_holds_both_the_h200_and_the_l40s_runs():
    # each entry's modelled throughput rises with the efficiency; at 0.355 the H200 run is already more than
    # 20 % slow and the L40S run still more than 20 % fast, so below it the H200 run is out of the band and
    # above it the L40S run is: why the L40S entry is recorded outside, not fitted into the band
    by_id = {e.id: e for e in ENTRIES if isinstance(e, EndToEndEntry) and e.id}
    h200, l40s = by_id["mlperf-v4.1-nvidia-h200-llama2-70b"], by_id["mlperf-v5.1-redhat-l40s-llama3.1-8b"]
    assert end_to_end_tokens_per_s(h200, EFF, 0.355)[0] / h200.published_tokens_per_s - 1 < -0.20
    assert end_to_end_tokens_per_s(l40s, EFF, 0.355)[0] / l40s.published_tokens_per_s - 1 > 0.20
    low, high = (end_to_end_tokens_per_s(l40s, EFF, f)[0] for f in (0.3, 0.4))
    assert low < high  # monotone in the efficiency
    # the claim itself, on a grid of efficiencies from 0.20 to 0.80 of the FP8 peak: never both within 20 %
    for f in (k / 100 for k in range(20, 81)):
        errors = [end_to_end_tokens_per_s(e, EFF, f)[0] / e.published_tokens_per_s - 1 for e in (h200, l40s)]
        assert not all(abs(x) <= 0.20 for x in errors), (f, errors)


def test_a_decode_step_is_the_published_fit_at_its_context():
    row = next(r for r in STEPS if r["context_tokens"] == 125000)
    assert row["published_step_ms"] == pytest.approx(6.44 + 4.37e-05 * 125000)
    step = roofline.decode_step_seconds(GPU, EFF, M8, 1, 125000)
    assert row["modelled_tokens_per_s"] == pytest.approx(1 / step, abs=0.1)


def test_error_is_modelled_over_published_minus_one():
    row = LAYERS[0]
    assert row["prefill_error"] == pytest.approx(
        row["prefill_modelled_tokens_per_s"] / row["prefill_published_tokens_per_s"] - 1, abs=1e-3)
    for row in WHOLE:
        assert row["error"] == pytest.approx(
            row["modelled_output_tokens_per_s"] / row["published_output_tokens_per_s"] - 1, abs=1e-3)
    for row in STEPS:
        assert row["error"] == pytest.approx(row["modelled_tokens_per_s"] / row["published_tokens_per_s"] - 1, abs=2e-3)


def test_the_old_typical_constants_miss_the_published_prefill():
    # prefill_mfu 0.5 (the uncalibrated value) is > 20 % slow on at least one entry: why it was recalibrated
    rows = calibration_errors(InferenceModelConfig(prefill_mfu=0.5, decode_hbm_efficiency=0.8))
    assert min(r["prefill_error"] for r in rows if r["kind"] == "layer_profile") < -0.20


def test_console_line_quotes_every_entry_with_its_source_kind():
    cal = {"prefill_mfu": 0.65, "decode_hbm_efficiency": 0.7, "this_pair": None, "entries": ROWS,
           "max_abs_prefill_error": max(abs(r["prefill_error"]) for r in LAYERS),
           "max_abs_decode_error": max(abs(r["decode_error"]) for r in LAYERS),
           "end_to_end": [{**r, "model": r["measured_model"]} for r in WHOLE], "decode_steps": STEPS,
           "fp8_compute_efficiency": {"value": 0.426, "fitted_on": ["a", "b"]}}
    line = engine_line(cal)
    assert "prefill_mfu 0.65 (FP8 runs: 0.426 of the FP8 peak, fitted on 2 MLPerf runs)" in line
    assert "MLPerf L40S llama3.1-8b fp8 +47% (outside 20%)" in line and "MLPerf H100 llama3.1-8b fp8 +15%," in line
    assert "MLPerf H100 deepseek-r1-distill-llama-8b bf16 +36% (outside 20%)" in line
    pairs = {(r["gpu"], r.get("measured_model") or r["model"]) for r in ROWS}
    assert len(pairs) < len(ROWS)  # several entries share a pair: the line counts both, apart
    assert f"error against {len(ROWS)} published throughputs of {len(pairs)} (GPU, model) pairs" in line
    # the "within" bounds are scoped to the per-layer profiles, which are the only ones they bound
    assert f"{len(LAYERS)} per-layer profiles (vidur) prefill within 15%, decode within 7%; end to end:" in line
    assert "vLLM H100 llama3.1-8b bf16" in line and "MLPerf H200 llama2-70b fp8" in line
    assert "decode steps at batch 1: vLLM H100 llama3.1-8b bf16 256 tokens" in line
    assert line.count("(outside 20%)") == sum(not r["within_20pct"] for r in WHOLE + STEPS)


# -- the closed loop ------------------------------------------------------------------------------------
GPU = gpu_specs()["h100"]
EFF = InferenceModelConfig()
M8 = MODEL_CONFIGS["llama3.1-8b"]


def test_one_request_takes_one_prefill_and_its_decode_steps():
    run = closed_loop(GPU, EFF, M8, [(1000, 5)], concurrency=1, chunk_tokens=8192)
    expected = roofline.iteration_seconds(GPU, EFF, M8, [(1000, 0)], 0, 0) + sum(
        roofline.iteration_seconds(GPU, EFF, M8, [], 1, 1000 + k) for k in range(1, 5))
    assert run.iterations == 5 and run.seconds == pytest.approx(expected)
    assert run.output_tokens_per_s == pytest.approx(5 / expected)


def test_a_long_prompt_is_prefilled_in_chunks():
    run = closed_loop(GPU, EFF, M8, [(20000, 1)], concurrency=1, chunk_tokens=8192)
    chunks = [(8192, 0), (8192, 8192), (3616, 16384)]
    assert run.iterations == 3
    assert run.seconds == pytest.approx(sum(roofline.iteration_seconds(GPU, EFF, M8, [c], 0, 0) for c in chunks))


def test_a_large_batch_runs_at_the_compute_roofline():
    # 512 short requests in flight on a 70B model at TP 4: every iteration compute-bound, so output tokens/s
    # is the compute rate over the FLOPs of each request's input and output tokens (attention < 1 % here)
    m70 = MODEL_CONFIGS["llama3.1-70b-instruct"]
    run = closed_loop(GPU, EFF, m70, [(200, 300)] * 3072, concurrency=512, chunk_tokens=8192, tp=4, skip=1024)
    rate = 4 * GPU.peak_dense_tflops * 1e12 * EFF.prefill_mfu / (2 * m70.active_params * 500 / 300)
    assert run.max_running == 512
    assert run.output_tokens_per_s == pytest.approx(rate, rel=0.03)


def test_admission_stops_where_hbm_cannot_hold_the_final_contexts():
    small = dataclasses.replace(GPU, hbm_gb=24.0)
    capacity = roofline.hbm_kv_capacity_tokens(small, EFF, M8)
    run = closed_loop(small, EFF, M8, [(4000, 1000)] * 64, concurrency=64, chunk_tokens=8192)
    assert run.max_running == capacity // 5000 < 64


def test_fp8_runs_a_compute_bound_run_at_its_own_efficiency_of_twice_the_peak():
    vllm = next(e for e in ENTRIES if isinstance(e, EndToEndEntry) and e.source_kind == "vLLM benchmark results")
    big = dataclasses.replace(vllm, model="llama3.1-70b-instruct", tp=4, gpus=8, input_tokens=200, output_tokens=300,
                              spread=0.0, concurrency=512, requests=3072, steady_state=True)
    fp8, _ = end_to_end_tokens_per_s(dataclasses.replace(big, dtype="fp8"), EFF)
    bf16, running = end_to_end_tokens_per_s(big, EFF)
    assert running == 512 and fp8 / bf16 == pytest.approx(2.0 * fp8_compute_efficiency() / EFF.prefill_mfu, rel=0.03)


def test_bad_closed_loop_input_is_refused():
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(100, 10)], concurrency=0, chunk_tokens=8192)
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(100, 10)] * 2, concurrency=1, chunk_tokens=8192, skip=1)
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(10**7, 10)], concurrency=1, chunk_tokens=8192)


def test_each_mlperf_entrys_output_per_sample_is_the_runs_tokens_over_its_samples():
    # calibration.yaml derives the mean output of an MLPerf entry from its run's summary (quoted in the
    # entry's note): Tokens per second / Samples per second; the workload and the published rate are those
    import re

    from kv_cache.serving.engine.calibration import _yaml

    mlperf = [e for e in _yaml() if e.get("source_kind") == "MLPerf Inference results"]
    assert len(mlperf) == 5
    for e in mlperf:
        found = re.search(r"Samples per second ([\d.]+), Tokens per second ([\d.]+) -> ([\d.]+) output tokens", e["note"])
        assert found, e["id"]
        samples, tokens, per_sample = map(float, found.groups())
        assert round(tokens / samples, 2) == per_sample == e["workload"]["output_tokens"], e["id"]
        assert e["published"]["output_tokens_per_s"] == tokens, e["id"]
        scenario = "Server" if e["id"] == BF16_MLPERF else "Offline"
        assert e["source"].endswith(f"/{scenario}/performance/run_1/mlperf_log_summary.txt"), e["id"]


# -- what the table says of a run's own GPU ----------------------------------------------------------------
def test_a_gpu_with_16_bit_checks_all_within_20_percent_is_validated():
    a100 = gpu_checks(ROWS, "a100", 2.0)
    assert a100["status"] == "validated" and not a100["unvalidated"]
    assert len(a100["checks"]) == len([r for r in LAYERS if r["gpu"] == "a100"]) and a100["precision"] == "16-bit"
    assert "3 published checks: 3 within 20 %" in a100["statement"]


def test_a_gpu_with_one_16_bit_check_outside_is_mixed_and_names_it():
    h100 = gpu_checks(ROWS, "h100", 2.0)
    here = [r for r in ROWS if r["gpu"] == "h100" and r["dtype"] in ("fp16", "bf16")]
    out = [r for r in here if not r.get("within_20pct", True)]
    assert h100["status"] == "mixed" and not h100["unvalidated"] and len(out) == 1
    assert f"{len(here)} published checks: {len(here) - 1} within 20 %" in h100["statement"]
    assert "1 outside (MLPerf deepseek-r1-distill-llama-8b bf16 +36%)" in h100["statement"]


def test_a_gpu_whose_only_check_is_outside_is_unvalidated_and_says_so():
    l40s = gpu_checks(ROWS, "l40s", 2.0)
    assert l40s["status"] == "other_precision" and l40s["unvalidated"]
    assert [c["within_20pct"] for c in l40s["checks"]] == [False]
    assert "no check at 16-bit" in l40s["statement"] and "MLPerf llama3.1-8b fp8 +47%" in l40s["statement"]
    assert "absolute figures (sessions held, throughput, TTFT) are unvalidated" in l40s["statement"]


def test_a_gpu_with_no_entry_is_unchecked_and_one_with_other_precision_checks_within_is_not_flagged():
    b200 = gpu_checks(ROWS, "b200", 2.0)
    assert (b200["status"], b200["unvalidated"], b200["checks"]) == ("unchecked", True, [])
    h200 = gpu_checks(ROWS, "h200", 2.0)  # FP8 MLPerf only, within 20 %: said, not flagged
    assert h200["status"] == "other_precision" and not h200["unvalidated"] and "MLPerf llama2-70b fp8 -11%" in h200["statement"]


def test_weights_other_than_2_bytes_match_no_entry():
    # the sessions engine costs every run at the 16-bit rate, so 1-byte weights are not the FP8 entries' costing
    h100 = gpu_checks(ROWS, "h100", 1.0)
    assert h100["status"] == "other_precision" and h100["precision"] == "1-byte weights at the 16-bit rate"


def test_the_console_line_ends_with_this_runs_gpu():
    cal = {"prefill_mfu": 0.65, "decode_hbm_efficiency": 0.7, "this_pair": None, "entries": ROWS,
           "max_abs_prefill_error": 0.15, "max_abs_decode_error": 0.07, "this_gpu": gpu_checks(ROWS, "l40s", 2.0)}
    assert engine_line(cal).endswith("this run's GPU: " + cal["this_gpu"]["statement"])
