"""Model table and the bytes-per-token formula (spec section 4)."""

import dataclasses

import pytest

from kv_cache.specs.models import MODEL_CONFIGS, ModelConfig

EXPECTED_BYTES_PER_TOKEN = {
    "tiny-1b": 24576,
    "mistral-7b": 131072,
    "llama2-7b": 524288,
    "llama3.1-8b": 131072,
    "llama3.1-70b-instruct": 327680,
    "deepseek-v3": 70272,
    "qwen3-32b": 262144,
    "gpt-oss-120b": 73728,
    "gpt-oss-20b": 49152,
}


def test_exactly_the_nine_reference_models():
    assert len(MODEL_CONFIGS) == 9
    assert set(MODEL_CONFIGS) == set(EXPECTED_BYTES_PER_TOKEN)


@pytest.mark.parametrize(("key", "expected"), sorted(EXPECTED_BYTES_PER_TOKEN.items()))
def test_bytes_per_token_of_each_builtin(key, expected):
    model = MODEL_CONFIGS[key]
    assert model.bytes_per_token == expected
    assert model.kv_cache_size_per_token == expected


def test_gqa_formula_matches_reference_test():
    m = MODEL_CONFIGS["llama3.1-8b"]
    assert m.bytes_per_element == 2
    assert m.head_dim == 128
    assert m.bytes_per_token == m.num_layers * m.kv_heads * m.head_dim * 2 * m.bytes_per_element


def test_mla_ignores_kv_heads_and_head_dim():
    m = MODEL_CONFIGS["deepseek-v3"]
    assert m.attention_type == "mla"
    assert m.bytes_per_token == 61 * (512 + 64) * 2
    assert dataclasses.replace(m, kv_heads=1, kv_dim_per_head=999).bytes_per_token == m.bytes_per_token


def test_head_dim_override():
    assert MODEL_CONFIGS["qwen3-32b"].head_dim == 128  # not 5120 // 64 = 80
    assert MODEL_CONFIGS["gpt-oss-20b"].head_dim == 64  # not 2880 // 64 = 45
    assert ModelConfig("x", 2, 1000, 3, 1).head_dim == 333  # integer division


@pytest.mark.parametrize(
    ("dtype", "size"), [("float32", 4), ("float16", 2), ("bfloat16", 2), ("int8", 1), ("fp8", 2)]
)
def test_bytes_per_element(dtype, size):
    assert ModelConfig("x", 1, 64, 1, 1, dtype=dtype).bytes_per_element == size


def test_large_model_rule():
    large = {k for k, m in MODEL_CONFIGS.items() if m.is_large_model}
    assert large == {"llama3.1-70b-instruct", "qwen3-32b"}


def test_models_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODEL_CONFIGS["tiny-1b"].num_layers = 1
    with pytest.raises(TypeError):
        MODEL_CONFIGS["new"] = MODEL_CONFIGS["tiny-1b"]


# Parameter counts (sessions mode): model cards, MoE active counts, the architecture estimate.
EXPECTED_PARAMS_B = {
    "mistral-7b": (7.24, 7.24),
    "llama2-7b": (6.74, 6.74),
    "llama3.1-8b": (8.03, 8.03),
    "llama3.1-70b-instruct": (70.6, 70.6),
    "deepseek-v3": (671.0, 37.0),
    "qwen3-32b": (32.8, 32.8),
    "gpt-oss-120b": (117.0, 5.1),
    "gpt-oss-20b": (21.0, 3.6),
}


@pytest.mark.parametrize(("key", "params"), sorted(EXPECTED_PARAMS_B.items()))
def test_builtin_parameter_counts(key, params):
    total, active = params
    m = MODEL_CONFIGS[key]
    assert m.weights_params == round(total * 1e9)
    assert m.active_params == round(active * 1e9)
    assert m.active_params <= m.weights_params


def test_tiny_model_parameters_are_derived_from_the_architecture():
    m = MODEL_CONFIGS["tiny-1b"]
    assert (m.total_params_b, m.active_params_b) == (0.0, 0.0)
    # 12 layers x (attention 2 x 1024 x 128 x (8 + 4) + SwiGLU MLP 8 x 1024^2)
    assert m.derived_params == 12 * (2 * 1024 * 128 * 12 + 8 * 1024 * 1024) == 138_412_032
    assert m.weights_params == m.active_params == 138_412_032


def test_parameter_fields_fallbacks():
    base = ModelConfig("x", 2, 64, 4, 2)  # head_dim 16
    assert base.weights_params == 2 * (2 * 64 * 16 * 6 + 8 * 64 * 64)
    assert dataclasses.replace(base, total_params_b=1.5).active_params == 1_500_000_000  # dense: all active
    moe = dataclasses.replace(base, total_params_b=10.0, active_params_b=2.0)
    assert (moe.weights_params, moe.active_params) == (10_000_000_000, 2_000_000_000)
