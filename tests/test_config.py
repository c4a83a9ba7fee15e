"""config.yaml schema, strict loading and merging (spec section 3)."""

import dataclasses
import os
import pickle
from pathlib import Path

import pytest

from kv_cache.errors import ConfigError, UsageError
from kv_cache.settings.schema import BenchConfig, ModelConfig, config_from_mapping, load_config

ROOT_CONFIG = Path(__file__).resolve().parent.parent / "config.yaml"


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config_error(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------------------------


def test_defaults_equal_shipped_config_yaml():
    assert load_config(str(ROOT_CONFIG)) == load_config(None) == BenchConfig()


def test_shipped_config_yaml_lists_every_key_of_the_schema():
    import yaml

    document = yaml.safe_load(ROOT_CONFIG.read_text())
    defaults = BenchConfig().to_dict()
    assert list(document) == list(defaults)
    for section, values in defaults.items():
        if section == "model_configs":
            assert set(document[section]) == set(values)
            continue
        if section == "gpus":  # an overlay of kv_cache/specs/gpus.yaml: it may list none of them
            assert set(document[section]) <= set(values)
            continue
        for key, value in values.items():
            if isinstance(value, dict):  # named sub-sections (user_templates, qos_profiles)
                assert set(document[section][key]) == set(value), f"{section}.{key}"
            else:
                assert key in document[section], f"{section}.{key}"


def test_shipped_values_from_the_reference_table():
    c = load_config(None)
    assert c.user_templates["chatbot"].context_range == (512, 4096)
    assert c.user_templates["coding"].context_range == (4096, 25000)
    assert c.user_templates["document"].think_time_range == (0.3, 1.5)
    assert c.generation_timing.realistic == 0.030
    assert c.qos_profiles["interactive"].target_latency_p95_ms == 50
    assert c.qos_profiles["batch"].target_latency_p9999_ms == 10000
    assert [c.qos_profiles[k].priority for k in ("interactive", "responsive", "batch")] == [3, 2, 1]
    assert c.qos_distribution.interactive_probability == 0.15
    assert c.eviction.target_usage_ratio == 0.8
    assert c.gpu_backend.memory_fraction == 0.9
    assert c.rag.max_chunk_bytes == 256 * 1024 * 1024
    assert c.rag.retrieval_distribution == "zipfian"
    assert c.sharegpt.max_context_tokens == 8192
    assert c.validation_limits.max_gpu_memory_gb == 1024
    assert c.validation_limits.max_cpu_memory_gb == 16384
    assert (c.storage.chunk_size_mb, c.storage.fsync, c.storage.io_mode, c.storage.io_workers) == (
        16,
        True,
        "auto",
        0,
    )
    assert len(c.model_configs) == 9
    assert c.model_configs["deepseek-v3"].name == "Deepseek v3"


def test_config_is_immutable_hashable_and_picklable():
    c = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.eviction = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.eviction.target_usage_ratio = 0.5
    with pytest.raises(TypeError):
        c.model_configs["x"] = c.model_configs["tiny-1b"]
    with pytest.raises(TypeError):
        c.user_templates["chatbot"] = None
    assert hash(c) == hash(BenchConfig())
    assert pickle.loads(pickle.dumps(c)) == c


def test_empty_file_and_comment_only_file_are_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == BenchConfig()
    assert load_config(write(tmp_path, "# nothing here\n", "c2.yaml")) == BenchConfig()


def test_empty_section_keeps_defaults(tmp_path):
    assert load_config(write(tmp_path, "eviction:\n  # all commented out\n")) == BenchConfig()


def test_accepts_pathlike(tmp_path):
    assert load_config(Path(write(tmp_path, "decode:\n  batch_size: 8\n"))).decode.batch_size == 8


# ---------------------------------------------------------------------------------------------
# Merging
# ---------------------------------------------------------------------------------------------


def test_partial_sections_merge_key_by_key(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "eviction:\n  target_usage_ratio: 0.5\n"
            "user_templates:\n  coding:\n    context_range: [100, 200]\n"
            "qos_profiles:\n  batch:\n    priority: 0\n"
            "storage:\n  io_mode: buffered\n",
        )
    )
    d = BenchConfig()
    assert c.eviction.target_usage_ratio == 0.5
    assert c.eviction.max_recursion_depth == d.eviction.max_recursion_depth
    assert c.user_templates["coding"].context_range == (100, 200)
    assert c.user_templates["coding"].generation_range == (100, 500)
    assert c.user_templates["chatbot"] == d.user_templates["chatbot"]
    assert c.qos_profiles["batch"].priority == 0
    assert c.qos_profiles["batch"].target_latency_p95_ms == 1000
    assert c.storage.io_mode == "buffered" and c.storage.chunk_size_mb == 16
    assert c.rag == d.rag


