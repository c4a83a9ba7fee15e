"""GPU specs and the roofline cost model (kv_cache.serving.engine.roofline): hand-computed examples."""

import dataclasses

import pytest

from kv_cache.serving.engine import roofline as g
from kv_cache.settings.schema import InferenceModelConfig, load_config
from kv_cache.specs.models import MODEL_CONFIGS

EFF = InferenceModelConfig(prefill_mfu=0.5, decode_hbm_efficiency=0.8)  # the arithmetic below; reserved 0.1, 2 bytes/param
H100 = g.GPU_SPECS["h100"]
LLAMA8 = MODEL_CONFIGS["llama3.1-8b"]
GIB = 1024**3


def test_builtin_gpu_table_matches_the_datasheets():
    expected = {
        "a100": (80, 2039, 312),
        "h100": (80, 3350, 989),
        "h200": (141, 4800, 989),
        "b200": (180, 8000, 2250),
        "l40s": (48, 864, 362),
    }
    assert set(g.GPU_SPECS) == set(expected)
    for name, (hbm, bw, tf) in expected.items():
        spec = g.GPU_SPECS[name]
        assert (spec.hbm_gb, spec.hbm_bandwidth_gbs, spec.peak_dense_tflops) == (hbm, bw, tf)
        assert spec.source and spec.name
    assert H100.hbm_bytes == 80 * GIB


def test_config_defaults_are_the_builtin_gpus():
    c = load_config(None)
    assert dict(c.gpus) == dict(g.GPU_SPECS)
    assert c.inference_model == InferenceModelConfig()  # the calibrated defaults (test_engine_calibration.py)


def test_weight_bytes_and_kv_bytes():
    assert g.weight_bytes(LLAMA8, EFF) == pytest.approx(16.06e9)
    assert g.kv_bytes_per_token(LLAMA8) == 131072
    fp8 = dataclasses.replace(EFF, weight_bytes_per_param=1.0)
    assert g.weight_bytes(LLAMA8, fp8) == pytest.approx(8.03e9)


def test_decode_step_llama8b_h100():
    # weights read once + the KV of the 1000-token context, at 80 % of 3.35 TB/s
    expected = (16.06e9 + 131072 * 1000) / (3350e9 * 0.8)
    assert g.decode_step_seconds(H100, EFF, LLAMA8, 1, 1000) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.0060415, rel=1e-4)
    # batch of 8 with 8000 context tokens in total: weights still read once
    assert g.decode_step_seconds(H100, EFF, LLAMA8, 8, 8000) == pytest.approx(
        (16.06e9 + 131072 * 8000) / (3350e9 * 0.8), rel=1e-12
    )
    assert g.decode_step_seconds(H100, EFF, LLAMA8, 0, 0) == 0.0


def test_prefill_llama8b_h100():
    expected = (2 * 8.03e9 * 1000 + 4 * 32 * 32 * 128 * 1000 * 500.5) / (989e12 * 0.5)
    assert g.prefill_seconds(H100, EFF, LLAMA8, 1000, 0) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.033008, rel=1e-4)
    assert g.prefill_flops(LLAMA8, 1000, 0) == pytest.approx(
        2 * 8.03e9 * 1000 + 4 * 32 * 32 * 128 * 1000 * 500.5
    )
    # 1000 new tokens after 3000 cached ones: only the attention to the cached tokens is added
    assert g.prefill_flops(LLAMA8, 1000, 3000) == pytest.approx(
        2 * 8.03e9 * 1000 + 4 * 32 * 32 * 128 * 1000 * 3500.5
    )
    assert g.attention_flops(LLAMA8, 1, 0) == 4 * 32 * 32 * 128 * 1
    assert g.prefill_flops(LLAMA8, 0, 5000) == 0.0


def test_moe_uses_active_params_for_flops_and_total_for_weights():
    m = MODEL_CONFIGS["gpt-oss-120b"]
    assert m.weights_params == 117e9 and m.active_params == 5.1e9
    assert g.weight_bytes(m, EFF) == pytest.approx(234e9)
    # head_dim 64, 64 query heads, 36 layers
    assert g.prefill_flops(m, 2000, 0) == pytest.approx(2 * 5.1e9 * 2000 + 4 * 36 * 64 * 64 * 2000 * 1000.5)
    assert g.decode_flops(m, 4, 10000) == pytest.approx(2 * 5.1e9 * 4 + 4 * 36 * 64 * 64 * 10000)
    dense_like = dataclasses.replace(m, active_params_b=0.0)  # every parameter active
    assert g.prefill_flops(dense_like, 2000, 0) == pytest.approx(
        2 * 117e9 * 2000 + 4 * 36 * 64 * 64 * 2000 * 1000.5
    )


