"""`kv-cache compare --plots DIR`: the runs overlaid, one PNG per figure and one line per run, and a page.

Figures (a figure no run has data for is not drawn):
- latency_cdf_storage_read.png, latency_cdf_storage_write.png: CDF of the storage read / write device time
  per KV entry operation; latency_cdf_end_to_end.png: CDF of the request latency. From each run's
  HdrHistograms, or from its percentiles where it has no histograms (merged documents; marked so);
- throughput_storage_read.png, throughput_storage_write.png: storage GiB/s per 1-second bucket over the
  measured window (runs without a time series are named in the figure as absent);
- ladder.png (sessions results): per-GPU throughput against concurrent sessions, per configuration and run.
Each line is labelled with its run's letter and storage; every figure lists the runs' files and storage at
its top and in its PNG text fields; index.html adds the comparison table.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.render.html import figures_html
from kv_cache.render.plots import latency_curve, pyplot, save_figure
from kv_cache.results.storage_info import storage_facts, storage_label

LATENCIES = (("latency_cdf_storage_read", "storage_read_device", "storage read, device time per KV entry operation"),
             ("latency_cdf_storage_write", "storage_write_device", "storage write, device time per KV entry operation"),
             ("latency_cdf_end_to_end", "request_e2e_total", "end-to-end request latency"))
# merged documents keep their latencies under other names (latency_ms)
MERGED_NAMES = {"request_e2e_total": "end_to_end"}
THROUGHPUTS = (("throughput_storage_read", "storage_read_gibps", "storage read GiB/s"),
               ("throughput_storage_write", "storage_write_gibps", "storage write GiB/s"))


def run_label(letter: str, doc: dict[str, Any]) -> str:
    """'A: ext4 vda /mnt/nvme direct': a run's letter and the storage facts that tell it apart."""
    f = storage_facts(doc)
    parts = [f["filesystem"], f["block_device"] or f["filesystem_kind"], f["cache_dir"], f["io_mode"]]
    return f"{letter}: " + " ".join(str(p) for p in parts if p)


def legend_text(names: list[str], docs: list[dict[str, Any]]) -> str:
    """One line per run: its letter, file and storage (the text at the top of every overlay)."""
    return "\n".join(f"{chr(65 + i)} = {name}: {storage_label(d)}" for i, (name, d) in enumerate(zip(names, docs,
                                                                                                      strict=True)))


def _latency(doc: dict[str, Any], name: str):
    return latency_curve(doc, name) or latency_curve(doc, MERGED_NAMES.get(name, name))


def latency_overlays(names: list[str], docs: list[dict[str, Any]], out: Path) -> list[Path]:
    plt = pyplot()
    written = []
    for stem, name, what in LATENCIES:
        curves = [(i, _latency(d, name)) for i, d in enumerate(docs)]
        if not any(c for _, c in curves):
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, found in curves:
            if found:
                (xs, ys), points_only = found
                label = run_label(chr(65 + i), docs[i]) + (" (percentiles only)" if points_only else "")
                ax.step(xs, ys, where="post", marker="o" if points_only else None, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log scale)")
        ax.set_ylabel("fraction of operations" if name != "request_e2e_total" else "fraction of requests")
        ax.set_title(f"Latency CDF: {what}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        written.append(save_figure(fig, out / f"{stem}.png", legend_text(names, docs)))
    return written


def throughput_overlays(names: list[str], docs: list[dict[str, Any]], out: Path) -> list[Path]:
    plt = pyplot()
    written = []
    for stem, column, what in THROUGHPUTS:
        series = [(i, [(r["t_s"], r[column]) for r in ((d.get("time_series") or {}).get("rows") or []) if column in r])
                  for i, d in enumerate(docs)]
        if not any(pts for _, pts in series):
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, pts in series:
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=run_label(chr(65 + i), docs[i]))
        absent = [chr(65 + i) for i, pts in series if not pts]
        ax.set_xlabel("seconds into the measured window")
        ax.set_ylabel(f"{what} (1-second buckets)")
        ax.set_title(f"Throughput over time: {what}" + (f" (no time series: {', '.join(absent)})" if absent else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        written.append(save_figure(fig, out / f"{stem}.png", legend_text(names, docs)))
    return written


def ladder_overlay(names: list[str], docs: list[dict[str, Any]], out: Path) -> list[Path]:
    if not any(d.get("rungs") for d in docs):
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, d in enumerate(docs):
        rungs = d.get("rungs") or []
        for cfg in dict.fromkeys(r["tiers"] for r in rungs):
            mine = sorted((r for r in rungs if r["tiers"] == cfg), key=lambda r: r["sessions"])
            ax.plot([r["sessions"] for r in mine], [r["throughput_tokens_per_s_per_gpu"]["estimate"] for r in mine],
                    marker="o", label=f"{run_label(chr(65 + i), d)} [{cfg}]")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Sessions ladder: per-GPU throughput by run and offload configuration")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return [save_figure(fig, out / "ladder.png", legend_text(names, docs))]


def draw_compare_plots(names: list[str], docs: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Every overlay the documents have data for, as PNGs in `out_dir` (created); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    try:
        return [*latency_overlays(names, docs, out), *throughput_overlays(names, docs, out),
                *ladder_overlay(names, docs, out)]
    finally:
        plt.close("all")


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:90%}}img{{max-width:100%}}</style>
</head><body><h1>kv-cache compare</h1>
<h2>Runs and their storage</h2>
<table><tr><th>run</th><th>file</th><th>filesystem</th><th>block device</th><th>cache directory</th>
<th>I/O mode</th><th>tiers</th></tr>{runs}</table>
<h2>Comparison</h2>
<pre>{table}</pre>
<h2>Plots</h2>
{figures}
</body></html>
"""


def write_compare_html(names: list[str], docs: list[dict[str, Any]], table: list[str], pngs: list[Path],
                       out_dir: str | Path) -> Path:
    """index.html in `out_dir`: the runs and their storage, the comparison table, the overlays."""
    rows = []
    for i, (name, d) in enumerate(zip(names, docs, strict=True)):
        f = storage_facts(d)
        cells = [chr(65 + i), name, f["filesystem"], f["block_device"] or f["filesystem_kind"], f["cache_dir"],
                 f["io_mode"], f["tiers"]]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c) if c is not None else 'unknown')}</td>" for c in cells)
                    + "</tr>")
    title = "kv-cache compare: " + " vs ".join(run_label(chr(65 + i), d) for i, d in enumerate(docs))
    page = PAGE.format(title=html.escape(title), runs="".join(rows), table=html.escape("\n".join(table)),
                       figures=figures_html(pngs, legend_text(names, docs)))
    path = Path(out_dir) / "index.html"
    keep_existing(path)  # an earlier page stays as index.html.1 (it embeds its own PNGs)
    with atomic_target(path) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return path
