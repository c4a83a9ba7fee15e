"""The flags of each sub-command: names, types, choices and help. Their defaults are not written here:
they come from the settings dataclasses (RunSettings' sub-configs, SessionsFlags), where they live once.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from datetime import datetime

from kv_cache import __version__
from kv_cache.cli.sessions import SessionsFlags, timestamped
from kv_cache.config.run import (
    DEFAULT_MODEL,
    GENERATION_MODES,
    GPU_TIERS,
    IO_MODES,
    LOG_LEVELS,
    PERFORMANCE_PROFILES,
    defaults,
)
from kv_cache.driver import shapes
from kv_cache.driver.ladder import TIER_CONFIGS
from kv_cache.engine.replica import LOAD_POLICIES
from kv_cache.specs import gpu_specs
from kv_cache.workload.traces import formats as trace_formats

__all__ = ["add_run_flags", "add_sessions_flags", "run_flag_defaults", "sessions_flag_defaults"]


def _gpu_keys() -> str:
    """The built-in GPU spec keys (kv_cache/specs/gpus.yaml), for the help."""
    return ", ".join(gpu_specs())


def run_flag_defaults(now: datetime | None = None) -> dict[str, object]:
    """Default of every `run` flag (by argparse dest), derived from the settings' defaults."""
    d = defaults()
    return {
        **{k: d[k] for k in d if k not in ("multi_turn", "prefix_caching", "output", "config_path", "gpu_spec")},
        "model": DEFAULT_MODEL,
        "config": d["config_path"],
        "disable_multi_turn": not d["multi_turn"],
        "disable_prefix_caching": not d["prefix_caching"],
        "output": timestamped(d["output"], now or datetime.now()),
        # None = as the config file's storage section says
        "io_chunk_mb": None, "io_workers": None, "io_mode": None, "no_fsync": None,
        "enable_latency_tracing": False,
        "verify": False,
    }


