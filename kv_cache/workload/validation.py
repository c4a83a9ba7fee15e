"""`--validation-trace`: compare this run's cache hit rate with a recorded real-world trace's.

The trace is read and checked BEFORE the run (a bad file is a usage error, never lost results).
"""

from __future__ import annotations

import json
from typing import Any

from kv_cache.workload.traces.model import TraceError

REQUIRED = ("timestamp", "request_id", "user_id", "context_tokens", "generation_tokens", "phase", "cache_hit",
            "cache_tier", "read_bytes", "write_bytes", "read_latency_ms", "write_latency_ms", "model_name")
OPTIONAL = ("conversation_id", "turn_number", "prefix_cached")
NUMERIC = ("timestamp", "context_tokens", "generation_tokens", "read_bytes", "write_bytes")


def _number(path: str, i: int, row: dict[str, Any], key: str) -> float:
    """A finite, non-negative number (ints, floats, numeric strings); anything else is a TraceError."""
    value = row[key]
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
    except (TypeError, ValueError):
        raise TraceError(path, f"entry {i}: {key} must be a number, got {value!r}").about("validation_trace") from None
    if f != f or f in (float("inf"), float("-inf")) or f < 0:
        raise TraceError(path, f"entry {i}: {key} must be a finite non-negative number, got {value!r}"
                         ).about("validation_trace")
    return f


def load_trace_stats(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise TraceError(path, "no such file").about("validation_trace") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"cannot read ({exc})").about("validation_trace") from None
    except json.JSONDecodeError as exc:
        raise TraceError(path, f"not valid JSON ({exc.msg} at line {exc.lineno})").about("validation_trace") from None
    if not isinstance(data, list) or not data:
        raise TraceError(path, "expected a non-empty JSON list of trace entries").about("validation_trace")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise TraceError(path, f"entry {i} is not an object").about("validation_trace")
        missing = [k for k in REQUIRED if k not in row]
        unknown = [k for k in row if k not in REQUIRED and k not in OPTIONAL]
        if missing or unknown:
            what = f"missing {missing}" if missing else f"unknown fields {unknown}"
            raise TraceError(path, f"entry {i} has {what}").about("validation_trace")
    n = len(data)
    nums = {k: [_number(path, i, r, k) for i, r in enumerate(data)] for k in NUMERIC}
    read_b, write_b, ts = sum(nums["read_bytes"]), sum(nums["write_bytes"]), nums["timestamp"]
    return {
        "total_requests": n,
        "duration_seconds": max(ts) - min(ts),
        "cache_hit_rate": sum(1 for r in data if r["cache_hit"]) / n,
        "read_write_ratio": read_b / max(write_b, 1.0),
        "context_tokens_mean": sum(nums["context_tokens"]) / n,
        "generation_tokens_mean": sum(nums["generation_tokens"]) / n,
    }


def compare(trace: dict[str, Any], cache_hit_rate: float, read_write_ratio: float) -> dict[str, Any]:
    """MLPerf-compatible verdict: pass when the cache hit rate is within 5 % (relative) of the trace's."""

    def err(bench: float, ref: float) -> float:
        return abs(bench - ref) / ref * 100 if ref else (0.0 if bench == 0 else 100.0)

    hit_err = err(cache_hit_rate, trace["cache_hit_rate"])
    rw_err = err(read_write_ratio, trace["read_write_ratio"])
    return {
        "passed": hit_err <= 5.0,
        "avg_error_pct": hit_err,
        "comparison": {
            "cache_hit_rate": {"benchmark": cache_hit_rate, "trace": trace["cache_hit_rate"], "error_pct": hit_err,
                               "within_5pct": hit_err <= 5.0},
            "read_write_ratio": {"benchmark": read_write_ratio, "trace": trace["read_write_ratio"],
                                 "error_pct": rw_err, "within_5pct": rw_err <= 5.0, "informational": True},
        },
        "trace_stats": trace,
    }