def test_int_accepted_where_float_expected_and_converted(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "user_templates:\n  chatbot:\n    think_time_range: [1, 2]\ngpu_backend:\n  memory_fraction: 1\n",
        )
    )
    assert c.user_templates["chatbot"].think_time_range == (1.0, 2.0)
    assert isinstance(c.user_templates["chatbot"].think_time_range[0], float)
    assert c.gpu_backend.memory_fraction == 1.0 and isinstance(c.gpu_backend.memory_fraction, float)


def test_probability_bounds_are_inclusive(tmp_path):
    c = load_config(
        write(tmp_path, "qos_distribution:\n  interactive_probability: 0\n  responsive_threshold: 1.0\n")
    )
    assert (c.qos_distribution.interactive_probability, c.qos_distribution.responsive_threshold) == (0.0, 1.0)


def test_custom_model_from_yaml_gets_defaults_and_bytes_per_token(tmp_path):
    c = load_config(write(tmp_path, "model_configs:\n  my-model:\n    num_layers: 10\n    kv_heads: 2\n"))
    m = c.model_configs["my-model"]
    assert m == ModelConfig(name="my-model", num_layers=10, hidden_dim=4096, num_heads=32, kv_heads=2)
    assert m.bytes_per_token == 10 * 2 * 128 * 2 * 2
    assert len(c.model_configs) == 10  # the 9 built-ins stay


def test_custom_mla_model(tmp_path):
    text = "model_configs:\n  mla:\n    num_layers: 4\n    attention_type: mla\n    kv_lora_rank: 100\n    qk_rope_head_dim: 28\n    dtype: float32\n"
    assert load_config(write(tmp_path, text)).model_configs["mla"].bytes_per_token == 4 * 128 * 4


def test_yaml_model_overrides_builtin_field_by_field(tmp_path):
    c = load_config(write(tmp_path, "model_configs:\n  llama3.1-8b:\n    dtype: float32\n    name: Custom\n"))
    m = c.model_configs["llama3.1-8b"]
    assert (m.name, m.dtype, m.num_layers, m.kv_heads) == ("Custom", "float32", 32, 8)
    assert m.bytes_per_token == 2 * 131072
    assert c.model_configs["mistral-7b"] == BenchConfig().model_configs["mistral-7b"]


def test_config_from_mapping():
    c = config_from_mapping({"decode": {"batch_size": 4}})
    assert c.decode.batch_size == 4
    with pytest.raises(ConfigError, match=r"^<config>: unknown key 'decode.batch'"):
        config_from_mapping({"decode": {"batch": 4}})


# ---------------------------------------------------------------------------------------------
# Strictness: every error kind, one line, file and dotted key named
# ---------------------------------------------------------------------------------------------


def test_config_error_is_a_usage_error():
    assert issubclass(ConfigError, UsageError)


def test_unknown_top_level_section(tmp_path):
    m = config_error(tmp_path, "evictions:\n  max_recursion_depth: 3\n")
    assert "unknown key 'evictions'" in m
    assert "valid keys: user_templates, generation_timing" in m and "storage" in m


def test_unknown_nested_key(tmp_path):
    m = config_error(tmp_path, "eviction:\n  target_usage_rati: 0.5\n")
    assert (
        "unknown key 'eviction.target_usage_rati' (valid keys: max_recursion_depth, target_usage_ratio" in m
    )


def test_unknown_persona_and_qos_class(tmp_path):
    assert "unknown key 'user_templates.gamer'" in config_error(tmp_path, "user_templates:\n  gamer: {}\n")
    assert "unknown key 'qos_profiles.gold'" in config_error(tmp_path, "qos_profiles:\n  gold: {}\n")
    assert "unknown key 'qos_profiles.batch.p95'" in config_error(
        tmp_path, "qos_profiles:\n  batch:\n    p95: 3\n"
    )


