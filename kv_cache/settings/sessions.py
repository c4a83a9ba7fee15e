"""The `kv-cache sessions` settings tree, typed: SessionsSettings (the ladder's own settings) above
LadderSettings (what every rung is built and run with) above the run's StorageSettings and remote tiers.

SessionsFlags declares the `kv-cache sessions` flags (cli/flags.py generates the parser from it);
cli/sessions.py fills in every field of the tree from them and config.yaml; no field repeats another's, and
none has a default of its own (tests/test_defaults_once.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache.settings.fields import Flag, setting
from kv_cache.settings.pacing import Pace
from kv_cache.settings.run import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    LOG_LEVELS,
    RemoteTierSettings,
    StorageSettings,
    TierSettings,
)
from kv_cache.settings.sections import (
    AUTO_FRACTION,
    IO_MODES,
    EvictionConfig,
    InferenceModelConfig,
    SessionsConfig,
)
from kv_cache.settings.shaping import BANDWIDTH_HELP, LATENCY_HELP
from kv_cache.specs import GIB, GPUSpec
from kv_cache.specs.models import ModelConfig

__all__ = ["DEFAULT_ANSWER_REPLICATIONS", "LOAD_POLICIES", "TIER_CONFIGS", "WINDOW_PLANS", "LadderSettings",
           "SessionsFlags", "SessionsSettings"]

TIER_CONFIGS = ("none", "dram", "dram+storage")  # --tiers: the offload configurations a ladder compares
WINDOW_PLANS = ("planned", "fixed")  # --window-plan: how an answer run sizes each rung's window
LOAD_POLICIES = ("always", "cost")  # --load-policy: when a replica loads an offloaded prefix (engine/replica.py)
DEFAULT_ANSWER_REPLICATIONS = 3  # K when an answer is asked for and --replications is not given


@dataclass(frozen=True)
class SessionsFlags:
    """The `kv-cache sessions` flags: each one's default, help and argparse arguments, written once here
    (cli/flags.py generates the parser from these fields)."""

    config: str | None = setting(None, flag=Flag(
        "--config", help="YAML config (sections sessions, gpus, inference_model, model_configs)."))
    model: str = setting(DEFAULT_MODEL, flag=Flag("--model", help="Model key."))
    gpu: str = setting(DEFAULT_GPU, flag=Flag(
        "--gpu", registry="gpu_specs", help="GPU spec."))
    gpu_mem_gb: float = setting(0.0, flag=Flag(
        "--gpu-mem-gb", type=float, help="HBM per GPU in GiB (0 = the GPU spec's)."))  # 0 = the GPU spec's HBM
    num_gpus: int = setting(1, flag=Flag(
        "--num-gpus", type=int, help="GPUs; replicas = num-gpus / tensor-parallel."))
    tensor_parallel: int = setting(1, flag=Flag("--tensor-parallel", type=int, help="GPUs per model replica."))
    ladder: str = setting("4,8,16", flag=Flag(
        "--ladder", help="Comma-separated concurrent-session counts (rungs), or auto[:START] (double from START, "
                         "default 2, until throughput has peaked)."))
    window: float = setting(30.0, flag=Flag(
        "--window", type=float, help="Measured seconds per rung (the article used 720)."))
    window_plan: str = setting("planned", flag=Flag(
        "--window-plan", choices=WINDOW_PLANS,
        help="With --slo-ttft-p90: planned (each rung's window holds >= 3 loaded turn cycles measured at the rung "
             "below, within [--window, 4 x --window]) or fixed (every window is --window: the answer then says "
             "'not enough evidence' where --window is too short, with the --window that would do)."))
    warmup: float = setting(10.0, flag=Flag(
        "--warmup", type=float, help="Unmeasured seconds before each window."))
    subwindows: int = setting(5, flag=Flag(
        "--subwindows", type=int, help="Sub-windows for the confidence intervals (>= 2)."))
    tiers: str = setting(",".join(TIER_CONFIGS), flag=Flag(
        "--tiers", help=f"Offload configurations: {', '.join(TIER_CONFIGS)}."))
    cpu_mem_gb: float = setting(8.0, flag=Flag("--cpu-mem-gb", type=float, help="DRAM offload tier per run, GiB."))
    cache_dir: str | None = setting(None, flag=Flag(
        "--cache-dir", help="Directory of the storage offload tier (default: a temp dir)."))
    storage_capacity_gb: float = setting(0.0, flag=Flag(
        "--storage-capacity-gb", type=float,
        help=f"Storage tier capacity, GiB (0 = automatic: {AUTO_FRACTION * 100:.0f}%% of the free space, less one block; "
             "on tmpfs also within the memory budget)."))
    tier_bandwidth: float | str = setting(0.0, flag=Flag(
        "--tier-bandwidth", metavar="GB/s|TIER=GB/s,...", help=BANDWIDTH_HELP))  # settings/shaping.py parses it
    tier_latency: float | str = setting(0.0, flag=Flag(
        "--tier-latency", metavar="ms|TIER=ms,...", help=LATENCY_HELP))
    trace: str | None = setting(None, flag=Flag(
        "--trace", help="Sessions from a trace (agentic-coding dir, AIPerf, Bailian, Mooncake)."))
    trace_format: str = setting("auto", flag=Flag("--trace-format", help="Trace format (default: detected)."))
    max_sessions: int = setting(0, flag=Flag(
        "--max-sessions", type=int, help="Use at most this many sessions of the trace (0 = all)."))
    pace: str = setting("trace", flag=Flag(
        "--pace", help="Pause transform: trace | human:A:B | agentic:A:B | fixed:S."))
    seed: int = setting(42, flag=Flag(
        "--seed", type=int, help="Seed of the session generator and the pace transform."))
    output: str = setting("sessions_results.json", flag=Flag(
        "--output", help="Results JSON."))  # the parser adds the start time to the name
    io_workers: int = setting(8, flag=Flag(
        "--io-workers", type=int, help="I/O worker threads moving blocks to/from the offload tiers."))
    io_chunk_mb: int | None = setting(None, flag=Flag(
        "--io-chunk-mb", type=int,
        help="MiB per pwritev/preadv call (default: config storage)."))  # None = the config's storage section
    io_mode: str | None = setting(None, flag=Flag("--io-mode", choices=IO_MODES))
    no_fsync: bool | None = setting(None, flag=Flag("--no-fsync", action="store_true"))
    prefill_chunk_tokens: int = setting(8192, flag=Flag(
        "--prefill-chunk-tokens", type=int, help="Prefill tokens per batching iteration."))
    log_level: str = setting("WARNING", flag=Flag("--log-level", choices=LOG_LEVELS))
    load_policy: str = setting("always", flag=Flag(
        "--load-policy", choices=LOAD_POLICIES,
        help="always: load every offloaded prefix hit; cost: recompute it when loading at the tier's measured "
             "bandwidth would take longer than the modelled prefill."))
    replications: int | None = setting(None, flag=Flag(
        "--replications", type=int,
        help="Independent seeded replications per (config, sessions) cell; CIs across them (t). Default: 3 "
             "with --slo-ttft-p90 (the answer's intervals come from them), else 1."))
    slo_ttft_p90: float | None = setting(None, flag=Flag(
        "--slo-ttft-p90", type=float, metavar="S",
        help="SLO on the p90 TTFT of returning turns: the run bisects each configuration's crossing (up to 3 "
             "extra rungs) and ends with one sentence: the sessions held at the SLO, with intervals."))
    verify: bool = setting(False, flag=Flag(
        "--verify", action="store_true",
        help="Every offload-tier read checks each 4 KiB block's stamp (mismatches are storage errors)."))
    steady_state: bool = setting(False, flag=Flag(
        "--steady-state", action="store_true",
        help="Start each rung as a long run would leave it (sessions mid-way, HBM full, evicted blocks in the "
             "tiers, staggered arrivals); the warm-up ends when occupancy is steady (--warmup = its cap)."))
    dram_write_through: bool = setting(False, flag=Flag(
        "--dram-write-through", action="store_true",
        help="Inclusive offload, as vLLM's CPU offloading connector: every block a turn computes is written to "
             "the offload tiers when the turn completes, not only when HBM evicts it (configurations with dram)."))
    models: str | None = setting(None, flag=Flag(
        "--models", help="Grid: comma-separated model keys (overrides --model); every (model, GPU) cell runs."))
    gpus: str | None = setting(None, flag=Flag(
        "--gpus", help="Grid: comma-separated GPU specs (overrides --gpu); one table and answer per cell."))


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
