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

from kv_cache.host.bpftrace_hist import lhist_buckets, quantile_bucket, quantile_value, total
from kv_cache.results.figures import Figures

# The syscall figures' names in the tool's own totals (storage/files.py syscall_totals)
TOOL_SYSCALL = {"vfs_read_us": "preadv", "vfs_write_us": "pwritev", "fsync_us": "fdatasync"}
LOG_LINEAR = 5  # <name>_ll0 .. _ll4: one lhist per decade (host/blocktrace.py)


def log_linear(maps: dict[str, Any], base: str) -> list[dict]:
    """The log-linear buckets of one syscall figure (its per-decade lhists, in us), as one histogram."""
    out: list[dict] = []
    for i in range(LOG_LINEAR):
        out += [b for b in maps.get(f"{base}_ll{i}") or [] if b["low"] is not None and b["high"] is not None]
    return out


PERCENTILE_KEYS = (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))


def _syscall_figures(maps: dict[str, Any], name: str, tool: dict[str, Any] | None) -> dict[str, Any]:
    """A syscall figure's exact mean and log-linear percentiles (the kernel's), and the tool's mean, P50 and
    P95 for the same syscalls over the same span, with the differences. The tool's percentiles are of its own
    times of each call put in the same log-linear buckets and interpolated as the kernel's (a bucket is 1-10 %
    wide from 10 us: a percentile read from it is not exact on either side, so like is compared with like)."""
    base = name[: -len("_us")]
    out: dict[str, Any] = {}
    avg = maps.get(f"{base}_avg_ns")
    if isinstance(avg, int):
        out["mean_ms"] = avg / 1e6
    ll = log_linear(maps, base)
    if total(ll):
        for key, q in PERCENTILE_KEYS:
            v = quantile_value(ll, q)
            out[key] = None if v is None else v / 1000
        out["percentiles"] = "log-linear lhist buckets (1-10 % wide from 10 us; 1 us wide below), interpolated inside the bucket"
    calls_ns = (tool or {}).get(TOOL_SYSCALL.get(name, ""))
    if calls_ns and calls_ns[0]:
        out["tool_count"] = int(calls_ns[0])
        out["tool_mean_ms"] = calls_ns[1] / calls_ns[0] / 1e6
        # the same calls only when both counted as many (a probe attached late, or another caller of the
        # syscall in this process, makes the error a comparison of different sets)
        out["same_calls"] = int(calls_ns[0]) == total(merged(maps.get(name), None))
        if out.get("mean_ms"):
            out["tool_mean_error_pct"] = 100 * (out["tool_mean_ms"] / out["mean_ms"] - 1)
        bins = calls_ns[2] if len(calls_ns) > 2 else None  # (a tool's totals without bins: its mean only)
        ours = lhist_buckets(bins) if bins else []
        if total(ours):
            for key, q in PERCENTILE_KEYS[:2]:
                v = quantile_value(ours, q)
                out[f"tool_{key}"] = None if v is None else v / 1000
                if out[f"tool_{key}"] is not None and out.get(key):
                    out[f"tool_{key[:-3]}_error_pct"] = 100 * (out[f"tool_{key}"] / out[key] - 1)
            out["tool_percentiles"] = "the tool's time of each call in the same log-linear buckets, interpolated alike"
    return out


# (label, map, key prefix for keyed maps, what it counts)
FIGURES = (
    ("D2C read", "d2c_us", "R", "block requests, device issue -> complete"),
    ("D2C write", "d2c_us", "W", "block requests, device issue -> complete"),
    ("Q2D", "q2d_us", None, "block requests, insert -> issue (queue)"),
    ("preadv syscall", "vfs_read_us", None, "read syscalls of this process"),
    ("pwritev syscall", "vfs_write_us", None, "write syscalls of this process"),
    ("fdatasync", "fsync_us", None, "fdatasync syscalls (the storage tier's; fsync counted apart)"),
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


def block_latency(maps: dict[str, Any] | None, reason: str | None, pid: int | None = None,
                  tool: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results block: per figure the count and the p50/p95 buckets in ms, plus the raw histograms;
    the syscall figures also the kernel's exact mean (`mean_ms`), log-linear percentiles, and the tool's
    mean, P50 and P95 for the same syscalls (`tool_mean_ms`, `tool_p50_ms`, `tool_p95_ms` and their
    `tool_*_error_pct`, from `tool`: {"preadv": (calls, ns[, bins]), ...} over the span, storage/files.py
    syscall_span)."""
    if maps is None:
        return {"enabled": True, "available": False, "reason": reason}
    figures = {}
    fsyncs = maps.get("fsync_calls", 0)  # the results files' fsync calls (host/blocktrace.py), not a figure
    for label, name, prefix, counts in FIGURES:
        buckets = merged(maps.get(name), prefix)
        if total(buckets):
            figures[label] = {"count": total(buckets), "counts": counts,
                              "p50_ms_bucket": _ms(quantile_bucket(buckets, 0.5)),
                              "p95_ms_bucket": _ms(quantile_bucket(buckets, 0.95)),
                              "p99_ms_bucket": _ms(quantile_bucket(buckets, 0.99))}
            if name in TOOL_SYSCALL:
                figures[label].update(_syscall_figures(maps, name, tool))
    # syscalls the tool made over the span of which the kernel's trace holds none (probes not attached)
    untraced = {call: int(v[0]) for fig, call in TOOL_SYSCALL.items()
                if (v := (tool or {}).get(call)) and v[0] and not total(merged(maps.get(fig), None))}
    return {"enabled": True, "available": True, "tool": "bpftrace", "pid": pid, "untraced_calls": untraced,
            "filter": "block requests this process inserted or issued; its own syscalls",
            "resolution": "power-of-two buckets: a percentile is the bucket holding it, [low, high) ms",
            "figures": figures, "fsync_calls_not_traced": fsyncs if isinstance(fsyncs, int) else 0,
            "histograms_us": maps}


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
    for call, n in (bl.get("untraced_calls") or {}).items():
        lines.append(f"  WARNING: the kernel's trace holds none of the tool's {n} {call} calls (traced none of them)")
    for label, f in bl["figures"].items():
        lines.append(f"  {label}: {f['count']} ({f['counts']}), p50 in {_range(f['p50_ms_bucket'])},"
                     f" p95 in {_range(f['p95_ms_bucket'])}, p99 in {_range(f['p99_ms_bucket'])}")
        if "mean_ms" in f:
            p = " ".join(f"{k[:-3]} {f[k]:.3f}" for k in ("p50_ms", "p95_ms") if f.get(k) is not None)
            tool = (f", tool's mean {f['tool_mean_ms']:.3f} ms ({f['tool_mean_error_pct']:+.1f} %)"
                    if "tool_mean_error_pct" in f else "")
            tool += "".join(f", {k} {f[f'tool_{k}_ms']:.3f} ms ({f[f'tool_{k}_error_pct']:+.1f} %)"
                            for k in ("p50", "p95") if f.get(f"tool_{k}_error_pct") is not None)  # (older: none)
            if f.get("same_calls") is False:
                tool += f"; counts differ (kernel {f['count']}, tool {f['tool_count']}): not the same calls"
            lines.append(f"    kernel: mean {f['mean_ms']:.3f} ms, {p} ms (log-linear){tool}")
    storage = Figures.from_json(results.get("summary")).cache.storage
    for op in ("read", "write"):
        if (device := storage.op(op).device) is not None and device.p50 is not None:
            lines.append(f"  Tool's storage {op} device time per KV entry (all its syscalls, see Timed):"
                         f" p50 {device.p50:.2f} ms, p95 {device.p95:.2f} ms")
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
