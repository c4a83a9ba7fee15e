"""One merged results document from the per-rank documents of one run (mpirun, --processes, the harness).

The maths, all from the ranks' documents:
- totals are sums (requests, tokens, bytes, operations, cache hits and misses);
- rates are merged totals / the merged window. The window is the common one when every rank's window was
  opened and closed by shared barriers (`window.kind` = "common (barrier-aligned)"), else the union of the
  ranks' windows, earliest start to latest end (`window.kind` = "union of the ranks' windows"); both from the
  ranks' wall-clock window times. Documents without those times fall back to the longest rank window and
  say so;
- latency percentiles are of the merged distribution: computed from the union of the ranks' per-request
  lists (`end_to_end_latencies`, `storage_latencies`, ...) and per-operation samples (`latency_samples`),
  never averaged or maxed. The one exception is `max_of_rank_p95_ms`, the maximum of the ranks' P95 that the
  Rules (and the mlpstorage harness) take, reported under that name;
- `sum_of_ranks`: what the harness computes by summing the ranks' rates, beside the merged figures;
- `per_rank`: one row per rank.
The merged document also carries the keys the mlpstorage harness reads (`summary.cache_stats.*`,
the seven top-level keys), filled with the merged figures.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from kv_cache.metrics.recorder import GIB, PERCENTILES
from kv_cache.metrics.stats import percentiles

__all__ = ["MERGED_SCHEMA_VERSION", "MergeError", "find_rank_files", "load_documents", "merge_documents"]

MERGED_SCHEMA_VERSION = "kv-cache-merged/1"
_RANK_DIR = re.compile(r"rank_?(\d+)")
# Per-request lists of the MLPerf tool's layout (seconds) -> merged latency block name.
_REQUEST_LISTS = {"end_to_end": "end_to_end_latencies", "storage_io": "storage_latencies",
                  "generation": "generation_latencies"}
_SUM_KEYS = ("tier_storage_read_bandwidth_gbps", "tier_storage_write_bandwidth_gbps")


class MergeError(ValueError):
    """Nothing to merge, or a file that is not a kv-cache results document."""


def find_rank_files(paths: Sequence[str]) -> list[str]:
    """The per-rank documents named by `paths`: files as given; a directory is searched for the harness
    layout (`rank_<N>/kvcache_results_*.json`, the newest per rank) and for `*_rank<r>.json` files."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            ranks = sorted(glob.glob(os.path.join(path, "rank_*")), key=_rank_key)
            for rank_dir in ranks:
                files = sorted(glob.glob(os.path.join(rank_dir, "kvcache_results_*.json")))
                if files:
                    found.append(files[-1])
            found += sorted(glob.glob(os.path.join(path, "*_rank[0-9]*.json")), key=_rank_key)
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise MergeError(f"{path}: no such file or directory")
    if not found:
        raise MergeError(f"no per-rank results in {', '.join(paths)} (rank_<N>/kvcache_results_*.json or "
                         "*_rank<r>.json)")
    return found


def _rank_key(path: str) -> tuple[int, str]:
    m = _RANK_DIR.findall(os.path.basename(path.rstrip("/")))
    return (int(m[-1]) if m else 1 << 30, path)


def load_documents(files: Sequence[str]) -> list[dict[str, Any]]:
    docs = []
    for path in files:
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            raise MergeError(f"{path}: {' '.join(str(exc).split())}") from None
        if not isinstance(doc, dict) or "measurement" not in doc:
            raise MergeError(f"{path}: not a kv-cache results document")
        doc.setdefault("_source", path)
        docs.append(doc)
    return docs


def _rank_of(doc: dict[str, Any], index: int) -> int:
    rank = (doc.get("run_parameters") or {}).get("mpi_rank")
    if rank is not None:
        return int(rank)
    m = _RANK_DIR.findall(str(doc.get("_source", "")))
    return int(m[-1]) if m else index


def _block(values_ms: np.ndarray) -> dict[str, float]:
    if not len(values_ms):
        return {"count": 0}
    ps = percentiles(values_ms, list(PERCENTILES.values()))
    return {"count": int(len(values_ms)), "mean": float(values_ms.mean()),
            **dict(zip(PERCENTILES, ps, strict=True)), "max": float(values_ms.max())}