def sessions_flag_defaults(now: datetime | None = None) -> dict[str, object]:
    """Default of every `sessions` flag (by argparse dest), from SessionsFlags."""
    out = {f.name: f.default for f in fields(SessionsFlags)}
    out["output"] = timestamped(out["output"], now or datetime.now())
    return out


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Every MLPerf kv-cache flag with its name, type and choices (drop-in compatible), plus ours."""
    d = run_flag_defaults()
    add = p.add_argument
    add("--version", action="version", version=f"kv-cache {__version__}")
    add("--log-level", type=str, default=d["log_level"], choices=LOG_LEVELS, help="Logging level (default: INFO).")
    add("--model", type=str, default=d["model"], help="Model key (built-in or from --config).")
    add("--num-users", type=int, default=d["num_users"], help="Number of concurrent users to simulate.")
    add("--duration", type=int, default=d["duration"], help="Measured phase length in seconds.")
    _add_tier_flags(p, d)
    add("--cache-dir", type=str, default=d["cache_dir"],
        help="Directory of the storage tier (default: a fresh temp dir).")
    add("--generation-mode", type=str, default=d["generation_mode"], choices=GENERATION_MODES,
        help="Simulated GPU time per generated token.")
    add("--performance-profile", type=str, default=d["performance_profile"], choices=PERFORMANCE_PROFILES,
        help="Which pass/fail criteria apply.")
    add("--disable-multi-turn", action="store_true", default=d["disable_multi_turn"],
        help="Disable multi-turn conversation caching.")
    add("--disable-prefix-caching", action="store_true", default=d["disable_prefix_caching"],
        help="Disable prefix caching.")
    add("--enable-rag", action="store_true", default=d["enable_rag"], help="Enable the RAG workload simulation.")
    add("--rag-num-docs", type=int, default=d["rag_num_docs"], help="Number of RAG documents to ingest.")
    add("--enable-autoscaling", action="store_true", default=d["enable_autoscaling"],
        help="Enable workload autoscaling.")
    add("--autoscaler-mode", type=str, default=d["autoscaler_mode"], choices=shapes.autoscaler_modes(),
        help="Autoscaling strategy: " + "; ".join(f"{s.name}: {s.summary}" for s in shapes.all_shapes()
                                                  if s.autoscaling) + ".")
    add("--target-saturation", type=float, default=d["target_saturation"],
        help="Target storage saturation (0.0-1.0).")
    add("--use-burst-trace", action="store_true", default=d["use_burst_trace"],
        help="Use BurstGPT trace(s) for the workload.")
    add("--burst-trace-path", type=str, default=d["burst_trace_path"],
        help="BurstGPT CSV file, directory of CSVs, or glob.")
    add("--validation-trace", type=str, default=d["validation_trace"], help="Real-world trace file for validation.")
    add("--dataset-path", type=str, default=d["dataset_path"], help="ShareGPT dataset JSON file.")
    add("--max-conversations", type=int, default=d["max_conversations"],
        help="Maximum conversations loaded from ShareGPT.")
    add("--output", type=str, default=d["output"], help="Result JSON path.")
    add("--seed", type=int, default=d["seed"], help="Seed for every random generator.")
    add("--max-concurrent-allocs", type=int, default=d["max_concurrent_allocs"],
        help="Limit concurrent allocations (0 = unlimited).")
    add("--request-rate", type=float, default=d["request_rate"],
        help="Target request arrival rate, req/s (0 = unlimited).")
    add("--max-requests", type=int, default=d["max_requests"],
        help="Stop after N completed requests (0 = duration only).")
    add("--xlsx-output", type=str, default=d["xlsx_output"], help="Optional XLSX (or CSV) summary path.")
    add("--config", type=str, default=d["config"], help="YAML configuration file.")
    add("--storage-capacity-gb", type=float, default=d["storage_capacity_gb"],
        help="Storage tier capacity, GiB (0 = auto).")
    add("--precondition", action="store_true", default=d["precondition"], help="Fill the device before measuring.")
    add("--precondition-size-gb", type=float, default=d["precondition_size_gb"],
        help="Preconditioning volume, GiB (0 = 2 x capacity).")
    add("--precondition-threads", type=int, default=d["precondition_threads"],
        help="Preconditioning writer threads (0 = CPU count).")
    add("--trace-speedup", type=float, default=d["trace_speedup"],
        help="BurstGPT inter-arrival divisor (0 = no sleeping).")
    add("--replay-cycles", type=int, default=d["replay_cycles"], help="Passes over the trace/dataset (0 = unlimited).")
    add("--prefill-only", action="store_true", default=d["prefill_only"], help="Disaggregated prefill node: writes only.")
    add("--decode-only", action="store_true", default=d["decode_only"], help="Disaggregated decode node: reads only.")
    add("--io-trace-log", type=str, default=d["io_trace_log"],
        help="Trace mode: log operations to CSV instead of doing I/O.")
    add("--enable-latency-tracing", action="store_true", default=d["enable_latency_tracing"],
        help="bpftrace block-layer and syscall latency histograms of this run (needs root and bpftrace; "
             "without them the run goes on and says why).")
    add("--fail-exit-code", action="store_true", default=d["fail_exit_code"],
        help="Exit 1 when the performance profile says FAIL (default: a completed run exits 0 whatever "
             "its verdict, as the mlpstorage harness reads results only after exit 0).")
    add("--processes", type=int, default=d["processes"],
        help="Run N worker processes on this host, each with a share of the users (and of --cpu-mem-gb), "
             "one common window, one merged result at --output (X_rank<r>.json beside it).")
    _add_trace_and_io_flags(p, d)


def _add_tier_flags(p: argparse.ArgumentParser, d: dict[str, object]) -> None:
    """The cache tiers' budgets: GPU (real or simulated), CPU RAM, and how memory limits apply."""
    add = p.add_argument
    add("--gpu-mem-gb", type=float, default=d["gpu_mem_gb"], help="GPU tier budget per GPU, GiB (0 = no GPU tier).")
    add("--num-gpus", type=int, default=d["num_gpus"], help="GPUs; GPU tier capacity = num-gpus x gpu-mem-gb.")
    add("--tensor-parallel", type=int, default=d["tensor_parallel"],
        help="Tensor-parallel degree; each rank stores 1/TP of an entry.")
    add("--gpu-tier", type=str, default=d["gpu_tier"], choices=GPU_TIERS,
        help="GPU tier when --gpu-mem-gb > 0: real (CUDA HBM via torch or cupy), simulated (host RAM, modelled "
             "copy times), off; auto = real where CUDA is present, else simulated.")
    add("--gpu-type", type=str, default=d["gpu_type"],
        help=f"GPU spec ({_gpu_keys()}, or a key the config's gpus section adds) whose host link and HBM "
             "bandwidth model the simulated GPU tier.")
    add("--gds", action="store_true", default=d["gds"],
        help="GPUDirect Storage: storage-tier reads land in GPU memory through kvikio (needs the real GPU tier).")
    add("--cpu-mem-gb", type=float, default=d["cpu_mem_gb"], help="CPU tier budget, GiB.")
    add("--strict-memory", action="store_true", default=d["strict_memory"],
        help="Refuse (exit 2) a --cpu-mem-gb that does not fit in the memory this process may use, "
             "instead of clamping it with a warning.")


