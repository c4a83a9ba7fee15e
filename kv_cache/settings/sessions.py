"""The `kv-cache sessions` settings tree, typed: SessionsSettings (the ladder's own settings) above
LadderSettings (what every rung is built and run with) above the run's StorageSettings and remote tiers.

cli/sessions.py fills in every field from the flags (SessionsFlags holds their defaults) and config.yaml;
no field repeats another's, and none has a default of its own (tests/test_defaults_once.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache.settings.pacing import Pace
from kv_cache.settings.run import RemoteTierSettings, StorageSettings, TierSettings
from kv_cache.settings.sections import EvictionConfig, InferenceModelConfig, SessionsConfig
from kv_cache.specs import GIB, GPUSpec
from kv_cache.specs.models import ModelConfig

__all__ = ["DEFAULT_ANSWER_REPLICATIONS", "LOAD_POLICIES", "TIER_CONFIGS", "WINDOW_PLANS", "LadderSettings",
           "SessionsSettings"]

TIER_CONFIGS = ("none", "dram", "dram+storage")  # --tiers: the offload configurations a ladder compares
WINDOW_PLANS = ("planned", "fixed")  # --window-plan: how an answer run sizes each rung's window
LOAD_POLICIES = ("always", "cost")  # --load-policy: when a replica loads an offloaded prefix (engine/replica.py)
DEFAULT_ANSWER_REPLICATIONS = 3  # K when an answer is asked for and --replications is not given


@dataclass(frozen=True)
class LadderSettings:
    """The ladder section of the tree (SessionsSettings.ladder_settings): what every rung is built and run
    with; `storage` is the I/O engine's section of the run's tree (settings/run.py StorageSettings)."""

    model: ModelConfig
    model_name: str
    gpu: GPUSpec
    gpu_name: str
    efficiency: InferenceModelConfig  # config inference_model section: the roofline's constants
    hbm_kv_bytes: float  # HBM left for KV in one replica (serving/engine/roofline.py hbm_kv_capacity_bytes)
    num_gpus: int
    tensor_parallel: int
    block_tokens: int
    shared_prefix_tokens: int
    dram_bytes: int
    cache_dir: str | None
    storage_capacity_bytes: float  # 0 = auto: 90 % of the free space less one block (host.capacity)
    storage: StorageSettings  # how the offload tiers move bytes; max_storage_errors: what a rung tolerates
    window_s: float
    warmup_s: float
    subwindows: int
    prefill_chunk_tokens: int
    human_threshold_s: float
    pace: Pace | None  # --pace, None = as the trace or generator gives the pauses
    seed: int
    eviction: EvictionConfig
    load_policy: str  # LOAD_POLICIES: always | cost (see Replica)
    steady_state: bool  # start as a long run would have left the engine and tiers (steady_state.py)
    dram_write_through: bool  # offload every computed block on completion (inclusive), not only on eviction
    remote: RemoteTierSettings  # which backend holds the storage tier (a remote one: S3, Redis)

    @property
    def replicas(self) -> int:
        return max(1, self.num_gpus // self.tensor_parallel)

    @property
    def block_bytes(self) -> int:
        """A whole block's KV: a replica offloads all of it (each TP rank its shard, together the block)."""
        return self.block_tokens * self.model.bytes_per_token

    @property
    def block_bytes_per_gpu(self) -> int:
        """Each GPU's (TP rank's) share of a block."""
        return self.block_bytes // self.tensor_parallel

    @property
    def dram_usable_fraction(self) -> float:
        """The DRAM tier's usable share, the same whether it is the last tier or spills to storage."""
        return self.eviction.target_usage_ratio

    def tier_settings(self, tiers: str) -> TierSettings:
        """The offload tiers of configuration `tiers` as the tier builder takes them (no GPU store: HBM is
        the modelled replicas' own)."""
        dram = self.dram_bytes if tiers in ("dram", "dram+storage") else 0
        return TierSettings(gpu_mem_gb=0.0, gpu_tier="off", num_gpus=self.num_gpus,
                            tensor_parallel=self.tensor_parallel, cpu_mem_gb=dram / GIB, cache_dir=self.cache_dir,
                            storage_capacity_gb=self.storage_capacity_bytes / GIB, remote=self.remote)

    def hbm_capacity_blocks(self) -> int:
        """Blocks of KV one replica's HBM holds (on this block size: a trace's may differ from the config's)."""
        return int(self.hbm_kv_bytes // self.block_bytes)


@dataclass(frozen=True)
class SessionsSettings:
    """One `kv-cache sessions` run, resolved (synthetic sessions' block size until a trace is loaded): the
    ladder's own settings, and `ladder_settings`, what every rung is built with."""

    ladder_settings: LadderSettings
    ladder: tuple[int, ...]
    tiers: tuple[str, ...]  # of TIER_CONFIGS
    sessions: SessionsConfig
    trace: str | None
    trace_format: str
    max_sessions: int
    pace_text: str
    output: str
    log_level: str
    argv: tuple[str, ...]
    replications: int
    slo_ttft_p90_s: float | None
    ladder_auto_start: int  # > 0: `--ladder auto`, climbing from this many sessions until throughput peaked
    grid: tuple[LadderSettings, ...]  # `--models` / `--gpus`: one ladder per (model, GPU) cell; () = one cell
    window_plan: str  # WINDOW_PLANS: "planned" (an answer run's windows hold 3 loaded cycles) or "fixed" (--window)
