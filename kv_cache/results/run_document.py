"""The results document of a standard run: the MLPerf tool's JSON layout, our additions, a schema version.

The composition root fills a RunRecord (how the run was set up, what it measured) and build_results turns
it into the document; nothing here runs or times anything. results_document stamps any mode's document
with the schema version, so readers can tell layouts apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from kv_cache import __version__
from kv_cache.core.autoscale import summarise
from kv_cache.host.devices import sysfs_limit
from kv_cache.host.preload import snapshot_at_start
from kv_cache.metrics import names
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.results import measurement as meas
from kv_cache.results.documents import SCHEMA_VERSION, SESSIONS_SCHEMA_VERSION
from kv_cache.results.figures import Figures
from kv_cache.results.integrity import audit_facts, facts_from_ours
from kv_cache.results.parameters import run_mode, run_parameters
from kv_cache.results.samples import latency_samples, window_wallclock
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.results.summary import block_stats, build_summary, harness_keys, per_turn_stats, request_lists
from kv_cache.results.verdict import never_exercised_note
from kv_cache.workload.validation import compare

__all__ = ["SCHEMA_VERSION", "SESSIONS_SCHEMA_VERSION", "RunRecord", "build_results", "interrupted_results",
           "rank_keys", "results_document", "summary_inputs"]

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.run import RunSettings



class Outcome(Protocol):
    """What the driver reports about the measured window."""

    stop_reason: str
    requests_issued: int
    requests_abandoned: int
    requests_failed: int
    requests_rejected: int
    final_active_users: int
    timeline: list[dict]
    plans: dict


class StorageTierStore(Protocol):
    run_dir: Any
    fs_type: str
    io_mode: str


class TraceReplay(Protocol):
    """A replayed trace: its sources (format, block size, statistics) and sessions when closed-loop."""

    sources: list
    sessions: list | None

    @property
    def format(self) -> str: ...


@dataclass
class RunRecord:
    """One standard run, as the results document needs it.

    Setup: settings, file_store (None in trace mode), memory_store (None without a CPU tier), workers,
    started, notes, trace, rag. Measured: metrics, outcome, usage and entry_sizes (the cache at the end),
    rusage0 (process usage at the window's start), the block device's counters before and after the run phase,
    phases, autoscaler, tracer."""

    settings: RunSettings
    metrics: RunMetrics
    outcome: Outcome
    usage: dict[str, dict[str, float]]
    entry_sizes: Sequence[int]
    workers: int
    started: datetime
    rusage0: Any
    notes: list[str] = field(default_factory=list)
    file_store: StorageTierStore | None = None
    memory_store: object | None = None
    blockdev: Any = None  # has .name
    disk_before: tuple[int, int] | None = None
    disk_after: tuple[int, int] | None = None
    phases: dict[str, Any] = field(default_factory=dict)
    autoscaler: Any = None  # has .history and .summary()
    rag: Any = None  # has .live (the retrievable documents)
    tracer: Any = None  # has .path and .rows
    trace: TraceReplay | None = None
    gpu_store: Any = None  # has .stats() (the GPU tier: simulated or real); None without one
    barrier_aligned: bool = False  # the window was opened and closed by barriers shared with other ranks
    run_id: str | None = None  # shared by every rank of this run (core/group.py shared_run_id)
    tier_sizes: dict[str, Any] = field(default_factory=dict)  # TierSet.sizes: asked and in force
    tier_backends: dict[str, str] = field(default_factory=dict)  # TierSet.backend_names(): tier -> backend
    process_io: dict[str, Any] | None = None  # host/procio.py IOSnapshot.delta(): this process's storage bytes
    # tier -> its ShapedStore.stats() at the end (--tier-bandwidth / --tier-latency): only the shaped tiers
    tier_shaping: dict[str, dict[str, Any]] = field(default_factory=dict)


def results_document(body: dict[str, Any], schema: str = SCHEMA_VERSION) -> dict[str, Any]:
    """`body` with the schema version as its first key (a reader checks it before trusting any key)."""
    return {"schema_version": schema, **body}


INTERRUPTED_EARLY = "interrupted before the measured phase"


def summary_inputs(settings: RunSettings) -> dict[str, Any]:
    """What the summary code takes besides the recorder (profile, PASS/FAIL thresholds, QoS targets), so a
    merge of ranks runs the same summary with the same inputs."""
    cfg = settings.config
    return {"performance_profile": settings.outputs.performance_profile, "kv_block_tokens": settings.workload.kv_block_tokens,
            "performance_criteria": dataclasses.asdict(cfg.performance_criteria),
            "qos_profiles": {level: dataclasses.asdict(p) for level, p in cfg.qos_profiles.items()}}


def rank_keys(settings: RunSettings, run_id: str | None) -> dict[str, Any]:
    """The run's id and world size: which run a rank's document belongs to, and how many ranks it had."""
    return {"run_id": run_id, "world_size": int(settings.mpi_world_size or 1)}


def interrupted_results(phases: dict[str, Any], settings: RunSettings | None = None,
                        metrics: RunMetrics | None = None, started: datetime | None = None,
                        run_id: str | None = None, reason: str = INTERRUPTED_EARLY) -> dict[str, Any]:
    """The document of a run stopped before its measured window opened: the phases it got through, and the
    same shape as any other run (harness keys, a FAIL `summary` of an empty window, `stop_reason`).
    `reason`: why it stopped (INTERRUPTED_EARLY, or e.g. "stopped before the measured phase: rank 1
    failed"), in `stop_reason`, `measurement.stop_reason` and the notes."""
    if settings is None:
        return results_document({"interrupted": True, "stop_reason": reason, "phases": phases})
    metrics = metrics if metrics is not None else RunMetrics()
    summary = build_summary(RunMetrics(), {}, settings.config.qos_profiles, settings.outputs.performance_profile,
                            settings.config.performance_criteria, 0.0, None, True)
    results = results_document(request_lists(RunMetrics()))
    results.update({"interrupted": True, "stop_reason": reason, "seed": settings.seed,
                    **rank_keys(settings, run_id), "summary": summary, **harness_keys(summary)})
    results["measurement"] = {"tool": f"kv-cache {__version__}", "run_mode": run_mode(settings),
                              "stop_reason": reason, "errors": int(sum(metrics.errors.values())),
                              "errors_by_kind": dict(metrics.errors), "first_error": metrics.first_error,
                              "notes": [reason]}
    results["run_parameters"] = run_parameters(settings, started or datetime.now())
    results["throughput_timeline"] = []
    results["phases"] = phases
    results["measurement"]["process_libraries"] = snapshot_at_start()
    results["integrity"] = audit_facts(facts_from_ours(results))
    return results


def build_results(record: RunRecord) -> dict[str, Any]:
    settings, metrics, outcome = record.settings, record.metrics, record.outcome
    summary = run_summary(record)
    results = results_document(request_lists(metrics))
    results["seed"] = settings.seed
    results.update(rank_keys(settings, record.run_id))
    results["stop_reason"] = outcome.stop_reason
    results["summary"] = summary
    results.update(harness_keys(summary))
    results["measurement"] = measurement(record)
    results["measurement"]["window_wallclock"] = window_wallclock(metrics, record.barrier_aligned)
    results["latency_samples"] = latency_samples(metrics)  # for an exact merge of ranks (results/merge.py)
    results["recorder"] = metrics.state()  # a merge adds the ranks' recorders up (results/merge.py)
    results["summary_inputs"] = summary_inputs(settings)
    results["run_parameters"] = run_parameters(settings, record.started, record.tier_sizes)
    if outcome.plans:
        results["_plans"] = outcome.plans  # only when asked for (tests of reproducibility)
    results["throughput_timeline"] = outcome.timeline
    results["time_series"] = time_series(metrics)
    results["latency_histograms"] = latency_histograms(metrics)
    if record.trace is not None:
        results["trace_replay"] = trace_replay(settings, record.trace)
    if record.phases:
        results["phases"] = record.phases
    if settings.workload.validation_trace_stats is not None and metrics.requests.completed > 0:
        cs = Figures.from_json(summary).cache
        results["validation"] = compare(settings.workload.validation_trace_stats, cs.hit_rate, cs.requests.read_write_ratio)
    if record.tracer is not None:
        results["measurement"]["io_trace"] = {"path": record.tracer.path, "rows": record.tracer.rows}
    results["measurement"]["process_libraries"] = snapshot_at_start()  # taken when the run started
    results["integrity"] = audit_facts(facts_from_ours(results))  # kv-cache audit's verdict (results/integrity.py)
    return results


def run_summary(record: RunRecord) -> dict[str, Any]:
    """The `summary` (MLPerf JSON layout) plus the mode-specific parts; present even when no request
    completed (its verdict is then FAIL). A storage tier that moved no bytes is said loudly, in the notes too."""
    settings, metrics, outcome = record.settings, record.metrics, record.outcome
    error_rate = outcome.requests_failed / max(1, outcome.requests_issued)
    summary = build_summary(metrics, record.usage, settings.config.qos_profiles, settings.outputs.performance_profile,
                            settings.config.performance_criteria, error_rate,
                            fatal_error=getattr(outcome, "fatal_error", None), storage_expected=True)
    exercised = Figures.from_json(summary).cache.storage_gb_moved > 0
    summary["storage_tier_exercised"] = exercised
    if not exercised and never_exercised_note() not in record.notes:
        record.notes.append(never_exercised_note())
    summary["per_turn"] = per_turn_stats(metrics)
    if settings.workload.kv_block_tokens > 0:
        summary["block_stats"] = block_stats(metrics, settings.workload.kv_block_tokens)
    if record.autoscaler is not None:
        summary["autoscaling_stats"] = record.autoscaler.history
        own = record.autoscaler.summary() if callable(getattr(record.autoscaler, "summary", None)) else None
        summary["autoscaling_summary"] = summarise(own, summary["autoscaling_stats"], settings.driver.autoscaler_mode,
                                                   settings.workload.num_users)
    if record.rag is not None:
        c = metrics.snapshot_counters()
        summary["rag_stats"] = {
            "documents_retrievable": len(record.rag.live),
            "chunk_hits": int(c.get(names.RAG_CHUNK_HITS, 0)),
            "chunk_misses": int(c.get(names.RAG_CHUNK_MISSES, 0)),
        }
    return summary


def _storage_setup(record: RunRecord) -> dict[str, Any]:
    fs, settings = record.file_store, record.settings
    return {
        "io_mode": fs.io_mode if fs is not None else "trace (no I/O)",
        "direct_io": fs is not None and fs.io_mode == "direct",
        "chunk_bytes": settings.storage.chunk_bytes,
        "fsync": settings.storage.fsync,
        "io_workers": record.workers,
        "run_dir": str(fs.run_dir) if fs is not None else None,
        "filesystem": fs.fs_type if fs is not None else None,
        "filesystem_kind": meas.filesystem_kind(fs.fs_type) if fs is not None else None,
        "storage_capacity_bytes": meas.storage_capacity_bytes(record.usage),
        "cpu_tier_bytes": (getattr(record.memory_store, "capacity_bytes", int(settings.tiers.cpu_mem_gb * GIB))
                           if record.memory_store is not None else 0),  # as clamped to the memory there is
        "gpu_tier": record.gpu_store.stats() if record.gpu_store is not None else "absent",
        "storage_gds": fs.gds_info() if hasattr(fs, "gds_info") else "off",
    }


def _total(settings: RunSettings, name: str) -> Any:
    """The total given for a setting the ranks split (None: one process, or flags given per rank)."""
    if settings.flags_per_rank or not settings.rank_totals:
        return None
    return settings.rank_totals.get(name)


def _window(record: RunRecord) -> dict[str, Any]:
    outcome = record.outcome
    return {
        "window_seconds": record.metrics.window_seconds,
        "stop_reason": outcome.stop_reason,
        "requests_issued": outcome.requests_issued,
        "requests_abandoned_at_stop": outcome.requests_abandoned,
        "requests_failed": outcome.requests_failed,
        "requests_rejected": outcome.requests_rejected,
        **meas.offered_load(outcome, record.settings.driver.request_rate, record.metrics.window_seconds,
                            record.notes, _total(record.settings, "request_rate")),
        "final_active_users": outcome.final_active_users,
        **meas.in_flight_at_stop(outcome),
    }


def measurement(record: RunRecord) -> dict[str, Any]:
    metrics = record.metrics
    skips, skip_notes = meas.tier_skips(record.usage)
    record.notes.extend(n for n in skip_notes if n not in record.notes)
    name = record.blockdev.name if record.blockdev is not None else None
    return {
        "tool": f"kv-cache {__version__}",
        "timed": meas.TIMED,
        "device_timer": meas.timedio.timer_info(),
        "run_mode": run_mode(record.settings),
        **_storage_setup(record),
        **_window(record),
        "counters": dict(metrics.snapshot_counters()),
        "after_window": meas.after_window(metrics),
        "window_edge": meas.window_edge(metrics),
        "achieved_queue_depth": meas.queue_depth(metrics),
        **meas.host_cost(metrics, record.rusage0),
        "block_device": meas.block_device(metrics, name, record.disk_before, record.disk_after),
        "process_io": record.process_io,
        "device_limit": _device_limit(record.settings, name),
        "entry_size_mib": meas.entry_size_mib(record.entry_sizes),
        "errors": int(sum(metrics.errors.values())),
        "errors_by_kind": dict(metrics.errors),
        "first_error": metrics.first_error,
        **meas.storage_errors(metrics, record.settings.storage.io_retries,
                              record.settings.storage.max_storage_errors, record.settings.storage.verify),
        "storage_fill": meas.storage_fill(record.usage),
        "tier_skipped_entries": skips,
        "notes": record.notes,
        "storage_location": _storage_location(record.file_store),
        **({"tier_backends": dict(record.tier_backends)} if record.tier_backends else {}),
        **({"tier_shaping": dict(record.tier_shaping)} if record.tier_shaping else {}),
    }


def _device_limit(settings: RunSettings, device: str | None) -> dict[str, Any]:
    """measurement.device_limit: --device-limit-gbs, else the drive's PCIe link from sysfs, else why none."""
    given = getattr(settings.storage, "device_limit_gbs", 0.0) or 0.0
    if given > 0:
        return {"gb_per_s": float(given), "source": f"--device-limit-gbs {given:g}"}
    if device is None:
        return {"gb_per_s": None, "source": None, "note": "no block device under the storage tier: no limit known"}
    return sysfs_limit(device)


def _storage_location(fs: StorageTierStore | None) -> dict[str, Any]:
    """measurement.storage_location (results/measurement.py): the storage the run measured, for readers."""
    if fs is None:
        return meas.storage_location(None, "trace (no I/O)")
    if getattr(fs, "io_mode", None) == "network":  # a remote tier: a URL, no mount, no block device
        return {"cache_dir": fs.cache_dir, "mount_point": None, "filesystem": fs.fs_type,
                "filesystem_kind": "remote", "mount_source": getattr(fs, "endpoint_host", None),
                "block_device": None, "io_mode": fs.io_mode, "io_mode_reason": fs.io_mode_reason}
    return meas.storage_location(getattr(fs, "cache_dir", fs.run_dir), fs.io_mode, getattr(fs, "io_mode_reason", None))


def trace_replay(settings: RunSettings, trace: TraceReplay) -> dict[str, Any]:
    if settings.driver.request_rate > 0:
        replay = "open loop, Poisson"
    elif trace.sessions is not None:
        replay = "closed-loop sessions"
    else:
        replay = "open loop, recorded timestamps"
    return {
        "format": trace.format,
        "paths": list(settings.workload.trace_paths),
        "replay": replay,
        "trace_speedup": settings.workload.trace_speedup,
        "think_time": settings.workload.think_time.kind if settings.workload.think_time else "trace",
        "sessions": len(trace.sessions) if trace.sessions is not None else None,
        "kv_block_tokens": settings.workload.kv_block_tokens,
        "trace_block_tokens": trace.sources[0].block_tokens,
        "stats": [src.summary() for src in trace.sources],  # per file: its own rows and skips, and what was
        # replayed of it over every pass (`replayed`)
    }
