"""The MLPerf tool's own results, read with their meaning: its per-rank `kvcache_results_*.json` and the
mlpstorage harness's `summary.json`.

Neither carries a `schema_version` of ours, so they are recognised by their own shape, never guessed at:
- a rank file of the MLPerf tool (`is_mlperf_tool_file`): a JSON object with no `schema_version` and
  all of RANK_SHAPE at its top level (`requests_completed`, `total_storage_io_latency` and the per-request
  `end_to_end_latencies` list), which is what the tool's `json.dump(results)` always writes, even when no
  request completed (then `summary` is absent);
- the harness's run summary (`is_harness_summary`): `schema_version` "1.0" with an `options` object and
  `trials_per_option` (what `_write_run_summary` writes).

`load_mlperf_rank` gives a typed view (MlperfToolRank) whose fields say what each key means: the write
"device" time is the fsync alone, `read_iops` / `write_iops` are counts of operations (not per second),
the storage throughput in tokens/s divides by the summed per-request storage time (not the wall clock), and
the bandwidths divide every byte the ranks moved, in the window or after it, by the window. A key the file
lacks is None in the view and named in `missing`; nothing here raises on a short file. This module imports
nothing of kv-cache's, so results/documents.py can dispatch on it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HARNESS_SCHEMA", "KEYS", "RANK_SHAPE", "HarnessSummary", "MlperfToolRank", "harness_place",
           "is_harness_summary", "is_mlperf_tool_file", "load_harness_summary", "load_mlperf_rank", "rank_view"]

RANK_SHAPE = ("requests_completed", "total_storage_io_latency", "end_to_end_latencies")
HARNESS_SCHEMA = "1.0"

# field -> (path in the file, meaning). The README's table is this table.
KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "requests_completed": (("requests_completed",), "requests that completed (count)"),
    "tokens": (("total_tokens_generated",), "tokens of the completed requests (count)"),
    "storage_io_s": (("total_storage_io_latency",),
                     "per-request storage time summed over requests, s (concurrent requests add up: not wall time)"),
    "seed": (("seed",), "the rank's seed (the harness gives base + rank)"),
    "elapsed_s": (("summary", "elapsed_time"), "the measured window, s"),
    "avg_tokens_per_s": (("summary", "avg_throughput_tokens_per_sec"), "tokens / window (wall clock)"),
    "storage_tokens_per_s": (("summary", "storage_throughput_tokens_per_sec"),
                             "tokens / summed per-request storage time (not wall clock)"),
    "request_storage_p95_ms": (("summary", "storage_io_latency_ms", "p95"),
                               "P95 of a request's summed storage time, ms (the harness's aggregated_p95_latency_ms)"),
    "e2e_p95_ms": (("summary", "end_to_end_latency_ms", "p95"), "end-to-end P95 per request, ms (queue wait included)"),
    "read_gibps": (("summary", "cache_stats", "tier_storage_read_bandwidth_gbps"),
                   "storage-tier bytes read / window, GiB/s (2^30; bytes of requests still running after the "
                   "window are counted in)"),
    "write_gibps": (("summary", "cache_stats", "tier_storage_write_bandwidth_gbps"),
                    "storage-tier bytes written / window, GiB/s (as read_gibps)"),
    "read_gib": (("summary", "cache_stats", "tier_storage_kv_bytes_read_gb"), "storage-tier bytes read, GiB (2^30)"),
    "write_gib": (("summary", "cache_stats", "tier_storage_kv_bytes_written_gb"), "storage-tier bytes written, GiB"),
    "read_ops": (("summary", "cache_stats", "read_iops"), "read operations, a COUNT over the run (not per second)"),
    "write_ops": (("summary", "cache_stats", "write_iops"), "write operations, a COUNT over the run (not per second)"),
    "read_p95_ms": (("summary", "cache_stats", "storage_read_p95_ms"), "storage read P95, host + device, ms"),
    "read_device_p95_ms": (("summary", "cache_stats", "storage_read_device_p95_ms"),
                           "storage read P95, the file read alone, ms"),
    "read_host_p95_ms": (("summary", "cache_stats", "storage_read_host_p95_ms"),
                         "storage read P95, deserialisation alone, ms"),
    "write_p95_ms": (("summary", "cache_stats", "storage_write_p95_ms"), "storage write P95, host + device, ms"),
    "write_device_p95_ms": (("summary", "cache_stats", "storage_write_device_p95_ms"),
                            "storage write P95 of the fsync ALONE, ms: the write() into the page cache is in host"),
    "write_host_p95_ms": (("summary", "cache_stats", "storage_write_host_p95_ms"),
                          "storage write P95 of serialisation + write() into the page cache, ms"),
    "cache_hit_rate": (("summary", "cache_stats", "cache_hit_rate"), "hits / (hits + misses), all tiers"),
    "storage_entries": (("summary", "cache_stats", "storage_entries"), "entries held on the storage tier at the end"),
    "status": (("summary", "cache_stats", "storage_health", "overall_status"), "the tool's PASS / FAIL"),
    "criteria": (("summary", "cache_stats", "storage_health", "criteria"), "the tool's criteria, as written"),
}

_PLACE = re.compile(r"(?:^|/)option_(\d+)/trial_(\d+)/rank_(\d+)(?:/|$)")


def _get(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def is_mlperf_tool_file(data: Any) -> bool:
    """The shape of the MLPerf tool's per-rank results: no schema_version, every key of RANK_SHAPE, the
    latencies a list."""
    return (isinstance(data, Mapping) and "schema_version" not in data and all(k in data for k in RANK_SHAPE)
            and isinstance(data.get("end_to_end_latencies"), (list, np.ndarray)))


def is_harness_summary(data: Any) -> bool:
    """The shape of the mlpstorage harness's `summary.json` (kvcache `_write_run_summary`)."""
    return (isinstance(data, Mapping) and data.get("schema_version") == HARNESS_SCHEMA
            and isinstance(data.get("options"), Mapping) and "trials_per_option" in data)


