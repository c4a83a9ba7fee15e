"""The config file's sections: one frozen dataclass each, attribute names = YAML keys, defaults = the
shipped config.yaml values, checks in the field metadata (see fields.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kv_cache.settings.fields import FrozenMap, _f, _int, _num, _prob
from kv_cache.specs.models import MODEL_CONFIGS, ModelConfig

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.specs.models import GPUSpec

RETRIEVAL_DISTRIBUTIONS = ("zipfian", "uniform", "random")

# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


# How the storage tier opens its files: O_DIRECT where the filesystem allows it, or the page cache.
IO_MODES = ("auto", "direct", "buffered")
# The storage tier's automatic capacity (--storage-capacity-gb 0): this share of the free space, shared with the
# other live runs, before the largest entry (host/capacity.py applies it).
AUTO_FRACTION = 0.90


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
    """Upper limits the command-line validation enforces."""

    max_users: int = _int(100000, minimum=1)
    max_duration_seconds: int = _int(86400, minimum=1)
    max_gpu_memory_gb: float = _num(1024.0)
    max_cpu_memory_gb: float = _num(16384.0)
    max_trace_context_tokens: int = _int(1048576, minimum=1)  # trace rows beyond this context are rejected


@dataclass(frozen=True)
class StorageConfig:
    """Our own section: how the storage tier moves bytes."""

    chunk_size_mb: int = _int(16, minimum=1)  # MiB per pwritev/preadv call
    fsync: bool = _f("bool", True)  # fdatasync once per written entry
    io_mode: str = _f("choice", "auto", choices=IO_MODES)
    io_workers: int = _int(0)  # 0 = auto
    io_retries: int = _int(3)  # tries again after a transient error (EIO, ENOTCONN, EAGAIN), per operation
    max_storage_errors: int = _int(10)  # storage errors left after retries that a run tolerates; then exit 3
    remote_grace_s: float = _num(10.0)  # a remote tier's operation still unanswered this long after the stop: abandoned
    remote_failover_s: float = _num(30.0)  # a lost remote server is retried this long (backoff, jitter); then exit 3


@dataclass(frozen=True)
class DriverConfig:
    """Our own section: how load is offered."""

    admission_queue_limit: int = _int(1000, minimum=1)  # open loop: arrivals beyond this are rejected
    timeline_interval_seconds: float = _num(10.0, exclusive_min=True)  # throughput_timeline sampling


@dataclass(frozen=True)
class PerformanceCriteria:
    """Our own section: PASS/FAIL thresholds of --performance-profile (latency defaults: MLPerf's)."""

    storage_write_device_p95_ms: float = _num(500.0, exclusive_min=True)
    storage_read_device_p95_ms: float = _num(200.0, exclusive_min=True)
    cpu_p95_ms: float = _num(150.0, exclusive_min=True)
    min_cache_hit_rate: float = _prob(0.3)
    min_storage_read_gbps: float = _num(0.1)  # throughput profile: GiB/s floor, reads (when reads happen)
    min_storage_write_gbps: float = _num(0.1)  # throughput profile: GiB/s floor, writes (when writes happen)
    max_error_rate: float = _prob(0.0)  # throughput profile: failed requests / issued


@dataclass(frozen=True)
class InferenceModelConfig:
    """Our own section (sessions mode): efficiencies of the modelled inference engine (kv_cache.serving.engine.roofline).

    ``prefill_mfu`` and ``decode_hbm_efficiency`` are calibrated on published measurements
    (kv_cache/specs/calibration.yaml, vidur's per-layer profiles on A100 and H100): the layers' linear work
    of a 4,096-token prefill reached 65-72 % of peak dense FLOP/s and a 32-request decode step 62-67 % of
    peak HBM bandwidth, so 0.65 and 0.70 (the earlier typical values 0.5 and 0.8 were 25-35 % slow on prefill
    and 11-22 % fast on decode against them). 10 % of HBM is kept for activations / workspace (vLLM's default
    gpu_memory_utilization = 0.9); weights in bf16 (2 bytes per parameter).
    """

    prefill_mfu: float = _f("prob", 0.65, minimum=0.0, exclusive_min=True)  # (0, 1]
    decode_hbm_efficiency: float = _f("prob", 0.7, minimum=0.0, exclusive_min=True)  # (0, 1]
    hbm_reserved_fraction: float = _prob(0.1)
    weight_bytes_per_param: float = _num(2.0, exclusive_min=True)


@dataclass(frozen=True)
class SessionsConfig:
    """Our own section (sessions mode): the built-in session generator (kv_cache.workload.sessions) and the
    turn classifier. Shaped like the NVIDIA AIPerf agentic-code generator (lognormal new tokens per turn
    and output lengths, an agentic / human pause mixture, a shared system prompt, 512-token blocks,
    sessions that end before they exceed the context limit); the pause mixture is AIPerf's (its
    1k_sessions_200k_ctx manifest: 70 % agentic, lognormal 5 s mean / 2 s median; 30 % human, lognormal
    30 s / 15 s), the other numbers are our defaults."""

    block_tokens: int = _int(512, minimum=1)  # KV block (page) size, tokens
    shared_prefix_tokens: int = _int(4000)  # system prompt + tools shared by every session (before turn 1)
    first_turn_tokens_mean: float = _num(12000.0, exclusive_min=True)  # shared prefix + first prompt, mean
    new_tokens_mean: float = _num(6000.0, exclusive_min=True)  # later turns: lognormal, mean
    new_tokens_median: float = _num(4000.0, exclusive_min=True)  # ... and median (<= mean)
    output_tokens_mean: float = _num(1000.0, exclusive_min=True)  # lognormal, mean
    output_tokens_median: float = _num(600.0, exclusive_min=True)  # ... and median (<= mean)
    turns_mean: float = _num(20.0, minimum=1.0)  # geometric turns per session, mean
    max_context_tokens: int = _int(200000, minimum=2)  # a session ends before its context would exceed it
    human_pause_probability: float = _prob(0.3)  # share of inter-turn pauses that are human (AIPerf 1 - 0.7)
    agentic_pause_mean_s: float = _num(5.0, exclusive_min=True)  # lognormal mean, seconds (AIPerf manifest)
    agentic_pause_median_s: float = _num(2.0, exclusive_min=True)  # ... and median (<= mean)
    human_pause_mean_s: float = _num(30.0, exclusive_min=True)  # lognormal mean, seconds (AIPerf manifest)
    human_pause_median_s: float = _num(15.0, exclusive_min=True)  # ... and median (<= mean)
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


def _builtin_gpus() -> Mapping[str, GPUSpec]:
    # imported lazily: models is a leaf module, this keeps the schema importable on its own
    from kv_cache.specs.models import GPU_SPECS

    return GPU_SPECS
