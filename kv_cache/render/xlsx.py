"""Spreadsheet summary (`--xlsx-output`): the MLPerf tool's columns and sheets, for compatibility.

Uses openpyxl directly; without it (or for a path not ending in .xlsx) a one-row CSV is written.
Written under the one file policy (host/files.py): an existing file at the path is kept as `PATH.1`
(`.2`, ...), and the sheet is saved to a temporary file beside it that replaces the target in one rename.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.render import catalogue_section
from kv_cache.results import blocklatency
from kv_cache.results.figures import Figures
from kv_cache.results.write import Written
from kv_cache.storage.tiername import TierName

log = logging.getLogger("kv_cache.report")

PCT = (("P50", "p50"), ("P95", "p95"), ("P99", "p99"), ("P99.9", "p999"), ("P99.99", "p9999"))


def run_parameter_columns(results: dict[str, Any]) -> dict[str, Any]:
    p = results.get("run_parameters", {})
    return {
        "Timestamp": p.get("timestamp"),
        "Model": p.get("model"),
        "Num Users": p.get("num_users"),
        "Duration (s)": p.get("duration"),
        "GPU Memory per Card (GiB)": p.get("gpu_mem_gb"),
        "Num GPUs": p.get("num_gpus"),
        "Tensor Parallel": p.get("tensor_parallel"),
        "Total GPU Memory (GiB)": (p.get("gpu_mem_gb") or 0) * (p.get("num_gpus") or 1),
        "CPU Memory (GiB)": p.get("cpu_mem_gb"),
        "Generation Mode": p.get("generation_mode"),
        "Performance Profile": p.get("performance_profile"),
        "Multi-turn": p.get("multi_turn"),
        "Prefix Caching": p.get("prefix_caching"),
        "RAG Enabled": p.get("rag_enabled"),
        "Autoscaling": p.get("autoscaling"),
        "Seed": p.get("seed"),
        "Max Concurrent Allocs": p.get("max_concurrent_allocs"),
        "Request Rate": p.get("request_rate"),
        "Max Requests": p.get("max_requests"),
        "Dataset Path": p.get("dataset_path") or "N/A",
        "Cache Dir": p.get("cache_dir") or "temp",
        "Storage Capacity (GiB)": p.get("storage_capacity_gb"),
        "Precondition": p.get("precondition"),
        "Precondition Size (GiB)": p.get("precondition_size_gb"),
        "Precondition Threads": p.get("precondition_threads"),
        "Trace Speedup": p.get("trace_speedup"),
        "Replay Cycles": p.get("replay_cycles"),
    }


def metric_columns(summary: dict[str, Any]) -> dict[str, Any]:
    f = Figures.from_json(summary)
    cs = f.cache
    cols: dict[str, Any] = {
        "Total Requests": f.total_requests,
        "Total Tokens": f.total_tokens,
        "Elapsed Time (s)": f.elapsed_time,
        "Avg Throughput (tok/s)": f.tokens_per_sec,
        "Storage Throughput (tok/s)": f.storage_tokens_per_sec,
        "Requests/sec": f.requests_per_second,
    }
    for label, block, pct in (("E2E Latency", f.e2e, PCT), ("Storage Latency", f.storage_io, PCT),
                              ("Gen Latency", f.generation, PCT[:3])):
        cols[f"{label} Mean (ms)"] = block.mean
        for name, key in pct:
            cols[f"{label} {name} (ms)"] = getattr(block, key)
    for part in ("Total", "Device", "Host"):
        for op in ("Read", "Write"):
            for name, key in PCT:
                cols[f"Storage Tier {op} {part} {name} (ms)"] = cs.storage.op(op.lower()).ms(key, part.lower())
    cols["Cache Hit Rate"] = cs.hit_rate
    cols["Read/Write Ratio"] = cs.requests.read_write_ratio
    cols["Total Read (GiB)"] = cs.requests.read_gb
    cols["Total Write (GiB)"] = cs.requests.write_gb
    tiers = [(cs.tier(t), "Storage" if t is TierName.STORAGE else t.value.upper()) for t in TierName]
    for word, op in (("Written", "write"), ("Read", "read")):
        for tier, name in tiers:
            cols[f"Tier {name} KV Bytes {word} (GiB)"] = tier.op(op).bytes_gb
    for tier, name in tiers:
        for op in ("Read", "Write"):
            cols[f"Tier {name} {op} Bandwidth (GiB/s)"] = tier.op(op.lower()).bandwidth_gbps
    for tier, name in tiers:
        cols[f"{name} Entries"] = tier.entries
    cols["Multi-turn Hit Rate"] = summary.get("multi_turn_stats", {}).get("hit_rate")
    return cols


def _csv_path(path: str) -> str:
    if path.endswith(".xlsx"):
        return path[: -len(".xlsx")] + ".csv"
    return path if path.endswith(".csv") else path + ".csv"


def _cell(v: Any) -> Any:
    return "" if v is None else v


def export(results: dict[str, Any], path: str) -> str:
    """Write the summary spreadsheet; returns the path actually written (.xlsx or the .csv fallback)."""
    return write_spreadsheet(results, path).path


def write_spreadsheet(results: dict[str, Any], path: str) -> Written:
    """Write the summary spreadsheet: where it went (.xlsx, or the .csv fallback) and the name an earlier
    file at that path was kept under."""
    summary = results.get("summary") or {}
    params = run_parameter_columns(results)
    metrics = metric_columns(summary)
    block = results.get("integrity") if isinstance(results.get("integrity"), dict) else {}
    # the verdict beside the integrity, as everywhere PASS is printed (appended: the reference's columns first)
    row = {**params, **metrics, "verdict": results.get("verdict") or ("PASS" if results.get("overall_passed") else "FAIL"),
           "integrity": block.get("verdict"), "integrity_reasons": "; ".join(block.get("reasons") or [])}
    try:
        import openpyxl
    except ImportError:
        openpyxl = None
    if openpyxl is None or not path.endswith(".xlsx"):
        if openpyxl is None and path.endswith(".xlsx"):
            log.warning("openpyxl is not installed: writing CSV instead of %s", path)
        return _write_csv(row, _csv_path(path))
    try:
        wb = openpyxl.Workbook()
        ws = wb.active
        ws.title = "Summary"
        ws.append(list(row))
        ws.append([_cell(v) for v in row.values()])
        ws = wb.create_sheet("Run Parameters")
        ws.append(["Parameter", "Value"])
        for k, v in params.items():
            ws.append([k, _cell(v)])
        ws = wb.create_sheet("Performance Metrics")
        ws.append(["Metric", "Value"])
        for k, v in metrics.items():
            ws.append([k, _cell(v)])
        qos = summary.get("qos_metrics", {})
        if any(not q.get("no_data") for q in qos.values()):
            ws = wb.create_sheet("QoS Metrics")
            ws.append(["QoS Level", "Total Requests", "Latency P95 (ms)", "Latency P99 (ms)", "SLA Met", "SLA Compliance"])
            throughput = results.get("run_parameters", {}).get("performance_profile") == "throughput"
            for level, q in qos.items():
                if q.get("no_data"):
                    continue
                sla = q["sla"]
                ws.append([level, q["total_requests"], q["latency_ms"]["p95"], q["latency_ms"]["p99"],
                           "N/A (throughput mode)" if throughput else sla["met"],
                           "N/A (throughput mode)" if throughput else sla["compliance"]])
        timeline = results.get("throughput_timeline") or []
        if timeline:
            ws = wb.create_sheet("Timeline")
            ws.append(list(timeline[0]))
            for point in timeline:
                ws.append([_cell(v) for v in point.values()])
        sheets = {**catalogue_section.sheets(results), **blocklatency.sheets(results)}  # catalogue; --enable-latency-tracing
        for name, rows in sheets.items():
            ws = wb.create_sheet(name)
            for r in rows:
                ws.append([_cell(v) for v in r])
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        kept = keep_existing(path)
        with atomic_target(path) as tmp:
            wb.save(tmp)
        return Written(path, kept)
    except Exception as exc:  # the JSON is the primary output; never lose the run over a spreadsheet
        log.warning("XLSX export failed (%s); writing CSV", exc)
        return _write_csv(row, _csv_path(path))


def _write_csv(row: dict[str, Any], path: str) -> Written:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    kept = keep_existing(path)
    with atomic_target(path) as tmp, open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(list(row))
        w.writerow([_cell(v) for v in row.values()])
    return Written(path, kept)
