"""One sessions rung's results: what it measured, inside the window, and the checks on it.

Pure functions of what the rung recorded (completed turns, first tokens, iterations, offload-I/O counter
snapshots, engine clock lateness): rates with circular block bootstrap intervals on fine bins (non-negative;
batch means, lag-1 checked, for the sub-window rates),
TTFT percentiles of the pooled samples with circular block bootstrap intervals, each turn's TTFT broken down into
queue wait, offload load and prefill, offered vs sustained load/store bandwidth and backlog, and the
flags that say when a cell cannot carry a finding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kv_cache.metrics.block_bootstrap import block_bootstrap_ci
from kv_cache.metrics.histograms import merge
from kv_cache.metrics.stats import (
    CI,
    batch_means_ci,
    lag1_autocorrelation,
    mean_ci,
    nonnegative,
    percentile,
    subwindow_rates,
)
from kv_cache.serving.engine.io_pool import IOCounters
from kv_cache.serving.engine.replica import TurnRequest
from kv_cache.settings.sessions import LadderSettings
from kv_cache.workload.sessions import TURN_CLASSES

__all__ = ["MIN_PERCENTILE_SAMPLES", "FailureInputs", "RungRecord", "engine_clock", "failure_flags", "failure_inputs",
           "io_rates", "kv_sources", "rung_flags", "throughput_ci", "ttft_breakdown", "ttft_percentiles", "window_rate_ci",
           "work_summary"]

MIN_PERCENTILE_SAMPLES = 20
HIGH_LAG1 = 0.5  # batch means this correlated: the sub-windows are too short for the run's correlation time
GB = 1e9


@dataclass
class RungRecord:
    """What a rung recorded, as its results need it (times in seconds since the rung's t0)."""

    window: tuple[float, float]
    subwindows: int
    gpus: int
    block_bytes: int
    first_tokens: list[tuple[float, TurnRequest]] = field(default_factory=list)
    io_open: dict[str, IOCounters] | None = None  # offload-I/O counters at the window's start
    io_close: dict[str, IOCounters] | None = None  # ... and at its end
    backlog_samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, load ops, store ops)


def throughput_ci(samples: Sequence[float]) -> CI:
    """Per-sub-window rates -> batch-means interval (widened for lag-1 autocorrelation), clamped at 0."""
    return nonnegative(batch_means_ci(samples))


RATE_BIN_S = 0.5  # the finest bin of the rates' block bootstrap
MAX_RATE_BINS = 120


def window_rate_ci(samples: list[tuple[float, float]], window: tuple[float, float], subwindows: int,
                   gpus: int) -> CI:
    """Per-GPU rate over the window (the sum of the ``(t, value)`` samples / its length / gpus) with a
    circular block bootstrap interval on the rates of fine bins (0.5 s, at most 120, at least `subwindows`):
    the blocks carry the bins' correlation, where batch means over a few sub-windows shorter than the
    correlation time gave intervals too narrow. Clamped at 0."""
    bins = max(subwindows, min(MAX_RATE_BINS, int((window[1] - window[0]) / RATE_BIN_S)))
    rates = per_gpu_rates(samples, window, bins, gpus)
    if len(rates) < 6:
        return throughput_ci(rates)
    return nonnegative(block_bootstrap_ci(rates, None, seed=bins))


def _ci_dict(values: list[float], q: float, seed: int) -> dict[str, Any] | None:
    """Percentile q of the values (in first-token order) with a circular block bootstrap interval: turns
    close in time share a queue, so they are resampled in blocks (metrics/block_bootstrap.py)."""
    return block_bootstrap_ci(values, q, seed=seed).to_dict() if values else None


def ttft_percentiles(rec: RungRecord, seed: int) -> dict[str, Any]:
    """p50/p90/p99 TTFT per turn class from the pooled first tokens of the window, in time order, with
    circular block bootstrap 95 % CIs (block length from the data)."""
    w0, w1 = rec.window
    out: dict[str, Any] = {}
    ordered = sorted(rec.first_tokens, key=lambda x: x[0])
    for cls in TURN_CLASSES:
        values = [r.ttft_ns / 1e9 for t, r in ordered if r.turn_class == cls and w0 <= t < w1]
        out[cls] = {"n": len(values)}
        for q in (50, 90, 99):
            out[cls][f"p{q}_s"] = _ci_dict(values, q, seed + q)
    return out


