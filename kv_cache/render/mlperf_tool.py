"""`kv-cache report` of the MLPerf tool's own rank file, and its `--plots`: each figure with what it means
(results/mlperf_tool.py KEYS), `missing` where the file lacks the key, never a traceback."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kv_cache.results.mlperf_tool import KEYS, MlperfToolRank

__all__ = ["COMPARED", "compare_rows", "compare_table", "draw_mlperf_compare", "draw_mlperf_plots", "mlperf_report_lines",
           "print_mlperf_report", "seed_differences", "summary_compare_rows", "summary_compare_table"]

GIB = float(1 << 30)


def _v(view: MlperfToolRank, name: str, digits: int = 3) -> str:
    v = view.values.get(name)
    if v is None:
        return f"missing ({'.'.join(KEYS[name][0])})"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{digits}f}" if not v.is_integer() else f"{v:,.0f}"


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
    if view.not_numbers:
        lines.append(f"Keys that are not numbers (read as missing): {', '.join(view.not_numbers)}")
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


COMPARED = ("requests_completed", "elapsed_s", "avg_tokens_per_s", "storage_tokens_per_s", "read_gibps", "write_gibps",
            "read_ops", "write_ops", "read_device_p95_ms", "write_device_p95_ms", "read_p95_ms", "write_p95_ms",
            "request_storage_p95_ms", "e2e_p95_ms", "cache_hit_rate")


def seed_differences(views: list[MlperfToolRank]) -> list[str]:
    """'seed: A=42, B=43' when the files' seeds differ (a missing seed counts as different)."""
    seeds = [v.values.get("seed") for v in views]
    if len(set(map(str, seeds))) <= 1:
        return []
    return ["seed: " + ", ".join(f"{chr(65 + i)}={s if s is not None else 'missing'}" for i, s in enumerate(seeds))]


def compare_rows(views: list[MlperfToolRank]) -> list[dict[str, Any]]:
    """One row per figure of COMPARED: each side's value (None where a file lacks it) and the ratio to A."""
    rows = []
    for name in COMPARED:
        vals = [v.values.get(name) for v in views]
        base = vals[0]
        rows.append({"metric": name, "meaning": KEYS[name][1], "values": vals,
                     "ratio_to_a": [None if base in (None, 0) or x is None else x / base for x in vals]})
    return rows


def _side_by_side(legend: list[str], title: str, rows: list[dict[str, Any]], label: Callable[[dict[str, Any]], str],
                  widths: tuple[int, int, int]) -> list[str]:
    """The legend (one line per side), then a line per row: its label, each side's value ('missing' where it
    has none) and the ratios to A; `widths`: of the label, of a value and of a ratio."""
    wide, value, ratio = widths
    n = len(legend)
    head = f"{title:<{wide}}" + "".join(f"{chr(65 + i):>{value}}" for i in range(n)) + "".join(
        f"{chr(65 + i) + '/A':>{ratio}}" for i in range(1, n))
    lines = [*legend, "", head]
    for row in rows:
        cells = "".join(f"{'missing' if x is None else f'{x:,.3f}':>{value}}" for x in row["values"])
        ratios = "".join(f"{'-' if r is None else f'{r:.3f}':>{ratio}}" for r in row["ratio_to_a"][1:])
        lines.append(f"{label(row):<{wide}}{cells}{ratios}")
    return lines


def compare_table(names: list[str], views: list[MlperfToolRank]) -> list[str]:
    legend = [f"{chr(65 + i)}: {n} ({'MLPerf tool' if 'schema_version' not in v.data else 'kv-cache'} rank file)"
              for i, (n, v) in enumerate(zip(names, views, strict=True))]
    lines = _side_by_side(legend, "metric", compare_rows(views), lambda row: row["metric"], (24, 16, 10))
    lines += ["", "write_device_p95_ms of the MLPerf tool is the fsync alone; read_ops / write_ops are counts; "
                  "storage_tokens_per_s divides by summed per-request storage time."]
    return lines


# the harness summary.json's per-option aggregates, with what each one is
SUMMARY_COMPARED = {
    "aggregated_read_bandwidth_gbps": "storage read GiB/s, summed over ranks, mean over trials",
    "aggregated_write_bandwidth_gbps": "storage write GiB/s, summed over ranks, mean over trials",
    "aggregated_avg_throughput_tokens_per_sec": "tokens/s (wall clock), summed over ranks, mean over trials",
    "aggregated_storage_throughput_tokens_per_sec": "tokens/s of summed storage time, summed, mean over trials",
    "aggregated_p95_latency_ms": "max over ranks of the per-request storage time P95, ms",
    "aggregated_storage_read_p95_ms": "max over ranks of the storage read P95 (host + device), ms",
    "rank_count": "ranks", "trial_count": "trials"}


def _finite(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def summary_compare_rows(options: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per option and aggregate of the harness summaries (`HarnessSummary.options` each): each side's
    value (None where a summary lacks the option or the key, or it is no number) and the ratio to A."""
    rows = []
    for key in sorted({k for o in options for k in o}, key=lambda k: (len(k), k)):
        for name, meaning in SUMMARY_COMPARED.items():
            vals = [_finite((o.get(key) or {}).get(name)) for o in options]
            base = vals[0]
            rows.append({"option": key, "metric": name, "meaning": meaning, "values": vals,
                         "ratio_to_a": [None if not base or x is None else x / base for x in vals]})
    return rows


def summary_compare_table(names: list[str], options: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The summaries side by side, per option ('missing' where one lacks a figure)."""
    legend = [f"{chr(65 + i)}: {n} (mlpstorage harness summary.json)" for i, n in enumerate(names)]
    lines = _side_by_side(legend, "option metric", summary_compare_rows(options),
                          lambda row: row["option"] + " " + row["metric"], (52, 14, 9))
    if len(lines) == len(names) + 2:
        lines.append("(no option in any summary)")
    return lines


def draw_mlperf_compare(names: list[str], views: list[MlperfToolRank], plots_dir: str) -> list[Path]:
    """latency_cdf.png: each file's per-request end-to-end latency CDF, overlaid (none drawn when no file
    keeps the list)."""
    from kv_cache.render.plots import pyplot, save_figure  # noqa: PLC0415  (matplotlib is optional)

    series = [(chr(65 + i), sorted(v.latencies_s("end_to_end_latencies"))) for i, v in enumerate(views)]
    if not any(values for _label, values in series):
        return []
    plt = pyplot()
    Path(plots_dir).mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, values in series:
        if values:
            ax.plot([x * 1e3 for x in values], [(i + 1) / len(values) for i in range(len(values))],
                    label=f"{label} ({len(values)} requests)")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end ms per request")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Per-request end-to-end latency CDF")
    ax.legend()
    text = "; ".join(f"{chr(65 + i)}: {n}" for i, n in enumerate(names))
    return [save_figure(fig, Path(plots_dir) / "compare_latency_cdf.png", text)]
