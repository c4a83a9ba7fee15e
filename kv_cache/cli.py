"""Command line: the reference flags (spec 2.1) plus the storage-engine knobs, turned into RunSettings.

Errors are one line on stderr, `kv-cache: error: <message>`, and exit status 2: argparse problems
(unknown flag, bad type or choice), flag values out of range, config-file problems, an unknown model,
an unsafe --cache-dir, and flags whose feature this version does not implement yet.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import datetime
from typing import NoReturn

from kv_cache import __version__
from kv_cache.config.run import GENERATION_MODES, IO_MODES, PERFORMANCE_PROFILES, RunSettings, StorageSettings
from kv_cache.config.schema import load_config
from kv_cache.config.validation import advisories, unimplemented_features, validate_args
from kv_cache.errors import UsageError
from kv_cache.storage.tracelog import check_trace_path
from kv_cache.workload.replay import ThinkTime, open_sources, resolve_burst_paths
from kv_cache.workload.validation import load_trace_stats

__all__ = ["build_parser", "configure_logging", "main", "parse_settings"]

PROG = "kv-cache"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
MIB = 1024 * 1024

logger = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump): `kv-cache: error: <message>`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: error: {' '.join(message.split())}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """All reference flags with their reference names, types, defaults and choices, plus ours."""
    p = _Parser(
        prog=PROG,
        description="Integrated Multi-User KV Cache Benchmark (MLPerf Storage v3 compatible).",
        epilog="Sessions held (modelled GPUs, concurrency ladder, real offload I/O): kv-cache sessions --help",
    )
    add = p.add_argument
    add("--version", action="version", version=f"%(prog)s {__version__}")
    add("--log-level", type=str, default="INFO", choices=LOG_LEVELS, help="Logging level (default: INFO).")
    add("--model", type=str, default="llama3.1-8b", help="Model key (built-in or from --config).")
    add("--num-users", type=int, default=100, help="Number of concurrent users to simulate.")
    add("--duration", type=int, default=60, help="Measured phase length in seconds.")
    add("--gpu-mem-gb", type=float, default=16, help="GPU tier budget per GPU, GiB (0 = no GPU tier).")
    add("--num-gpus", type=int, default=1, help="GPUs; GPU tier capacity = num-gpus x gpu-mem-gb.")
    add(
        "--tensor-parallel",
        type=int,
        default=1,
        help="Tensor-parallel degree; each rank stores 1/TP of an entry.",
    )
    add("--cpu-mem-gb", type=float, default=32, help="CPU tier budget, GiB.")
    add(
        "--cache-dir",
        type=str,
        default=None,
        help="Directory of the storage tier (default: a fresh temp dir).",
    )
    add(
        "--generation-mode",
        type=str,
        default="realistic",
        choices=GENERATION_MODES,
        help="Simulated GPU time per generated token.",
    )
    add(
        "--performance-profile",
        type=str,
        default="latency",
        choices=PERFORMANCE_PROFILES,
        help="Which pass/fail criteria apply.",
    )
    add("--disable-multi-turn", action="store_true", help="Disable multi-turn conversation caching.")
    add("--disable-prefix-caching", action="store_true", help="Disable prefix caching.")
    add("--enable-rag", action="store_true", help="Enable the RAG workload simulation.")
    add("--rag-num-docs", type=int, default=10, help="Number of RAG documents to ingest.")
    add("--enable-autoscaling", action="store_true", help="Enable workload autoscaling.")
    add(
        "--autoscaler-mode",
        type=str,
        default="qos",
        choices=("qos", "capacity"),
        help="Autoscaling strategy.",
    )
    add("--target-saturation", type=float, default=0.8, help="Target storage saturation (0.0-1.0).")
    add("--use-burst-trace", action="store_true", help="Use BurstGPT trace(s) for the workload.")
    add(
        "--burst-trace-path",
        type=str,
        default="BurstGPT/data/BurstGPT_1.csv",
        help="BurstGPT CSV file, directory of CSVs, or glob.",
    )
    add("--validation-trace", type=str, default=None, help="Real-world trace file for validation.")
    add("--dataset-path", type=str, default=None, help="ShareGPT dataset JSON file.")
    add("--max-conversations", type=int, default=500, help="Maximum conversations loaded from ShareGPT.")
    add(
        "--output",
        type=str,
        default=f"benchmark_results_{datetime.now().strftime('%Y%m%d_%H%M%S')}.json",
        help="Result JSON path.",
    )
    add("--seed", type=int, default=None, help="Seed for every random generator.")
    add("--max-concurrent-allocs", type=int, default=0, help="Limit concurrent allocations (0 = unlimited).")
    add("--request-rate", type=float, default=0, help="Target request arrival rate, req/s (0 = unlimited).")
    add("--max-requests", type=int, default=0, help="Stop after N completed requests (0 = duration only).")
    add("--xlsx-output", type=str, default=None, help="Optional XLSX (or CSV) summary path.")
    add("--config", type=str, default=None, help="YAML configuration file.")
    add("--storage-capacity-gb", type=float, default=0, help="Storage tier capacity, GiB (0 = auto).")
    add("--precondition", action="store_true", help="Fill the device before measuring.")
    add(
        "--precondition-size-gb",
        type=float,
        default=0,
        help="Preconditioning volume, GiB (0 = 2 x capacity).",
    )
    add("--precondition-threads", type=int, default=0, help="Preconditioning writer threads (0 = CPU count).")
    add("--trace-speedup", type=float, default=1.0, help="BurstGPT inter-arrival divisor (0 = no sleeping).")
    add("--replay-cycles", type=int, default=0, help="Passes over the trace/dataset (0 = unlimited).")
    add("--prefill-only", action="store_true", help="Disaggregated prefill node: writes only.")
    add("--decode-only", action="store_true", help="Disaggregated decode node: reads only.")
    add(
        "--io-trace-log",
        type=str,
        default=None,
        help="Trace mode: log operations to CSV instead of doing I/O.",
    )
    add("--enable-latency-tracing", action="store_true", help="bpftrace device latency tracing (needs sudo).")
    add("--fail-exit-code", action="store_true",
        help="Exit 1 when the performance profile says FAIL (default: a completed run exits 0 whatever "
             "its verdict, as the mlpstorage harness reads results only after exit 0).")

    tr = p.add_argument_group("trace replay and KV layout")
    tr.add_argument("--trace", type=str, default=None,
                    help="Replay a trace: a file, or a directory of WEKA agentic-coding JSON files.")
    tr.add_argument("--trace-format", default="auto",
                    choices=("auto", "mooncake", "aiperf", "weka", "bailian", "burstgpt", "sharegpt"),
                    help="Format of --trace (default: detected).")
    tr.add_argument("--kv-block-tokens", type=int, default=0,
                    help="0 = one KV entry per request (reference layout); N > 0 = entries of N tokens keyed "
                         "by the prefix hash chain (loads for cached blocks, stores for the rest).")
    tr.add_argument("--think-time", type=str, default="trace",
                    help="Pause between a session's turns: trace (recorded), fixed:S or uniform:A:B seconds.")

    io = p.add_argument_group("storage engine (override the config 'storage' section)")
    io.add_argument("--io-chunk-mb", type=int, default=None, help="MiB per pwritev/preadv call.")
    io.add_argument("--io-workers", type=int, default=None, help="I/O worker threads (0 = auto).")
    io.add_argument(
        "--io-mode",
        type=str,
        default=None,
        choices=IO_MODES,
        help="auto = O_DIRECT where possible; direct = O_DIRECT or fail; buffered = page cache.",
    )
    io.add_argument(
        "--no-fsync", action="store_true", default=None, help="Skip the fdatasync per written entry."
    )
    return p


def parse_settings(argv: list[str] | None = None) -> RunSettings:
    """Parse, load the config, validate, resolve the model: the run's immutable settings.

    Raises UsageError (one line) for anything wrong; argparse problems exit 2 after one stderr line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.prefill_only and args.decode_only:
        raise UsageError("--prefill-only and --decode-only are mutually exclusive")

    config = load_config(args.config)
    errors = validate_args(args, config.validation_limits)
    errors += unimplemented_features(args)
    model = config.model_configs.get(args.model)
    if model is None:
        errors.append(f"unknown model '{args.model}' (available: {', '.join(sorted(config.model_configs))})")
    if errors:
        raise UsageError("; ".join(errors))

    storage = config.storage
    settings_storage = StorageSettings(
        chunk_bytes=(args.io_chunk_mb if args.io_chunk_mb is not None else storage.chunk_size_mb) * MIB,
        fsync=False if args.no_fsync else storage.fsync,
        io_mode=args.io_mode if args.io_mode is not None else storage.io_mode,
        io_workers=args.io_workers if args.io_workers is not None else storage.io_workers,
    )
    cache_dir = os.path.abspath(os.path.expanduser(args.cache_dir)) if args.cache_dir is not None else None
    output = args.output
    rank, world = mpi_rank()
    if world > 1:  # several ranks were given the same --output and --cache-dir: keep them apart
        if cache_dir is not None:
            cache_dir = os.path.join(cache_dir, f"rank{rank}")
        stem, dot, ext = output.rpartition(".")
        output = f"{stem}_rank{rank}.{ext}" if dot and "/" not in ext else f"{output}_rank{rank}"
    if args.io_trace_log:
        check_trace_path(args.io_trace_log)
    trace_stats = load_trace_stats(args.validation_trace) if args.validation_trace else None
    trace_paths, trace_format = trace_source(args)
    return RunSettings(
        config=config,
        model=model,
        model_name=args.model,
        num_users=args.num_users,
        duration=float(args.duration),
        gpu_mem_gb=float(args.gpu_mem_gb),
        num_gpus=args.num_gpus,
        tensor_parallel=args.tensor_parallel,
        cpu_mem_gb=float(args.cpu_mem_gb),
        cache_dir=cache_dir,
        generation_mode=args.generation_mode,
        performance_profile=args.performance_profile,
        multi_turn=not args.disable_multi_turn,
        prefix_caching=not args.disable_prefix_caching,
        output=output,
        seed=args.seed,
        max_concurrent_allocs=args.max_concurrent_allocs,
        max_requests=args.max_requests,
        storage_capacity_gb=float(args.storage_capacity_gb),
        log_level=args.log_level,
        config_path=args.config,
        storage=settings_storage,
        request_rate=float(args.request_rate),
        enable_autoscaling=args.enable_autoscaling,
        autoscaler_mode=args.autoscaler_mode,
        target_saturation=float(args.target_saturation),
        precondition=args.precondition,
        precondition_size_gb=float(args.precondition_size_gb),
        precondition_threads=args.precondition_threads,
        prefill_only=args.prefill_only,
        decode_only=args.decode_only,
        enable_rag=args.enable_rag,
        rag_num_docs=args.rag_num_docs,
        validation_trace=args.validation_trace,
        validation_trace_stats=trace_stats,
        io_trace_log=args.io_trace_log,
        xlsx_output=args.xlsx_output,
        trace_paths=trace_paths,
        trace_format=trace_format,
        kv_block_tokens=args.kv_block_tokens,
        think_time=ThinkTime.parse(args.think_time),
        trace_speedup=float(args.trace_speedup),
        replay_cycles=args.replay_cycles,
        max_conversations=args.max_conversations,
        mpi_rank=rank if world > 1 else None,
        mpi_world_size=world,
        fail_exit_code=args.fail_exit_code,
        argv=tuple(argv),
    )