def _parts(req: TurnRequest) -> tuple[float, float, float]:
    """(queue wait, load, prefill) seconds of one turn's TTFT; they add up to the TTFT."""
    ttft = req.ttft_ns / 1e9
    queue = max(0.0, (req.admitted_ns - req.issue_ns) / 1e9)
    load = req.load_ns / 1e9 if req.load_keys else 0.0
    return queue, load, max(0.0, ttft - queue - load)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _p90(xs: list[float]) -> float | None:
    return percentile(xs, 90) if xs else None


def ttft_breakdown(rec: RungRecord) -> dict[str, Any]:
    """Per turn class: mean and p90 of queue wait, offload load and prefill (incl. batching) seconds; the
    bytes loaded per turn and the load bandwidth of the turns that loaded (their bytes / their load time)."""
    w0, w1 = rec.window
    out: dict[str, Any] = {}
    for cls in TURN_CLASSES:
        reqs = [r for t, r in rec.first_tokens if r.turn_class == cls and w0 <= t < w1]
        parts = [_parts(r) for r in reqs]
        loading = [r for r in reqs if r.load_keys]
        load_s = sum(r.load_ns for r in loading) / 1e9
        load_bytes = sum(r.load_bytes for r in loading)
        out[cls] = {
            "n": len(reqs),
            "queue_wait_s": {"mean": _mean([p[0] for p in parts]), "p90": _p90([p[0] for p in parts])},
            "load_s": {"mean": _mean([p[1] for p in parts]), "p90": _p90([p[1] for p in parts])},
            "prefill_s": {"mean": _mean([p[2] for p in parts]), "p90": _p90([p[2] for p in parts])},
            "turns_loading": len(loading),
            "load_gb_per_turn": (load_bytes / GB / len(reqs)) if reqs else None,
            "load_gbps": (load_bytes / GB / load_s) if load_s > 0 else None,
            "loads_skipped_turns": sum(1 for r in reqs if r.skipped_load_blocks),
        }
    return out


def io_rates(rec: RungRecord) -> dict[str, Any] | None:
    """Offered (submitted) vs sustained (completed) load and store GB/s in the window, and the backlog
    (moves submitted, not yet done) at its end and at its worst monitor tick. None without offload tiers."""
    if rec.io_open is None or rec.io_close is None:
        return None
    span = rec.window[1] - rec.window[0]
    w0, w1 = rec.window
    out: dict[str, Any] = {}
    for i, kind in enumerate(("load", "store")):
        a, b = rec.io_open[kind], rec.io_close[kind]
        ticks = [s[1 + i] for s in rec.backlog_samples if w0 <= s[0] <= w1]
        out[kind] = {
            "offered_gbps": (b.submitted_bytes - a.submitted_bytes) / GB / span,
            "sustained_gbps": (b.completed_bytes - a.completed_bytes) / GB / span,
            "offered_ops": b.submitted_ops - a.submitted_ops,
            "completed_ops": b.completed_ops - a.completed_ops,
            "backlog_ops_end": b.backlog_ops,
            "backlog_gb_end": b.backlog_ops * rec.block_bytes / GB,
            "backlog_ops_max": max([b.backlog_ops, *ticks]),
        }
    return out


def rung_flags(result: dict[str, Any], tiers: str, hbm_filled: bool, throughput_samples: Sequence[float]) -> list[str]:
    """Why this cell cannot carry a finding on its own (flags, not findings)."""
    flags = []
    if not hbm_filled:
        flags.append("HBM never filled: contexts fit in GPU memory, the offload tier cannot matter here")
    io = result.get("offload_io_rates")
    if tiers != "none" and (io is None or io["load"]["completed_ops"] == 0):
        flags.append("the offload tier was never read in the window")
    for cls, t in result["ttft"].items():
        n = t["n"]
        if 0 < n < MIN_PERCENTILE_SAMPLES or (n == 0 and cls in ("start", "return")):
            flags.append(f"TTFT {cls}: n = {n} < {MIN_PERCENTILE_SAMPLES}, percentiles unreliable")
    r1 = lag1_autocorrelation(throughput_samples) if len(throughput_samples) >= 3 else float("nan")
    if r1 == r1 and r1 > HIGH_LAG1:
        flags.append(f"throughput sub-windows autocorrelated (lag-1 r1 = {r1:.2f}): a window short for the run's "
                     "correlation time (the block bootstrap interval carries it), "
                     "use a longer window or --replications")
    return flags


def mean_of(values: list[float]) -> dict[str, Any]:
    """t-interval across independent replications, clamped at 0 (for non-negative quantities)."""
    return nonnegative(mean_ci(values)).to_dict()