def test_non_mapping_section(tmp_path):
    assert "'eviction' must be a mapping, got list" in config_error(tmp_path, "eviction: [1, 2]\n")
    assert "'storage' must be a mapping, got int" in config_error(tmp_path, "storage: 5\n")
    assert "'user_templates.chatbot' must be a mapping, got str" in config_error(
        tmp_path, "user_templates:\n  chatbot: fast\n"
    )
    assert "'model_configs' must be a mapping, got list" in config_error(tmp_path, "model_configs: [a]\n")


def test_non_mapping_top_level_document(tmp_path):
    assert "top-level document must be a mapping" in config_error(tmp_path, "- eviction\n- rag\n")
    assert "got str" in config_error(tmp_path, "just a string\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "eviction:\n  max_recursion_depth: true\n",
            "'eviction.max_recursion_depth' must be an integer, got bool (True)",
        ),
        (
            "eviction:\n  max_recursion_depth: 2.5\n",
            "'eviction.max_recursion_depth' must be an integer, got float",
        ),
        ("decode:\n  batch_size: '32'\n", "'decode.batch_size' must be an integer, got str ('32')"),
        (
            "eviction:\n  target_usage_ratio: high\n",
            "'eviction.target_usage_ratio' must be a number, got str",
        ),
        (
            "eviction:\n  target_usage_ratio: false\n",
            "'eviction.target_usage_ratio' must be a number, got bool",
        ),
        ("generation_timing:\n  fast: .nan\n", "'generation_timing.fast' must be a finite number"),
        ("storage:\n  fsync: 1\n", "'storage.fsync' must be true or false, got int (1)"),
        (
            "storage:\n  io_mode: fast\n",
            "'storage.io_mode' must be one of auto, direct, buffered; got 'fast'",
        ),
        (
            "rag:\n  retrieval_distribution: normal\n",
            "'rag.retrieval_distribution' must be one of zipfian, uniform, random",
        ),
        ("rag:\n  chunk_size_tokens: null\n", "'rag.chunk_size_tokens' must be an integer, got null"),
    ],
)
def test_wrong_types(tmp_path, text, expected):
    assert expected in config_error(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "user_templates:\n  chatbot:\n    context_range: 512\n",
            "'user_templates.chatbot.context_range' must be a [min, max] list of 2 integers, got int",
        ),
        (
            "user_templates:\n  chatbot:\n    context_range: [1, 2, 3]\n",
            "list of 2 integers, got list ([1, 2, 3])",
        ),
        ("user_templates:\n  chatbot:\n    context_range: [1]\n", "list of 2 integers"),
        ("user_templates:\n  chatbot:\n    context_range: [1.5, 2]\n", "list of 2 integers"),
        ("user_templates:\n  chatbot:\n    context_range: [true, 2]\n", "list of 2 integers"),
        (
            "user_templates:\n  chatbot:\n    think_time_range: [a, 2]\n",
            "'user_templates.chatbot.think_time_range' must be a [min, max] list of 2 numbers",
        ),
        (
            "user_templates:\n  coding:\n    generation_range: [500, 100]\n",
            "'user_templates.coding.generation_range' must be [min, max] with min <= max, got [500, 100]",
        ),
        (
            "user_templates:\n  coding:\n    think_time_range: [-1, 1]\n",
            "'user_templates.coding.think_time_range' values must be >= 0",
        ),
        (
            "user_templates:\n  coding:\n    context_range: [0, 10]\n",
            "'user_templates.coding.context_range' values must be >= 1",
        ),
    ],
)
def test_bad_ranges(tmp_path, text, expected):
    assert expected in config_error(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "eviction:\n  target_usage_ratio: 1.5\n",
            "'eviction.target_usage_ratio' must be between 0 and 1, got 1.5",
        ),
        (
            "qos_distribution:\n  interactive_probability: -0.1\n",
            "'qos_distribution.interactive_probability' must be between 0 and 1",
        ),
        (
            "conversation:\n  end_conversation_probability: 2\n",
            "'conversation.end_conversation_probability' must be between 0 and 1",
        ),
        ("gpu_backend:\n  memory_fraction: 1.01\n", "'gpu_backend.memory_fraction' must be between 0 and 1"),
        (
            "eviction:\n  max_evictions_hard_cap: -1\n",
            "'eviction.max_evictions_hard_cap' must be >= 0, got -1",
        ),
        (
            "qos_profiles:\n  batch:\n    target_latency_p99_ms: -5\n",
            "'qos_profiles.batch.target_latency_p99_ms' must be >= 0, got -5",
        ),
        ("storage:\n  chunk_size_mb: 0\n", "'storage.chunk_size_mb' must be >= 1, got 0"),
        ("storage:\n  io_workers: -2\n", "'storage.io_workers' must be >= 0, got -2"),
        ("decode:\n  batch_size: 0\n", "'decode.batch_size' must be >= 1, got 0"),
        ("autoscaler:\n  scale_up_factor: 0\n", "'autoscaler.scale_up_factor' must be > 0, got 0"),
        ("validation_limits:\n  max_users: 0\n", "'validation_limits.max_users' must be >= 1, got 0"),
        (
            "validation_limits:\n  max_gpu_memory_gb: -1\n",
            "'validation_limits.max_gpu_memory_gb' must be >= 0",
        ),
        (
            "rag:\n  small_model_doc_tokens_min: 20000\n",
            "'rag.small_model_doc_tokens_min' (20000) must be <= 'rag.small_model_doc_tokens_max' (12000)",
        ),
        (
            "autoscaler:\n  min_users: 50\n  max_users: 10\n",
            "'autoscaler.min_users' (50) must be <= 'autoscaler.max_users' (10)",
        ),
    ],
)
def test_out_of_range_values(tmp_path, text, expected):
    assert expected in config_error(tmp_path, text)


