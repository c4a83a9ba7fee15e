"""The immutable description of one benchmark run: CLI flags merged over config.yaml, validated.

Everything downstream (workload, driver, cache, storage, reports) reads only this object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.config.schema import BenchConfig
    from kv_cache.models import ModelConfig

GENERATION_MODES = ("none", "fast", "realistic")
PERFORMANCE_PROFILES = ("latency", "throughput")
IO_MODES = ("auto", "direct", "buffered")


@dataclass(frozen=True)
class StorageSettings:
    """How the storage tier moves bytes (the I/O engine's knobs)."""

    chunk_bytes: int = 16 * 1024 * 1024  # bytes per pwritev/preadv call; bounds RAM per in-flight op
    fsync: bool = True  # fdatasync once per written entry
    io_mode: str = "auto"  # auto = O_DIRECT where the filesystem allows it, else buffered + fadvise
    io_workers: int = 0  # 0 = derived from the core count and user count


@dataclass(frozen=True)
class RunSettings:
    """One run, fully resolved. Field names follow the reference CLI flags."""

    config: BenchConfig
    model: ModelConfig
    model_name: str
    num_users: int = 100
    duration: float = 60.0
    gpu_mem_gb: float = 16.0
    num_gpus: int = 1
    tensor_parallel: int = 1
    cpu_mem_gb: float = 32.0
    cache_dir: str | None = None
    generation_mode: str = "realistic"
    performance_profile: str = "latency"
    multi_turn: bool = True
    prefix_caching: bool = True
    output: str = "benchmark_results.json"
    seed: int | None = None
    max_concurrent_allocs: int = 0
    max_requests: int = 0
    storage_capacity_gb: float = 0.0
    log_level: str = "INFO"
    config_path: str | None = None
    storage: StorageSettings = field(default_factory=StorageSettings)
    # Run modes
    request_rate: float = 0.0  # > 0: open-loop Poisson arrivals per second
    enable_autoscaling: bool = False
    autoscaler_mode: str = "qos"
    target_saturation: float = 0.8
    precondition: bool = False
    precondition_size_gb: float = 0.0
    precondition_threads: int = 0
    prefill_only: bool = False
    decode_only: bool = False
    enable_rag: bool = False
    rag_num_docs: int = 10
    validation_trace: str | None = None
    validation_trace_stats: dict | None = None
    io_trace_log: str | None = None
    xlsx_output: str | None = None
    # Trace replay (empty trace_paths = synthetic users)
    trace_paths: tuple[str, ...] = ()
    trace_format: str | None = None
    kv_block_tokens: int = 0
    think_time: object = None  # workload.replay.ThinkTime
    trace_speedup: float = 1.0
    replay_cycles: int = 0
    max_conversations: int = 500
    mpi_rank: int | None = None  # set when several MPI ranks run (cache dir and output are per rank)
    mpi_world_size: int = 1
    fail_exit_code: bool = False  # exit 1 on a FAIL verdict (CI pipelines); default: a completed run exits 0
    argv: tuple[str, ...] = ()

    @property
    def effective_seed(self) -> int:
        """The seed every generator derives from (the reference uses 0 when --seed is absent)."""
        return 0 if self.seed is None else self.seed
