"""Parse bpftrace's printed maps: power-of-two `hist()`, linear `lhist()`, keyed maps and plain values.

Every bucket form bpftrace prints is read (the MLPerf tool's parser dropped the suffixed ones):

    [0]                      a single value (hist: 0 and 1 have their own buckets)
    [2, 4)   [512, 1K)       a power-of-two range; K, M, G, T, P, E are powers of 1024
    [1K, 2K)  [4M, 8M)
    [0, 5)   [-10, -5)       an lhist step
    (..., 0)                 below an lhist's min
    [100, ...)               at or above an lhist's max

A map's buckets come back as {"low": int | None, "high": int | None, "count": int} (None = unbounded),
with `high` exclusive, and the single-value bucket [v] as low = v, high = v + 1.
"""

from __future__ import annotations

import math
import re
from typing import Any

SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
_NUM = r"-?\d+[KMGTPE]?"
_HEADER = re.compile(r"^(@[\w.]*)(?:\[(.*)\])?:\s*(.*)$")
_BUCKET = re.compile(
    rf"^\s*(?:\[(?P<single>{_NUM})\]|\[(?P<lo>{_NUM}),\s*(?P<hi>{_NUM}|\.\.\.)\)|\(\.\.\.,\s*(?P<below>{_NUM})\))"
    r"\s+(?P<count>\d+)\s*\|.*$")


def number(text: str) -> int:
    """'512' -> 512, '1K' -> 1024, '-10' -> -10, '4M' -> 4194304."""
    m = re.fullmatch(r"(-?\d+)([KMGTPE]?)", text.strip())
    if m is None:
        raise ValueError(f"not a bpftrace bucket bound: {text!r}")
    return int(m.group(1)) * SUFFIX[m.group(2)]


def parse_bucket(line: str) -> dict[str, int | None] | None:
    """One histogram line -> {"low", "high", "count"}; None when the line is not a bucket."""
    m = _BUCKET.match(line)
    if m is None:
        return None
    count = int(m.group("count"))
    if m.group("single") is not None:
        v = number(m.group("single"))
        return {"low": v, "high": v + 1, "count": count}
    if m.group("below") is not None:
        return {"low": None, "high": number(m.group("below")), "count": count}
    hi = m.group("hi")
    return {"low": number(m.group("lo")), "high": None if hi == "..." else number(hi), "count": count}


def _key(raw: str | None) -> str | None:
    return None if raw is None else raw.strip()


def parse_output(text: str) -> dict[str, Any]:
    """bpftrace's output -> {map name: histogram | {key: histogram} | value}.

    A histogram is a list of buckets; a keyed map (`@bs[R]:`) becomes {key: ...}; a plain value (`@n: 12`)
    an int (or its text when it is not a number). Lines that are neither (Attaching N probes...) are skipped.
    A key printed twice (bpftrace keys char arrays by all their bytes, so two keys may print alike) is one
    histogram: the second's buckets are added to the first's."""
    maps: dict[str, Any] = {}
    current: list | None = None
    for line in text.splitlines():
        bucket = parse_bucket(line)
        if bucket is not None and current is not None:
            current.append(bucket)
            continue
        m = _HEADER.match(line.strip())
        if m is None:
            if line.strip():
                current = None
            continue
        name, key, rest = m.group(1), _key(m.group(2)), m.group(3).strip()
        value: Any
        if rest:
            value = int(rest) if re.fullmatch(r"-?\d+", rest) else rest
            current = None
        else:
            value = current = []
        if key is None:
            maps[name] = value
        else:
            keyed = maps.setdefault(name, {})
            if key in keyed and isinstance(value, list):  # the same printed key twice: one histogram
                current = keyed[key]
            else:
                keyed[key] = value
    for value in maps.values():
        if isinstance(value, dict):
            for key, hist in value.items():
                if isinstance(hist, list):
                    value[key] = _combined(hist)
    return maps


def _combined(buckets: list[dict]) -> list[dict]:
    """One bucket per range, in order: the buckets of histograms printed under the same key, added up."""
    counts: dict[tuple, int] = {}
    for b in buckets:
        edge = (b["low"], b["high"])
        counts[edge] = counts.get(edge, 0) + b["count"]

    def order(edge: tuple) -> tuple[float, float]:
        low, high = edge
        return (-math.inf if low is None else low, math.inf if high is None else high)

    return [{"low": low, "high": high, "count": n} for (low, high), n in sorted(counts.items(), key=lambda e: order(e[0]))]


def total(buckets: list[dict]) -> int:
    return sum(b["count"] for b in buckets)


def quantile_bucket(buckets: list[dict], q: float) -> dict | None:
    """The bucket holding the q-quantile (0 < q <= 1) of a histogram; None when it is empty."""
    n = total(buckets)
    if n == 0:
        return None
    seen = 0
    for b in sorted(buckets, key=lambda b: float("-inf") if b["low"] is None else b["low"]):
        seen += b["count"]
        if seen >= q * n:
            return b
    return buckets[-1]


def bucket_text(b: dict | None, unit: str = "") -> str:
    if b is None:
        return "-"
    lo, hi = b["low"], b["high"]
    if lo is None:
        return f"< {hi}{unit}"
    if hi is None:
        return f">= {lo}{unit}"
    return f"[{lo}, {hi}){unit}"


def quantile_value(buckets: list[dict], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) of a histogram, interpolated linearly inside the bucket holding it
    (for log-linear buckets, within a bucket's width: 1-10 % of its value from 10 us, 1 us below); None when it is empty or the
    quantile falls in an unbounded bucket."""
    n = total(buckets)
    if n == 0:
        return None
    seen = 0
    for b in sorted(buckets, key=lambda b: float("-inf") if b["low"] is None else b["low"]):
        if seen + b["count"] >= q * n:
            if b["low"] is None or b["high"] is None:
                return None
            return b["low"] + (b["high"] - b["low"]) * (q * n - seen) / b["count"]
        seen += b["count"]
    return None


# The log-linear layout of host/blocktrace.py's syscall lhists (per decade of whole us: 1 us steps below 100 us,
# 10 below 1 ms, 100 below 10 ms, 1 ms below 100 ms, 10 ms below 10 s), as one array of bins so that the tool can
# bin its own syscall times the same way (storage/files.py) and read its percentiles as the kernel's are read.
LHIST_DECADES = ((0, 100, 1), (100, 1000, 10), (1000, 10000, 100), (10000, 100000, 1000), (100000, 10000000, 10000))
LHIST_BINS = sum((hi - lo) // step for lo, hi, step in LHIST_DECADES) + 1  # 1360 bounded bins, then >= 10 s


def lhist_index(ns: int) -> int:
    """The bin of a duration of `ns` nanoseconds (its whole us, as the trace's `$d / 1000`)."""
    u = ns // 1000
    if u < 100:
        return u if u > 0 else 0
    if u < 1000:
        return 90 + u // 10
    if u < 10000:
        return 180 + u // 100
    if u < 100000:
        return 270 + u // 1000
    if u < 10000000:
        return 360 + u // 10000
    return LHIST_BINS - 1


def lhist_buckets(counts: Any) -> list[dict]:
    """Bins of `lhist_index` as the parsed kernel's buckets ({"low", "high", "count"} in us, empty ones left
    out); the last bin (>= 10 s) is left out, as results/blocklatency.py log_linear() leaves the kernel's."""
    out: list[dict] = []
    i = 0
    for lo, hi, step in LHIST_DECADES:
        for low in range(lo, hi, step):
            if i < len(counts) and counts[i]:
                out.append({"low": low, "high": low + step, "count": int(counts[i])})
            i += 1
    return out
