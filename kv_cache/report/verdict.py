"""The run's own PASS/FAIL criteria, part of every profile's storage_health.

Whatever the profile measures, a run FAILS when it cannot vouch for the storage:
- more failed requests than `performance_criteria.max_error_rate` allows;
- a storage error stopped it (ENOSPC, EROFS, ...);
- no request completed;
- its storage tier moved no bytes in the measured window ("storage tier never exercised"), e.g. because
  everything fitted in the RAM tier: a storage verdict that never touched storage is no verdict.
"""

from __future__ import annotations

from typing import Any

NEVER_EXERCISED = "storage tier never exercised"


def storage_bytes_moved(stats: dict[str, Any]) -> float:
    """GiB read plus written by the storage tier inside the measured window."""
    return float(stats.get("tier_storage_kv_bytes_read_gb", 0.0)) + float(stats.get("tier_storage_kv_bytes_written_gb", 0.0))


def run_criteria(stats: dict[str, Any], error_rate: float, max_error_rate: float, fatal_error: str | None,
                 storage_expected: bool, completed: int | None = None) -> list[dict[str, Any]]:
    """The criteria every profile adds, as storage_health criteria dicts (`completed`: requests that
    completed in the window; None: not known, no criterion)."""
    out = [] if completed is None else [
        {"name": "Requests Completed > 0", "target": "> 0", "actual": str(completed), "unit": "",
         "passed": completed > 0}]
    out += [
        {"name": f"Failed Requests <= {max_error_rate * 100:g}%", "target": max_error_rate, "actual": error_rate,
         "unit": "ratio", "passed": bool(error_rate <= max_error_rate)},
        {"name": "Not Stopped By A Storage Error", "target": "none", "actual": fatal_error or "none", "unit": "",
         "passed": fatal_error is None},
    ]
    if storage_expected:
        moved = storage_bytes_moved(stats)
        out.append({"name": "Storage Tier Exercised (bytes moved > 0)", "target": "> 0",
                    "actual": f"{moved:.3f} GiB" if moved > 0 else NEVER_EXERCISED, "unit": "",
                    "passed": moved > 0})
    return out


def never_exercised_note() -> str:
    return (f"{NEVER_EXERCISED}: the storage tier read and wrote 0 bytes in the measured window (everything "
            "fitted in a faster tier?); lower --cpu-mem-gb, raise --num-users or --duration so it is used")
