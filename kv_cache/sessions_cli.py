"""`kv-cache sessions`: how many concurrent sessions do my GPUs hold with this storage tier behind them?

Climbs a concurrency ladder for each offload configuration (none, DRAM, DRAM + storage under
--cache-dir), replaying human-paced multi-turn sessions closed loop against modelled GPUs, with real I/O
to the offload tiers, and reports per-GPU throughput, completed turns and TTFT by turn class with 95 %
confidence intervals, the effective capacity of each configuration and the ratios between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import signal
import sys
import threading
from datetime import datetime
from typing import Any, NoReturn, TextIO

from kv_cache import __version__
from kv_cache.cache import EvictionPolicy
from kv_cache.config.schema import load_config
from kv_cache.config.validation import check_cache_dir
from kv_cache.driver.ladder import TIER_CONFIGS, LadderSettings, RungRun, flag_work_equivalence, summarize
from kv_cache.engine import roofline as gpumod
from kv_cache.errors import UsageError
from kv_cache.metrics.recorder import GIB
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.workload.sessions import generate_sessions, parse_pace, sessions_from_trace
from kv_cache.workload.traces import TraceError, open_trace

log = logging.getLogger("kv_cache.sessions")

METHOD = (
    "Closed loop: each of N session slots issues its next turn only after the previous answer completed and "
    "its pause elapsed; a finished session is replaced by the next one. Compute is modelled (roofline per "
    "continuous-batching iteration, HBM = GPU memory - weights, block prefix cache with LRU); offload tiers "
    "are real: evicted blocks are written to DRAM / files, found blocks are read back. 95 % CIs: batch means "
    "over equal sub-windows of the measured window, Student t interval; ratios: CI of the ratio of mean "
    "sub-window throughputs. Effective capacity = the rung (sessions) with the highest mean per-GPU throughput."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"kv-cache sessions: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kv-cache sessions", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--config", default=None, help="YAML config (sections sessions, gpus, inference_model, model_configs).")
    a("--model", default="llama3.1-8b", help="Model key.")
    a(
        "--gpu",
        default="h100",
        help="GPU spec key from the config's gpus section (a100, h100, h200, b200, l40s).",
    )
    a("--gpu-mem-gb", type=float, default=0.0, help="HBM per GPU in GiB (0 = the GPU spec's).")
    a("--num-gpus", type=int, default=1, help="GPUs; replicas = num-gpus / tensor-parallel.")
    a("--tensor-parallel", type=int, default=1, help="GPUs per model replica.")
    a("--ladder", default="4,8,16", help="Comma-separated concurrent-session counts (rungs).")
    a("--window", type=float, default=30.0, help="Measured seconds per rung (the article used 720).")
    a("--warmup", type=float, default=10.0, help="Unmeasured seconds before each window.")
    a("--subwindows", type=int, default=5, help="Sub-windows for the confidence intervals (>= 2).")
    a("--tiers", default=",".join(TIER_CONFIGS), help="Offload configurations: none, dram, dram+storage.")
    a("--cpu-mem-gb", type=float, default=8.0, help="DRAM offload tier per run, GiB.")
    a("--cache-dir", default=None, help="Directory of the storage offload tier (default: a temp dir).")
    a(
        "--storage-capacity-gb",
        type=float,
        default=0.0,
        help="Storage tier capacity (0 = 95%% of free space).",
    )
    a("--trace", default=None, help="Sessions from a trace (agentic-coding dir, AIPerf, Bailian, Mooncake).")
    a("--trace-format", default="auto", help="Trace format (default: detected).")
    a("--max-sessions", type=int, default=0, help="Use at most this many sessions of the trace (0 = all).")
    a("--pace", default="trace", help="Pause transform: trace | human:A:B | agentic:A:B | fixed:S.")
    a("--seed", type=int, default=42, help="Seed of the session generator and the pace transform.")
    a("--output", default=f"sessions_results_{datetime.now():%Y%m%d_%H%M%S}.json", help="Results JSON.")
    a("--io-workers", type=int, default=8, help="I/O worker threads moving blocks to/from the offload tiers.")
    a("--io-chunk-mb", type=int, default=None, help="MiB per pwritev/preadv call (default: config storage).")
    a("--io-mode", choices=("auto", "direct", "buffered"), default=None)
    a("--no-fsync", action="store_true", default=None)
    a("--prefill-chunk-tokens", type=int, default=8192, help="Prefill tokens per batching iteration.")
    a("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    return p


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{flag} needs positive integers, got {text!r}")
    return values


def resolve(argv: list[str]) -> tuple[LadderSettings, list[int], list[str], Any, dict[str, Any]]:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config)
    errors = []
    model = cfg.model_configs.get(args.model)
    if model is None:
        errors.append(f"unknown model '{args.model}' (available: {', '.join(sorted(cfg.model_configs))})")
    spec = cfg.gpus.get(args.gpu)
    if spec is None:
        errors.append(f"unknown GPU '{args.gpu}' (available: {', '.join(sorted(cfg.gpus))})")
    ladder = _positive_ints(args.ladder, "--ladder")
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    bad = [t for t in tiers if t not in TIER_CONFIGS]
    if bad or not tiers:
        errors.append(f"--tiers accepts {', '.join(TIER_CONFIGS)}, got {args.tiers!r}")
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
    if args.cache_dir is not None and "dram+storage" in tiers:
        problem = check_cache_dir(args.cache_dir)
        if problem:
            errors.append(problem)
    try:
        pace = parse_pace(args.pace)
    except ValueError as exc:
        errors.append(f"--pace: {exc}")
        pace = None
    if errors:
        raise UsageError("; ".join(errors))
    if args.gpu_mem_gb > 0:
        spec = dataclasses.replace(spec, hbm_gb=args.gpu_mem_gb)  # GiB, as the spec table
    try:
        gpumod.hbm_kv_capacity_bytes(spec, cfg.inference_model, model, tp=args.tensor_parallel)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sess = cfg.sessions
    trace_scripts = None
    if args.trace:
        try:
            source = open_trace(args.trace, args.trace_format)
            trace_scripts = sessions_from_trace(source, max_sessions=args.max_sessions)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
        if not trace_scripts:
            raise UsageError(f"{args.trace}: no sessions found")
    storage = cfg.storage
    ls = LadderSettings(
        model=model,
        model_name=args.model,
        gpu=spec,
        gpu_name=args.gpu,
        efficiency=cfg.inference_model,
        num_gpus=args.num_gpus,
        tensor_parallel=args.tensor_parallel,
        block_tokens=trace_scripts[0].block_tokens if trace_scripts else sess.block_tokens,
        shared_prefix_tokens=0 if trace_scripts else sess.shared_prefix_tokens,
        dram_bytes=int(args.cpu_mem_gb * GIB),
        cache_dir=args.cache_dir,
        storage_capacity_bytes=args.storage_capacity_gb * GIB,
        chunk_bytes=(args.io_chunk_mb or storage.chunk_size_mb) << 20,
        fsync=False if args.no_fsync else storage.fsync,
        io_mode=args.io_mode or storage.io_mode,
        io_workers=args.io_workers,
        window_s=args.window,
        warmup_s=args.warmup,
        subwindows=args.subwindows,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        human_threshold_s=sess.human_threshold_s,
        pace=pace,
        seed=args.seed,
        eviction=EvictionPolicy.from_config(cfg.eviction),
    )
    meta = {
        "output": args.output,
        "trace": args.trace,
        "pace": args.pace,
        "log_level": args.log_level,
        "argv": argv,
    }
    return ls, ladder, tiers, (trace_scripts, sess), meta


def script_supply(trace_scripts, sess_cfg, seed: int):
    """A fresh, identical stream of sessions for every rung (so configs replay the same work)."""

    def make():
        if trace_scripts is None:
            return generate_sessions(sess_cfg, seed)
        return (
            dataclasses.replace(s, session_id=f"{s.session_id}#{i // len(trace_scripts)}")
            for i, s in zip(itertools.count(), itertools.cycle(trace_scripts))
        )

    return make


def run_ladder(
    ls: LadderSettings, ladder: list[int], tiers: list[str], supply, out: TextIO,
    rungs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run every (tier config, rung); `rungs` (if given) receives each finished rung as it completes."""
    rungs = [] if rungs is None else rungs
    raw = {}
    cap_blocks = ls.hbm_capacity_blocks()
    out.write(
        f"kv-cache {__version__} sessions: {ls.model_name} on {ls.num_gpus} x {ls.gpu_name} "
        f"(HBM for KV: {cap_blocks} blocks of {ls.block_tokens} tokens = "
        f"{cap_blocks * ls.block_tokens:,} tokens per replica), rungs {ladder}, tiers {tiers}, "
        f"window {ls.window_s:g} s + warm-up {ls.warmup_s:g} s each\n"
    )
    for tier in tiers:
        for n in ladder:
            out.write(f"  running {tier:<13} {n:>5} sessions ...")
            out.flush()
            rung = RungRun(ls, tier, n, supply)
            result = rung.run()
            raw[(tier, n)] = rung.throughput_samples
            rungs.append(result)
            t = result["throughput_tokens_per_s_per_gpu"]
            out.write(f" {t['estimate']:10.1f} tok/s/GPU, {result['completed_turns']} turns\n")
            out.flush()
    flag_work_equivalence(rungs)
    return {"rungs": rungs, "summary": summarize(rungs, raw)}


