"""The lines printed before a standard run starts: what is about to be measured, on what."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from kv_cache import __version__
from kv_cache.metrics.stats import mean
from kv_cache.report.parameters import generation_ms_per_token

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.config.run import RunSettings

LINE = "=" * 80


def _storage_where(settings: RunSettings, file_store: Any) -> str:
    if file_store is None:
        return f"trace only -> {settings.io_trace_log}"
    return f"{file_store.run_dir} ({file_store.fs_type}, {file_store.io_mode} I/O)"


def banner_lines(settings: RunSettings, context_lengths: Sequence[int], workers: int, file_store: Any) -> list[str]:
    """`context_lengths`: the synthetic users' context sizes (empty for a trace, whose sizes vary per row)."""
    """`file_store`: the storage tier's store (run_dir, fs_type, io_mode), None in trace mode."""
    m = settings.model
    lines = [LINE, f"Integrated Multi-User KV Cache Benchmark - MLPerf Edition (kv-cache {__version__})",
             f"Model: {m.name} ({m.bytes_per_token:,} bytes/token)",
             f"GPU Memory: {settings.gpu_mem_gb * settings.num_gpus:g} GiB | CPU Memory: {settings.cpu_mem_gb:g} GiB"
             f" | Storage: {_storage_where(settings, file_store)}",
             f"Users: {settings.num_users} | Duration: {settings.duration:g} s | Seed: {settings.effective_seed}"
             f" | Generation: {settings.generation_mode} ({generation_ms_per_token(settings):.1f} ms/token)"
             f" | I/O workers: {workers}"]
    feats = [f"multi-turn {'on' if settings.multi_turn else 'off'}",
             f"prefix caching {'on' if settings.prefix_caching else 'off'}"]
    if settings.max_concurrent_allocs:
        feats.append(f"max concurrent requests {settings.max_concurrent_allocs}")
    if settings.max_requests:
        feats.append(f"stop after {settings.max_requests} requests")
    lines.append("Features: " + ", ".join(feats))
    if settings.trace_paths:
        layout = f"{settings.kv_block_tokens}-token blocks" if settings.kv_block_tokens else "entry per request"
        lines.append(f"Trace: {', '.join(settings.trace_paths)} ({settings.trace_format}), speed-up "
                     f"{settings.trace_speedup:g}{' (no pacing)' if settings.trace_speedup == 0 else ''}, "
                     f"KV layout: {layout}")
    ctx = list(context_lengths)
    if ctx:
        bpt = m.bytes_per_token / settings.tensor_parallel
        lines.append(f"User context lengths: min {min(ctx)}, max {max(ctx)}, mean {mean(ctx):.0f} tokens "
                     f"(max entry {max(ctx) * bpt / 2**20:.1f} MiB)")
    lines.append(LINE)
    return lines


def print_banner(settings: RunSettings, context_lengths: Sequence[int], workers: int, file_store: Any,
                 out: TextIO) -> None:
    out.write("".join(line + "\n" for line in banner_lines(settings, context_lengths, workers, file_store)))
    out.flush()