def per_gpu_rates(samples: list[tuple[float, float]], window: tuple[float, float], k: int, gpus: int) -> list[float]:
    return [x / gpus for x in subwindow_rates(samples, window, k)]


def work_summary(done: list, offered: list, new_done: list[int], new_offered: list[int]) -> dict[str, Any]:
    """What the completed turns were: the work-equivalence control's inputs."""
    ctx = [r.input_tokens for _, r in done]
    out = [r.output_tokens for _, r in done]
    return {
        "turns_offered": len(offered),
        "turns_completed": len(done),
        "mean_new_tokens_offered": sum(new_offered) / len(new_offered) if new_offered else 0.0,
        "mean_new_tokens_completed": sum(new_done) / len(new_done) if new_done else 0.0,
        "new_tokens_per_turn_ci": mean_ci(new_done).to_dict() if new_done else None,
        "mean_output_tokens_completed": (sum(out) / len(done)) if done else 0.0,
        "context_tokens_per_turn_ci": mean_ci(ctx).to_dict() if ctx else None,
        "output_tokens_per_turn_ci": mean_ci(out).to_dict() if out else None,
        "context_tokens_p50_p90": [percentile(ctx, 50), percentile(ctx, 90)] if ctx else None,
        "new_tokens_p50_p90": [percentile(new_done, 50), percentile(new_done, 90)] if new_done else None,
        "output_tokens_p50_p90": [percentile(out, 50), percentile(out, 90)] if out else None,
    }


def engine_clock(replicas: Sequence[Any]) -> dict[str, Any]:
    """How late the replicas woke up against their modelled (absolute) deadlines: the drift that remained."""
    samples = [r.late_ns for r in replicas if len(r.late_ns)]  # LatencySamples (bounded), or lists
    n = sum(len(s) for s in samples)
    modelled = sum(r.modelled_ns for r in replicas) / 1e9
    if all(getattr(s, "exact", True) for s in samples):
        p99 = percentile([x / 1e6 for s in samples for x in s], 99) if n else None
    else:  # past a replica's cap: the merged histograms (within 0.1 %, metrics/histograms.py)
        p99 = merge(s.hist for s in samples).get_value_at_percentile(99.0) / 1e6
    return {
        "method": "absolute deadlines: iteration i ends at t_start + sum of modelled iteration times; "
                  "lateness = wake-up time - deadline, not accumulated",
        "iterations": n,
        "modelled_busy_s": modelled,
        "late_ms_mean": sum(_sum(s) for s in samples) / n / 1e6 if n else None,
        "late_ms_p99": p99,
        "late_ms_max": max(_max(s) for s in samples) / 1e6 if n else None,
    }


def _sum(s: Any) -> int:
    return s.sum if hasattr(s, "sum") else sum(s)


def _max(s: Any) -> int:
    return s.max if hasattr(s, "max") else max(s)


@dataclass(frozen=True)
class FailureInputs:
    """What the failure-mode flags need beyond the result: the modelled prefill seconds of every turn the
    rung issued (warm-up included) with its whole context computed, the largest context a session of the
    rung reaches (tokens, its last turn's input and output), the KV bytes per token, the offload tiers'
    effective sizes (GiB, TierSet.sizes) and the rung's window and replicas."""

    issued_prefill_s: list[float]
    issued_context_tokens: list[int]
    largest_session_tokens: int
    bytes_per_token: int
    tier_sizes_gib: dict[str, float]
    window_s: float
    replicas: int
    usable_fraction: float = 1.0


def failure_inputs(ls: LadderSettings, issued_inputs: list[int], slots: Iterable[Any], sizes: dict[str, Any],
                   prefill_s: Callable[[int], float]) -> FailureInputs:
    """FailureInputs of a rung: `ls` its LadderSettings, `issued_inputs` the context tokens of every turn it
    issued, `slots` its session slots (their scripts' last turns give the largest session context),
    `sizes` its TierSet.sizes, `prefill_s(tokens)` the modelled prefill of a whole context."""
    largest = 0
    for slot in slots:
        script = getattr(slot, "script", None)
        if script is not None and script.turns:
            largest = max(largest, script.contexts()[-1][1] + script.turns[-1].output_tokens)
    return FailureInputs(
        issued_prefill_s=[prefill_s(n) for n in issued_inputs], issued_context_tokens=list(issued_inputs),
        largest_session_tokens=largest, bytes_per_token=ls.model.bytes_per_token,
        tier_sizes_gib={k: float(v["effective"]) for k, v in (sizes or {}).items()
                        if k in ("cpu_mem_gb", "storage_capacity_gb")},
        window_s=ls.window_s, replicas=ls.replicas, usable_fraction=ls.dram_usable_fraction)