def _fmt_ci(ci: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not ci:
        return "-"
    est, lo, hi = ci["estimate"] * scale, ci.get("low"), ci.get("high")
    if lo is None or hi is None or lo == hi:
        return f"{est:.{digits}f}"
    return f"{est:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


def print_table(results: dict[str, Any], out: TextIO) -> None:
    line = "=" * 118
    out.write(
        f"\n{line}\nSESSIONS HELD - per-GPU throughput and TTFT by configuration and concurrency "
        "(95 % CI in brackets)\n{line}\n".replace("{line}", line)
    )
    out.write(
        f"{'config':<13} {'sessions':>8}  {'tokens/s per GPU':<28} {'turns':>6}  "
        f"{'TTFT p90 return (s)':<26} {'n':>4}  {'TTFT p90 start (s)':<22} {'work':<6}\n"
    )
    for r in results["rungs"]:
        ret, start = r["ttft"]["return"], r["ttft"]["start"]
        out.write(
            f"{r['tiers']:<13} {r['sessions']:>8}  {_fmt_ci(r['throughput_tokens_per_s_per_gpu']):<28} "
            f"{r['completed_turns']:>6}  {_fmt_ci(ret['p90_s'], digits=2):<26} {ret['n']:>4}  "
            f"{_fmt_ci(start['p90_s'], digits=2):<22} {'FLAG' if r['work']['flagged'] else 'ok':<6}\n"
        )
    s = results["summary"]
    out.write("\nEffective capacity (sessions at peak per-GPU throughput):\n")
    for cfg, c in s["configs"].items():
        out.write(
            f"  {cfg:<13} {c['effective_capacity_sessions']:>6} sessions, peak "
            f"{_fmt_ci(c['peak_throughput_tokens_per_s_per_gpu'])} tok/s/GPU\n"
        )
    for r in s["ratios"]:
        out.write(
            f"  {r['config']} vs {r['baseline']}: capacity x{r['effective_capacity_ratio']:.2f}, "
            f"peak throughput x{_fmt_ci(r['peak_throughput_ratio'], digits=2)}\n"
        )
    for r in s.get("ratios_by_rung", []):
        turns = r["completed_turns_ratio"]
        turns_text = f"x{turns:.2f}" if turns is not None else "-"
        out.write(f"  at {r['sessions']:>4} sessions, {r['config']} vs {r['baseline']}: throughput "
                  f"x{_fmt_ci(r['throughput_ratio'], digits=2)}, completed turns {turns_text}\n")
    flagged = [r for r in results["rungs"] if r["work"]["flagged"]]
    for r in flagged:
        out.write(f"  WORK FLAG {r['tiers']} @ {r['sessions']}: {'; '.join(r['work']['flag_reasons'])}\n")
    out.write(f"\nMethod: {results['method']}\n")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    try:
        ls, ladder, tiers, (trace_scripts, sess), meta = resolve(argv)
    except UsageError as exc:
        sys.stderr.write(f"kv-cache sessions: error: {exc}\n")
        return 2
    logging.basicConfig(
        level=getattr(logging, meta["log_level"]),
        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s",
    )
    out = sys.stdout
    started = datetime.now()
    done_rungs: list[dict[str, Any]] = []
    code = 0
    if threading.current_thread() is threading.main_thread():  # SIGTERM: stop, clean up, write, like Ctrl-C
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        body = run_ladder(ls, ladder, tiers, script_supply(trace_scripts, sess, ls.seed), out, done_rungs)
    except KeyboardInterrupt:  # keep what was measured: the rungs that completed
        sys.stderr.write(f"kv-cache sessions: interrupted after {len(done_rungs)} rung(s); writing them\n")
        body, code = {"rungs": done_rungs, "summary": None, "interrupted": True}, 130
    except UsageError as exc:
        sys.stderr.write(f"kv-cache sessions: error: {exc}\n")
        return 2
    results = {
        "tool": f"kv-cache {__version__}",
        "mode": "sessions",
        "timestamp": started.isoformat(timespec="seconds"),
        "command": " ".join(["kv-cache", "sessions", *meta["argv"]]),
        "parameters": {
            "model": ls.model_name,
            "gpu": ls.gpu_name,
            "hbm_gb": ls.gpu.hbm_gb,
            "num_gpus": ls.num_gpus,
            "tensor_parallel": ls.tensor_parallel,
            "block_tokens": ls.block_tokens,
            "ladder": ladder,
            "tiers": tiers,
            "window_s": ls.window_s,
            "warmup_s": ls.warmup_s,
            "subwindows": ls.subwindows,
            "dram_gib": ls.dram_bytes / GIB,
            "pace": meta["pace"],
            "seed": ls.seed,
            "trace": meta["trace"],
            "hbm_kv_capacity_blocks": ls.hbm_capacity_blocks(),
            "io_workers": ls.io_workers,
        },
        "method": METHOD,
        **body,
    }
    write_json_atomic(meta["output"], results)
    if code == 0:
        print_table(results, out)
    out.write(f"\nResults written to {meta['output']}\n")
    return code
