"""The immutable description of one benchmark run: CLI flags merged over config.yaml, validated.

A tree of frozen dataclasses, one per component, so that each component can be handed only its own
part: `storage` (the I/O engine), `tiers` (capacities and where the storage tier lives), `workload`
(who issues what), `driver` (how the run is paced and stopped) and `outputs` (where results go). Every
default is written here once; the command-line parser takes its defaults from these classes.

The flat names of the MLPerf-compatible flags (`settings.num_users`, `settings.cpu_mem_gb`...) stay
readable on RunSettings: each sub-config field is also a read-only property of the whole.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from kv_cache.config.pacing import ThinkTime
from kv_cache.config.sections import IO_MODES, StorageConfig

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.config.schema import BenchConfig
    from kv_cache.models import GPUSpec, ModelConfig

__all__ = [
    "DEFAULT_MODEL",
    "GENERATION_MODES",
    "GPU_TIERS",
    "IO_MODES",
    "LOG_LEVELS",
    "PERFORMANCE_PROFILES",
    "SECTIONS",
    "DriverSettings",
    "OutputSettings",
    "RunSettings",
    "SourceFlags",
    "StorageSettings",
    "TierSettings",
    "WorkloadSettings",
    "defaults",
]

GENERATION_MODES = ("none", "fast", "realistic")
PERFORMANCE_PROFILES = ("latency", "throughput")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
GPU_TIERS = ("auto", "real", "simulated", "off")
DEFAULT_MODEL = "llama3.1-8b"
_STORAGE = StorageConfig()  # the config file's storage section is the I/O engine's default


@dataclass(frozen=True)
class StorageSettings:
    """How the storage tier moves bytes (the I/O engine's knobs)."""

    chunk_bytes: int = _STORAGE.chunk_size_mb << 20  # bytes per pwritev/preadv call; bounds RAM per op
    fsync: bool = _STORAGE.fsync  # fdatasync once per written entry
    io_mode: str = _STORAGE.io_mode  # auto = O_DIRECT where the filesystem allows it, else buffered + fadvise
    io_workers: int = _STORAGE.io_workers  # 0 = derived from the core count and user count
    io_retries: int = _STORAGE.io_retries  # retries after a transient error (EIO, ENOTCONN, EAGAIN)
    max_storage_errors: int = _STORAGE.max_storage_errors  # tolerated storage errors; one more stops the run
    verify: bool = False  # every read checks the per-block stamps against what was written


def _builtin_gpu(key: str) -> GPUSpec:
    from kv_cache.models import GPU_SPECS  # noqa: PLC0415  (models is the bottom layer; kept lazy as the import above)

    return GPU_SPECS[key]


@dataclass(frozen=True)
class TierSettings:
    """The cache tiers' budgets and where the storage tier lives."""

    gpu_mem_gb: float = 16.0  # per GPU
    num_gpus: int = 1
    tensor_parallel: int = 1
    cpu_mem_gb: float = 32.0
    cache_dir: str | None = None  # None = a fresh temporary directory
    gpu_tier: str = "auto"  # auto (real with CUDA, else simulated) | real | simulated | off
    gpu_type: str = "h100"  # the config's gpus key whose host link / HBM figures model a simulated tier
    gds: bool = False  # storage-tier reads into GPU memory through kvikio (needs the real GPU tier)
    gpu_spec: GPUSpec | None = field(default_factory=lambda: _builtin_gpu("h100"))  # gpu_type's, from the config
    storage_capacity_gb: float = 0.0  # 0 = 90 % of the free space less the largest entry (shared with live runs)
    strict_memory: bool = False  # a host-RAM tier (CPU, simulated GPU) that does not fit is refused (exit 2)


@dataclass(frozen=True)
class WorkloadSettings:
    """Who issues which requests: synthetic users, RAG, or a replayed trace (empty trace_paths = synthetic)."""

    num_users: int = 100
    multi_turn: bool = True
    prefix_caching: bool = True
    enable_rag: bool = False
    rag_num_docs: int = 10
    max_conversations: int = 500
    trace_paths: tuple[str, ...] = ()
    trace_format: str | None = None  # "auto" until the sources are opened
    kv_block_tokens: int = 0
    think_time: ThinkTime = field(default_factory=ThinkTime)
    trace_speedup: float = 1.0
    replay_cycles: int = 0
    validation_trace: str | None = None
    validation_trace_stats: dict | None = None


@dataclass(frozen=True)
class DriverSettings:
    """How the run is paced, scaled and stopped, and its phases before the measured window."""

    duration: float = 60.0
    generation_mode: str = "realistic"
    max_concurrent_allocs: int = 0
    max_requests: int = 0
    request_rate: float = 0.0  # > 0: open-loop Poisson arrivals per second
    enable_autoscaling: bool = False
    autoscaler_mode: str = "qos"
    target_saturation: float = 0.8
    precondition: bool = False
    precondition_size_gb: float = 0.0
    precondition_threads: int = 0
    prefill_only: bool = False
    decode_only: bool = False
    processes: int = 1  # > 1: that many worker processes on this host, each with a share of the users


@dataclass(frozen=True)
class OutputSettings:
    """Where results go and how the verdict is reported."""

    output: str = "benchmark_results.json"
    xlsx_output: str | None = None
    io_trace_log: str | None = None  # trace mode: log operations instead of doing I/O
    performance_profile: str = "latency"
    fail_exit_code: bool = False  # exit 1 on a FAIL verdict (CI pipelines); default: a completed run exits 0
    log_level: str = "INFO"
    latency_tracing: bool = False  # --enable-latency-tracing: bpftrace block-layer histograms around the window


@dataclass(frozen=True)
class SourceFlags:
    """Flags that choose the workload source; resolved into WorkloadSettings.trace_paths/trace_format."""

    trace: str | None = None
    trace_format: str = "auto"
    dataset_path: str | None = None
    use_burst_trace: bool = False
    burst_trace_path: str = "BurstGPT/data/BurstGPT_1.csv"
    think_time: str = "trace"


# Sub-config attribute of RunSettings -> its class; their field names are also RunSettings properties.
SECTIONS: dict[str, type] = {
    "storage": StorageSettings,
    "tiers": TierSettings,
    "workload": WorkloadSettings,
    "driver": DriverSettings,
    "outputs": OutputSettings,
}


@dataclass(frozen=True)
class RunSettings:
    """One run, fully resolved: the config file, the model, and one sub-config per component."""

    config: BenchConfig
    model: ModelConfig
    model_name: str = DEFAULT_MODEL
    seed: int | None = None
    config_path: str | None = None
    storage: StorageSettings = field(default_factory=StorageSettings)
    tiers: TierSettings = field(default_factory=TierSettings)
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    driver: DriverSettings = field(default_factory=DriverSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)
    mpi_rank: int | None = None  # set when several MPI ranks run (cache dir and output are per rank)
    mpi_world_size: int = 1
    merged_output: str | None = None  # several ranks: where rank 0 writes the merged results document
    argv: tuple[str, ...] = ()

    @property
    def effective_seed(self) -> int:
        """The seed every generator derives from (0 when --seed is absent, as in the MLPerf tool)."""
        return 0 if self.seed is None else self.seed


def _flat(section: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, section), name),
                    doc=f"Shortcut for `{section}.{name}`.")


for _section, _cls in SECTIONS.items():
    if _section == "storage":  # `settings.storage` is the sub-config itself; its fields stay qualified
        continue
    for _f in fields(_cls):
        setattr(RunSettings, _f.name, _flat(_section, _f.name))


def defaults() -> dict[str, Any]:
    """Every flat setting's default (sub-config fields, the source flags and the top-level ones)."""
    out: dict[str, Any] = {}
    for cls in (SourceFlags, *(c for s, c in SECTIONS.items() if s != "storage")):
        for f in fields(cls):
            if f.name not in out:
                out[f.name] = f.default_factory() if f.default is MISSING else f.default
    for f in fields(RunSettings):
        if f.default is not MISSING:
            out.setdefault(f.name, f.default)
    return out