def merged_latencies(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles (ms) of the union of the ranks' samples, per request list and per operation list."""
    out: dict[str, Any] = {}
    for name, key in _REQUEST_LISTS.items():
        arrays = [np.asarray(d.get(key) or [], dtype=float) * 1e3 for d in docs]
        out[name] = _block(np.concatenate(arrays) if arrays else np.empty(0))
    names = sorted({k for d in docs for k in (d.get("latency_samples") or {}) if k.endswith("_ns")})
    for key in names:
        parts = [(d.get("latency_samples") or {}).get(key) for d in docs]
        arrays = [np.asarray(p["values"], dtype=float) / 1e6 for p in parts if p]
        block = _block(np.concatenate(arrays))
        strides = {p["stride"] for p in parts if p}
        block["samples"] = sum(p["count"] for p in parts if p)
        if strides != {1}:
            block["note"] = "some ranks kept every k-th sample (bounded documents): percentiles of that subsample"
        out[key[:-3]] = block
    return out


def _window(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    clocks = [d["measurement"].get("window_wallclock") or {} for d in docs]
    if all(c.get("start_unix") is not None and c.get("end_unix") is not None for c in clocks):
        start, end = min(c["start_unix"] for c in clocks), max(c["end_unix"] for c in clocks)
        aligned = all(c.get("barrier_aligned") for c in clocks)
        kind = "common (barrier-aligned)" if aligned else "union of the ranks' windows"
        return {"kind": kind, "seconds": max(0.0, end - start), "start_unix": start, "end_unix": end,
                "rank_seconds": [d["measurement"].get("window_seconds", 0.0) for d in docs]}
    seconds = max(float(d["measurement"].get("window_seconds") or 0.0) for d in docs)
    return {"kind": "longest rank window (documents without wall-clock window times)", "seconds": seconds,
            "start_unix": None, "end_unix": None,
            "rank_seconds": [d["measurement"].get("window_seconds", 0.0) for d in docs]}


def _cs(doc: dict[str, Any]) -> dict[str, Any]:
    return (doc.get("summary") or {}).get("cache_stats") or {}


def _totals(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def total(get) -> float:
        return sum(float(get(d) or 0) for d in docs)

    return {
        "requests_completed": int(total(lambda d: d.get("requests_completed"))),
        "tokens_generated": int(total(lambda d: d.get("total_tokens_generated"))),
        "storage_io_seconds": total(lambda d: d.get("total_storage_io_latency")),
        "storage_read_bytes": int(round(total(lambda d: _cs(d).get("tier_storage_kv_bytes_read_gb")) * GIB)),
        "storage_write_bytes": int(round(total(lambda d: _cs(d).get("tier_storage_kv_bytes_written_gb")) * GIB)),
        "cache_hits": int(total(lambda d: _cs(d).get("cache_hits"))),
        "cache_misses": int(total(lambda d: _cs(d).get("cache_misses"))),
        "requests_failed": int(total(lambda d: d["measurement"].get("requests_failed"))),
        "requests_issued": int(total(lambda d: d["measurement"].get("requests_issued"))),
        "errors": int(total(lambda d: d["measurement"].get("errors"))),
    }


def _per_rank(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for i, d in enumerate(docs):
        s, cs = d.get("summary") or {}, _cs(d)
        rows.append({
            "rank": _rank_of(d, i), "host": (d.get("run_parameters") or {}).get("host"),
            "file": d.get("_source"), "seed": d.get("seed"),
            "window_seconds": d["measurement"].get("window_seconds"),
            "requests": d.get("requests_completed", 0),
            "storage_read_gib": cs.get("tier_storage_kv_bytes_read_gb", 0.0),
            "storage_write_gib": cs.get("tier_storage_kv_bytes_written_gb", 0.0),
            "storage_read_gibps": cs.get("tier_storage_read_bandwidth_gbps", 0.0),
            "storage_write_gibps": cs.get("tier_storage_write_bandwidth_gbps", 0.0),
            "e2e_p95_ms": (s.get("end_to_end_latency_ms") or {}).get("p95"),
            "storage_io_p95_ms": (s.get("storage_io_latency_ms") or {}).get("p95"),
            "storage_read_device_p95_ms": cs.get("storage_read_device_p95_ms"),
            "overall_passed": bool(d.get("overall_passed")),
        })
    return sorted(rows, key=lambda r: r["rank"])


def _max_of(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return max(vals) if vals else None


def merge_documents(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merged results document of several ranks' documents (see the module docstring)."""
    if not docs:
        raise MergeError("no per-rank results to merge")
    window = _window(docs)
    w = window["seconds"]
    totals = _totals(docs)
    lat = merged_latencies(docs)
    rate = (lambda x: x / w) if w > 0 else (lambda x: 0.0)
    read_gibps, write_gibps = rate(totals["storage_read_bytes"] / GIB), rate(totals["storage_write_bytes"] / GIB)
    lookups = totals["cache_hits"] + totals["cache_misses"]
    io_s = totals["storage_io_seconds"]
    ranks = _per_rank(docs)
    cache_stats = {
        "tier_storage_read_bandwidth_gbps": read_gibps, "tier_storage_write_bandwidth_gbps": write_gibps,
        "tier_storage_kv_bytes_read_gb": totals["storage_read_bytes"] / GIB,
        "tier_storage_kv_bytes_written_gb": totals["storage_write_bytes"] / GIB,
        "cache_hits": totals["cache_hits"], "cache_misses": totals["cache_misses"],
        "cache_hit_rate": totals["cache_hits"] / lookups if lookups else 0.0,
    }
    for op in ("read", "write"):
        for part in ("device", "total"):
            block = lat.get(f"storage_{op}_{part}")
            if block and block.get("count"):
                key = f"storage_{op}_device_p95_ms" if part == "device" else f"storage_{op}_p95_ms"
                cache_stats[key] = block["p95"]
    e2e = lat["end_to_end"]
    summary = {
        "total_requests": totals["requests_completed"], "total_tokens": totals["tokens_generated"],
        "elapsed_time": w,
        "avg_throughput_tokens_per_sec": rate(totals["tokens_generated"]),
        "storage_throughput_tokens_per_sec": totals["tokens_generated"] / io_s if io_s > 0 else 0.0,
        "requests_per_second": rate(totals["requests_completed"]),
        "end_to_end_latency_ms": e2e, "storage_io_latency_ms": lat["storage_io"],
        "generation_latency_ms": lat["generation"], "cache_stats": cache_stats,
    }
    return {
        "schema_version": MERGED_SCHEMA_VERSION,
        "merged_from": [r["file"] for r in ranks],
        "ranks": len(docs),
        "window": window,
        "totals": totals,
        "bandwidth_gibps": {"storage_read": read_gibps, "storage_write": write_gibps,
                            "storage_total": read_gibps + write_gibps},
        "latency_ms": lat,
        "max_of_rank_p95_ms": {
            "storage_io_latency": _max_of(r["storage_io_p95_ms"] for r in ranks),
            "storage_read_device": _max_of(r["storage_read_device_p95_ms"] for r in ranks),
            "end_to_end_latency": _max_of(r["e2e_p95_ms"] for r in ranks),
        },
        "sum_of_ranks": {
            **{k: sum(float(_cs(d).get(k) or 0.0) for d in docs) for k in _SUM_KEYS},
            "avg_throughput_tokens_per_sec": sum(float((d.get("summary") or {}).get(
                "avg_throughput_tokens_per_sec") or 0.0) for d in docs),
            "storage_throughput_tokens_per_sec": sum(float((d.get("summary") or {}).get(
                "storage_throughput_tokens_per_sec") or 0.0) for d in docs),
        },
        "per_rank": ranks,
        "summary": summary,
        # The seven top-level keys the mlpstorage harness reads, from the merged figures; passed = every rank.
        "overall_passed": all(r["overall_passed"] for r in ranks),
        "total_requests": totals["requests_completed"],
        "avg_latency_ms": e2e.get("mean", 0.0),
        "p99_latency_ms": e2e.get("p99", 0.0),
        "throughput_req_per_sec": rate(totals["requests_completed"]),
        "storage_throughput_mbps": (read_gibps + write_gibps) * GIB / 1e6,
        "cache_hit_rate": cache_stats["cache_hit_rate"],
    }


def merged_table(doc: dict[str, Any]) -> str:
    """The merged figures and the per-rank table, as text for the console."""
    w, bw, lat = doc["window"], doc["bandwidth_gibps"], doc["latency_ms"]
    lines = [f"Merged {doc['ranks']} rank(s): window {w['seconds']:.3f} s, {w['kind']}",
             f"  storage read {bw['storage_read']:.3f} GiB/s, write {bw['storage_write']:.3f} GiB/s "
             f"(sum of the ranks' rates: read {doc['sum_of_ranks']['tier_storage_read_bandwidth_gbps']:.3f}, "
             f"write {doc['sum_of_ranks']['tier_storage_write_bandwidth_gbps']:.3f})",
             f"  requests {doc['totals']['requests_completed']}, end-to-end P95 "
             f"{lat['end_to_end'].get('p95', 0.0):.2f} ms (merged), max of rank P95 "
             f"{doc['max_of_rank_p95_ms']['end_to_end_latency'] or 0.0:.2f} ms",
             f"  {'rank':>4} {'window s':>9} {'requests':>8} {'read GiB/s':>10} {'write GiB/s':>11} "
             f"{'e2e P95 ms':>10}  host / file"]
    for r in doc["per_rank"]:
        lines.append(f"  {r['rank']:>4} {r['window_seconds'] or 0.0:>9.3f} {r['requests']:>8} "
                     f"{r['storage_read_gibps'] or 0.0:>10.3f} {r['storage_write_gibps'] or 0.0:>11.3f} "
                     f"{r['e2e_p95_ms'] or 0.0:>10.2f}  {r.get('host') or '-'}: {r['file']}")
    return "\n".join(lines) + "\n"