def trace_source(args: argparse.Namespace) -> tuple[tuple[str, ...], str | None]:
    """Which trace (if any) drives the run; every file is opened and checked now, before the run."""
    chosen = [flag for flag, on in (("--trace", args.trace), ("--dataset-path", args.dataset_path),
                                    ("--use-burst-trace", args.use_burst_trace)) if on]
    if len(chosen) > 1:
        raise UsageError(f"choose one workload source, not {' and '.join(chosen)}")
    if args.trace:
        paths, fmt = (args.trace,), args.trace_format
    elif args.dataset_path:
        paths, fmt = (args.dataset_path,), "sharegpt"
    elif args.use_burst_trace:
        paths, fmt = tuple(resolve_burst_paths(args.burst_trace_path)), "burstgpt"
    else:
        if args.kv_block_tokens < 0:
            raise UsageError(f"--kv-block-tokens cannot be negative, got {args.kv_block_tokens}")
        return (), None
    if args.kv_block_tokens < 0:
        raise UsageError(f"--kv-block-tokens cannot be negative, got {args.kv_block_tokens}")
    if args.enable_autoscaling:
        raise UsageError("--enable-autoscaling scales synthetic users; it cannot be combined with a trace")
    sources = open_sources(list(paths), fmt, 0, args.max_conversations if fmt == "sharegpt" else 0)
    return paths, sources[0].format