def test_tensor_parallel_divides_time_and_multiplies_capacity():
    one = g.prefill_seconds(H100, EFF, LLAMA8, 4096, 1024)
    assert g.prefill_seconds(H100, EFF, LLAMA8, 4096, 1024, tp=2) == pytest.approx(one / 2)
    d1 = g.decode_step_seconds(H100, EFF, LLAMA8, 4, 40000)
    assert g.decode_step_seconds(H100, EFF, LLAMA8, 4, 40000, tp=4) == pytest.approx(d1 / 4)
    cap1 = g.hbm_kv_capacity_bytes(H100, EFF, LLAMA8)
    cap2 = g.hbm_kv_capacity_bytes(H100, EFF, LLAMA8, tp=2)
    assert cap2 == pytest.approx(2 * 80 * GIB * 0.9 - 16.06e9)
    assert cap2 > 2 * cap1 - 1  # the weights are paid once per replica
    with pytest.raises(ValueError, match="tensor parallelism"):
        g.prefill_seconds(H100, EFF, LLAMA8, 10, 0, tp=0)


def test_hbm_kv_capacity_llama8b_h100():
    # 80 GiB x 0.9 usable - 16.06e9 bytes of weights
    assert g.hbm_kv_capacity_bytes(H100, EFF, LLAMA8) == pytest.approx(77309411328 - 16060000000)
    assert g.hbm_kv_capacity_tokens(H100, EFF, LLAMA8) == (77309411328 - 16060000000) // 131072 == 467295


def test_model_too_big_raises_a_clear_error():
    ds = MODEL_CONFIGS["deepseek-v3"]  # 671e9 x 2 bytes = 1342 GB of weights
    with pytest.raises(ValueError, match=r"does not fit on 8 x NVIDIA H200.*1342\.0 GB"):
        g.hbm_kv_capacity_bytes(g.GPU_SPECS["h200"], EFF, ds, tp=8)
    # 8 x 180 GiB x 0.9 = 1391.6e9 usable on an HGX B200
    assert g.hbm_kv_capacity_bytes(g.GPU_SPECS["b200"], EFF, ds, tp=8) == pytest.approx(
        8 * 180 * GIB * 0.9 - 1342e9
    )
    with pytest.raises(ValueError, match="does not fit"):
        g.hbm_kv_capacity_bytes(H100, EFF, MODEL_CONFIGS["llama3.1-70b-instruct"])  # 141.2 GB of weights


def test_iteration_decode_only_is_memory_bound_and_equals_a_decode_step():
    cost = g.iteration_cost(H100, EFF, LLAMA8, [], 1, 1000)
    assert not cost.compute_bound
    assert cost.memory_s == pytest.approx(g.decode_step_seconds(H100, EFF, LLAMA8, 1, 1000))
    assert g.iteration_seconds(H100, EFF, LLAMA8, [], 1, 1000) == pytest.approx(cost.memory_s)
    assert cost.compute_s == pytest.approx((2 * 8.03e9 + 4 * 32 * 32 * 128 * 1000) / (989e12 * 0.5))


def test_iteration_with_a_prefill_chunk_is_compute_bound():
    # an 8192-token chunk (2048 cached) + 32 decoding requests with 320,000 context tokens in total
    flops = (
        2 * 8.03e9 * 8192
        + 4 * 32 * 32 * 128 * 8192 * (2048 + 8193 / 2)
        + 2 * 8.03e9 * 32
        + 4 * 32 * 32 * 128 * 320000
    )
    moved = 16.06e9 + 131072 * (320000 + 8192 + 2048)
    cost = g.iteration_cost(H100, EFF, LLAMA8, [(8192, 2048)], 32, 320000)
    assert cost.flops == pytest.approx(flops)
    assert cost.bytes_moved == pytest.approx(moved)
    assert cost.compute_s == pytest.approx(flops / (989e12 * 0.5))
    assert cost.memory_s == pytest.approx(moved / (3350e9 * 0.8))
    assert cost.compute_bound and cost.seconds == cost.compute_s
    assert g.iteration_seconds(H100, EFF, LLAMA8, [(8192, 2048)], 32, 320000, tp=2) == pytest.approx(
        cost.seconds / 2
    )


def test_iteration_sums_several_prefill_chunks_and_empty_costs_nothing():
    two = g.iteration_cost(H100, EFF, LLAMA8, [(1000, 0), (500, 4000)], 0, 0)
    assert two.flops == pytest.approx(g.prefill_flops(LLAMA8, 1000, 0) + g.prefill_flops(LLAMA8, 500, 4000))
    assert two.bytes_moved == pytest.approx(16.06e9 + 131072 * 5500)
    assert g.iteration_seconds(H100, EFF, LLAMA8, [], 0, 0) == 0.0
    assert g.iteration_seconds(H100, EFF, LLAMA8, [(0, 100)], 0, 0) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: g.prefill_flops(LLAMA8, -1, 0),
        lambda: g.prefill_flops(LLAMA8, 10, -5),
        lambda: g.decode_step_seconds(H100, EFF, LLAMA8, -1, 0),
        lambda: g.iteration_seconds(H100, EFF, LLAMA8, [(10, -1)], 0, 0),
        lambda: g.iteration_seconds(H100, EFF, LLAMA8, [], 1, 0, tp=1.5),
    ],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
