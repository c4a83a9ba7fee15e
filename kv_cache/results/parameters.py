"""How the run was set up, in words and as the `run_parameters` block of the results document."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kv_cache.settings.ranks import totals
from kv_cache.settings.run import redacted_argv

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.run import RunSettings


def run_mode(settings: RunSettings) -> str:
    """One line naming what kind of run this is (shown before the window and kept in the results)."""
    parts = []
    if settings.driver.prefill_only:
        parts.append("PREFILL-ONLY (writes; no decode reads)")
    elif settings.driver.decode_only:
        parts.append("DECODE-ONLY (reads of pre-populated entries)")
    else:
        parts.append("standard (prefill+decode)")
    rate = settings.driver.request_rate
    if rate > 0:
        total = (settings.rank_totals or {}).get("request_rate") if not settings.flags_per_rank else None
        if total and total != rate:  # several ranks split the flag's total: it is what the run offers
            parts.append(f"open loop, Poisson arrivals at {total:g} req/s in all ({rate:g} per rank of "
                         f"{max(1, settings.mpi_world_size)})")
        else:
            parts.append(f"open loop, Poisson arrivals at {rate:g} req/s")
    else:
        parts.append("closed loop")
    if settings.driver.enable_autoscaling:
        parts.append(f"autoscaling ({settings.driver.autoscaler_mode})")
    if settings.outputs.io_trace_log:
        parts.append("TRACE MODE (no real I/O)")
    return ", ".join(parts)


def generation_ms_per_token(settings: RunSettings) -> float:
    return getattr(settings.config.generation_timing, settings.driver.generation_mode) * 1000


def settings_split(settings: RunSettings) -> dict[str, Any]:
    """How this rank's settings relate to the whole run's: `flags_given_as` "totals" (divided between the
    ranks: `totals` holds what was given, `rank_share` this rank's part), "per_rank" (each rank was given
    its own values, the mlperf_wrapper.py Rules' semantics: `totals` = ranks x the values, every rank
    being given the same flags) or "single" (one process: share = totals)."""
    ranks = max(1, settings.mpi_world_size)
    share = totals(settings)
    share["seed"] = settings.seed
    if settings.rank_totals is not None and not settings.flags_per_rank:
        given_as, whole = "totals", dict(settings.rank_totals)
    elif ranks > 1:
        given_as = "per_rank"
        whole = {k: (v * ranks if isinstance(v, (int, float)) and k != "seed" else v) for k, v in share.items()}
    else:
        given_as, whole = "single", dict(share)
    return {"flags_given_as": given_as, "ranks": ranks, "host_ranks": settings.tiers.host_ranks,
            "totals": whole, "rank_share": share}


def effective_sizes(sizes: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """`<setting>_effective` keys: the tier sizes in force after clamping (None where no tier was sized:
    trace mode, or no measured phase)."""
    sizes = sizes or {}
    return {f"{key}_effective": (sizes[key]["effective"] if key in sizes else None)
            for key in ("gpu_mem_gb", "cpu_mem_gb", "storage_capacity_gb")}


def run_parameters(settings: RunSettings, started: datetime,
                   sizes: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The `run_parameters` block: the settings as given (the flat keys, unchanged), the tier sizes in
    force beside them (`*_effective`, `tier_sizes`: from TierSet.sizes) and how the settings were divided
    between ranks (`settings_split`)."""
    return {
        "timestamp": started.isoformat(timespec="seconds"),
        "command": " ".join(redacted_argv(settings.argv)),
        "config_path": settings.config_path,
        "model": settings.model_name,
        "bytes_per_token": settings.model.bytes_per_token,
        "num_users": settings.workload.num_users,
        "duration": settings.driver.duration,
        "gpu_mem_gb": settings.tiers.gpu_mem_gb,
        "num_gpus": settings.tiers.num_gpus,
        "tensor_parallel": settings.tiers.tensor_parallel,
        "cpu_mem_gb": settings.tiers.cpu_mem_gb,
        "cache_dir": settings.tiers.cache_dir,
        "generation_mode": settings.driver.generation_mode,
        "generation_ms_per_token": generation_ms_per_token(settings),
        "performance_profile": settings.outputs.performance_profile,
        "multi_turn": settings.workload.multi_turn,
        "prefix_caching": settings.workload.prefix_caching,
        "seed": settings.seed,
        "max_concurrent_allocs": settings.driver.max_concurrent_allocs,
        "max_requests": settings.driver.max_requests,
        "storage_capacity_gb": settings.tiers.storage_capacity_gb,
        "request_rate": settings.driver.request_rate,
        "autoscaling": settings.driver.enable_autoscaling,
        "autoscaler_mode": settings.driver.autoscaler_mode if settings.driver.enable_autoscaling else None,
        "target_saturation": settings.driver.target_saturation if settings.driver.enable_autoscaling else None,
        "rag_enabled": settings.workload.enable_rag,
        "rag_num_docs": settings.workload.rag_num_docs if settings.workload.enable_rag else None,
        "precondition": settings.driver.precondition,
        "precondition_size_gb": settings.driver.precondition_size_gb,
        "precondition_threads": settings.driver.precondition_threads or os.cpu_count(),
        "prefill_only": settings.driver.prefill_only,
        "decode_only": settings.driver.decode_only,
        "io_trace_log": settings.outputs.io_trace_log,
        "validation_trace": settings.workload.validation_trace,
        "mpi_rank": settings.mpi_rank,
        "mpi_world_size": settings.mpi_world_size,
        "pid": os.getpid(),
        "host": socket.gethostname(),  # tells the ranks of a multi-host run apart in the merged rows
        **effective_sizes(sizes),
        "tier_sizes": {k: dict(v) for k, v in (sizes or {}).items()},
        "settings_split": settings_split(settings),
    }


def merged_settings_split(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The merged document's `settings_split`: the totals given (rank 0's record of them) and every rank's
    share, in rank order, so that a merged document never reads like one run of the flags given; None when
    the ranks' documents predate the record."""
    splits = [(d.get("run_parameters") or {}).get("settings_split") for d in docs]
    if not splits or any(s is None for s in splits):
        return None
    order = sorted(range(len(docs)), key=lambda i: (docs[i].get("run_parameters") or {}).get("mpi_rank") or 0)
    first = splits[order[0]]
    return {"flags_given_as": first["flags_given_as"], "ranks": len(docs), "totals": first["totals"],
            "rank_shares": [splits[i]["rank_share"] for i in order]}
