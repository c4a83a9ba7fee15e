"""The `block_latency` block of the results (--enable-latency-tracing) and its report section.

bpftrace's histograms (host/blocktrace.py) are power-of-two buckets, so a percentile is known as the
bucket holding it ("p95 in [8, 16) ms"), not as a number: that is the block layer's resolution. Next to
them the report puts the tool's own figures, each saying what it times:
- D2C (one block request, device issue to completion) vs the tool's per-syscall "device" time is not the
  same unit: one preadv/pwritev of a chunk may become several block requests;
- the syscall histograms (vfs_read_us, vfs_write_us: one preadv/pwritev each) are what the tool's device
  time adds up per entry; a CPU-bound Python thread beside them inflates the tool's figure, never these.
"""

from __future__ import annotations

from typing import Any

from kv_cache.host.bpftrace_hist import quantile_bucket, total

# (label, map, key prefix for keyed maps, what it counts)
FIGURES = (
    ("D2C read", "d2c_us", "R", "block requests, device issue -> complete"),
    ("D2C write", "d2c_us", "W", "block requests, device issue -> complete"),
    ("Q2D", "q2d_us", None, "block requests, insert -> issue (queue)"),
    ("preadv syscall", "vfs_read_us", None, "read syscalls of this process"),
    ("pwritev syscall", "vfs_write_us", None, "write syscalls of this process"),
    ("fdatasync", "fsync_us", None, "fdatasync/fsync syscalls"),
)


def merged(hist: Any, prefix: str | None) -> list[dict]:
    """A histogram, or the keyed histograms whose key starts with `prefix` added bucket by bucket."""
    if isinstance(hist, list):
        return hist
    if not isinstance(hist, dict):
        return []
    counts: dict[tuple, int] = {}
    for key, buckets in hist.items():
        if prefix is None or str(key).startswith(prefix):
            for b in buckets:
                counts[(b["low"], b["high"])] = counts.get((b["low"], b["high"]), 0) + b["count"]
    return [{"low": lo, "high": hi, "count": n} for (lo, hi), n in counts.items()]


def _ms(b: dict | None) -> list[float | None] | None:
    if b is None:
        return None
    return [None if b["low"] is None else b["low"] / 1000, None if b["high"] is None else b["high"] / 1000]


def block_latency(maps: dict[str, Any] | None, reason: str | None, pid: int | None = None) -> dict[str, Any]:
    """The results block: per figure the count and the p50/p95 buckets in ms, plus the raw histograms."""
    if maps is None:
        return {"enabled": True, "available": False, "reason": reason}
    figures = {}
    for label, name, prefix, counts in FIGURES:
        buckets = merged(maps.get(name), prefix)
        if total(buckets):
            figures[label] = {"count": total(buckets), "counts": counts,
                              "p50_ms_bucket": _ms(quantile_bucket(buckets, 0.5)),
                              "p95_ms_bucket": _ms(quantile_bucket(buckets, 0.95)),
                              "p99_ms_bucket": _ms(quantile_bucket(buckets, 0.99))}
    return {"enabled": True, "available": True, "tool": "bpftrace", "pid": pid,
            "filter": "block requests this process inserted or issued; its own syscalls",
            "resolution": "power-of-two buckets: a percentile is the bucket holding it, [low, high) ms",
            "figures": figures, "histograms_us": maps}


def _range(r: list | None) -> str:
    if not r:
        return "-"
    lo, hi = r
    if lo is None:
        return f"< {hi:g} ms"
    if hi is None:
        return f">= {lo:g} ms"
    return f"[{lo:g}, {hi:g}) ms"


def report_lines(results: dict[str, Any]) -> list[str]:
    bl = results.get("block_latency")
    if not bl:
        return []
    title = "### BLOCK LAYER LATENCY (bpftrace, --enable-latency-tracing) ###"
    if not bl.get("available"):
        return ["", title, f"  Not traced: {bl.get('reason')}"]
    lines = ["", title, f"  Filter: {bl['filter']}; {bl['resolution']}"]
    for label, f in bl["figures"].items():
        lines.append(f"  {label}: {f['count']} ({f['counts']}), p50 in {_range(f['p50_ms_bucket'])},"
                     f" p95 in {_range(f['p95_ms_bucket'])}, p99 in {_range(f['p99_ms_bucket'])}")
    cs = (results.get("summary") or {}).get("cache_stats") or {}
    for op in ("read", "write"):
        if f"storage_{op}_device_p50_ms" in cs:
            lines.append(f"  Tool's storage {op} device time per KV entry (all its syscalls, timed in Python):"
                         f" p50 {cs[f'storage_{op}_device_p50_ms']:.2f} ms, p95 {cs[f'storage_{op}_device_p95_ms']:.2f} ms")
    return lines


def sheets(results: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Spreadsheet sheets of a traced run: the figures, and every histogram bucket (empty without tracing)."""
    bl = results.get("block_latency") or {}
    if not bl.get("available"):
        return {}
    figures = [["Figure", "Count", "Counts", "P50 low (ms)", "P50 high (ms)", "P95 low (ms)", "P95 high (ms)",
                "P99 low (ms)", "P99 high (ms)"]]
    for label, f in bl["figures"].items():
        figures.append([label, f["count"], f["counts"], *(f[k][i] if f[k] else None
                                                          for k in ("p50_ms_bucket", "p95_ms_bucket", "p99_ms_bucket")
                                                          for i in (0, 1))])
    buckets = [["Map", "Key", "Low", "High", "Count"]]
    for name, hist in (bl.get("histograms_us") or {}).items():
        keyed = hist.items() if isinstance(hist, dict) else [("", hist)] if isinstance(hist, list) else []
        for key, rows in keyed:
            buckets += [[name, key, b["low"], b["high"], b["count"]] for b in rows]
    return {"Block Latency": figures, "Block Histograms": buckets}