def _add_trace_and_io_flags(p: argparse.ArgumentParser, d: dict[str, object]) -> None:
    tr = p.add_argument_group("trace replay and KV layout")
    tr.add_argument("--trace", type=str, default=d["trace"],
                    help="Replay a trace: a file, or a directory of WEKA agentic-coding JSON files.")
    tr.add_argument("--trace-format", default=d["trace_format"],
                    choices=("auto", *trace_formats.names()),
                    help="Format of --trace (default: detected): "
                         + "; ".join(f"{f.name}: {f.summary}" for f in trace_formats.all_formats()) + ".")
    tr.add_argument("--kv-block-tokens", type=int, default=d["kv_block_tokens"],
                    help="0 = one KV entry per request (reference layout); N > 0 = entries of N tokens keyed "
                         "by the prefix hash chain (loads for cached blocks, stores for the rest).")
    tr.add_argument("--think-time", type=str, default=d["think_time"],
                    help="Pause between a session's turns: trace (recorded), fixed:S or uniform:A:B seconds.")

    io = p.add_argument_group("storage engine (override the config 'storage' section)")
    io.add_argument("--io-chunk-mb", type=int, default=d["io_chunk_mb"], help="MiB per pwritev/preadv call.")
    io.add_argument("--io-workers", type=int, default=d["io_workers"], help="I/O worker threads (0 = auto).")
    io.add_argument("--io-mode", type=str, default=d["io_mode"], choices=IO_MODES,
                    help="auto = O_DIRECT where possible; direct = O_DIRECT or fail; buffered = page cache.")
    io.add_argument("--no-fsync", action="store_true", default=d["no_fsync"],
                    help="Skip the fdatasync per written entry.")
    io.add_argument("--verify", action="store_true", default=d["verify"],
                    help="Check every read's per-block stamps against what was written (mismatches counted).")


def add_sessions_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `kv-cache sessions`."""
    d = sessions_flag_defaults()
    a = p.add_argument
    a("--config", default=d["config"],
      help="YAML config (sections sessions, gpus, inference_model, model_configs).")
    a("--model", default=d["model"], help="Model key.")
    a("--gpu", default=d["gpu"], help=f"GPU spec ({_gpu_keys()}, or a key the config's gpus section adds).")
    a("--gpu-mem-gb", type=float, default=d["gpu_mem_gb"], help="HBM per GPU in GiB (0 = the GPU spec's).")
    a("--num-gpus", type=int, default=d["num_gpus"], help="GPUs; replicas = num-gpus / tensor-parallel.")
    a("--tensor-parallel", type=int, default=d["tensor_parallel"], help="GPUs per model replica.")
    a("--ladder", default=d["ladder"],
      help="Comma-separated concurrent-session counts (rungs), or auto[:START] (double from START, default 2, "
           "until throughput has peaked).")
    a("--window", type=float, default=d["window"], help="Measured seconds per rung (the article used 720).")
    a("--warmup", type=float, default=d["warmup"], help="Unmeasured seconds before each window.")
    a("--subwindows", type=int, default=d["subwindows"], help="Sub-windows for the confidence intervals (>= 2).")
    a("--tiers", default=d["tiers"], help=f"Offload configurations: {', '.join(TIER_CONFIGS)}.")
    a("--cpu-mem-gb", type=float, default=d["cpu_mem_gb"], help="DRAM offload tier per run, GiB.")
    a("--cache-dir", default=d["cache_dir"], help="Directory of the storage offload tier (default: a temp dir).")
    a("--storage-capacity-gb", type=float, default=d["storage_capacity_gb"],
      help="Storage tier capacity (0 = 95%% of free space).")
    a("--trace", default=d["trace"], help="Sessions from a trace (agentic-coding dir, AIPerf, Bailian, Mooncake).")
    a("--trace-format", default=d["trace_format"], help="Trace format (default: detected).")
    a("--max-sessions", type=int, default=d["max_sessions"],
      help="Use at most this many sessions of the trace (0 = all).")
    a("--pace", default=d["pace"], help="Pause transform: trace | human:A:B | agentic:A:B | fixed:S.")
    a("--seed", type=int, default=d["seed"], help="Seed of the session generator and the pace transform.")
    a("--output", default=d["output"], help="Results JSON.")
    a("--io-workers", type=int, default=d["io_workers"],
      help="I/O worker threads moving blocks to/from the offload tiers.")
    a("--io-chunk-mb", type=int, default=d["io_chunk_mb"],
      help="MiB per pwritev/preadv call (default: config storage).")
    a("--io-mode", choices=IO_MODES, default=d["io_mode"])
    a("--no-fsync", action="store_true", default=d["no_fsync"])
    a("--prefill-chunk-tokens", type=int, default=d["prefill_chunk_tokens"],
      help="Prefill tokens per batching iteration.")
    a("--log-level", default=d["log_level"], choices=LOG_LEVELS)
    a("--load-policy", choices=LOAD_POLICIES, default=d["load_policy"],
      help="always: load every offloaded prefix hit; cost: recompute it when loading at the tier's measured "
           "bandwidth would take longer than the modelled prefill.")
    a("--replications", type=int, default=d["replications"],
      help="Independent seeded replications per (config, sessions) cell; CIs across them (t).")
    a("--slo-ttft-p90", type=float, default=d["slo_ttft_p90"], metavar="S",
      help="SLO on the p90 TTFT of returning turns: effective capacity = largest session count meeting it.")
    a("--verify", action="store_true", default=d["verify"],
      help="Every offload-tier read checks each 4 KiB block's stamp (mismatches are storage errors).")
    a("--steady-state", action="store_true", default=d["steady_state"],
      help="Start each rung as a long run would leave it (sessions mid-way, HBM full, evicted blocks in the "
           "tiers, staggered arrivals); the warm-up ends when occupancy is steady (--warmup = its cap).")