def harness_place(path: str | os.PathLike | None) -> tuple[int | None, int | None, int | None]:
    """(option, trial, rank) from a path with `option_<O>/trial_<T>/rank_<N>/` in it (Nones otherwise)."""
    m = _PLACE.findall(Path(os.fspath(path)).as_posix()) if path else []
    return tuple(int(x) for x in m[-1]) if m else (None, None, None)  # type: ignore[return-value]


def _number(v: Any) -> float | int | None:
    """A number as written (a count stays an int); None for anything else, NaN and infinities included."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return v if isinstance(v, int) else float(v)


@dataclass
class MlperfToolRank:
    """One rank file of the MLPerf tool, read with the meaning of its keys (KEYS gives each field's key and
    meaning); a field is None where the file lacks its key, and `missing` names those keys."""

    data: dict[str, Any]
    source: str | None = None
    option: int | None = None
    trial: int | None = None
    rank: int | None = None
    requests_completed: int | None = None
    tokens: int | None = None
    storage_io_s: float | None = None
    seed: int | None = None
    elapsed_s: float | None = None
    avg_tokens_per_s: float | None = None
    storage_tokens_per_s: float | None = None
    request_storage_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    read_gibps: float | None = None
    write_gibps: float | None = None
    read_gib: float | None = None
    write_gib: float | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    read_p95_ms: float | None = None
    read_device_p95_ms: float | None = None
    read_host_p95_ms: float | None = None
    write_p95_ms: float | None = None
    write_device_p95_ms: float | None = None
    write_host_p95_ms: float | None = None
    cache_hit_rate: float | None = None
    storage_entries: int | None = None
    status: str | None = None
    criteria: list[dict[str, Any]] | None = None
    missing: list[str] = field(default_factory=list)
    not_numbers: list[str] = field(default_factory=list)  # keys present whose value is no finite number

    @property
    def values(self) -> dict[str, Any]:
        """The KEYS fields by name."""
        return {name: getattr(self, name) for name in KEYS}

    def latencies_s(self, key: str) -> list[float]:
        """A per-request list as written (seconds): end_to_end_latencies, storage_latencies, ..."""
        values = self.data.get(key)
        if isinstance(values, np.ndarray):  # (a document built in this process: results/summary.py _seconds)
            values = values.tolist()
        return [float(v) for v in values if _number(v) is not None] if isinstance(values, list) else []


def rank_view(data: Mapping[str, Any], source: str | os.PathLike | None = None) -> MlperfToolRank:
    """The typed view of an already-parsed MLPerf-tool rank file (`missing` names the KEYS it lacks, by the
    file's own dotted key)."""
    values: dict[str, Any] = {}
    missing: list[str] = []
    not_numbers: list[str] = []
    for name, (path, _meaning) in KEYS.items():
        v = _get(data, path)
        if v is None and not (name == "seed" and "seed" in data):
            missing.append(".".join(path))
        values[name] = v if name in ("status", "criteria", "seed") else _number(v)
        if v is not None and values[name] is None:
            not_numbers.append(".".join(path))
    option, trial, rank = harness_place(source)
    return MlperfToolRank(dict(data), None if source is None else os.fspath(source), option, trial, rank,
                          **values, missing=missing, not_numbers=not_numbers)


def _read(path: str | os.PathLike) -> Any:
    with open(path, "rb") as fh:
        return json.loads(fh.read())


def load_mlperf_rank(path: str | os.PathLike) -> MlperfToolRank:
    """The typed view of an MLPerf-tool rank file on disk; ValueError (one line) when it is not one."""
    data = _read(path)
    if not is_mlperf_tool_file(data):
        raise ValueError(f"{os.fspath(path)} is not an MLPerf tool rank file (it lacks "
                         f"{', '.join(k for k in RANK_SHAPE if not isinstance(data, dict) or k not in data)})")
    return rank_view(data, path)


@dataclass
class HarnessSummary:
    """The harness's summary.json: per option, its aggregates (sums over ranks, mean over trials, max P95)."""

    data: dict[str, Any]
    source: str | None = None

    @property
    def options(self) -> dict[str, dict[str, Any]]:
        return {str(k): dict(v) for k, v in (self.data.get("options") or {}).items() if isinstance(v, Mapping)}

    @property
    def total_ranks(self) -> int | None:
        return self.data.get("total_ranks")

    @property
    def trials(self) -> int | None:
        return self.data.get("trials_per_option")


def load_harness_summary(path: str | os.PathLike) -> HarnessSummary:
    data = _read(path)
    if not is_harness_summary(data):
        raise ValueError(f"{os.fspath(path)} is not an mlpstorage harness summary.json")
    return HarnessSummary(data, os.fspath(path))
