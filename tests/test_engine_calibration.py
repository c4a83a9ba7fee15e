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
    end_to_end_tokens_per_s,
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
    # an entry the table holds within 20 % is; one it records outside (FP8 MLPerf runs) is outside, so the
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
           "end_to_end": [{**r, "model": r["measured_model"]} for r in WHOLE], "decode_steps": STEPS}
    line = engine_line(cal)
    assert f"error against {len(ROWS)} published (GPU, model) throughputs" in line
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


def test_fp8_doubles_a_compute_bound_run_and_the_dtype_is_a_field_of_the_entry():
    vllm = next(e for e in ENTRIES if isinstance(e, EndToEndEntry) and e.source_kind == "vLLM benchmark results")
    big = dataclasses.replace(vllm, model="llama3.1-70b-instruct", tp=4, gpus=8, input_tokens=200, output_tokens=300,
                              spread=0.0, concurrency=512, requests=3072, steady_state=True)
    fp8, _ = end_to_end_tokens_per_s(dataclasses.replace(big, dtype="fp8"), EFF)
    bf16, running = end_to_end_tokens_per_s(big, EFF)
    assert running == 512 and fp8 / bf16 == pytest.approx(2.0, rel=0.03)


def test_bad_closed_loop_input_is_refused():
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(100, 10)], concurrency=0, chunk_tokens=8192)
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(100, 10)] * 2, concurrency=1, chunk_tokens=8192, skip=1)
    with pytest.raises(ValueError):
        closed_loop(GPU, EFF, M8, [(10**7, 10)], concurrency=1, chunk_tokens=8192)
