"""PNG plots of a results document (matplotlib, Agg backend: no display needed).

Drawn from the document alone, so a saved result plots exactly as the run that wrote it:
- latency_cdf.png: latency CDF per tier and operation (from the HdrHistograms in `latency_histograms`);
- throughput.png: GiB/s per tier and direction, and p95 latency, over time (from `time_series`);
- occupancy.png: bytes held per tier, queue depth and active users over time (from `time_series`);
- ladder.png (sessions results): per-GPU throughput and p90 TTFT of returning turns against concurrent sessions,
  per configuration, 95 % CIs (log2 x axis for doubling rungs; the SLO line when one was given).
A plot with nothing to show is not drawn. matplotlib is the `plots` extra; without it, PlotsUnavailable.

Every figure names the storage it measured at its top (filesystem, block device, cache directory, I/O mode,
tier configuration: results/storage_info.py), and carries the same text in the PNG's Title and Description
fields, so that two plot folders from two storages can be told apart once opened.

Drawing into a folder that already holds plots keeps each earlier file (a PNG, index.html) as `NAME.1`
(`.2`, ...) beside the new one, never overwriting it (host/files.py); each file is written to a temporary
name and renamed, so a folder never holds half a PNG. Files are kept one by one rather than the folder moved
aside: --plots may name a folder that holds other things, and an earlier index.html embeds its own PNGs, so
a kept page stays whole. kept_since names what was kept, for the message that names the plots.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.metrics.histograms import cdf_points, decode
from kv_cache.results.storage_info import storage_label, wrapped
from kv_cache.storage.tiername import TierName

GIB = float(1 << 30)
TIER_OPS = [(t, op) for t in TierName for op in ("read", "write")]
PERCENTILE_KEYS = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999), ("max", 1.0))


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed (pip install 'kv-cache[plots]')."""


