"""The config file: schema (frozen dataclasses), strict YAML loading, defaults = the shipped config.yaml.

Every section of config.yaml is one frozen dataclass whose attribute names are the YAML key names and
whose defaults are the shipped values. `load_config(None)` returns those defaults; `load_config(path)`
merges a (possibly partial) YAML file over them key by key and rejects anything it does not know, with a
one-line `ConfigError` that names the file and the dotted key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kv_cache.config.run import IO_MODES
from kv_cache.errors import ConfigError
from kv_cache.models import ATTENTION_TYPES, DTYPE_BYTES, MODEL_CONFIGS, NEW_MODEL_DEFAULTS, ModelConfig

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.models import GPUSpec

__all__ = [
    "AutoscalerConfig",
    "BenchConfig",
    "ConversationConfig",
    "DecodeConfig",
    "EvictionConfig",
    "FrozenMap",
    "GPUBackendConfig",
    "GenerationTiming",
    "InferenceModelConfig",
    "PrefixCacheConfig",
    "QoSDistribution",
    "QoSProfile",
    "RAGConfig",
    "RETRIEVAL_DISTRIBUTIONS",
    "SaturationDetectionConfig",
    "SessionsConfig",
    "ShareGPTConfig",
    "StorageConfig",
    "UserTemplate",
    "ValidationLimits",
    "config_from_mapping",
    "load_config",
]

RETRIEVAL_DISTRIBUTIONS = ("zipfian", "uniform", "random")

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only mapping that, unlike `types.MappingProxyType`, can be hashed and pickled."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[K, V] | None = None) -> None:
        self._data: dict[K, V] = dict(data or {})

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self):
        return (FrozenMap, (self._data,))


# --------------------------------------------------------------------------------------------------
# Field checks (kept in the dataclass field metadata, so the schema has one source of truth)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Check:
    kind: str  # int | float | prob | range_int | range_float | choice | bool | str
    minimum: float | None = None
    exclusive_min: bool = False
    choices: tuple[str, ...] = ()


def _f(kind: str, default: Any = MISSING, **kw: Any) -> Any:
    return field(default=default, metadata={"check": _Check(kind, **kw)})


def _int(default: Any = MISSING, minimum: int = 0) -> Any:
    return _f("int", default, minimum=minimum)


def _num(default: Any = MISSING, minimum: float = 0.0, exclusive_min: bool = False) -> Any:
    return _f("float", default, minimum=minimum, exclusive_min=exclusive_min)


def _prob(default: Any = MISSING) -> Any:
    return _f("prob", default)


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserTemplate:
    """One persona: [min, max] context tokens, generated tokens and think time (s) per request."""

    context_range: tuple[int, int] = _f("range_int", minimum=1)
    generation_range: tuple[int, int] = _f("range_int", minimum=0)
    think_time_range: tuple[float, float] = _f("range_float", minimum=0.0)


@dataclass(frozen=True)
class GenerationTiming:
    """Simulated GPU seconds per generated token for each --generation-mode."""

    none: float = _num(0.0)
    fast: float = _num(0.002)
    realistic: float = _num(0.030)


@dataclass(frozen=True)
class QoSProfile:
    """SLA targets (ms) and queue priority (higher = served first) of one QoS class."""

    target_latency_p95_ms: float = _num()
    target_latency_p99_ms: float = _num()
    target_latency_p999_ms: float = _num()
    target_latency_p9999_ms: float = _num()
    priority: int = _int()


@dataclass(frozen=True)
class QoSDistribution:
    interactive_probability: float = _prob(0.15)
    responsive_threshold: float = _prob(0.50)  # cumulative: P(responsive) = threshold - interactive


@dataclass(frozen=True)
class EvictionConfig:
    max_recursion_depth: int = _int(10)
    target_usage_ratio: float = _prob(0.8)
    large_entry_limit_ratio: float = _prob(0.95)
    max_evictions_hard_cap: int = _int(5000)
    max_evictions_min: int = _int(1000)


@dataclass(frozen=True)
class GPUBackendConfig:
    memory_fraction: float = _prob(0.9)
    max_eviction_attempts: int = _int(100)
    free_memory_threshold: float = _prob(0.1)


@dataclass(frozen=True)
class PrefixCacheConfig:
    min_prefix_length: int = _int(50)
    max_prefix_entries: int = _int(1000)
    system_prompt_hit_probability: float = _prob(0.2)


@dataclass(frozen=True)
class RAGConfig:
    chunk_size_tokens: int = _int(512, minimum=1)
    top_k_chunks: int = _int(5)
    max_chunk_bytes: int = _int(268435456, minimum=1)
    request_probability: float = _prob(0.1)
    retrieval_distribution: str = _f("choice", "zipfian", choices=RETRIEVAL_DISTRIBUTIONS)
    max_documents: int = _int(0)  # 0 = unlimited
    large_model_doc_tokens_min: int = _int(1024, minimum=1)
    large_model_doc_tokens_max: int = _int(4096, minimum=1)
    small_model_doc_tokens_min: int = _int(4000, minimum=1)
    small_model_doc_tokens_max: int = _int(12000, minimum=1)


@dataclass(frozen=True)
class ConversationConfig:
    max_conversations: int = _int(1000, minimum=1)
    max_turns_per_conv: int = _int(50, minimum=1)
    end_conversation_probability: float = _prob(0.2)


@dataclass(frozen=True)
class AutoscalerConfig:
    min_users: int = _int(1, minimum=1)
    max_users: int = _int(10000, minimum=1)
    scale_up_factor: float = _num(1.2, exclusive_min=True)
    scale_down_factor: float = _num(0.8, exclusive_min=True)
    consecutive_samples_required: int = _int(2, minimum=1)
    interval_seconds: float = _num(10.0, exclusive_min=True)  # ours: seconds between autoscaler samples


@dataclass(frozen=True)
class DecodeConfig:
    batch_size: int = _int(32, minimum=1)


@dataclass(frozen=True)
class ShareGPTConfig:
    max_context_tokens: int = _int(8192, minimum=1)
    max_generation_tokens: int = _int(2048, minimum=1)
    chars_per_token_estimate: float = _num(4.0, exclusive_min=True)


@dataclass(frozen=True)
class SaturationDetectionConfig:
    read_latency_p95_threshold_ms: float = _num(100.0)
    write_latency_p95_threshold_ms: float = _num(50.0)
    queue_depth_threshold: int = _int(100)
    history_window_size: int = _int(10, minimum=1)


@dataclass(frozen=True)
class ValidationLimits:
    """Upper limits the command-line validation enforces (these take effect, unlike the reference)."""

    max_users: int = _int(100000, minimum=1)
    max_duration_seconds: int = _int(86400, minimum=1)
    max_gpu_memory_gb: float = _num(1024.0)
    max_cpu_memory_gb: float = _num(16384.0)


@dataclass(frozen=True)
class StorageConfig:
    """Our own section: how the storage tier moves bytes."""

    chunk_size_mb: int = _int(16, minimum=1)  # MiB per pwritev/preadv call
    fsync: bool = _f("bool", True)  # fdatasync once per written entry
    io_mode: str = _f("choice", "auto", choices=IO_MODES)
    io_workers: int = _int(0)  # 0 = auto


@dataclass(frozen=True)
class DriverConfig:
    """Our own section: how load is offered."""

    admission_queue_limit: int = _int(1000, minimum=1)  # open loop: arrivals beyond this are rejected
    timeline_interval_seconds: float = _num(10.0, exclusive_min=True)  # throughput_timeline sampling


@dataclass(frozen=True)
class PerformanceCriteria:
    """Our own section: PASS/FAIL thresholds of --performance-profile (reference values for latency)."""

    storage_write_device_p95_ms: float = _num(500.0, exclusive_min=True)
    storage_read_device_p95_ms: float = _num(200.0, exclusive_min=True)
    cpu_p95_ms: float = _num(150.0, exclusive_min=True)
    min_cache_hit_rate: float = _prob(0.3)
    min_storage_read_gbps: float = _num(0.1)  # throughput profile: GiB/s floor, reads (when reads happen)
    min_storage_write_gbps: float = _num(0.1)  # throughput profile: GiB/s floor, writes (when writes happen)
    max_error_rate: float = _prob(0.0)  # throughput profile: failed requests / issued


@dataclass(frozen=True)
class InferenceModelConfig:
    """Our own section (sessions mode): efficiencies of the modelled inference engine (kv_cache.engine.roofline).

    Assumptions to tune, from typical vLLM / SGLang measurements: long prefills reach ~40-60 % MFU, decode
    steps ~70-85 % of peak HBM bandwidth; 10 % of HBM is kept for activations / workspace (vLLM's default
    gpu_memory_utilization = 0.9); weights in bf16 (2 bytes per parameter).
    """

    prefill_mfu: float = _f("prob", 0.5, minimum=0.0, exclusive_min=True)  # (0, 1]
    decode_hbm_efficiency: float = _f("prob", 0.8, minimum=0.0, exclusive_min=True)  # (0, 1]
    hbm_reserved_fraction: float = _prob(0.1)
    weight_bytes_per_param: float = _num(2.0, exclusive_min=True)


@dataclass(frozen=True)
class SessionsConfig:
    """Our own section (sessions mode): the built-in session generator (kv_cache.workload.sessions) and the
    turn classifier. Shaped like the NVIDIA AIPerf agentic-code generator (lognormal new tokens per turn
    and output lengths, an agentic / human pause mixture, a shared system prompt, 512-token blocks,
    sessions that end before they exceed the context limit); the numbers are our defaults."""

    block_tokens: int = _int(512, minimum=1)  # KV block (page) size, tokens
    shared_prefix_tokens: int = _int(4000)  # system prompt + tools shared by every session (before turn 1)
    first_turn_tokens_mean: float = _num(12000.0, exclusive_min=True)  # shared prefix + first prompt, mean
    new_tokens_mean: float = _num(6000.0, exclusive_min=True)  # later turns: lognormal, mean
    new_tokens_median: float = _num(4000.0, exclusive_min=True)  # ... and median (<= mean)
    output_tokens_mean: float = _num(1000.0, exclusive_min=True)  # lognormal, mean
    output_tokens_median: float = _num(600.0, exclusive_min=True)  # ... and median (<= mean)
    turns_mean: float = _num(20.0, minimum=1.0)  # geometric turns per session, mean
    max_context_tokens: int = _int(200000, minimum=2)  # a session ends before its context would exceed it
    human_pause_probability: float = _prob(0.2)  # share of inter-turn pauses that are human
    agentic_pause_mean_s: float = _num(5.0)  # exponential, seconds
    human_pause_mean_s: float = _num(30.0)  # exponential, seconds
    human_threshold_s: float = _num(15.0)  # classifier: a pause of unknown kind >= this is a human return


_DEFAULT_USER_TEMPLATES = {
    "chatbot": UserTemplate((512, 4096), (50, 200), (0.1, 0.5)),
    "coding": UserTemplate((4096, 25000), (100, 500), (0.2, 1.0)),
    "document": UserTemplate((4096, 16384), (200, 800), (0.3, 1.5)),
}

_DEFAULT_QOS_PROFILES = {
    "interactive": QoSProfile(50.0, 100.0, 150.0, 200.0, 3),
    "responsive": QoSProfile(100.0, 200.0, 350.0, 500.0, 2),
    "batch": QoSProfile(1000.0, 5000.0, 7500.0, 10000.0, 1),
}


@dataclass(frozen=True)
class BenchConfig:
    """The whole config file, fully resolved. Attribute names are the YAML section names."""

    user_templates: Mapping[str, UserTemplate] = field(
        default_factory=lambda: FrozenMap(_DEFAULT_USER_TEMPLATES)
    )
    generation_timing: GenerationTiming = field(default_factory=GenerationTiming)
    qos_profiles: Mapping[str, QoSProfile] = field(default_factory=lambda: FrozenMap(_DEFAULT_QOS_PROFILES))
    qos_distribution: QoSDistribution = field(default_factory=QoSDistribution)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    gpu_backend: GPUBackendConfig = field(default_factory=GPUBackendConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    rag: RAGConfig = field(default_factory=RAGConfig)
    conversation: ConversationConfig = field(default_factory=ConversationConfig)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    sharegpt: ShareGPTConfig = field(default_factory=ShareGPTConfig)
    saturation_detection: SaturationDetectionConfig = field(default_factory=SaturationDetectionConfig)
    validation_limits: ValidationLimits = field(default_factory=ValidationLimits)
    storage: StorageConfig = field(default_factory=StorageConfig)
    driver: DriverConfig = field(default_factory=DriverConfig)
    performance_criteria: PerformanceCriteria = field(default_factory=PerformanceCriteria)
    model_configs: Mapping[str, ModelConfig] = field(default_factory=lambda: FrozenMap(MODEL_CONFIGS))
    gpus: Mapping[str, GPUSpec] = field(default_factory=lambda: FrozenMap(_builtin_gpus()))
    inference_model: InferenceModelConfig = field(default_factory=InferenceModelConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts/lists in config.yaml layout (for echoing the effective config in results)."""

        def plain(value: Any) -> Any:
            if dataclasses.is_dataclass(value):
                return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, Mapping):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            return value

        return plain(self)


