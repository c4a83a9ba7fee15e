"""The metric catalogue's output: its block of the summary, its console section and its sheet.

The block is ``summary.metrics`` (kv_cache/metrics/catalogue: one key per entry); the console section
and the sheet iterate over the catalogue and print the entries the document carries a value for, so a
document written before an entry existed (or without that kind of I/O) reads as it always did.
"""

from __future__ import annotations

from typing import Any

from kv_cache.metrics import catalogue

TITLE = "### MORE STORAGE METRICS (the metric catalogue) ###"


def _carried(results: dict[str, Any]) -> list[tuple[catalogue.Metric, float]]:
    block = (results.get("summary") or {}).get("metrics") or {}
    return [(m, block[m.key]) for m in catalogue.all_metrics() if block.get(m.key) is not None]


def report_lines(results: dict[str, Any]) -> list[str]:
    """The console section: one line per entry with a value (nothing when there is none)."""
    carried = _carried(results)
    if not carried:
        return []
    return ["", TITLE, *(f"  {m.label}: {format(v, m.spec)}{' ' + m.unit if m.unit else ''}" for m, v in carried)]


def sheets(results: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """The spreadsheet's "Metrics" sheet (none when the document carries no catalogue value)."""
    carried = _carried(results)
    if not carried:
        return {}
    return {"Metrics": [["Key", "Metric", "Value", "Unit", "Merge"],
                        *([m.key, m.label, v, m.unit, m.merge] for m, v in carried)]}
