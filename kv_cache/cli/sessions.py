"""`kv-cache sessions` settings: the flags' defaults, and parsed flags + config.yaml -> SessionsSettings.

The trace (when one is given) is not opened here: the composition root loads its sessions once and
adjusts the block size to the trace's.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from datetime import datetime

from kv_cache.app_sessions import SessionsSettings
from kv_cache.config.pacing import PaceError, parse_pace
from kv_cache.config.schema import load_config
from kv_cache.config.validation import check_cache_dir
from kv_cache.driver.ladder import TIER_CONFIGS, LadderSettings
from kv_cache.engine import roofline as gpumod
from kv_cache.errors import UsageError
from kv_cache.metrics.recorder import GIB
from kv_cache.models import SESSION_MODELS
from kv_cache.report.outputs import check_output_path

__all__ = ["SessionsFlags", "SessionsSettings", "resolve_sessions"]


@dataclass(frozen=True)
class SessionsFlags:
    """Defaults of the `kv-cache sessions` flags (the parser reads them from here)."""

    config: str | None = None
    model: str = "llama3.1-8b"
    gpu: str = "h100"
    gpu_mem_gb: float = 0.0  # 0 = the GPU spec's HBM
    num_gpus: int = 1
    tensor_parallel: int = 1
    ladder: str = "4,8,16"
    window: float = 30.0
    warmup: float = 10.0
    subwindows: int = 5
    tiers: str = ",".join(TIER_CONFIGS)
    cpu_mem_gb: float = 8.0
    cache_dir: str | None = None
    storage_capacity_gb: float = 0.0
    trace: str | None = None
    trace_format: str = "auto"
    max_sessions: int = 0
    pace: str = "trace"
    seed: int = 42
    output: str = "sessions_results.json"  # the parser adds the start time to the name
    io_workers: int = 8
    io_chunk_mb: int | None = None  # None = the config's storage section
    io_mode: str | None = None
    no_fsync: bool | None = None
    prefill_chunk_tokens: int = 8192
    log_level: str = "WARNING"
    load_policy: str = "always"
    replications: int = 1
    slo_ttft_p90: float | None = None
    steady_state: bool = False
    verify: bool = False


def timestamped(name: str, when: datetime) -> str:
    """`name` with `_YYYYmmdd_HHMMSS` before its extension."""
    stem, _, ext = name.rpartition(".")
    return f"{stem}_{when:%Y%m%d_%H%M%S}.{ext}"


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{flag} needs positive integers, got {text!r}")
    return values


def _range_errors(args: argparse.Namespace, tiers: list[str]) -> list[str]:
    errors = []
    for flag, value, low in (
        ("--window", args.window, 0.0),
        ("--warmup", args.warmup, -1e-9),
        ("--gpu-mem-gb", args.gpu_mem_gb, -1e-9),
        ("--cpu-mem-gb", args.cpu_mem_gb, -1e-9),
        ("--storage-capacity-gb", args.storage_capacity_gb, -1e-9),
    ):
        if not value > low:
            errors.append(f"{flag} must be {'positive' if low == 0 else 'non-negative'}, got {value}")
    if args.subwindows < 2:
        errors.append(f"--subwindows must be >= 2, got {args.subwindows}")
    if args.num_gpus < 1 or args.tensor_parallel < 1 or args.num_gpus % args.tensor_parallel:
        errors.append("--num-gpus must be a positive multiple of --tensor-parallel")
    if args.io_workers < 1 or args.prefill_chunk_tokens < 1:
        errors.append("--io-workers and --prefill-chunk-tokens must be positive")
    if args.replications < 1:
        errors.append(f"--replications must be >= 1, got {args.replications}")
    if args.slo_ttft_p90 is not None and not args.slo_ttft_p90 > 0:
        errors.append(f"--slo-ttft-p90 must be positive seconds, got {args.slo_ttft_p90}")
    if args.cache_dir is not None and "dram+storage" in tiers:
        problem = check_cache_dir(args.cache_dir)
        if problem:
            errors.append(problem)
    return errors


def resolve_sessions(args: argparse.Namespace, argv: list[str]) -> SessionsSettings:
    """Validate every flag (all problems in one message), then resolve model, GPU and I/O settings."""
    cfg = load_config(args.config)
    errors = []
    model = cfg.model_configs.get(args.model) or SESSION_MODELS.get(args.model)
    if model is None:
        names = sorted({*cfg.model_configs, *SESSION_MODELS})
        errors.append(f"unknown model '{args.model}' (available: {', '.join(names)})")
    spec = cfg.gpus.get(args.gpu)
    if spec is None:
        errors.append(f"unknown GPU '{args.gpu}' (available: {', '.join(sorted(cfg.gpus))})")
    auto_start = 0
    if args.ladder.strip().startswith("auto"):  # auto or auto:START
        start = args.ladder.strip()[4:].lstrip(":") or "2"
        auto_start = _positive_ints(start, "--ladder auto:START")[0]
        ladder = [auto_start]
    else:
        ladder = _positive_ints(args.ladder, "--ladder")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    bad = [t for t in tiers if t not in TIER_CONFIGS]
    if bad or not tiers:
        errors.append(f"--tiers accepts {', '.join(TIER_CONFIGS)}, got {args.tiers!r}")
    errors += _range_errors(args, tiers)
    try:
        pace = parse_pace(args.pace)
    except PaceError as exc:
        errors.append(f"--pace: {exc}")
        pace = None
    if errors:
        raise UsageError("; ".join(errors))
    try:
        check_output_path(args.output)
    except UsageError as exc:
        raise UsageError(f"--output {exc}") from None
    if args.gpu_mem_gb > 0:
        spec = dataclasses.replace(spec, hbm_gb=args.gpu_mem_gb)  # GiB, as the spec table
    try:
        gpumod.hbm_kv_capacity_bytes(spec, cfg.inference_model, model, tp=args.tensor_parallel)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sess, storage = cfg.sessions, cfg.storage
    ls = LadderSettings(
        model=model, model_name=args.model, gpu=spec, gpu_name=args.gpu, efficiency=cfg.inference_model,
        num_gpus=args.num_gpus, tensor_parallel=args.tensor_parallel,
        block_tokens=sess.block_tokens, shared_prefix_tokens=sess.shared_prefix_tokens,
        dram_bytes=int(args.cpu_mem_gb * GIB), cache_dir=args.cache_dir,
        storage_capacity_bytes=args.storage_capacity_gb * GIB,
        chunk_bytes=(args.io_chunk_mb or storage.chunk_size_mb) << 20,
        fsync=False if args.no_fsync else storage.fsync,
        io_mode=args.io_mode or storage.io_mode, io_workers=args.io_workers,
        window_s=args.window, warmup_s=args.warmup, subwindows=args.subwindows,
        prefill_chunk_tokens=args.prefill_chunk_tokens, human_threshold_s=sess.human_threshold_s,
        pace=pace, seed=args.seed, eviction=cfg.eviction,
        load_policy=args.load_policy, steady_state=args.steady_state,
        io_retries=storage.io_retries, max_storage_errors=storage.max_storage_errors, verify=args.verify,
    )
    return SessionsSettings(
        ladder_settings=ls, ladder=tuple(ladder), tiers=tuple(tiers), sessions=sess, trace=args.trace,
        trace_format=args.trace_format, max_sessions=args.max_sessions, pace_text=args.pace,
        output=args.output, log_level=args.log_level, argv=tuple(argv),
        replications=args.replications, slo_ttft_p90_s=args.slo_ttft_p90, ladder_auto_start=auto_start,
    )
