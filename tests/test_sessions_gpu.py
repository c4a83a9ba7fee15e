"""GPU specs and the roofline cost model (kv_cache.serving.engine.roofline): hand-computed examples."""

import dataclasses

import numpy as np
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
        "mi300x": (192, 5300, 1307.4),
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


def test_an_iteration_pays_its_compute_bound_linear_layers_and_its_memory_bound_attention():
    # a 2,048-token first prefill (no cache) beside 64 decodes over 100k-token contexts: the linear layers are
    # compute-bound (2 x 8.03e9 x 2,112 FLOPs against 16.06 GB of weights), the attention memory-bound
    # (6.4M tokens of KV against few FLOPs), and the two kinds of kernel run one after the other
    rate, bandwidth = 989e12 * 0.5, 3350e9 * 0.8
    cost = g.iteration_cost(H100, EFF, LLAMA8, [(2048, 0)], 64, 6_400_000)
    linear = max(2 * 8.03e9 * (2048 + 64) / rate, 16.06e9 / bandwidth)
    attention_flops = 4 * 32 * 32 * 128 * (2048 * (0 + 2049 / 2) + 6_400_000)
    attention = max(attention_flops / rate, 131072 * (2048 + 6_400_000) / bandwidth)
    assert attention == pytest.approx(131072 * (2048 + 6_400_000) / bandwidth)  # memory-bound
    assert cost.seconds == pytest.approx(linear + attention)
    assert cost.seconds > max(cost.compute_s, cost.memory_s) * 1.05  # more than the whole-iteration max


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
    assert cost.compute_bound and cost.seconds == pytest.approx(cost.compute_s)
    # both of its parts are compute-bound: the linear layers' FLOPs, and the chunk's attention FLOPs over its
    # 2,048 cached + 8,192 new tokens exceed the time to read the KV
    assert cost.linear_s == pytest.approx(2 * 8.03e9 * (8192 + 32) / (989e12 * 0.5))
    assert cost.attention_s == pytest.approx((flops - 2 * 8.03e9 * (8192 + 32)) / (989e12 * 0.5))
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


def test_costing_per_kernel_kind_never_speeds_an_iteration_and_at_most_doubles_it():
    # max(a, b) + max(c, d) >= max(a + c, b + d): against the roofline before it (the larger of the whole
    # iteration's compute and memory times) an iteration is never faster. The excess is at most the time to
    # read the KV it touches where its attention is memory-bound, and at most the time to read the weights
    # where its attention is compute-bound (a short prefill chunk over a long cached context): so never more
    # than the old time again. Sampled small chunks over long contexts too, where the second case lives.
    rng = np.random.default_rng(7)
    bandwidth = H100.hbm_bandwidth_gbs * 1e9 * EFF.decode_hbm_efficiency
    weights_s = g.weight_bytes(LLAMA8, EFF) / bandwidth
    cases = {"kv": 0, "weights": 0}
    for _ in range(3000):
        top = 9000 if rng.random() < 0.5 else 400
        chunks = [(int(rng.integers(1, top)), int(rng.integers(0, 200000))) for _ in range(int(rng.integers(0, 3)))]
        batch = int(rng.integers(0, 300 if top == 9000 else 20))
        context = float(rng.integers(0, 3_000_000)) if batch else 0.0
        cost = g.iteration_cost(H100, EFF, LLAMA8, chunks, batch, context)
        old = max(cost.compute_s, cost.memory_s)
        kv_s = g.kv_bytes_per_token(LLAMA8) * (context + sum(n + c for n, c in chunks)) / bandwidth
        assert old - 1e-12 <= cost.seconds <= 2 * old + 1e-12
        if cost.attention_s > kv_s * (1 + 1e-9):  # attention compute-bound
            assert cost.seconds <= old + weights_s + 1e-12
            cases["weights"] += cost.seconds - old > kv_s
        else:
            assert cost.seconds <= old + kv_s + 1e-12
            cases["kv"] += cost.seconds - old > 1e-6
    assert cases["kv"] > 0 and cases["weights"] > 0  # both bounds are reached past the other one


def test_a_short_chunk_over_a_long_cached_context_pays_the_weights_and_the_attention_flops():
    # benchmarks/sessions_laptop.yaml's llama8b-kv1 on its 18 GiB H100 (the README's runs): a turn's last
    # 100 new tokens over 39,900 cached. The linear layers are memory-bound (100 tokens: 100 FLOPs per weight
    # byte, under the ridge), the attention compute-bound (each cached key serves 100 x 32 query heads): the
    # two kernels add, and the excess over the whole-iteration maximum (3.0 ms: 7.1 -> 10.1 ms) is far more
    # than the 0.57 ms it takes to read all the KV HBM holds there
    kv1 = dataclasses.replace(LLAMA8, kv_heads=1, total_params_b=8.03)
    small = dataclasses.replace(H100, hbm_gb=18.0)
    eff = InferenceModelConfig()
    rate, bandwidth = 989e12 * 0.65, 3350e9 * 0.70
    weights_s = 16.06e9 / bandwidth
    attention_flops = 4 * 32 * 32 * 128 * 100 * (39_900 + 101 / 2)
    assert weights_s > 2 * 8.03e9 * 100 / rate and attention_flops / rate > 16384 * 40_000 / bandwidth
    cost = g.iteration_cost(small, eff, kv1, [(100, 39_900)], 0, 0)
    assert cost.linear_s == pytest.approx(weights_s, rel=1e-3)
    assert cost.attention_s == pytest.approx(attention_flops / rate, rel=1e-3)
    old = max(cost.compute_s, cost.memory_s)
    assert old * 1e3 == pytest.approx(7.1, abs=0.05) and cost.seconds * 1e3 == pytest.approx(10.1, abs=0.05)
    assert cost.seconds - old > g.hbm_kv_capacity_bytes(small, eff, kv1) / bandwidth * 5


def test_the_bound_the_readme_quotes_for_its_18_gib_h100_runs():  # and see the short-chunk test above
    # benchmarks/sessions_laptop.yaml's llama8b-kv1 (Llama 3.1 8B with one KV head) on an 18 GiB H100: the
    # KV HBM holds takes 0.57 ms to read, the weights 6.8 ms
    kv1 = dataclasses.replace(LLAMA8, kv_heads=1, total_params_b=8.03)
    small = dataclasses.replace(H100, hbm_gb=18.0)
    bandwidth = H100.hbm_bandwidth_gbs * 1e9 * 0.70
    eff = InferenceModelConfig()
    assert g.hbm_kv_capacity_tokens(small, eff, kv1) // 512 * 512 == 81408  # in whole 512-token blocks
    assert g.hbm_kv_capacity_bytes(small, eff, kv1) / 1e9 == pytest.approx(1.33, abs=0.01)
    assert g.hbm_kv_capacity_bytes(small, eff, kv1) / bandwidth * 1e3 == pytest.approx(0.57, abs=0.01)
    assert g.weight_bytes(kv1, eff) / bandwidth * 1e3 == pytest.approx(6.8, abs=0.1)
