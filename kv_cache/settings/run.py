"""The immutable description of one benchmark run: CLI flags merged over config.yaml, validated.

A tree of frozen dataclasses, one per component, so that each component can be handed only its own
part: `storage` (the I/O engine), `tiers` (capacities and where the storage tier lives), `workload`
(who issues what), `driver` (how the run is paced and stopped) and `outputs` (where results go). Every
default is written here once; the command-line parser takes its defaults from these classes.

Readers reach a setting through its section (`settings.workload.num_users`, `settings.tiers.cpu_mem_gb`);
only the run's identity (`model_name`, `seed`, `config_path`) sits on RunSettings itself. The flat names
of the MLPerf-compatible flags remain the keys of `defaults()` and of `rank_totals`
(config/ranks.py `setting_value` reads a setting by its flat name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from kv_cache.settings.fields import OFFSET, SPLIT, Flag, FrozenMap, setting
from kv_cache.settings.pacing import ThinkTime
from kv_cache.settings.sections import IO_MODES, GenerationTiming, StorageConfig
from kv_cache.settings.shaping import BANDWIDTH_HELP, LATENCY_HELP

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.schema import BenchConfig
    from kv_cache.specs.models import GPUSpec, ModelConfig

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "GENERATION_MODES",
    "GPU_TIERS",
    "IO_MODES",
    "LOG_LEVELS",
    "PERFORMANCE_PROFILES",
    "REMOTE_GROUP",
    "RUN_FLAG_TREE",
    "SECTIONS",
    "DriverSettings",
    "OutputSettings",
    "RemoteTierSettings",
    "RunSettings",
    "SourceFlags",
    "StorageSettings",
    "TierSettings",
    "WorkloadSettings",
    "defaults",
]

GENERATION_MODES = tuple(f.name for f in fields(GenerationTiming))  # each mode is a key of config generation_timing
PERFORMANCE_PROFILES = ("latency", "throughput")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
GPU_TIERS = ("auto", "real", "simulated", "off")
DEFAULT_MODEL = "llama3.1-8b"
DEFAULT_GPU = "h100"  # the GPU spec of the simulated GPU tier (run) and of the modelled GPUs (sessions)
_STORAGE = StorageConfig()  # the config file's storage section is the I/O engine's default
_ENGINE = "storage engine (override the config 'storage' section)"  # --help group of the --io-* flags
_TRACE = "trace replay and KV layout"  # --help group of the trace flags
REMOTE_GROUP = "remote storage tiers (S3, Redis/Valkey)"  # --help group of the remote-tier flags


@dataclass(frozen=True)
class StorageSettings:
    """How the storage tier moves bytes (the I/O engine's knobs). Their flags default to None: as the
    config file's storage section says (cli/resolve.py lays the flags given over it)."""

    chunk_bytes: int = setting(_STORAGE.chunk_size_mb << 20, flag=Flag(
        "--io-chunk-mb", type=int, default=None, group=_ENGINE,
        help="MiB per pwritev/preadv call."))  # bytes per pwritev/preadv call; bounds RAM per op
    io_workers: int = setting(_STORAGE.io_workers, flag=Flag(
        "--io-workers", type=int, default=None, group=_ENGINE, help="I/O worker threads (0 = auto)."))
    io_mode: str = setting(_STORAGE.io_mode, flag=Flag(
        "--io-mode", type=str, choices=IO_MODES, default=None, group=_ENGINE,
        help="auto = O_DIRECT where possible; direct = O_DIRECT or fail; buffered = page cache."))
    fsync: bool = setting(_STORAGE.fsync, flag=Flag(
        "--no-fsync", action="store_true", default=None, group=_ENGINE,
        help="Skip the fdatasync per written entry."))  # fdatasync once per written entry
    io_retries: int = _STORAGE.io_retries  # retries after a transient error (EIO, ENOTCONN, EAGAIN)
    max_storage_errors: int = _STORAGE.max_storage_errors  # tolerated storage errors; one more stops the run
    remote_grace_s: float = setting(_STORAGE.remote_grace_s, flag=Flag(
        "--remote-grace-s", type=float, default=None, group=REMOTE_GROUP,
        help="Seconds a remote tier's operation may still wait on its server after the run's stop (the "
             "window's end); then it is abandoned as 'the server stopped answering' and the run ends with its "
             "results (exit 3). Config: storage.remote_grace_s (default 10)."))
    remote_failover_s: float = setting(_STORAGE.remote_failover_s, flag=Flag(
        "--remote-failover-s", type=float, default=None, group=REMOTE_GROUP,
        help="Seconds a lost remote server is retried (exponential backoff with jitter, counted) before the "
             "run stops (exit 3): a Sentinel or cluster failover is ridden through. Config: "
             "storage.remote_failover_s (default 30)."))
    verify: bool = setting(False, flag=Flag(
        "--verify", action="store_true", group=_ENGINE,
        help="Compare every byte of every block read with the payload written (mismatches counted; any makes "
             "the integrity verdict invalid)."))
    device_limit_gbs: float = setting(0.0, flag=Flag(
        "--device-limit-gbs", type=float, metavar="GB/s", group=_ENGINE,
        help="The storage device's (or its link's) rated bandwidth, decimal GB/s: a storage bandwidth above it "
             "makes the integrity verdict invalid (default: the PCIe link from sysfs where known)."))
    # A tier as slow as the user's (storage/shaped.py): an offload tier's real reads and writes held to a rate
    # per direction (a token bucket each; a total the ranks share) and an added latency per operation. The two
    # flags are parsed by settings/shaping.py: a bare number is the storage tier's, TIER=VALUE,... names tiers.
    tier_bandwidth_gbps: float = setting(0.0, split=SPLIT, flag=Flag(
        "--tier-bandwidth", metavar="GB/s|TIER=GB/s,...", group=_ENGINE, help=BANDWIDTH_HELP))  # storage tier
    tier_latency_ms: float = setting(0.0, flag=Flag(
        "--tier-latency", metavar="ms|TIER=ms,...", group=_ENGINE, help=LATENCY_HELP))  # storage tier
    cpu_tier_bandwidth_gbps: float = setting(0.0, split=SPLIT)  # the CPU (DRAM) tier's: --tier-bandwidth cpu=...
    cpu_tier_latency_ms: float = 0.0  # --tier-latency cpu=...

    def tier_shaping(self) -> dict[str, tuple[float, float]]:
        """{tier: (GB/s per direction, ms per operation)} of every shaped offload tier, fastest first."""
        out = {"cpu": (self.cpu_tier_bandwidth_gbps, self.cpu_tier_latency_ms),
               "storage": (self.tier_bandwidth_gbps, self.tier_latency_ms)}
        return {tier: v for tier, v in out.items() if v[0] > 0 or v[1] > 0}


def _builtin_gpu(key: str) -> GPUSpec:
    from kv_cache.specs.models import GPU_SPECS  # noqa: PLC0415  (models is the bottom layer; kept lazy as the import above)

    return GPU_SPECS[key]


@dataclass(frozen=True)
class RemoteTierSettings:
    """Which backend holds the storage tier, and the backends' own options (settings.tiers.remote; each
    declared whole, flag and default, on its backend's registry entry, storage/backends: `Option`); both
    `run` and `sessions` take these flags. An option reads as an attribute, `tiers.remote.s3_bucket`: its
    value where one other than its default was given, else its default (`option_defaults`; `option_rules`:
    the rules across ranks other than COPY, settings/ranks.py; the backends' registry fills both as it
    registers them: settings sit below storage)."""

    storage_backend: str = setting("file", flag=Flag(
        "--storage-backend", type=str, registry="storage_backends", group=REMOTE_GROUP,
        help="Where the storage tier lives:"))
    options: FrozenMap[str, Any] = field(default_factory=FrozenMap)  # option name -> value given (not its default)
    option_defaults: ClassVar[dict[str, Any]] = {}
    option_rules: ClassVar[dict[str, str]] = {}

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options") or {}
        if name in options:
            return options[name]
        if name in self.option_defaults:
            return self.option_defaults[name]
        raise AttributeError(f"{type(self).__name__!r} has no setting {name!r}")


@dataclass(frozen=True)
class TierSettings:
    """The cache tiers' budgets and where the storage tier lives."""

    gpu_mem_gb: float = setting(16.0, split=SPLIT, flag=Flag(
        "--gpu-mem-gb", type=float, help="GPU tier budget per GPU, GiB (0 = no GPU tier)."))  # per GPU
    num_gpus: int = setting(1, flag=Flag(
        "--num-gpus", type=int,
        help="GPUs, a multiple of --tensor-parallel; the GPU tier holds num-gpus / tensor-parallel x gpu-mem-gb "
             "of entries."))
    tensor_parallel: int = setting(1, flag=Flag(
        "--tensor-parallel", type=int,
        help="Tensor-parallel degree, GPUs per group: an entry is 1/TP of the KV, held on each GPU of one group."))
    gpu_tier: str = setting("auto", flag=Flag(
        "--gpu-tier", type=str, choices=GPU_TIERS,
        help="GPU tier when --gpu-mem-gb > 0: real (CUDA HBM via torch or cupy), simulated (host RAM, modelled "
             "copy times), off; auto = real where CUDA is present, else simulated."))
    gpu_type: str = setting(DEFAULT_GPU, flag=Flag(
        "--gpu-type", type=str, registry="gpu_specs",
        help="GPU spec whose host link and HBM bandwidth model the simulated GPU tier."))  # the config's gpus key whose figures model a simulated tier
    gds: bool = setting(False, flag=Flag(
        "--gds", action="store_true",
        help="GPUDirect Storage: storage-tier reads land in GPU memory through kvikio (needs the real GPU "
             "tier)."))
    cpu_mem_gb: float = setting(32.0, split=SPLIT, flag=Flag("--cpu-mem-gb", type=float, help="CPU tier budget, GiB."))
    strict_memory: bool = setting(False, flag=Flag(
        "--strict-memory", action="store_true",
        help="Refuse (exit 2) a size larger than the room there is, instead of clamping it with a warning and "
             "a note: --cpu-mem-gb or --gpu-mem-gb beyond the memory this process may use (or a GPU has free), "
             "--storage-capacity-gb beyond the free space, and I/O worker buffers beyond the memory budget."))  # a host-RAM tier that does not fit is refused
    cache_dir: str | None = setting(None, flag=Flag(
        "--cache-dir", type=str,
        help="Directory of the storage tier (default: a fresh temp dir)."))  # None = a fresh temporary directory
    gpu_spec: GPUSpec | None = field(default_factory=lambda: _builtin_gpu(DEFAULT_GPU))  # gpu_type's, from the config
    storage_capacity_gb: float = setting(0.0, split=SPLIT, flag=Flag(
        "--storage-capacity-gb", type=float,
        help="Storage tier capacity, GiB (0 = auto)."))  # 0 = 90 % of the free space less the largest entry
    host_ranks: int = 1  # ranks of this run on this host: the host's memory budget is divided between them
    local_rank: int = 0  # this rank's index among the ranks on this host: it takes GPUs local_rank x num_gpus ...
    local_rank_from: str = ""  # where local_rank came from (OMPI_COMM_WORLD_LOCAL_RANK, the --processes index)
    remote: RemoteTierSettings = field(default_factory=lambda: RemoteTierSettings())  # --storage-backend s3 | redis


@dataclass(frozen=True)
class WorkloadSettings:
    """Who issues which requests: synthetic users, RAG, or a replayed trace (empty trace_paths = synthetic)."""

    num_users: int = setting(100, split=SPLIT, flag=Flag(
        "--num-users", type=int, help="Number of concurrent users to simulate."))
    multi_turn: bool = setting(True, flag=Flag(
        "--disable-multi-turn", action="store_true", invert=True, help="Disable multi-turn conversation caching."))
    prefix_caching: bool = setting(True, flag=Flag(
        "--disable-prefix-caching", action="store_true", invert=True, help="Disable prefix caching."))
    enable_rag: bool = setting(False, flag=Flag(
        "--enable-rag", action="store_true", help="Enable the RAG workload simulation."))
    rag_num_docs: int = setting(10, split=SPLIT, flag=Flag(
        "--rag-num-docs", type=int, help="Number of RAG documents to ingest."))
    max_conversations: int = setting(500, flag=Flag(
        "--max-conversations", type=int, help="Maximum conversations loaded from ShareGPT."))
    validation_trace: str | None = setting(None, flag=Flag(
        "--validation-trace", type=str, help="Real-world trace file for validation."))
    trace_speedup: float = setting(1.0, flag=Flag(
        "--trace-speedup", type=float, help="BurstGPT inter-arrival divisor (0 = no sleeping)."))
    replay_cycles: int = setting(0, flag=Flag(
        "--replay-cycles", type=int, help="Passes over the trace/dataset (0 = unlimited)."))
    kv_block_tokens: int = setting(0, flag=Flag(
        "--kv-block-tokens", type=int, group=_TRACE,
        help="0 = one KV entry per request (reference layout); N > 0 = entries of N tokens keyed "
             "by the prefix hash chain (loads for cached blocks, stores for the rest)."))
    trace_paths: tuple[str, ...] = ()
    trace_format: str | None = None  # "auto" until the sources are opened
    think_time: ThinkTime = field(default_factory=ThinkTime)  # from SourceFlags.think_time
    validation_trace_stats: dict | None = None


# The MLPerf tool's wait before and after each run (the Rules' settle time): mlperf_wrapper.py's default of
# --start-delay and --end-delay; the plain tool waits 0.
MLPERF_SETTLE_S = 90.0


@dataclass(frozen=True)
class DriverSettings:
    """How the run is paced, scaled and stopped, and its phases before the measured window."""

    duration: float = setting(60.0, flag=Flag("--duration", type=int, help="Measured phase length in seconds."))
    generation_mode: str = setting("realistic", flag=Flag(
        "--generation-mode", type=str, choices=GENERATION_MODES, help="Simulated GPU time per generated token."))
    enable_autoscaling: bool = setting(False, flag=Flag(
        "--enable-autoscaling", action="store_true", help="Enable workload autoscaling."))
    autoscaler_mode: str = setting("qos", flag=Flag(
        "--autoscaler-mode", type=str, registry="load_shapes", help="Autoscaling strategy."))
    target_saturation: float = setting(0.8, flag=Flag(
        "--target-saturation", type=float, help="Target storage saturation (0.0-1.0)."))
    max_concurrent_allocs: int = setting(0, flag=Flag(
        "--max-concurrent-allocs", type=int, help="Limit concurrent allocations (0 = unlimited)."))
    request_rate: float = setting(0.0, split=SPLIT, flag=Flag(
        "--request-rate", type=float,
        help="Target request arrival rate, req/s (0 = unlimited)."))  # > 0: open-loop Poisson arrivals per second
    max_requests: int = setting(0, split=SPLIT, flag=Flag(
        "--max-requests", type=int, help="Stop after N completed requests (0 = duration only)."))
    precondition: bool = setting(False, flag=Flag(
        "--precondition", action="store_true", help="Fill the device before measuring."))
    precondition_size_gb: float = setting(0.0, split=SPLIT, flag=Flag(
        "--precondition-size-gb", type=float, help="Preconditioning volume, GiB (0 = 2 x capacity)."))
    precondition_threads: int = setting(0, flag=Flag(
        "--precondition-threads", type=int, help="Preconditioning writer threads (0 = CPU count)."))
    prefill_only: bool = setting(False, flag=Flag(
        "--prefill-only", action="store_true", help="Disaggregated prefill node: writes only."))
    decode_only: bool = setting(False, flag=Flag(
        "--decode-only", action="store_true", help="Disaggregated decode node: reads only."))
    start_delay: float = setting(0.0, flag=Flag(
        "--start-delay", type=float,
        help="Seconds to wait before the run, the Rules' settle time (0 = none; mlperf_wrapper.py: "
             f"{MLPERF_SETTLE_S:g}). Ctrl-C during the wait ends cleanly, nothing run."))
    end_delay: float = setting(0.0, flag=Flag(
        "--end-delay", type=float,
        help="Seconds to wait after the results are written (0 = none; mlperf_wrapper.py: "
             f"{MLPERF_SETTLE_S:g}). Ctrl-C during the wait keeps the run's results and exit status."))
    malloc_trim_interval: float = setting(60.0, flag=Flag(
        "--malloc-trim-interval", type=float,
        help="Every S seconds of the measured window, give malloc's free space back to the kernel "
             "(glibc's malloc_trim, on a thread of its own; reported in measurement.malloc), so that a long "
             "run's RSS does not creep (0 = never; default 60; skipped where malloc is not glibc's)."))
    processes: int = setting(1, flag=Flag(
        "--processes", type=int,
        help="Run N worker processes on this host, one common window, one merged result at --output "
             "(X_rank<r>.json beside it). The users, --request-rate, the tier sizes, --max-requests, "
             "--precondition-size-gb and --rag-num-docs are totals the processes share; seed + rank each."))


@dataclass(frozen=True)
class OutputSettings:
    """Where results go and how the verdict is reported."""

    log_level: str = setting("INFO", flag=Flag(
        "--log-level", type=str, choices=LOG_LEVELS, help="Logging level (default: INFO)."))
    performance_profile: str = setting("latency", flag=Flag(
        "--performance-profile", type=str, choices=PERFORMANCE_PROFILES, help="Which pass/fail criteria apply."))
    output: str = setting("benchmark_results.json", flag=Flag(
        "--output", type=str, help="Result JSON path."))  # the parser adds the start time to the name
    xlsx_output: str | None = setting(None, flag=Flag(
        "--xlsx-output", type=str, help="Optional XLSX (or CSV) summary path."))
    io_trace_log: str | None = setting(None, flag=Flag(
        "--io-trace-log", type=str,
        help="Trace mode: log operations to CSV instead of doing I/O."))  # log operations instead of doing I/O
    latency_tracing: bool = setting(False, flag=Flag(
        "--enable-latency-tracing", action="store_true",
        help="bpftrace block-layer and syscall latency histograms of this run (needs root and bpftrace; "
             "without them the run goes on and says why)."))
    partial_results_interval: float = setting(10.0, flag=Flag(
        "--partial-results-interval", type=float,
        help="Every S seconds of the measured window (at its 1-second ticks), rewrite the results file (each "
             "rank's) with the window so far, marked INCOMPLETE, so that a process killed before its end "
             "(SIGKILL, out of memory) leaves what it measured; the final document replaces it (0 = only at "
             "the end; default 10)."))
    fail_exit_code: bool = setting(False, flag=Flag(
        "--fail-exit-code", action="store_true",
        help="Exit 1 when the performance profile says FAIL (default: a completed run exits 0 whatever "
             "its verdict, as the mlpstorage harness reads results only after exit 0)."))


@dataclass(frozen=True)
class SourceFlags:
    """Flags that choose the workload source; resolved into WorkloadSettings.trace_paths/trace_format."""

    trace: str | None = setting(None, flag=Flag(
        "--trace", type=str, group=_TRACE,
        help="Replay a trace: a file, or a directory of WEKA agentic-coding JSON files."))
    trace_format: str = setting("auto", flag=Flag(
        "--trace-format", registry="trace_formats", group=_TRACE, help="Format of --trace (default: detected)."))
    dataset_path: str | None = setting(None, flag=Flag(
        "--dataset-path", type=str, help="ShareGPT dataset JSON file."))
    use_burst_trace: bool = setting(False, flag=Flag(
        "--use-burst-trace", action="store_true", help="Use BurstGPT trace(s) for the workload."))
    burst_trace_path: str = setting("BurstGPT/data/BurstGPT_1.csv", flag=Flag(
        "--burst-trace-path", type=str, help="BurstGPT CSV file, directory of CSVs, or glob."))
    think_time: str = setting("trace", flag=Flag(
        "--think-time", type=str, group=_TRACE,
        help="Pause between a session's turns: trace (recorded), fixed:S or uniform:A:B seconds."))


# Sub-config attribute of RunSettings -> its class (a flat setting name is a field name of one of them).
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
    model_name: str = setting(DEFAULT_MODEL, flag=Flag("--model", type=str, help="Model key (built-in or from --config)."))
    seed: int | None = setting(None, split=OFFSET, flag=Flag("--seed", type=int, help="Seed for every random generator."))
    config_path: str | None = setting(None, flag=Flag("--config", type=str, help="YAML configuration file."))
    storage: StorageSettings = field(default_factory=StorageSettings)
    tiers: TierSettings = field(default_factory=TierSettings)
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    driver: DriverSettings = field(default_factory=DriverSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)
    mpi_rank: int | None = None  # set when several MPI ranks run (cache dir and output are per rank)
    mpi_world_size: int = 1
    merged_output: str | None = None  # several ranks: where rank 0 writes the merged results document
    argv: tuple[str, ...] = ()
    # Several ranks: the totals of the SPLIT settings (and the OFFSET base) this rank's values are a share
    # of, by flat name; None for a single process. flags_per_rank: the flags were each rank's own values
    # (mlperf_wrapper.py, the Rules' semantics), so nothing was divided.
    rank_totals: Mapping[str, Any] | None = None
    flags_per_rank: bool = False

    @property
    def effective_seed(self) -> int:
        """The seed every generator derives from (0 when --seed is absent, as in the MLPerf tool)."""
        return 0 if self.seed is None else self.seed


# The settings classes whose flagged fields make the `run` command, in --help order (cli/flags.py).
RUN_FLAG_TREE: tuple[type, ...] = (RunSettings, WorkloadSettings, DriverSettings, TierSettings, OutputSettings,
                                   SourceFlags, StorageSettings, RemoteTierSettings)


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


# the userinfo's password up to the last "@" of the authority: redis-py (urlparse) takes an unencoded "@" in it
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s/?#]+@", re.IGNORECASE)


# a secret in a URL's query (redis-py takes ?password=...; a presigned S3 URL carries a signature and a token)
_QUERY_SECRET = re.compile(r"([?&;](?:password|passwd|pass|pwd|secret|token|auth|access_key|secret_key|ssl_password|"
                           r"x-amz-signature|x-amz-credential|x-amz-security-token|sig|signature)=)[^&;#\s]+",
                           re.IGNORECASE)


def redacted(text: str) -> str:
    """`text` with every credential a URL can carry replaced by ``***``: the password of its userinfo
    (``redis://:PASSWORD@host``, ``redis://user:PASSWORD@host``) and the value of a secret query parameter
    (``?password=...``, ``&token=...``, a presigned URL's signature)."""
    return _QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def redacted_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """The command line as results record it, every argument redacted (a URL's password in its userinfo
    or its query replaced by ``***``), so a results file shared or submitted carries none. Credentials
    given in the environment or the AWS config files are never written (the remote tiers record the
    endpoint, the scheme and the CA file, not the keys)."""
    return [redacted(a) for a in argv]