def test_zero_accepted_where_meaningful(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "rag:\n  max_documents: 0\n  top_k_chunks: 0\nstorage:\n  io_workers: 0\neviction:\n  max_recursion_depth: 0\n",
        )
    )
    assert (
        c.rag.max_documents,
        c.rag.top_k_chunks,
        c.storage.io_workers,
        c.eviction.max_recursion_depth,
    ) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "model_configs:\n  m:\n    num_layer: 3\n",
            "unknown key 'model_configs.m.num_layer' (valid keys: name, num_layers, hidden_dim",
        ),
        ("model_configs:\n  m:\n    num_layers: 0\n", "'model_configs.m.num_layers' must be >= 1, got 0"),
        ("model_configs:\n  m:\n    kv_heads: 2.0\n", "'model_configs.m.kv_heads' must be an integer"),
        ("model_configs:\n  m:\n    kv_dim_per_head: -1\n", "'model_configs.m.kv_dim_per_head' must be >= 0"),
        (
            "model_configs:\n  m:\n    dtype: fp8\n",
            "'model_configs.m.dtype' must be one of float32, float16, bfloat16, int8; got 'fp8'",
        ),
        (
            "model_configs:\n  m:\n    attention_type: sparse\n",
            "'model_configs.m.attention_type' must be one of mha, gqa, mla",
        ),
        ("model_configs:\n  m:\n    name: 5\n", "'model_configs.m.name' must be a non-empty string"),
        ("model_configs:\n  m: 7\n", "'model_configs.m' must be a mapping, got int"),
        (
            "model_configs:\n  m:\n    attention_type: mla\n",
            "'model_configs.m' gives 0 bytes per token: attention_type 'mla' needs",
        ),
        (
            "model_configs:\n  m:\n    hidden_dim: 16\n    num_heads: 32\n",
            "'model_configs.m' gives 0 bytes per token: head_dim",
        ),
        ("model_configs:\n  7: {}\n", "'model_configs' keys must be non-empty model names, got 7"),
    ],
)
def test_bad_model_entries(tmp_path, text, expected):
    assert expected in config_error(tmp_path, text)


def test_yaml_syntax_error_names_line(tmp_path):
    m = config_error(tmp_path, "eviction:\n  target_usage_ratio: [0.5\n")
    assert "invalid YAML:" in m and "(line " in m


def test_duplicate_keys_rejected(tmp_path):
    m = config_error(tmp_path, "decode:\n  batch_size: 1\ndecode:\n  batch_size: 2\n")
    assert "invalid YAML: duplicate key 'decode' (line 3, column 1)" in m
    assert "duplicate key 'batch_size'" in config_error(
        tmp_path, "decode:\n  batch_size: 1\n  batch_size: 2\n"
    )