def _no_turn_flag(result: dict[str, Any], f: FailureInputs) -> str | None:
    """Why no turn completed: the modelled prefill per turn, and queued per replica, against the window. None
    when the prefill fits the window (then it is not the reason: steady_state.window_cycles says the window
    is shorter than one turn cycle, decode and pauses included)."""
    if result["completed_turns"] or not f.issued_prefill_s:
        return None
    p50, p_max = percentile(f.issued_prefill_s, 50), max(f.issued_prefill_s)
    ctx = int(percentile(f.issued_context_tokens, 50)) if f.issued_context_tokens else 0
    queued = sum(f.issued_prefill_s) / max(1, f.replicas)
    need = max(3 * p50, queued)
    if need <= f.window_s:
        return None
    return (f"no turn completed in the {f.window_s:g} s window: the {len(f.issued_prefill_s)} turns issued need "
            f"{p50:.1f} s (median; max {p_max:.1f} s) of modelled prefill each with their whole context "
            f"computed ({ctx:,} tokens median), {queued:.0f} s queued per replica; to measure turns, give "
            f"--window >= {need:.0f} s, fewer sessions (--ladder), a faster --gpu or shorter contexts "
            "(sessions.max_context_tokens)")


def _tier_too_small_flag(tiers: str, f: FailureInputs) -> str | None:
    """The offload tiers together smaller than one session's whole context: nothing useful can stay there."""
    if tiers == "none" or not f.tier_sizes_gib or f.largest_session_tokens <= 0:
        return None
    held = sum(f.tier_sizes_gib.values()) * f.usable_fraction
    need = f.largest_session_tokens * f.bytes_per_token / 2**30
    if need <= held:
        return None
    parts = ", ".join(f"{k.removesuffix('_gb').replace('_', ' ')} {v:.2f} GiB" for k, v in f.tier_sizes_gib.items())
    return (f"the offload tiers cannot hold even one session's context: they hold {held:.2f} GiB usable ({parts}) "
            f"but one session reaches {f.largest_session_tokens:,} tokens x {f.bytes_per_token / 1024:.0f} KiB = "
            f"{need:.2f} GiB; raise --cpu-mem-gb / --storage-capacity-gb, put --cache-dir on a larger "
            "filesystem, or use shorter contexts (sessions.max_context_tokens)")


def failure_flags(result: dict[str, Any], tiers: str, f: FailureInputs) -> list[str]:
    """Flags for a rung that could not measure what it was run for (no turn completed; a tier too small for
    one session), each saying why and what to change."""
    return [x for x in (_no_turn_flag(result, f), _tier_too_small_flag(tiers, f)) if x]


class RemoteWatch:
    """A rung's remote storage tier, watched: the interface towards its server (/proc/net/dev) and the
    process CPU from the rung's start, for the rung's `remote_tier` (as the standard run's)."""

    def __init__(self, store: Any) -> None:
        import resource  # noqa: PLC0415

        from kv_cache.host.netdev import NetCounter  # noqa: PLC0415

        self.store = store if hasattr(store, "remote_stats") else None
        self.net = NetCounter.for_host(getattr(self.store, "endpoint_host", None)) if self.store is not None else None
        self.before = self.net.snapshot() if self.net else None
        self.rusage0 = resource.getrusage(resource.RUSAGE_SELF)

    def result(self, metrics: Any) -> dict[str, Any]:
        """{"remote_tier": ...} for a remote tier; {} otherwise."""
        if self.store is None:
            return {}
        from kv_cache.results.measurement import network  # noqa: PLC0415

        return {"remote_tier": {**self.store.remote_stats(), "network": network(
            metrics, self.net.name if self.net else None, self.before, self.net.snapshot() if self.net else None,
            self.rusage0)}}


def kv_sources(done: list, block_tokens: int) -> dict[str, Any]:
    """Where the context of the window's completed turns came from: HBM hits, loads, recomputation."""
    hit_tok = sum(r.hbm_hit_blocks * block_tokens for _, r in done)
    load_tok = sum(len(r.load_keys) * block_tokens for _, r in done)
    recompute_tok = sum(r.recomputed_tokens for _, r in done)
    source_total = max(1, hit_tok + load_tok + recompute_tok)
    return {"hbm_hit_share": hit_tok / source_total, "loaded_share": load_tok / source_total,
            "recomputed_share": recompute_tok / source_total,
            "load_skipped_blocks": sum(r.skipped_load_blocks for _, r in done)}