_NAMED_SECTIONS = {"user_templates": _DEFAULT_USER_TEMPLATES, "qos_profiles": _DEFAULT_QOS_PROFILES}
_MODEL_FIELD_CHECKS = {
    "name": _Check("str"),
    "num_layers": _Check("int", minimum=1),
    "hidden_dim": _Check("int", minimum=1),
    "num_heads": _Check("int", minimum=1),
    "kv_heads": _Check("int", minimum=1),
    "dtype": _Check("choice", choices=tuple(DTYPE_BYTES)),
    "kv_dim_per_head": _Check("int", minimum=0),
    "attention_type": _Check("choice", choices=ATTENTION_TYPES),
    "kv_lora_rank": _Check("int", minimum=0),
    "qk_rope_head_dim": _Check("int", minimum=0),
    "total_params_b": _Check("float", minimum=0.0),
    "active_params_b": _Check("float", minimum=0.0),
}
_GPU_FIELD_CHECKS = {
    "name": _Check("str"),
    "hbm_gb": _Check("float", minimum=0.0, exclusive_min=True),
    "hbm_bandwidth_gbs": _Check("float", minimum=0.0, exclusive_min=True),
    "peak_dense_tflops": _Check("float", minimum=0.0, exclusive_min=True),
    "source": _Check("str"),
}
_NEW_GPU_REQUIRED = ("hbm_gb", "hbm_bandwidth_gbs", "peak_dense_tflops")
# (min key, max key) pairs that must be ordered, per section.
_ORDERED_PAIRS = {
    "rag": (
        ("large_model_doc_tokens_min", "large_model_doc_tokens_max"),
        ("small_model_doc_tokens_min", "small_model_doc_tokens_max"),
    ),
    "autoscaler": (("min_users", "max_users"),),
    "sessions": (
        ("new_tokens_median", "new_tokens_mean"),
        ("output_tokens_median", "output_tokens_mean"),
        ("shared_prefix_tokens", "first_turn_tokens_mean"),
        ("first_turn_tokens_mean", "max_context_tokens"),
    ),
}