def mpi_rank() -> tuple[int, int]:
    """(rank, world size) from the MPI launcher's environment (Open MPI or PMI); (0, 1) otherwise."""
    env = os.environ
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank_var in env:
            try:
                return int(env[rank_var]), int(env.get(size_var, "1"))
            except ValueError:
                raise UsageError(f"{rank_var}={env[rank_var]!r} is not an integer") from None
    return 0, 1


def configure_logging(level: str) -> None:
    """Reference log format on stderr; the level applies to the `kv_cache` loggers."""
    numeric = getattr(logging, level)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, datefmt=LOG_DATEFMT)
    logging.getLogger("kv_cache").setLevel(numeric)


def _usage_error(message: object) -> int:
    sys.stderr.write(f"{PROG}: error: {' '.join(str(message).split())}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kv-cache`, `mlperf-kv-cache` and kv-cache.py; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sessions"]:  # the session-aware capacity mode has its own options
        from kv_cache.sessions_cli import main as sessions_main

        try:
            return sessions_main(args[1:])
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    argv = args
    try:
        try:
            settings = parse_settings(argv)
        except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2, already printed)
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except UsageError as exc:
            return _usage_error(exc)
        configure_logging(settings.log_level)
        if settings.config_path:
            logger.info("Loaded configuration from %s", settings.config_path)
        for message in advisories(settings):
            logger.warning(message)
        from kv_cache.app import run_benchmark

        return run_benchmark(settings)
    except UsageError as exc:
        return _usage_error(exc)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
