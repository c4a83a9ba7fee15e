"""`kv-cache report` of the MLPerf tool's own rank file, and its `--plots`: each figure with what it means
(results/mlperf_tool.py KEYS), `missing` where the file lacks the key, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from kv_cache.results.mlperf_tool import KEYS, MlperfToolRank

__all__ = ["draw_mlperf_plots", "mlperf_report_lines", "print_mlperf_report"]

GIB = float(1 << 30)


def _v(view: MlperfToolRank, name: str, digits: int = 3) -> str:
    v = view.values.get(name)
    if v is None:
        return f"missing ({'.'.join(KEYS[name][0])})"
    return f"{v:,.{digits}f}" if isinstance(v, float) and not v.is_integer() else f"{v:,.0f}" if isinstance(
        v, float) else str(v)


def _line(view: MlperfToolRank, name: str, label: str, unit: str = "", digits: int = 3) -> str:
    return f"  {label:<46} {_v(view, name, digits)}{(' ' + unit) if unit and view.values.get(name) is not None else ''}"


def _derived(view: MlperfToolRank) -> list[str]:
    """Figures the keys imply, said as such."""
    out = []
    if view.read_ops is not None and view.elapsed_s:
        out.append(f"  read operations per second (count / window)     {view.read_ops / view.elapsed_s:,.2f}")
    if view.write_ops is not None and view.elapsed_s:
        out.append(f"  write operations per second (count / window)    {view.write_ops / view.elapsed_s:,.2f}")
    if view.storage_io_s is not None and view.elapsed_s:
        out.append(f"  mean requests in storage I/O (summed time / window) {view.storage_io_s / view.elapsed_s:,.1f}")
    if view.write_gib and view.write_ops and view.write_device_p95_ms:
        per_op = view.write_gib * GIB / view.write_ops
        out.append(f"  mean write size {per_op / 1e6:,.1f} MB: at the write device P95 that would be "
                   f"{per_op / (view.write_device_p95_ms / 1e3) / 1e9:,.1f} GB/s (the fsync alone is timed)")
    return out


def mlperf_report_lines(view: MlperfToolRank) -> list[str]:
    where = ", ".join(f"{k} {v}" for k, v in (("option", view.option), ("trial", view.trial), ("rank", view.rank))
                      if v is not None)
    lines = ["=" * 80, f"MLPerf tool results (its own rank file, read by kv-cache){': ' + where if where else ''}",
             f"  {view.source or ''}", "=" * 80,
             f"The tool's verdict: {_v(view, 'status')}"]
    for c in view.criteria or []:
        if isinstance(c, dict):
            lines.append(f"  [{'OK' if c.get('passed') else 'X'}] {c.get('name')}: {c.get('actual')} {c.get('unit', '')}"
                         f" (target {c.get('target')})")
    sections = [
        ("Requests", [("requests_completed", "requests completed", ""), ("tokens", "tokens", ""),
                      ("elapsed_s", "window", "s"), ("seed", "seed", "")]),
        ("Throughput", [("avg_tokens_per_s", "tokens/s over the window (wall clock)", "tok/s"),
                        ("storage_tokens_per_s", "tokens/s of summed storage time (not wall)", "tok/s"),
                        ("storage_io_s", "summed per-request storage time", "s")]),
        ("Storage tier", [("read_gib", "read", "GiB"), ("write_gib", "written", "GiB"),
                          ("read_gibps", "read bandwidth (bytes / window)", "GiB/s"),
                          ("write_gibps", "write bandwidth (bytes / window)", "GiB/s"),
                          ("read_ops", "read operations (a count)", ""), ("write_ops", "write operations (a count)", ""),
                          ("cache_hit_rate", "cache hit rate (all tiers)", ""),
                          ("storage_entries", "entries on storage at the end", "")]),
        ("Latency P95, ms", [("read_p95_ms", "storage read, host + device", "ms"),
                             ("read_device_p95_ms", "storage read, device (file read)", "ms"),
                             ("read_host_p95_ms", "storage read, host (deserialise)", "ms"),
                             ("write_p95_ms", "storage write, host + device", "ms"),
                             ("write_device_p95_ms", "storage write, device = fsync ALONE", "ms"),
                             ("write_host_p95_ms", "storage write, host (incl. write())", "ms"),
                             ("request_storage_p95_ms", "per-request summed storage time", "ms"),
                             ("e2e_p95_ms", "end to end per request", "ms")]),
    ]
    for title, rows in sections:
        lines += ["", f"### {title} ###"] + [_line(view, k, label, unit) for k, label, unit in rows]
    derived = _derived(view)
    if derived:
        lines += ["", "### Implied by those keys ###", *derived]
    lines += ["", f"Keys missing from this file: {', '.join(view.missing) if view.missing else 'none'}"]
    return lines


def print_mlperf_report(view: MlperfToolRank, out: TextIO) -> None:
    out.write("\n".join(mlperf_report_lines(view)) + "\n")


def draw_mlperf_plots(view: MlperfToolRank, plots_dir: str) -> list[Path]:
    """latency_cdf.png: the CDFs of the per-request lists the file keeps (end to end, storage); none drawn
    when both are empty. PlotsUnavailable without matplotlib."""
    from kv_cache.render.plots import pyplot, save_figure  # noqa: PLC0415  (matplotlib is optional)

    series: dict[str, Any] = {k: sorted(view.latencies_s(k)) for k in ("end_to_end_latencies", "storage_latencies")}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return []
    plt = pyplot()
    Path(plots_dir).mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in series.items():
        n = len(values)
        ax.plot([v * 1e3 for v in values], [(i + 1) / n for i in range(n)], label=f"{name} ({n} requests)")
    ax.set_xscale("log")
    ax.set_xlabel("ms per request")
    ax.set_ylabel("fraction of requests")
    ax.set_title("MLPerf tool rank file: per-request latency CDF")
    ax.legend()
    text = f"MLPerf tool rank file {view.source or ''} (option {view.option}, trial {view.trial}, rank {view.rank})"
    return [save_figure(fig, Path(plots_dir) / "latency_cdf.png", text)]
