"""One sessions rung's results: what it measured, inside the window, and the checks on it.

Pure functions of what the rung recorded (completed turns, first tokens, iterations, offload-I/O counter
snapshots, engine clock lateness): throughput with batch-means intervals (lag-1 checked, non-negative),
TTFT percentiles of the pooled samples with bootstrap intervals, each turn's TTFT broken down into
queue wait, offload load and prefill, offered vs sustained load/store bandwidth and backlog, and the
flags that say when a cell cannot carry a finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kv_cache.metrics.stats import (
    CI,
    batch_means_ci,
    lag1_autocorrelation,
    mean_ci,
    nonnegative,
    percentile,
    percentile_ci,
    subwindow_rates,
)
from kv_cache.serving.engine.replica import IOCounters, TurnRequest

__all__ = ["MIN_PERCENTILE_SAMPLES", "RungRecord", "io_rates", "rung_flags", "throughput_ci", "ttft_breakdown",
           "ttft_percentiles"]

TURN_CLASSES = ("start", "return", "agentic")
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


def _ci_dict(values: list[float], q: float, seed: int) -> dict[str, Any] | None:
    return percentile_ci(values, q, seed=seed).to_dict() if values else None


def ttft_percentiles(rec: RungRecord, seed: int) -> dict[str, Any]:
    """p50/p90/p99 TTFT per turn class from the pooled first tokens of the window, bootstrap 95 % CIs."""
    w0, w1 = rec.window
    out: dict[str, Any] = {}
    for cls in TURN_CLASSES:
        values = [r.ttft_ns / 1e9 for t, r in rec.first_tokens if r.turn_class == cls and w0 <= t < w1]
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
        flags.append(f"throughput sub-windows autocorrelated (lag-1 r1 = {r1:.2f}): interval widened, "
                     "use a longer window or --replications")
    return flags


def mean_of(values: list[float]) -> dict[str, Any]:
    """t-interval across independent replications, clamped at 0 (for non-negative quantities)."""
    return nonnegative(mean_ci(values)).to_dict()


def per_gpu_rates(samples: list[tuple[float, float]], window: tuple[float, float], k: int, gpus: int) -> list[float]:
    return [x / gpus for x in subwindow_rates(samples, window, k)]


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