def pyplot():
    """matplotlib.pyplot on the Agg backend; PlotsUnavailable without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415  (optional dependency, loaded only to plot)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise PlotsUnavailable("plots need matplotlib: pip install 'kv-cache[plots]'") from exc
    return plt


def caption(results: dict[str, Any]) -> str:
    """The storage line every figure of `results` carries."""
    return f"Storage: {storage_label(results)}"


def save_figure(fig, path: Path, text: str, title: str | None = None) -> Path:
    """`fig` as a PNG at `path`, with `text` (the storage it is about) above the plots and in the PNG's
    Title / Description fields."""
    lines = wrapped(text, int(fig.get_figwidth() * 14))  # about 14 characters of 8 pt text per inch
    fig.suptitle(lines, fontsize=8, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.14 * (lines.count("\n") + 1) + 0.05) / fig.get_figheight()))
    axes = fig.get_axes()
    meta_title = title or (axes[0].get_title() if axes else path.stem)
    keep_existing(path)
    with atomic_target(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100,
                    metadata={"Title": meta_title, "Description": text, "Software": "kv-cache"})
    fig.clf()
    return path


def _save(fig, path: Path, results: dict[str, Any]) -> Path:
    return save_figure(fig, path, caption(results))


def percentile_points(block: dict[str, Any] | None) -> tuple[list[float], list[float]] | None:
    """(ms, fraction) points of a block of percentiles (p50 ... p9999, max), as merged documents keep them."""
    if not block or not block.get("count"):
        return None
    pts = sorted((float(block[k]), q) for k, q in PERCENTILE_KEYS if isinstance(block.get(k), (int, float)))
    return ([x for x, _ in pts], [q for _, q in pts]) if pts else None


def latency_curve(results: dict[str, Any], name: str) -> tuple[tuple[list[float], list[float]], bool] | None:
    """The CDF of the latency `name` (e.g. storage_read_device): from its HdrHistogram when the document has
    one (exact to the histogram's precision), else from its percentiles (`latency_ms`, merged documents);
    with True when it is percentile points only."""
    hist = (results.get("latency_histograms") or {}).get(name)
    if hist and hist.get("count") and hist.get("hdr"):
        return cdf_points(decode(hist["hdr"])), False
    pts = percentile_points((results.get("latency_ms") or {}).get(name))
    return (pts, True) if pts else None


def latency_cdf(results: dict[str, Any], out: Path) -> Path | None:
    curves = []
    for t, op in TIER_OPS:
        found = latency_curve(results, f"{t}_{op}_total")
        if found:
            curves.append((f"{t} {op}" + (" (percentiles)" if found[1] else ""), found[0]))
    if not curves:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, (xs, ys) in curves:
        ax.step(xs, ys, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency per KV entry operation, ms (total = host + device; log scale)")
    ax.set_ylabel("fraction of operations")
    ax.set_title("Latency CDF per tier and operation (measured window)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, out / "latency_cdf.png", results)


def _rows(results: dict[str, Any]) -> list[dict]:
    return (results.get("time_series") or {}).get("rows") or []


def throughput(results: dict[str, Any], out: Path) -> Path | None:
    rows = _rows(results)
    keys = [(t, op) for t, op in TIER_OPS if any(f"{t}_{op}_bytes" in r for r in rows)]
    if not rows or not keys:
        return None
    plt = pyplot()
    ts = [r["t_s"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for t, op in keys:
        top.plot(ts, [r.get(f"{t}_{op}_gibps", 0.0) for r in rows], label=f"{t} {op}")
        pts = [(r["t_s"], r[f"{t}_{op}_p95_ms"]) for r in rows if f"{t}_{op}_p95_ms" in r]
        if pts:
            bottom.plot(*zip(*pts, strict=True), marker=".", label=f"{t} {op}")
    top.set_ylabel("GiB/s (per bucket)")
    top.set_title("Throughput and p95 latency over time (1-second buckets)")
    bottom.set_ylabel("p95 latency, ms (log)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds into the measured window")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, out / "throughput.png", results)


def occupancy(results: dict[str, Any], out: Path) -> Path | None:
    rows = _rows(results)
    tiers = [t for t in TierName if any(f"occupancy_{t}_bytes" in r for r in rows)]
    if not rows or not tiers:
        return None
    plt = pyplot()
    ts = [r["t_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5))
    for t in tiers:
        ax.plot(ts, [r.get(f"occupancy_{t}_bytes", 0) / GIB for r in rows], label=f"{t} tier used (GiB)")
    ax.set_ylabel("GiB held")
    ax.set_xlabel("seconds into the measured window")
    right = ax.twinx()
    right.plot(ts, [r.get("active_users", 0) for r in rows], "k--", label="active users")
    right.plot(ts, [r.get("queue_depth", 0) for r in rows], "r:", label="requests waiting for a worker")
    right.plot(ts, [r.get("in_flight", 0) for r in rows], "g-.", label="requests in flight")
    right.set_ylabel("count")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize="small", loc="upper left")
    ax.set_title("Cache occupancy, queue and users over time")
    ax.grid(True, alpha=0.3)
    return _save(fig, out / "occupancy.png", results)


def _doubling(xs: list[int]) -> bool:
    """Rungs that (mostly) double: a log axis spaces them evenly."""
    xs = sorted(set(xs))
    return len(xs) >= 3 and xs[0] > 0 and all(b / a >= 1.5 for a, b in zip(xs, xs[1:], strict=False))


def _log_axis(results: dict[str, Any]) -> bool:
    """A log2 axis when the ladder asked for doubles: the rungs an SLO's bisection added between them (4, 5, 6,
    8, ...) do not make it linear; without the asked ladder (older documents), the rungs run."""
    asked = (results.get("parameters") or {}).get("ladder")
    return _doubling(list(asked) if asked else [r["sessions"] for r in results.get("rungs") or []])


def _ci_bars(cis: list[dict[str, Any] | None]) -> tuple[list[float], list[list[float]]]:
    ys, lo, hi = [], [], []
    for c in cis:
        est = c["estimate"] if c else float("nan")
        ys.append(est)
        lo.append(est - c["low"] if c and c.get("low") is not None else 0.0)
        hi.append(c["high"] - est if c and c.get("high") is not None else 0.0)
    return ys, [lo, hi]


def ladder(results: dict[str, Any], out: Path) -> Path | None:
    """Per-GPU throughput (left) and p90 TTFT of returning turns (right) against concurrent sessions, per
    configuration, with 95 % CIs; a log2 x axis when the rungs double; the SLO, when one was given."""
    rungs = results.get("rungs") or []
    if not rungs:
        return None
    plt = pyplot()
    fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 5))
    for cfg in dict.fromkeys(r["tiers"] for r in rungs):
        mine = sorted((r for r in rungs if r["tiers"] == cfg), key=lambda r: r["sessions"])
        xs = [r["sessions"] for r in mine]
        ys, err = _ci_bars([r["throughput_tokens_per_s_per_gpu"] for r in mine])
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, label=cfg)
        ts, terr = _ci_bars([((r.get("ttft") or {}).get("return") or {}).get("p90_s") for r in mine])
        right.errorbar(xs, ts, yerr=terr, marker="o", capsize=4, label=cfg)
    slo = (results.get("parameters") or {}).get("slo_ttft_p90_s")
    if slo:
        right.axhline(slo, color="k", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    log_x = _log_axis(results)
    for a in (ax, right):
        if log_x:
            a.set_xscale("log", base=2)
            ticks = sorted({r["sessions"] for r in rungs})
            a.set_xticks(ticks, [str(t) for t in ticks])  # the rungs themselves, not powers of 2
            a.minorticks_off()
        a.set_xlabel("concurrent sessions" + (" (log2 scale)" if log_x else ""))
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    ax.set_ylabel("tokens/s per GPU (95 % CI)")
    ax.set_title("Per-GPU throughput by offload configuration")
    right.set_ylabel("p90 TTFT of returning turns, s (95 % CI)")
    right.set_title("p90 TTFT of returning turns")
    return save_figure(fig, out / "ladder.png", caption(results) + _shaping_note(results),
                       title="Sessions ladder: per-GPU throughput and p90 TTFT by offload configuration")


def _shaping_note(results: dict[str, Any]) -> str:
    """The ladder's caption tail: the I/O mode the rungs' storage tier ran in (measured, where the parameters
    hold the requested one) and its shaping."""
    measured = next((st for r in results.get("rungs") or [] if (st := (r.get("offload_tier") or {}).get("storage"))),
                    None)
    return (f"; the rungs' storage tier: {measured['filesystem']}, {measured['io_mode']} I/O" if measured else "") + \
        _shaped(results)


def _shaped(results: dict[str, Any]) -> str:
    shaping = (results.get("parameters") or {}).get("tier_shaping") or {}
    tiers = shaping.get("tiers") or {"storage": shaping}  # a document from before per-tier shaping: storage only
    out = ""
    for tier, how in tiers.items():
        parts = [f"{how['bandwidth_gbps']:g} GB/s (10^9 B/s)" if how.get("bandwidth_gbps") else "",
                 f"+{how['latency_ms']:g} ms" if how.get("latency_ms") else ""]
        parts = [p for p in parts if p]
        if parts:
            out += f"; {'DRAM' if tier == 'cpu' else tier} tier shaped to {', '.join(parts)} per direction"
    return out


PLOTS = (latency_cdf, throughput, occupancy, ladder)


def folder_listing(out_dir: str | Path) -> set[str]:
    """The names in `out_dir` now (none when it does not exist yet): kept_since's `before`."""
    try:
        return set(os.listdir(out_dir))
    except OSError:
        return set()


def kept_since(out_dir: str | Path, before: set[str]) -> list[str]:
    """`NAME -> NAME.N` for each earlier file that drawing into `out_dir` kept aside since `before`."""
    kept = []
    for name in sorted(folder_listing(out_dir) - before):
        stem, dot, n = name.rpartition(".")
        if dot and n.isdigit() and stem in before:
            kept.append(f"{stem} -> {name}")
    return kept


def kept_clause(kept: list[str]) -> str:
    """The end of the 'Plots written' line: which earlier files were kept, if any."""
    return f"; earlier files kept: {', '.join(kept)}" if kept else ""


def draw_plots(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Every plot the document has data for, as PNGs in `out_dir` (created); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    try:
        return [p for plot in PLOTS if (p := plot(results, out)) is not None]
    finally:
        plt.close("all")
