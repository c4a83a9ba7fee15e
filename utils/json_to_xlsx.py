#!/usr/bin/env python3
"""Collect every kv-cache result JSON of a directory into one spreadsheet (reference
``utils/json_to_xlsx.py``, spec section 12.6).

    python3 utils/json_to_xlsx.py [--input-dir/-i DIR] [--output/-o FILE]

One row per ``*.json`` in DIR that has a ``summary`` (others are reported and skipped), sorted by
file name. Columns: ``Filename``, ``Storage Throughput (tok/s)`` = root ``total_tokens_generated /
total_storage_io_latency``, ``Storage Requests/sec`` = ``requests_completed /
total_storage_io_latency``, ``Total I/O Time (s)``, then the metric columns of ``--xlsx-output``
(``kv_cache.render.xlsx.metric_columns``) with the per-tier KV byte columns ordered GPU W, GPU R,
CPU W, CPU R, Storage W, Storage R. Written as .xlsx with openpyxl when it is installed and the
output ends in .xlsx, otherwise as CSV (``.xlsx`` replaced by ``.csv``).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys
from typing import Any

try:
    from kv_cache.render.xlsx import metric_columns
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kv_cache.render.xlsx import metric_columns

TIER_BYTES_ORDER = [
    f"Tier {tier} KV Bytes {word} (GiB)" for tier in ("GPU", "CPU", "Storage") for word in ("Written", "Read")
]


def build_row(filename: str, data: dict[str, Any]) -> dict[str, Any]:
    """The spreadsheet row of one result document (which must have a `summary`)."""
    summary = data["summary"]
    tokens = data.get("total_tokens_generated") or 0
    io_time = data.get("total_storage_io_latency") or 0
    requests = data.get("requests_completed") or 0
    row: dict[str, Any] = {
        "Filename": filename,
        "Storage Throughput (tok/s)": tokens / io_time if io_time > 0 else None,
        "Storage Requests/sec": requests / io_time if io_time > 0 else None,
        "Total I/O Time (s)": io_time,
    }
    metrics = metric_columns(summary)
    if metrics.get("Total Tokens") is None:
        metrics["Total Tokens"] = tokens
    if metrics.get("Total Requests") is None:
        metrics["Total Requests"] = requests
    tier_bytes = {k: metrics[k] for k in TIER_BYTES_ORDER if k in metrics}
    for key, value in metrics.items():
        if key in row:  # the leading columns win (same formula as the summary's storage throughput)
            continue
        if key in tier_bytes:  # the whole group goes where its first column was, in the reference's order
            row.update(tier_bytes)
            continue
        row[key] = value
    return row


def collect(input_dir: str) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(glob.glob(os.path.join(input_dir, "*.json"))):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"Error processing {path}: {exc}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("summary"), dict) or not data["summary"]:
            print(f"Skipping {path}: no 'summary'")
            continue
        rows.append(build_row(path, data))
        print(f"Processed {path}")
    rows.sort(key=lambda r: r["Filename"])
    return rows


def _cell(v: Any) -> Any:
    return "" if v is None else v


def _csv_path(path: str) -> str:
    return path[: -len(".xlsx")] + ".csv" if path.endswith(".xlsx") else path


def write_csv(rows: list[dict[str, Any]], path: str) -> str:
    columns = list(rows[0])
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])
    return path


def write_table(rows: list[dict[str, Any]], path: str) -> str:
    """Write the rows as .xlsx (openpyxl) or CSV; returns the path actually written."""
    try:
        import openpyxl
    except ImportError:
        openpyxl = None
    if openpyxl is None or not path.endswith(".xlsx"):
        if path.endswith(".xlsx"):
            print("openpyxl is not installed: writing CSV instead")
        return write_csv(rows, _csv_path(path))
    try:
        wb = openpyxl.Workbook()
        ws = wb.active
        ws.title = "Summary"
        columns = list(rows[0])
        ws.append(columns)
        for row in rows:
            ws.append([_cell(row.get(c)) for c in columns])
        wb.save(path)
        return path
    except Exception as exc:  # never lose the table over a spreadsheet problem
        print(f"Error saving Excel file ({exc}); writing CSV instead")
        return write_csv(rows, _csv_path(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert kv-cache JSON results to one spreadsheet.", allow_abbrev=False)
    parser.add_argument("--input-dir", "-i", default=".", help="directory containing the JSON files")
    parser.add_argument("--output", "-o", default="mlperf_storage_summary.xlsx", help="output .xlsx (or .csv) file")
    args = parser.parse_args(argv)
    if not glob.glob(os.path.join(args.input_dir, "*.json")):
        print(f"No JSON files found in {args.input_dir}")
        return 1
    rows = collect(args.input_dir)
    if not rows:
        print("No valid data extracted.")
        return 1
    written = write_table(rows, args.output)
    print(f"Wrote {written} with {len(rows)} record{'s' if len(rows) != 1 else ''}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
