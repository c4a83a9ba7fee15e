"""The lines printed before a standard run starts: what is about to be measured, on what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from kv_cache import __version__
from kv_cache.metrics.stats import mean
from kv_cache.results.parameters import generation_ms_per_token
from kv_cache.settings.ranks import setting_value

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.settings.run import RunSettings

LINE = "=" * 80


def _storage_where(settings: RunSettings, file_store: Any) -> str:
    if file_store is None:
        return f"trace only -> {settings.outputs.io_trace_log}"
    return f"{file_store.run_dir} ({file_store.fs_type}, {file_store.io_mode} I/O)"


# TierSet.sizes keys -> how the banner names them
_SIZE_LABELS = {"gpu_mem_gb": "GPU tier (per GPU)", "cpu_mem_gb": "CPU tier", "storage_capacity_gb": "Storage tier"}


def size_lines(sizes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per tier size in force that differs from the one asked for: clamped to a memory budget,
    or an automatic storage capacity bounded by it (e.g. `CPU tier: 20.38 GiB (asked 1000.00, clamped:
    ...)`)."""
    lines = []
    for key, label in _SIZE_LABELS.items():
        size = sizes.get(key)
        if size and size.get("clamped"):
            asked = "auto" if key == "storage_capacity_gb" and not size["asked"] else f"{size['asked']:.2f}"
            lines.append(f"{label}: {size['effective']:.2f} GiB (asked {asked}, clamped: {size['clamped']})")
    return lines


def _gib(settings: RunSettings, sizes: Mapping[str, Mapping[str, Any]], key: str) -> str:
    size = sizes.get(key)
    asked = getattr(settings.tiers, key) * (settings.tiers.num_gpus if key == "gpu_mem_gb" else 1)
    if not size or not size.get("clamped"):
        return f"{asked:g} GiB"
    scale = settings.tiers.num_gpus if key == "gpu_mem_gb" else 1
    return f"{size['effective'] * scale:.2f} GiB (asked {asked:g}, clamped)"