def test_yaml_python_tags_rejected(tmp_path):
    assert "invalid YAML" in config_error(tmp_path, "decode: !!python/object:os.system {}\n")


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found \(check the path"):
        load_config(path)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))


def test_binary_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path):
    path = write(tmp_path, "decode:\n  batch_size: 1\n")
    os.chmod(path, 0)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(path)


def test_unreadable_file_reported_via_oserror(tmp_path, monkeypatch):
    path = write(tmp_path, "decode:\n  batch_size: 1\n")
    real_open = open

    def fake_open(file, *args, **kwargs):
        if str(file) == path:
            raise PermissionError(13, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    with pytest.raises(ConfigError, match=r"cfg\.yaml: cannot read config file: Permission denied$"):
        load_config(path)


def test_newline_in_key_stays_one_line(tmp_path):
    m = config_error(tmp_path, 'eviction:\n  "a\\nb": 1\n')
    assert "unknown key 'eviction.a\\nb'" in m


# ---------------------------------------------------------------------------------------------
# Sessions-mode sections: model parameters, gpus, inference_model, sessions
# ---------------------------------------------------------------------------------------------


def test_sessions_sections_defaults():
    c = load_config(None)
    assert set(c.gpus) >= {"a100", "h100", "h200", "b200", "l40s"}  # the data file's (a new GPU adds to them)
    h200 = c.gpus["h200"]
    assert (h200.hbm_gb, h200.hbm_bandwidth_gbs, h200.peak_dense_tflops) == (141, 4800, 989)
    assert (c.inference_model.prefill_mfu, c.inference_model.decode_hbm_efficiency) == (0.65, 0.7)
    assert (c.inference_model.hbm_reserved_fraction, c.inference_model.weight_bytes_per_param) == (0.1, 2.0)
    assert c.sessions.block_tokens == 512 and c.sessions.max_context_tokens == 200000
    assert c.model_configs["gpt-oss-120b"].active_params_b == 5.1
    d = c.to_dict()
    assert d["gpus"]["b200"]["hbm_gb"] == 180 and d["sessions"]["human_threshold_s"] == 15


def test_model_parameter_fields_from_yaml(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "model_configs:\n  my-moe:\n    total_params_b: 30\n    active_params_b: 3\n"
            "  llama3.1-8b:\n    total_params_b: 8\n",
        )
    )
    assert (c.model_configs["my-moe"].weights_params, c.model_configs["my-moe"].active_params) == (30e9, 3e9)
    assert c.model_configs["llama3.1-8b"].weights_params == 8e9
    assert c.model_configs["llama3.1-8b"].num_layers == 32
    new = load_config(write(tmp_path, "model_configs:\n  plain:\n    num_layers: 2\n", "c2.yaml"))
    assert new.model_configs["plain"].total_params_b == 0.0  # derived from the architecture


def test_gpus_merge_field_by_field_and_accept_new_gpus(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "gpus:\n  h100:\n    hbm_gb: 94\n"
            "  z9:\n    name: Z9 (no GPU of the table)\n    hbm_gb: 192\n    hbm_bandwidth_gbs: 5300\n"
            "    peak_dense_tflops: 1307\n    source: its datasheet\n",
        )
    )
    assert c.gpus["h100"].hbm_gb == 94.0 and c.gpus["h100"].hbm_bandwidth_gbs == 3350
    assert c.gpus["z9"].peak_dense_tflops == 1307.0 and c.gpus["z9"].name == "Z9 (no GPU of the table)"
    from kv_cache.specs.models import GPU_SPECS

    assert "z9" not in GPU_SPECS and set(c.gpus) == {*GPU_SPECS, "z9"}
    bare = load_config(
        write(
            tmp_path,
            "gpus:\n  x:\n    hbm_gb: 1\n    hbm_bandwidth_gbs: 2\n    peak_dense_tflops: 3\n",
            "c2.yaml",
        )
    )
    assert bare.gpus["x"].name == "x" and bare.gpus["x"].source == ""


