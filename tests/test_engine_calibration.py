"""The roofline against published throughputs (kv_cache/specs/calibration.yaml): vidur's per-layer
profiles, vLLM's benchmark results and MLPerf Inference results; and the closed loop the end-to-end
entries are modelled with (kv_cache/serving/engine/closed_loop.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kv_cache.render.sessions import engine_line
from kv_cache.serving.engine import roofline
from kv_cache.serving.engine.calibration import (
    EndToEndEntry,
    _at_precision,
    calibration_entries,
    calibration_errors,
    constants,
    end_to_end_tokens_per_s,
    fit_fp8_compute_efficiency,
    fp8_compute_efficiency,
    fp8_leave_one_out,
    gpu_checks,
    prefill_ttft_entries,
    prefill_ttft_errors,
    prefill_ttft_seconds,
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
    # an entry the table holds within 20 % is; one it records outside (FlexAI's BF16 run) is outside, so the
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


def test_the_mlperf_entries_but_the_bf16_one_are_held_within_20_percent():
    mlperf = [r for r in WHOLE if r["source_kind"] == "MLPerf Inference results"]
    assert len(mlperf) == 5
    outside = [(r["gpu"], r["measured_model"], r["dtype"]) for r in mlperf if not r["held_within_20pct"]]
    assert outside == [("h100", "deepseek-r1-distill-llama-8b", "bf16")]
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
    assert row["error"] == 0.3623 and not row["within_20pct"]
    # its concurrency is Little's law on the run's own summary: completed samples/s x mean latency
    note = next(x["note"] for x in _yaml() if x.get("id") == BF16_MLPERF)
    samples = float(re.search(r"Samples per second ([\d.]+)", note).group(1))
    latency_s = int(re.search(r"Mean latency \(ns\) (\d+)", note).group(1)) / 1e9
    assert round(samples * latency_s) == e.concurrency == 22
    # the mapping's free choices do not bring it into the band: one request fewer in flight, a larger chunk
    for variant in (dataclasses.replace(e, concurrency=21, requests=126),
                    dataclasses.replace(e, prefill_chunk_tokens=8192)):
        assert end_to_end_tokens_per_s(variant, EFF)[0] / e.published_tokens_per_s - 1 > 0.20


def test_the_one_entry_the_table_holds_outside_is_one_another_published_run_contradicts():
    outside = [r for r in ROWS if not r.get("held_within_20pct", True)]
    assert [r.get("id", r["measured_model"]) for r in outside] == ["deepseek-r1-distill-llama-8b"]
    assert all(r["contradicted_by"] for r in outside)
    # and it names an entry of the table: the 125,000-token decode step (proved below)
    assert any(r["kind"] == "decode_step" and r["context_tokens"] == 125000 and r["gpu"] == "h100" for r in STEPS)
    assert "125,000 tokens" in outside[0]["contradicted_by"]
    assert all(not r.get("contradicted_by") for r in ROWS if r.get("held_within_20pct", True))


def test_no_decode_efficiency_holds_the_flexai_run_and_vllms_long_context_decode_step_together():
    # both measure Llama 3.1 8B's decode on one H100 in BF16 (FlexAI: vLLM 0.7.3; the vLLM blog's fit: vLLM
    # v0.19.1): within 20 % of FlexAI needs decode_hbm_efficiency <= 0.61, within 20 % of the 125k-token
    # decode step >= 0.65. So no roofline constant holds both: the two published measurements of the same GPU
    # work disagree with each other, not only with the model. FlexAI's is the one that disagrees with the
    # table's other H100 16-bit entries (vidur's kernels, vLLM's decode steps and its end-to-end run).
    e = next(x for x in ENTRIES if isinstance(x, EndToEndEntry) and x.id == BF16_MLPERF)
    step = next(x for x in ENTRIES if getattr(x, "kind", "") == "decode_step" and x.context_tokens == 125000)

    def flexai(d: float) -> float:
        return end_to_end_tokens_per_s(e, dataclasses.replace(EFF, decode_hbm_efficiency=d))[0] / e.published_tokens_per_s - 1

    def vllm(d: float) -> float:
        at = dataclasses.replace(EFF, decode_hbm_efficiency=d)
        return 1.0 / roofline.decode_step_seconds(GPU, at, M8, 1, step.context_tokens) / (1000.0 / step.published_ms) - 1

    assert flexai(0.61) <= 0.20 < flexai(0.615) and vllm(0.652) >= -0.20 > vllm(0.648)
    # the README's and the yaml's figures: the modelled decode step at the run's 22 requests of ~514 tokens of
    # context each (222 in + half of 584 out) is 7.5 ms (not the 6.9 ms of the weights alone), and the
    # run's 10.23 ms per output token over it is the entry's +36 %
    gpu, model, at = _at_precision(e, EFF)
    assert model.bytes_per_token == 131072 and at.weight_bytes_per_param == 2.0
    step_ms = roofline.decode_step_seconds(gpu, at, model, 22, 22 * 514) * 1e3
    assert round(step_ms, 1) == 7.5 and 10.23 / step_ms - 1 == pytest.approx(0.36, abs=0.01)
    for d in (k / 1000 for k in range(400, 1001, 5)):
        assert not (abs(flexai(d)) <= 0.20 and abs(vllm(d)) <= 0.20), d

    # the same from the decode steps alone, without the closed loop's mapping of a Server run (Poisson
    # arrivals) onto synchronized identical requests: the run's own 10.23 ms per output token against the
    # modelled step at 22 x ~514 tokens needs at most 0.614, the 125k-token step at least 0.651
    def tpot(d: float) -> float:
        step_s = roofline.decode_step_seconds(gpu, dataclasses.replace(at, decode_hbm_efficiency=d), model, 22, 22 * 514)
        return 10.23e-3 / step_s - 1

    assert tpot(0.614) <= 0.20 < tpot(0.616) and vllm(0.651) >= -0.20 > vllm(0.650)
    for d in (k / 1000 for k in range(400, 1001, 1)):
        assert not (abs(tpot(d)) <= 0.20 and abs(vllm(d)) <= 0.20), d


def test_bf16_errors_are_those_of_the_bf16_calibration():
    # the FP8 constant leaves every BF16 figure as it was (prefill_mfu 0.65, decode_hbm_efficiency 0.70)
    errors = [(r["prefill_error"], r["decode_error"]) for r in LAYERS]
    assert errors == [(-0.0197, 0.0187), (-0.0389, 0.0165), (-0.1521, -0.0245), (-0.0713, 0.0706)]
    assert [r["error"] for r in STEPS] == [-0.06, -0.1397]
    bf16 = [r for r in WHOLE if r["dtype"] == "bf16"]
    assert [r["error"] for r in bf16] == [-0.0596, 0.3623]
    assert all(r["compute_efficiency"] == 0.65 for r in bf16)


def test_the_fp8_compute_efficiency_is_the_fit_the_yaml_describes():
    # recompute it: each fitted entry's exact efficiency by bisection, then their geometric mean
    c = constants()["fp8_compute_efficiency"]
    fit, exact = fit_fp8_compute_efficiency(EFF)
    assert fit == c.value == fp8_compute_efficiency() == 0.419
    ids = {e.id for e in ENTRIES if isinstance(e, EndToEndEntry)}
    assert set(c.fitted_on) | set(c.held_out) <= ids and not set(c.fitted_on) & set(c.held_out)
    # the fit is on every FP8 run of the table (NVIDIA's TensorRT-LLM and Red Hat's vLLM runs)
    fp8_ids = {e.id for e in ENTRIES if isinstance(e, EndToEndEntry) and e.dtype == "fp8"}
    assert set(c.fitted_on) == fp8_ids and len(fp8_ids) == 4 and c.held_out == ()
    fp8 = {r["source"]: r for r in WHOLE if r["dtype"] == "fp8"}
    assert all(r["compute_efficiency"] == 0.419 for r in fp8.values())
    for e in ENTRIES:
        if isinstance(e, EndToEndEntry) and e.id in exact:
            # at its exact efficiency the entry reproduces; the table's error follows from the ratio
            at, _ = end_to_end_tokens_per_s(e, EFF, exact[e.id])
            assert at == pytest.approx(e.published_tokens_per_s, rel=1e-6)
    # the L40S run reached the lowest share of its peak, the H200 run the highest: the fit's two ends
    assert min(exact, key=exact.get) == "mlperf-v5.1-redhat-l40s-llama3.1-8b"
    assert max(exact, key=exact.get) == "mlperf-v4.1-nvidia-h200-llama2-70b"


def test_the_fp8_fits_out_of_sample_errors_are_those_the_yaml_quotes():
    # each FP8 run left out of the fit in turn: its error at the other three's geometric mean
    c = constants()["fp8_compute_efficiency"]
    loo = fp8_leave_one_out(EFF)
    assert loo == dict(c.leave_one_out)
    assert loo == {"mlperf-v4.1-nvidia-h200-llama2-70b": -0.2219, "mlperf-v4.1-nvidia-h100-llama2-70b": 0.03,
                   "mlperf-v5.1-redhat-h100-llama3.1-8b": -0.0301, "mlperf-v5.1-redhat-l40s-llama3.1-8b": 0.2466}
    # out of sample the two ends are outside 20 %, the middle two within: what README and yaml say
    assert [abs(x) > 0.20 for x in loo.values()] == [True, False, False, True]


def test_the_fp8_runs_are_held_together_only_by_the_per_operator_roofline(monkeypatch):
    # with the linear layers and the attention costed as separate kernels (iteration_cost), efficiencies
    # about 0.405-0.425 hold all four FP8 runs within 20 %; costing a whole iteration as the larger of its
    # compute and memory times (the roofline before), no efficiency held the H200 and the L40S runs together
    by_id = {e.id: e for e in ENTRIES if isinstance(e, EndToEndEntry) and e.id}
    fp8 = [by_id[i] for i in constants()["fp8_compute_efficiency"].fitted_on]

    def errors(runs: list[EndToEndEntry], f: float) -> list[float]:
        return [end_to_end_tokens_per_s(e, EFF, f)[0] / e.published_tokens_per_s - 1 for e in runs]

    assert all(abs(x) <= 0.20 for x in errors(fp8, 0.419))
    assert not all(abs(x) <= 0.20 for x in errors(fp8, 0.39)) and not all(abs(x) <= 0.20 for x in errors(fp8, 0.44))
    monkeypatch.setattr(roofline.IterationCost, "seconds", property(lambda c: max(c.compute_s, c.memory_s)))
    ends = [by_id["mlperf-v4.1-nvidia-h200-llama2-70b"], by_id["mlperf-v5.1-redhat-l40s-llama3.1-8b"]]
    for f in (k / 100 for k in range(20, 81, 2)):
        both = errors(ends, f)
        assert not all(abs(x) <= 0.20 for x in both), (f, both)


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
           "fp8_compute_efficiency": {"value": 0.419, "fitted_on": ["a", "b", "c", "d"],
                                      "leave_one_out_errors": {"a": -0.2219, "b": 0.03, "c": -0.03, "d": 0.2466}}}
    line = engine_line(cal)
    assert ("prefill_mfu 0.65 (FP8 runs: 0.419 of the FP8 peak, fitted on 4 MLPerf runs; each left out of the "
            "fit: -22% to +25%)") in line
    assert "MLPerf L40S llama3.1-8b fp8 +18%," in line and "MLPerf H100 llama3.1-8b fp8 -2%," in line
    assert ("MLPerf H100 deepseek-r1-distill-llama-8b bf16 +36% (outside 20%) (contradicted by a published run of "
            "the same work)") in line
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


def _large_batch_rate(gpu, compute: float, kv_bytes_per_token: float, m70) -> float:
    """Output tokens/s of (200 in, 300 out) requests at 512 in flight on a 70B model at TP 4, where every
    iteration's linear layers are compute-bound and its attention memory-bound (its KV reads are 34 x its
    FLOPs' time here): the two add, so per request 2 x active x 499 tokens (200 prefilled, 299 decode
    steps) at the compute rate, plus its KV read at the bandwidth (200 written, then the contexts 201..499)."""
    linear = 2 * m70.active_params * 499 / (4 * gpu.peak_dense_tflops * 1e12 * compute)
    kv = kv_bytes_per_token * (200 + (201 + 499) * 299 / 2) / (4 * gpu.hbm_bandwidth_gbs * 1e9 * EFF.decode_hbm_efficiency)
    return 300 / (linear + kv)  # every request's work runs in the shared iterations, one part after another


def test_a_large_batch_pays_its_linear_compute_and_its_attention_reads():
    m70 = MODEL_CONFIGS["llama3.1-70b-instruct"]
    run = closed_loop(GPU, EFF, m70, [(200, 300)] * 3072, concurrency=512, chunk_tokens=8192, tp=4, skip=1024)
    assert run.max_running == 512
    rate = _large_batch_rate(GPU, EFF.prefill_mfu, roofline.kv_bytes_per_token(m70), m70)
    assert run.output_tokens_per_s == pytest.approx(rate, rel=0.03)
    # the linear compute alone would be more than 10 % faster: the attention's KV reads are not hidden under it
    compute_only = 4 * GPU.peak_dense_tflops * 1e12 * EFF.prefill_mfu / (2 * m70.active_params * 499 / 300)
    assert run.output_tokens_per_s < 0.9 * compute_only


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
    m70 = MODEL_CONFIGS["llama3.1-70b-instruct"]
    kvb = roofline.kv_bytes_per_token(m70)  # bf16 KV; FP8 KV is 1 byte per element: half
    fast = dataclasses.replace(GPU, peak_dense_tflops=2 * GPU.peak_dense_tflops)
    expected = _large_batch_rate(fast, fp8_compute_efficiency(), kvb / 2, m70) / _large_batch_rate(
        GPU, EFF.prefill_mfu, kvb, m70)
    assert running == 512 and fp8 / bf16 == pytest.approx(expected, rel=0.03)


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


def test_a_gpu_whose_checks_at_the_runs_precision_are_all_outside_is_unvalidated_and_says_so():
    l40s_row = next(r for r in WHOLE if r["gpu"] == "l40s")
    bf16 = gpu_checks([{**l40s_row, "dtype": "bf16", "error": 0.4682, "within_20pct": False}], "l40s", 2.0)
    assert bf16["status"] == "outside" and bf16["unvalidated"] and "0 within 20 %; 1 outside" in bf16["statement"]
    assert "MLPerf llama3.1-8b bf16 +47%" in bf16["statement"]
    assert bf16["statement"].endswith("no check on this GPU at 16-bit is within 20 %: this run's absolute figures "
                                      "(sessions held, throughput, TTFT) are unvalidated")


def test_a_gpu_checked_only_at_another_precision_is_unvalidated_at_this_one():
    # the H200's and L40S's only checks are FP8 MLPerf runs (within 20 %, in the FP8 fit): a 16-bit run on
    # either rests on constants no 16-bit run of that GPU supports, and says so, with the FP8 figures
    for gpu, text in (("h200", "MLPerf llama2-70b fp8 -17%"), ("l40s", "MLPerf llama3.1-8b fp8 +18%")):
        this = gpu_checks(ROWS, gpu, 2.0)
        assert this["status"] == "other_precision" and this["unvalidated"], gpu
        assert "no check at 16-bit; at other precisions: " + text in this["statement"]
        assert "no check on this GPU at 16-bit is within 20 %" in this["statement"]


def test_a_gpu_with_no_entry_is_unchecked():
    b200 = gpu_checks(ROWS, "b200", 2.0)
    assert (b200["status"], b200["unvalidated"], b200["checks"]) == ("unchecked", True, [])


def test_weights_other_than_2_bytes_match_no_entry():
    # the sessions engine costs every run at the 16-bit rate, so 1-byte weights are not the FP8 entries' costing
    h100 = gpu_checks(ROWS, "h100", 1.0)
    assert h100["status"] == "other_precision" and h100["precision"] == "1-byte weights at the 16-bit rate"


def test_the_console_line_ends_with_this_runs_gpu():
    cal = {"prefill_mfu": 0.65, "decode_hbm_efficiency": 0.7, "this_pair": None, "entries": ROWS,
           "max_abs_prefill_error": 0.15, "max_abs_decode_error": 0.07, "this_gpu": gpu_checks(ROWS, "l40s", 2.0)}
    assert engine_line(cal).endswith("this run's GPU: " + cal["this_gpu"]["statement"])


def test_gpu_checks_of_a_respecified_builtin_gpu_do_not_vouch_for_it():
    # a config file's `gpus: {h100: {peak_dense_tflops: 400}}` keeps the name but not the GPU the table's
    # checks were costed with: none applies, and the run is unvalidated; HBM size alone (--gpu-mem-gb) changes
    # no check, and a GPU the table does not know stays `unchecked` whatever its spec
    h100 = gpu_specs()["h100"]
    plain = gpu_checks(ROWS, "h100", 2.0, h100)
    assert plain["status"] == "mixed" and not plain["unvalidated"] and plain["respecified"] == ""
    smaller = gpu_checks(ROWS, "h100", 2.0, dataclasses.replace(h100, hbm_gb=18.0))
    assert smaller == plain
    slow = gpu_checks(ROWS, "h100", 2.0, dataclasses.replace(h100, peak_dense_tflops=400.0))
    assert slow["status"] == "respecified" and slow["unvalidated"]
    assert slow["respecified"] == "peak_dense_tflops 400 (the checks' 989)"
    assert "not the table's" in slow["statement"] and slow["statement"].endswith("are unvalidated")
    assert len(slow["checks"]) == len(plain["checks"])
    new = gpu_checks(ROWS, "z9", 2.0, dataclasses.replace(h100, name="Z9 (no GPU of the table)", hbm_gb=192.0))
    assert new["status"] == "unchecked" and new["unvalidated"] and new["respecified"] == ""


def test_a_runs_weight_size_does_not_recost_the_16_bit_profiles():
    # vidur's profiles measured fp16 kernels: a run at weight_bytes_per_param 1 (a config file's choice) once
    # costed them with 1-byte weights, and its Engine model line read "decode within 114%"; every entry is
    # costed at its own precision, so the table's errors do not depend on the run's weight size
    one = calibration_errors(dataclasses.replace(EFF, weight_bytes_per_param=1.0))
    assert one == calibration_errors(EFF)
    assert max(abs(r["decode_error"]) for r in one if r["kind"] == "layer_profile") <= 0.20


def test_every_entry_has_an_out_of_sample_error_and_the_console_line_quotes_them():
    # issue 29 item 7: "within 20 %" was in sample; every entry now has its leave-one-out error
    from kv_cache.serving.engine.calibration import leave_one_out

    loo = leave_one_out(EFF)
    assert len(loo) == (2 * len(LAYERS) + len(WHOLE) + len(STEPS) + sum("ttft_error" in r for r in WHOLE)
                        + len(prefill_ttft_errors(EFF)))
    by = {r["entry"]: r for r in loo}
    # recomputed by hand: H100 llama2-7b's prefill at the geometric mean of the three A100 profiles' exact mfu
    others = [r["prefill_error"] for r in LAYERS if r["gpu"] != "h100"]
    c = 0.65 * (1 / ((1 + others[0]) * (1 + others[1]) * (1 + others[2]))) ** (1 / 3)
    h100 = next(r for r in LAYERS if r["gpu"] == "h100")
    assert by["vidur h100 llama2-7b prefill"]["out_of_sample"] == pytest.approx((1 + h100["prefill_error"]) * c / 0.65 - 1,
                                                                                abs=1e-4)
    fp8 = {k: v for k, v in constants()["fp8_compute_efficiency"].leave_one_out}
    assert sorted(r["out_of_sample"] for r in loo if r["fit"] == "fp8_compute_efficiency") == sorted(fp8.values())
    assert all(r["out_of_sample"] == r["in_sample"] for r in loo if r["fit"] is None)
    assert max(abs(r["out_of_sample"]) for r in loo if r["fit"] in ("prefill_mfu", "decode_hbm_efficiency")) < 0.2


def test_a_long_input_prefill_ttft_is_checked():
    # vLLM's Table 4: median TTFT 763.6 ms at ~20k input tokens, 8 in flight on one H100 (BF16)
    row = next(r for r in WHOLE if r.get("published_median_ttft_ms"))
    assert row["input_tokens"] >= 8000 and row["published_median_ttft_ms"] == 763.6
    assert row["ttft_within_20pct"] and abs(row["ttft_error"]) <= 0.2


SINGLE = prefill_ttft_errors(InferenceModelConfig())


def test_a_second_long_input_ttft_single_requests_are_held_within_20_percent():
    # issue 29 item 7's second long-input TTFT check: the vLLM blog's offloading-connector post, Figure 1
    # ("GPU Compute": one request, GPU prefix caching off, Llama-3.1-8B-Instruct on an H100, BF16), read off
    # the figure at 10k-100k tokens; each point in no fit, so out of sample as it is
    assert [r["input_tokens"] for r in SINGLE] == [k * 10000 for k in range(1, 11)]
    assert all(r["input_tokens"] >= 8000 for r in SINGLE)
    assert [r["published_ttft_ms"] for r in SINGLE] == [264, 636, 1099, 1653, 2290, 3015, 3848, 4792, 5744, 6849]
    assert all(r["source"].startswith("https://github.com/vllm-project/vllm-project.github.io/blob/")
               and "kv-offloading-connector/figure1.png" in r["source"] and "read off the figure" in r["source"]
               for r in SINGLE)
    assert {(r["gpu"], r["model"], r["dtype"], r["tp"], r["kind"]) for r in SINGLE} == {
        ("h100", "llama3.1-8b", "bf16", 1, "prefill_ttft")}
    assert all(r["held_within_20pct"] and r["within_20pct"] and abs(r["error"]) <= 0.20 for r in SINGLE)
    # the figures the yaml, docs/sessions.md and the Engine model line quote: -4 % to +10 %
    assert min(r["error"] for r in SINGLE) == -0.0398 and max(r["error"] for r in SINGLE) == 0.1008
    # not among the throughputs (their count on the console line stays theirs), but in the results
    assert not any(r["kind"] == "prefill_ttft" for r in ROWS)


def test_the_single_request_check_does_not_hinge_on_how_the_figure_was_read():
    # adversarial: the values are read off a plot (two pixels, 19 ms) and its axis says "K of tokens"
    # (1,000 or 1,024 a K); every point from 20k up stays within 20 % at every corner of both, and the 10k
    # point, the one the reading moves most (19 ms of 264), within 25 % (+22 % at 1,024 a K and -19 ms)
    for e in prefill_ttft_entries():
        for tokens in (e.input_tokens, e.input_tokens * 1024 // 1000):
            modelled = prefill_ttft_seconds(e, EFF, tokens) * 1e3
            for published in (e.published_ms - e.reading_error_ms, e.published_ms + e.reading_error_ms):
                err = modelled / published - 1
                assert abs(err) <= (0.20 if e.input_tokens >= 20000 else 0.25), (e.input_tokens, tokens, published)
    # the chunk (vLLM's server budget 8,192 or the LLM class's 16,384) does not move it: compute-bound
    e = prefill_ttft_entries()[-1]
    assert prefill_ttft_seconds(dataclasses.replace(e, prefill_chunk_tokens=16384), EFF) == pytest.approx(
        prefill_ttft_seconds(e, EFF), rel=1e-3)


def test_the_single_request_check_has_power_over_the_prefill_constant_and_the_attention_cost():
    # the ten points hold prefill_mfu to 0.60-0.78 (all within 20 %), around its 0.65 (chosen on vidur's
    # 4,096-token profiles, which have no attention): a constant outside that band misses some point
    def worst(mfu: float) -> float:
        return max(abs(r["error"]) for r in prefill_ttft_errors(InferenceModelConfig(prefill_mfu=mfu)))

    assert worst(0.65) <= 0.20 and worst(0.60) <= 0.20 and worst(0.78) <= 0.20
    assert worst(0.59) > 0.20 and worst(0.79) > 0.20
    # and the long points are attention-bound: at 100k the attention is most of the modelled FLOPs, so a
    # roofline that left it out (as the 4,096-token profiles could not tell) would be far outside 20 %
    att = roofline.attention_flops(M8, 100000, 0)
    assert att / roofline.prefill_flops(M8, 100000, 0) > 0.5


def test_the_engine_line_quotes_out_of_sample_figures():
    from types import SimpleNamespace

    from kv_cache.results.sessions_document import engine_calibration

    ls = SimpleNamespace(efficiency=EFF, gpu_name="h100", model_name="llama3.1-8b", gpu=GPU)
    cal = engine_calibration(ls)
    assert cal["prefill_ttfts"] == SINGLE  # the results carry every single-request point, with its reading range
    line = engine_line(cal)
    assert "out of sample (each entry left out of its constant's fit): prefill -11% to +8%, decode -6% to +7%, " \
           "FP8 -22% to +25%, the rest in no fit, long-input TTFT (vLLM H100 llama3.1-8b bf16, median at ~20,000 " \
           "tokens) -12%, single-request TTFT (vLLM H100 llama3.1-8b bf16, 10,000-100,000 tokens, read off a " \
           "published figure) -4% to +10%" in line