def _builtin_gpus() -> Mapping[str, GPUSpec]:
    # imported lazily: models is a leaf module, this keeps the schema importable on its own
    from kv_cache.models import GPU_SPECS

    return GPU_SPECS


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str] | None) -> BenchConfig:
    """Built-in defaults (None) or a YAML file merged over them; any problem -> one-line ConfigError."""
    if path is None:
        return BenchConfig()
    source = os.fspath(path)
    return config_from_mapping(_read_yaml(source), source)


def config_from_mapping(data: Any, source: str = "<config>") -> BenchConfig:
    """Validate an already-parsed document (None = empty) and merge it over the defaults."""
    if data is None:
        return BenchConfig()
    if not isinstance(data, Mapping):
        _fail(source, f"the top-level document must be a mapping of sections, got {_type_name(data)}")
    defaults = BenchConfig()
    section_fields = [f.name for f in dataclasses.fields(BenchConfig)]
    updates: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in section_fields:
            _unknown(source, str(key), section_fields)
        if key == "model_configs":
            updates[key] = _build_models(value, source)
        elif key == "gpus":
            updates[key] = _build_gpus(value, source)
        elif key in _NAMED_SECTIONS:
            updates[key] = _build_named(getattr(defaults, key), value, key, source)
        else:
            updates[key] = _build_section(getattr(defaults, key), value, key, source)
    return dataclasses.replace(defaults, **updates)