def test_sessions_and_inference_model_override(tmp_path):
    c = load_config(
        write(
            tmp_path,
            "inference_model:\n  prefill_mfu: 0.4\n  weight_bytes_per_param: 1\n"
            "sessions:\n  human_pause_probability: 0.5\n  new_tokens_median: 6000\n",
        )
    )
    assert c.inference_model.prefill_mfu == 0.4 and c.inference_model.weight_bytes_per_param == 1.0
    assert c.inference_model.decode_hbm_efficiency == 0.7
    assert c.sessions.human_pause_probability == 0.5 and c.sessions.new_tokens_median == 6000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus:\n  h100:\n    hbm: 80\n", "unknown key 'gpus.h100.hbm' (valid keys: name, hbm_gb"),
        ("gpus:\n  h100:\n    hbm_gb: 0\n", "'gpus.h100.hbm_gb' must be > 0, got 0"),
        (
            "gpus:\n  new:\n    hbm_gb: 10\n",
            "'gpus.new' is a new GPU and needs hbm_bandwidth_gbs, peak_dense_tflops",
        ),
        ("gpus: [a]\n", "'gpus' must be a mapping, got list"),
        ("gpus:\n  h100: 3\n", "'gpus.h100' must be a mapping, got int"),
        ("inference_model:\n  prefill_mfu: 0\n", "'inference_model.prefill_mfu' must be > 0 and <= 1, got 0"),
        ("inference_model:\n  decode_hbm_efficiency: 1.5\n", "must be > 0 and <= 1"),
        ("inference_model:\n  hbm_reserved_fraction: -0.1\n", "must be between 0 and 1"),
        ("inference_model:\n  weight_bytes_per_param: 0\n", "must be > 0"),
        ("inference_model:\n  mfu: 0.5\n", "unknown key 'inference_model.mfu'"),
        (
            "sessions:\n  new_tokens_median: 7000\n",
            "'sessions.new_tokens_median' (7000.0) must be <= 'sessions.new_tokens_mean' (6000.0)",
        ),
        ("sessions:\n  output_tokens_median: 2000\n", "'sessions.output_tokens_median' (2000.0) must be <="),
        ("sessions:\n  shared_prefix_tokens: 20000\n", "'sessions.shared_prefix_tokens' (20000) must be <="),
        ("sessions:\n  max_context_tokens: 1000\n", "'sessions.first_turn_tokens_mean' (12000.0) must be <="),
        ("sessions:\n  turns_mean: 0.5\n", "'sessions.turns_mean' must be >= 1"),
        ("sessions:\n  human_pause_probability: 2\n", "must be between 0 and 1"),
        ("sessions:\n  block_tokens: 0\n", "'sessions.block_tokens' must be >= 1"),
        ("model_configs:\n  m:\n    total_params_b: -1\n", "'model_configs.m.total_params_b' must be >= 0"),
        (
            "model_configs:\n  m:\n    total_params_b: 2\n    active_params_b: 3\n",
            "'model_configs.m.active_params_b' (3) must be <= 'model_configs.m.total_params_b' (2)",
        ),
    ],
)
def test_bad_sessions_mode_entries(tmp_path, text, expected):
    assert expected in config_error(tmp_path, text)


# ---------------------------------------------------------------------------------------------
# The resolved run settings: a tree of per-component sub-configs with flat shortcuts
# ---------------------------------------------------------------------------------------------


def test_run_settings_tree_with_flat_shortcuts():
    from kv_cache.cli import parse_settings

    s = parse_settings(["--num-users", "7", "--cpu-mem-gb", "4", "--duration", "30", "--output", "o.json",
                        "--io-workers", "3"])
    assert s.workload.num_users == s.workload.num_users == 7
    assert s.tiers.cpu_mem_gb == s.tiers.cpu_mem_gb == 4.0
    assert s.driver.duration == s.driver.duration == 30.0
    assert s.outputs.output == s.outputs.output == "o.json"
    assert s.storage.io_workers == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.workload.num_users = 1
    with pytest.raises(AttributeError):
        s.workload.num_users = 1


def test_sub_config_field_names_are_unique():
    from kv_cache.settings.run import SECTIONS, RunSettings

    names = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    top = {f.name for f in dataclasses.fields(RunSettings)}
    assert len(names) == len(set(names)) and not (set(names) & top)


def test_io_modes_are_defined_once():
    from kv_cache.settings import run, sections
    from kv_cache.storage import files

    assert run.IO_MODES is files.IO_MODES
    assert sections.StorageConfig.__dataclass_fields__["io_mode"].metadata["check"].choices is files.IO_MODES