def banner_lines(settings: RunSettings, context_lengths: Sequence[int], workers: int, file_store: Any,
                 sizes: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """`context_lengths`: the synthetic users' context sizes (empty for a trace, whose sizes vary per row).
    `file_store`: the storage tier's store (run_dir, fs_type, io_mode), None in trace mode. `sizes`: the
    tier sizes in force (TierSet.sizes); a clamped one is shown beside the one asked for."""
    sizes = sizes or {}
    m = settings.model
    lines = [LINE, f"Integrated Multi-User KV Cache Benchmark - MLPerf Edition (kv-cache {__version__})",
             f"Model: {m.name} ({m.bytes_per_token:,} bytes/token)",
             f"GPU Memory: {_gib(settings, sizes, 'gpu_mem_gb')} | CPU Memory: {_gib(settings, sizes, 'cpu_mem_gb')}"
             f" | Storage: {_storage_where(settings, file_store)}",
             *size_lines(sizes),
             f"Users: {settings.workload.num_users} | Duration: {settings.driver.duration:g} s | Seed: {settings.effective_seed}"
             f" | Generation: {settings.driver.generation_mode} ({generation_ms_per_token(settings):.1f} ms/token)"
             f" | I/O workers: {workers}"]
    feats = [f"multi-turn {'on' if settings.workload.multi_turn else 'off'}",
             f"prefix caching {'on' if settings.workload.prefix_caching else 'off'}"]
    if settings.driver.max_concurrent_allocs:
        feats.append(f"max concurrent requests {settings.driver.max_concurrent_allocs}")
    if settings.driver.max_requests:
        feats.append(f"stop after {settings.driver.max_requests} requests")
    lines.append("Features: " + ", ".join(feats))
    if settings.driver.start_delay > 0 or settings.driver.end_delay > 0:
        lines.append(delay_line(settings))
    if settings.mpi_world_size > 1:
        lines.append(rank_line(settings))
    if settings.workload.trace_paths:
        layout = f"{settings.workload.kv_block_tokens}-token blocks" if settings.workload.kv_block_tokens else "entry per request"
        lines.append(f"Trace: {', '.join(settings.workload.trace_paths)} ({settings.workload.trace_format}), speed-up "
                     f"{settings.workload.trace_speedup:g}{' (no pacing)' if settings.workload.trace_speedup == 0 else ''}, "
                     f"KV layout: {layout}")
    ctx = list(context_lengths)
    if ctx:
        bpt = m.bytes_per_token / settings.tiers.tensor_parallel
        lines.append(f"User context lengths: min {min(ctx)}, max {max(ctx)}, mean {mean(ctx):.0f} tokens "
                     f"(max entry {max(ctx) * bpt / 2**20:.1f} MiB)")
    lines.append(LINE)
    return lines


def rank_line(settings: RunSettings) -> str:
    """Which share of the run this rank is: `Rank 1 of 2: its share of the totals given (users 50 of 100,
    ...)`, or that every rank was given its own values."""
    head = f"Rank {settings.mpi_rank} of {settings.mpi_world_size}: "
    if settings.flags_per_rank or not settings.rank_totals:
        return head + "the flags are this rank's own values (per rank)"
    shares = [f"{name} {setting_value(settings, name):g} of {total:g}" for name, total in settings.rank_totals.items()
              if name != "seed" and total]
    return head + "its share of the totals given (" + ", ".join(shares) + ")"


def delay_line(settings: RunSettings) -> str:
    """The settle waits around the run (--start-delay / --end-delay), said in the banner when there are any."""
    return (f"Settle time: waited {settings.driver.start_delay:g} s before the run (--start-delay), "
            f"{settings.driver.end_delay:g} s after its results are written (--end-delay)")


def print_banner(settings: RunSettings, context_lengths: Sequence[int], workers: int, file_store: Any,
                 out: TextIO, sizes: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    out.write("".join(line + "\n" for line in banner_lines(settings, context_lengths, workers, file_store, sizes)))
    out.flush()


def ranks_lines(settings: RunSettings, shares: Mapping[int, RunSettings],
                sizes: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """Under `--processes`: each process's share of the totals given and its tier sizes in force
    (TierSet.sizes, as each process sent them; a clamped one says so), then the totals over the processes
    beside the totals asked for. `shares`: each rank's settings; `sizes`: those that sent theirs."""
    n = len(shares)
    names = [name for name, total in (shares[0].rank_totals or {}).items()
             if name != "seed" and total and (name != "rag_num_docs" or settings.workload.enable_rag)]
    lines = [f"Processes: {n} on this host, one common window; each one's share of the totals given and its "
             "tier sizes in force:"]
    for r in sorted(shares):
        share = ", ".join(f"{name} {setting_value(shares[r], name):g}" for name in names)
        tiers = _rank_tiers(shares[r], sizes.get(r))
        lines.append(f"  rank {r}: {share}, seed {shares[r].effective_seed} | {tiers}")
    totals = ", ".join(f"{name} {total:g}" for name, total in (shares[0].rank_totals or {}).items()
                       if name in names)
    lines.append(f"  total: {totals} | {_total_tiers(settings, shares, sizes)}")
    return lines


def _over_ranks(label: str) -> str:
    """A tier's label in the per-rank lines, whose GPU figure is all of a rank's GPUs (HBM, not entries:
    under tensor parallelism an entry is held on each GPU of its group)."""
    return label.replace(" (per GPU)", " (HBM of all GPUs)")


def _tier_gib(share: RunSettings, key: str, size: Mapping[str, Any]) -> tuple[float, float]:
    """(in force, asked) GiB of a rank's tier, a GPU tier over all its GPUs."""
    scale = share.tiers.num_gpus if key == "gpu_mem_gb" else 1
    return float(size["effective"]) * scale, float(size["asked"]) * scale


def _rank_tiers(share: RunSettings, sizes: Mapping[str, Mapping[str, Any]] | None) -> str:
    if sizes is None:
        return "tier sizes not known (the process ended before it sent them)"
    parts = []
    for key, label in _SIZE_LABELS.items():
        size = sizes.get(key)
        if size:
            effective, _ = _tier_gib(share, key, size)
            parts.append(f"{_over_ranks(label)} {effective:.2f} GiB" + (" (clamped)" if size.get("clamped") else ""))
    return ", ".join(parts) or "no tier sizes"


def _total_tiers(settings: RunSettings, shares: Mapping[int, RunSettings],
                 sizes: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> str:
    parts = []
    for key, label in _SIZE_LABELS.items():
        got = [_tier_gib(shares[r], key, s[key]) for r, s in sorted(sizes.items()) if s.get(key)]
        if not got:
            continue
        effective, asked = sum(g[0] for g in got), sum(g[1] for g in got)
        asked_text = "auto" if key == "storage_capacity_gb" and not asked else f"{asked:.2f}"
        partial = f", {len(got)} of {len(shares)} processes" if len(got) < len(shares) else ""
        parts.append(f"{_over_ranks(label)} {effective:.2f} GiB in force (asked {asked_text}{partial})")
    return ", ".join(parts) or "no tier sizes"
