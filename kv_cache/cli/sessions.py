"""`kv-cache sessions` settings: parsed flags (settings/sessions.py SessionsFlags) + config.yaml -> SessionsSettings.

The trace (when one is given) is not opened here: the composition root loads its sessions once and
adjusts the block size to the trace's.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from datetime import datetime

from kv_cache.errors import UsageError
from kv_cache.metrics.recorder import GIB
from kv_cache.results.outputs import check_output_path
from kv_cache.serving.engine import roofline as gpumod
from kv_cache.settings.pacing import PaceError, parse_pace
from kv_cache.settings.run import StorageSettings
from kv_cache.settings.schema import load_config
from kv_cache.settings.sessions import (
    DEFAULT_ANSWER_REPLICATIONS,
    TIER_CONFIGS,
    LadderSettings,
    SessionsFlags,
    SessionsSettings,
)
from kv_cache.settings.shaping import shaping_fields, spec_errors
from kv_cache.settings.validation import check_cache_dir
from kv_cache.specs.models import SESSION_MODELS
from kv_cache.storage import backends

__all__ = ["SessionsFlags", "SessionsSettings", "resolve_sessions"]


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
        elif math.isinf(value):  # would run forever, or end in a results file JSON cannot hold
            errors.append(f"{flag} must be finite, got {value}")
    errors += spec_errors(args.tier_bandwidth, args.tier_latency)  # a number (the storage tier) or TIER=VALUE,...
    if args.subwindows < 2:
        errors.append(f"--subwindows must be >= 2, got {args.subwindows}")
    if args.num_gpus < 1 or args.tensor_parallel < 1 or args.num_gpus % args.tensor_parallel:
        errors.append("--num-gpus must be a positive multiple of --tensor-parallel")
    if args.io_workers < 1 or args.prefill_chunk_tokens < 1:
        errors.append("--io-workers and --prefill-chunk-tokens must be positive")
    if args.replications is not None and args.replications < 1:
        errors.append(f"--replications must be >= 1, got {args.replications}")
    if args.slo_ttft_p90 is not None and not 0 < args.slo_ttft_p90 < math.inf:
        errors.append(f"--slo-ttft-p90 must be positive seconds, got {args.slo_ttft_p90}")
    if args.cache_dir is not None and "dram+storage" in tiers:
        problem = check_cache_dir(args.cache_dir)
        if problem:
            errors.append(problem)
    return errors + backends.option_errors(args)


def _replications(args: argparse.Namespace) -> int:
    """--replications as given, else DEFAULT_ANSWER_REPLICATIONS when an answer is asked for, else 1."""
    if args.replications is not None:
        return args.replications
    return DEFAULT_ANSWER_REPLICATIONS if args.slo_ttft_p90 is not None else 1


def _resolve_cell(args: argparse.Namespace, argv: list[str]) -> SessionsSettings:
    """One (model, GPU): validate every flag (all problems in one message), then resolve model, GPU and
    I/O settings."""
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
        if args.slo_ttft_p90 is not None and len(set(ladder)) < len(ladder):  # two records of one x in the fit
            raise UsageError(f"--ladder repeats a session count, got {args.ladder!r} (with --slo-ttft-p90 each "
                             "rung is one point of the fit: --replications repeats a rung)")
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
        hbm_kv_bytes = gpumod.hbm_kv_capacity_bytes(spec, cfg.inference_model, model, tp=args.tensor_parallel)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sess, storage = cfg.sessions, cfg.storage
    ls = LadderSettings(
        model=model, model_name=args.model, gpu=spec, gpu_name=args.gpu, efficiency=cfg.inference_model,
        hbm_kv_bytes=hbm_kv_bytes, num_gpus=args.num_gpus, tensor_parallel=args.tensor_parallel,
        block_tokens=sess.block_tokens, shared_prefix_tokens=sess.shared_prefix_tokens,
        dram_bytes=int(args.cpu_mem_gb * GIB), cache_dir=args.cache_dir,
        storage_capacity_bytes=args.storage_capacity_gb * GIB,
        storage=StorageSettings(
            chunk_bytes=(args.io_chunk_mb or storage.chunk_size_mb) << 20,
            fsync=False if args.no_fsync else storage.fsync,
            io_mode=args.io_mode or storage.io_mode, io_workers=args.io_workers,
            io_retries=storage.io_retries, max_storage_errors=storage.max_storage_errors, verify=args.verify,
            **shaping_fields(args.tier_bandwidth, args.tier_latency)),
        window_s=args.window, warmup_s=args.warmup, subwindows=args.subwindows,
        prefill_chunk_tokens=args.prefill_chunk_tokens, human_threshold_s=sess.human_threshold_s,
        pace=pace, seed=args.seed, eviction=cfg.eviction,
        load_policy=args.load_policy, steady_state=args.steady_state,
        dram_write_through=args.dram_write_through,
        remote=backends.remote_settings(args),
    )
    return SessionsSettings(
        ladder_settings=ls, ladder=tuple(ladder), tiers=tuple(tiers), sessions=sess, trace=args.trace,
        trace_format=args.trace_format, max_sessions=args.max_sessions, pace_text=args.pace,
        output=args.output, log_level=args.log_level, argv=tuple(argv),
        replications=_replications(args), slo_ttft_p90_s=args.slo_ttft_p90, ladder_auto_start=auto_start,
        window_plan=args.window_plan, grid=(),
    )


def _names(text: str | None, flag: str) -> list[str]:
    names = [x.strip() for x in (text or "").split(",") if x.strip()]
    if text is not None and not names:
        raise UsageError(f"{flag} needs comma-separated names, got {text!r}")
    return list(dict.fromkeys(names))


def resolve_sessions(args: argparse.Namespace, argv: list[str]) -> SessionsSettings:
    """Validate every flag (all problems in one message), then resolve model, GPU and I/O settings; with
    --models / --gpus, every (model, GPU) cell is resolved (and checked) before anything runs, and the
    settings carry them in `grid` (the first cell's are the settings' own)."""
    if args.models is None and args.gpus is None:
        return _resolve_cell(args, argv)
    models = _names(args.models, "--models") or [args.model]
    gpus = _names(args.gpus, "--gpus") or [args.gpu]
    cells, errors = [], []
    for m in models:
        for g in gpus:
            try:
                cells.append(_resolve_cell(argparse.Namespace(**{**vars(args), "model": m, "gpu": g}), argv))
            except UsageError as exc:
                errors.append(f"{m} on {g}: {exc}" if len(models) * len(gpus) > 1 else str(exc))
    if errors:
        raise UsageError("; ".join(dict.fromkeys(errors)))
    return dataclasses.replace(cells[0], grid=tuple(c.ladder_settings for c in cells))