def _read_yaml(source: str) -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a hard dependency
        _fail(source, "PyYAML is required to read a config file (pip install pyyaml)")
    try:
        with open(source, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        _fail(source, "config file not found")
    except IsADirectoryError:
        _fail(source, "is a directory, not a config file")
    except UnicodeDecodeError:
        _fail(source, "config file is not UTF-8 text")
    except OSError as exc:
        _fail(source, f"cannot read config file: {exc.strerror or exc}")
    try:
        return yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as exc:
        _fail(source, f"invalid YAML: {_yaml_message(exc)}")


@functools.cache
def _strict_loader() -> Any:
    """A SafeLoader that also rejects duplicate keys (plain safe_load keeps the last one silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        loader.flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: construct_mapping reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def _yaml_message(exc: Exception) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem:
        context = getattr(exc, "context", None)
        text = f"{context}, {problem}" if context else problem
    else:
        text = str(exc)
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------------
# Section builders
# --------------------------------------------------------------------------------------------------

T = TypeVar("T")


def _build_section(default: T, data: Any, key: str, source: str) -> T:
    if data is None:  # an empty section (every key commented out) keeps the defaults
        return default
    if not isinstance(data, Mapping):
        _fail(source, f"'{key}' must be a mapping, got {_type_name(data)}")
    fields = {f.name: f for f in dataclasses.fields(default)}
    updates: dict[str, Any] = {}
    for name, value in data.items():
        dotted = f"{key}.{name}"
        if not isinstance(name, str) or name not in fields:
            _unknown(source, dotted, fields)
        updates[name] = _check(fields[name].metadata["check"], value, dotted, source)
    result = dataclasses.replace(default, **updates)
    for low, high in _ORDERED_PAIRS.get(key, ()):
        lo_value, hi_value = getattr(result, low), getattr(result, high)
        if lo_value > hi_value:
            _fail(source, f"'{key}.{low}' ({lo_value}) must be <= '{key}.{high}' ({hi_value})")
    return result


def _build_named(defaults: Mapping[str, Any], data: Any, key: str, source: str) -> FrozenMap:
    if data is None:
        return FrozenMap(defaults)
    if not isinstance(data, Mapping):
        _fail(source, f"'{key}' must be a mapping, got {_type_name(data)}")
    merged = dict(defaults)
    for name, value in data.items():
        if not isinstance(name, str) or name not in defaults:
            _unknown(source, f"{key}.{name}", defaults)
        merged[name] = _build_section(defaults[name], value, f"{key}.{name}", source)
    return FrozenMap(merged)


def _build_models(data: Any, source: str) -> FrozenMap:
    """Built-in models merged with the YAML ones, field by field (spec 3.4)."""
    models = dict(MODEL_CONFIGS)
    if data is None:
        return FrozenMap(models)
    if not isinstance(data, Mapping):
        _fail(source, f"'model_configs' must be a mapping, got {_type_name(data)}")
    for name, entry in data.items():
        if not isinstance(name, str) or not name.strip():
            _fail(source, f"'model_configs' keys must be non-empty model names, got {_show(name)}")
        dotted = f"model_configs.{name}"
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            _fail(source, f"'{dotted}' must be a mapping, got {_type_name(entry)}")
        base = models.get(name)
        values = dataclasses.asdict(base) if base is not None else {"name": name, **NEW_MODEL_DEFAULTS}
        for field_name, value in entry.items():
            if not isinstance(field_name, str) or field_name not in _MODEL_FIELD_CHECKS:
                _unknown(source, f"{dotted}.{field_name}", _MODEL_FIELD_CHECKS)
            values[field_name] = _check(
                _MODEL_FIELD_CHECKS[field_name], value, f"{dotted}.{field_name}", source
            )
        model = ModelConfig(**values)
        if 0 < model.total_params_b < model.active_params_b:
            _fail(
                source,
                f"'{dotted}.active_params_b' ({_fmt(model.active_params_b)}) must be <= "
                f"'{dotted}.total_params_b' ({_fmt(model.total_params_b)})",
            )
        if model.bytes_per_token <= 0:
            if model.attention_type == "mla":
                why = "attention_type 'mla' needs kv_lora_rank + qk_rope_head_dim > 0"
            else:
                why = "head_dim (hidden_dim // num_heads) is 0; set kv_dim_per_head"
            _fail(source, f"'{dotted}' gives 0 bytes per token: {why}")
        models[name] = model
    return FrozenMap(models)


def _build_gpus(data: Any, source: str) -> FrozenMap:
    """Built-in GPUs merged with the YAML ones, field by field; a new GPU must give its three numbers."""
    from kv_cache.models import GPUSpec

    gpus = dict(_builtin_gpus())
    if data is None:
        return FrozenMap(gpus)
    if not isinstance(data, Mapping):
        _fail(source, f"'gpus' must be a mapping, got {_type_name(data)}")
    for name, entry in data.items():
        if not isinstance(name, str) or not name.strip():
            _fail(source, f"'gpus' keys must be non-empty GPU names, got {_show(name)}")
        dotted = f"gpus.{name}"
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            _fail(source, f"'{dotted}' must be a mapping, got {_type_name(entry)}")
        base = gpus.get(name)
        values = dataclasses.asdict(base) if base is not None else {"name": name, "source": ""}
        for field_name, value in entry.items():
            if not isinstance(field_name, str) or field_name not in _GPU_FIELD_CHECKS:
                _unknown(source, f"{dotted}.{field_name}", _GPU_FIELD_CHECKS)
            values[field_name] = _check(
                _GPU_FIELD_CHECKS[field_name], value, f"{dotted}.{field_name}", source
            )
        missing = [k for k in _NEW_GPU_REQUIRED if k not in values]
        if missing:
            _fail(source, f"'{dotted}' is a new GPU and needs {', '.join(missing)}")
        gpus[name] = GPUSpec(**values)
    return FrozenMap(gpus)


# --------------------------------------------------------------------------------------------------
# Leaf checks
# --------------------------------------------------------------------------------------------------


def _check(check: _Check, value: Any, key: str, source: str) -> Any:
    kind = check.kind
    if kind == "int":
        return _check_int(check, value, key, source)
    if kind in ("float", "prob"):
        return _check_float(check, value, key, source)
    if kind in ("range_int", "range_float"):
        return _check_range(check, value, key, source)
    if kind == "choice":
        if not isinstance(value, str) or value not in check.choices:
            _fail(source, f"'{key}' must be one of {', '.join(check.choices)}; got {_show(value)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            _fail(source, f"'{key}' must be true or false, got {_type_name(value)} ({_show(value)})")
        return value
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            _fail(source, f"'{key}' must be a non-empty string, got {_type_name(value)} ({_show(value)})")
        return value
    raise AssertionError(f"unknown check kind {kind}")  # pragma: no cover


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float))) and not isinstance(value, bool)


def _check_int(check: _Check, value: Any, key: str, source: str) -> int:
    if not _is_int(value):
        _fail(source, f"'{key}' must be an integer, got {_type_name(value)} ({_show(value)})")
    if check.minimum is not None and value < check.minimum:
        _fail(source, f"'{key}' must be >= {_fmt(check.minimum)}, got {value}")
    return int(value)


def _check_float(check: _Check, value: Any, key: str, source: str) -> float:
    if not _is_number(value):
        _fail(source, f"'{key}' must be a number, got {_type_name(value)} ({_show(value)})")
    number = float(value)
    if not math.isfinite(number):
        _fail(source, f"'{key}' must be a finite number, got {value}")
    if check.kind == "prob":
        if check.exclusive_min and not 0.0 < number <= 1.0:
            _fail(source, f"'{key}' must be > 0 and <= 1, got {value}")
        if not 0.0 <= number <= 1.0:
            _fail(source, f"'{key}' must be between 0 and 1, got {value}")
    elif check.minimum is not None:
        if check.exclusive_min and number <= check.minimum:
            _fail(source, f"'{key}' must be > {_fmt(check.minimum)}, got {value}")
        if number < check.minimum:
            _fail(source, f"'{key}' must be >= {_fmt(check.minimum)}, got {value}")
    return number


def _check_range(check: _Check, value: Any, key: str, source: str) -> tuple:
    integers = check.kind == "range_int"
    what = "integers" if integers else "numbers"
    is_elem = _is_int if integers else _is_number
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(is_elem(v) for v in value):
        _fail(
            source, f"'{key}' must be a [min, max] list of 2 {what}, got {_type_name(value)} ({_show(value)})"
        )
    low, high = (int(v) for v in value) if integers else (float(v) for v in value)
    if not integers and not (math.isfinite(low) and math.isfinite(high)):
        _fail(source, f"'{key}' must hold finite numbers, got {_show(list(value))}")
    if check.minimum is not None and low < check.minimum:
        _fail(source, f"'{key}' values must be >= {_fmt(check.minimum)}, got {_show(list(value))}")
    if low > high:
        _fail(source, f"'{key}' must be [min, max] with min <= max, got {_show(list(value))}")
    return (low, high)


# --------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------


def _fail(source: str, message: str) -> Any:
    text = f"{source}: {message}".replace("\r", "\\r").replace("\n", "\\n")
    raise ConfigError(text)


def _unknown(source: str, dotted: str, valid: Any) -> Any:
    _fail(source, f"unknown key '{dotted}' (valid keys: {', '.join(valid)})")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "mapping"
    return type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)
