"""The run's own PASS/FAIL criteria, part of every profile's storage_health.

Whatever the profile measures, a run FAILS when it cannot vouch for the storage:
- more failed requests than `performance_criteria.max_error_rate` allows;
- a storage error stopped it (ENOSPC, EROFS, ...);
- no request completed;
- its storage tier moved no bytes in the measured window ("storage tier never exercised"), e.g. because
  everything fitted in the RAM tier: a storage verdict that never touched storage is no verdict.

A run stopped before its window ended (Ctrl-C, SIGTERM), or a merge that lacks ranks, is INCOMPLETE: never
PASS, whatever the part measured says (`mark_incomplete`, `mark_missing_ranks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kv_cache.results.figures import CacheStats, Criterion, Figures

NEVER_EXERCISED = "storage tier never exercised"
STORAGE_STOP_CRITERION = "Not Stopped By A Storage Error"


def run_criteria(stats: CacheStats | Mapping[str, Any], error_rate: float, max_error_rate: float, fatal_error: str | None,
                 storage_expected: bool, completed: int | None = None) -> list[dict[str, Any]]:
    """The criteria every profile adds, as storage_health criteria dicts (`stats`: the `cache_stats`, typed
    or as written; `completed`: requests that completed in the window; None: not known, no criterion)."""
    out = [] if completed is None else [
        {"name": "Requests Completed > 0", "target": "> 0", "actual": str(completed), "unit": "",
         "passed": completed > 0}]
    out += [
        {"name": f"Failed Requests <= {max_error_rate * 100:g}%", "target": max_error_rate, "actual": error_rate,
         "unit": "ratio", "passed": bool(error_rate <= max_error_rate)},
        {"name": STORAGE_STOP_CRITERION, "target": "none", "actual": fatal_error or "none", "unit": "",
         "passed": fatal_error is None},
    ]
    if storage_expected:
        moved = (stats if isinstance(stats, CacheStats) else CacheStats.from_json(stats)).storage_gb_moved
        out.append({"name": "Storage Tier Exercised (bytes moved > 0)", "target": "> 0",
                    "actual": f"{moved:.3f} GiB" if moved > 0 else NEVER_EXERCISED, "unit": "",
                    "passed": moved > 0})
    return out


def never_exercised_note() -> str:
    return (f"{NEVER_EXERCISED}: the storage tier read and wrote 0 bytes in the measured window (everything "
            "fitted in a faster tier?); lower --cpu-mem-gb, raise --num-users or --duration so it is used")


INCOMPLETE = "INCOMPLETE"
WINDOW_CRITERION = "Measured Window Completed"
RANKS_CRITERION = "Every Rank Reported"


def window_fraction(window_s: float, duration_s: float) -> float:
    """The share of the asked-for window that was measured, 0..1 (1 when no duration was asked for)."""
    if duration_s <= 0:
        return 1.0
    return max(0.0, min(1.0, window_s / duration_s))


def verdict_keys(results: dict[str, Any]) -> dict[str, Any]:
    """`verdict` (PASS / FAIL) and `window_fraction` of a run whose window ran to its end."""
    return {"verdict": "PASS" if results.get("overall_passed") else "FAIL", "window_fraction": 1.0}


def _fail_health(results: dict[str, Any], criterion: dict[str, Any]) -> None:
    """Add a failed criterion to storage_health, whose status becomes INCOMPLETE (the console says so); one
    of the same name already there is replaced, so marking a document twice lists it once."""
    summary = results.get("summary")
    health = summary.get("cache_stats", {}).get("storage_health") if isinstance(summary, dict) else None
    if not isinstance(health, dict):
        return
    health["criteria"] = [c for c in health.get("criteria", []) if c.get("name") != criterion.get("name")]
    health["criteria"].append(criterion)
    health["total_count"] = len(health["criteria"])
    health["passed_count"] = sum(1 for c in health["criteria"] if c.get("passed"))
    health["overall_status"] = INCOMPLETE


def mark_storage_stop(results: dict[str, Any], error: str) -> None:
    """A run a storage error stopped before its window: its "Not Stopped By A Storage Error" criterion
    names the error and fails (the document of such a run has no window to judge otherwise)."""
    summary = results.get("summary")
    health = summary.get("cache_stats", {}).get("storage_health") if isinstance(summary, dict) else None
    for criterion in (health or {}).get("criteria", []):
        if criterion.get("name") == STORAGE_STOP_CRITERION:
            criterion.update(actual=error, passed=False)
    if health:
        health["passed_count"] = sum(1 for c in health["criteria"] if c["passed"])


def mark_incomplete(results: dict[str, Any], fraction: float, why: str) -> None:
    """A run stopped before its window ended is INCOMPLETE, never PASS, whatever it measured: a fraction
    of a window says nothing of the storage's steady state. Sets overall_passed False, `verdict`,
    `window_fraction`, and a failed "Measured Window Completed" criterion."""
    results["overall_passed"] = False
    results["verdict"] = INCOMPLETE
    results["window_fraction"] = fraction
    _fail_health(results, {"name": WINDOW_CRITERION, "target": "100%", "actual": f"{fraction * 100:.0f}% ({why})",
                           "unit": "", "passed": False})


UNKNOWN_END = "unknown (no results document of it was given to the merge)"


def mark_missing_ranks(merged: dict[str, Any], missing: list[int], world_size: int,
                       ended: dict[int, str] | None = None) -> dict[str, Any]:
    """A merged document that lacks ranks (killed, out of memory, crashed) names them and is INCOMPLETE:
    `missing_ranks`, `ranks_expected`, `lost_ranks` (each with how it ended: `ended`, where the writer
    knows it, else UNKNOWN_END), overall_passed False, `verdict` INCOMPLETE, and a failed "Every Rank
    Reported" criterion of its own (a missing rank is not a storage error). Returns `merged`."""
    merged["missing_ranks"] = sorted(missing)
    merged["ranks_expected"] = world_size
    merged["lost_ranks"] = [{"rank": r, "ended": (ended or {}).get(r, UNKNOWN_END)} for r in sorted(missing)]
    merged["overall_passed"] = False
    merged["verdict"] = INCOMPLETE
    note = (f"INCOMPLETE: {len(missing)} of {world_size} ranks lost (rank(s) "
            f"{', '.join(str(r) for r in sorted(missing))}): their results never came; the others' are merged")
    if note not in merged.setdefault("notes", []):
        merged["notes"].append(note)
    _fail_health(merged, {"name": RANKS_CRITERION, "target": f"{world_size} ranks",
                          "actual": f"{world_size - len(missing)} ranks (lost: {merged['missing_ranks']})",
                          "unit": "", "passed": False})
    if "ranks_not_to_average" in merged:  # the missing ranks there say how they ended, as lost_ranks now does
        present = [x for x in merged["ranks_not_to_average"] if x.get("status") != MISSING]
        merged["ranks_not_to_average"] = sorted(present + _missing_entries(merged["lost_ranks"]),
                                                key=lambda x: x["rank"])
    return merged


def conclude_merge(merged: dict[str, Any], missing: list[int], world_size: int, fraction: float,
                   incomplete_ranks: list[int], ended: dict[int, str] | None = None) -> dict[str, Any]:
    """The verdict keys every merged document carries, whoever wrote it (`--processes`, mpirun rank 0,
    `kv-cache merge`): `verdict` (PASS / FAIL / INCOMPLETE), `window_fraction`, `missing_ranks`,
    `ranks_expected` (the world size) and `lost_ranks`. INCOMPLETE when a rank is missing
    (`mark_missing_ranks`) or a rank's own verdict is INCOMPLETE (its window was cut short:
    `mark_incomplete`, with `fraction`, the lowest of the ranks'); else PASS or FAIL from overall_passed."""
    merged.update(missing_ranks=sorted(missing), ranks_expected=world_size, lost_ranks=[],
                  window_fraction=fraction)
    merged.update(verdict_keys(merged), window_fraction=fraction)
    if incomplete_ranks:
        mark_incomplete(merged, fraction, f"rank(s) {', '.join(map(str, sorted(incomplete_ranks)))} stopped "
                                          "before the window's end")
    if missing:
        mark_missing_ranks(merged, missing, world_size, ended)
    return merged


# Whether a rank's document counts (`rank_status`): a harness that averages ranks takes the complete ones.
COMPLETE, INCOMPLETE_RANK, FAILED = "complete", "incomplete", "failed"
MISSING = "missing"  # in a merged document's ranks_not_to_average: a rank whose document never came


def _criteria(results: dict[str, Any]) -> tuple[Criterion, ...]:
    health = Figures.from_json(results.get("summary")).cache.health
    return health.criteria if health else ()


def rank_status(results: dict[str, Any]) -> tuple[str, str]:
    """(`rank_status`, `rank_status_reason`) of a run's document, whether it should be averaged with the
    other ranks': "failed" when a storage error stopped it or its verdict is FAIL (the failed criteria
    named), "incomplete" when its window was cut short (INCOMPLETE: the fraction measured and why),
    "complete" when its window ran to its end and its verdict is PASS."""
    failed = [c for c in _criteria(results) if not c.passed]
    for c in failed:
        if c.name == STORAGE_STOP_CRITERION:
            return FAILED, f"stopped by a storage error: {c.actual}"
    if results.get("verdict") == INCOMPLETE:
        cut = next((c for c in failed if c.name == WINDOW_CRITERION), None)
        fraction = float(results.get("window_fraction") or 0.0)
        return INCOMPLETE_RANK, (f"measured window incomplete: {cut.actual}" if cut else
                                 f"measured window incomplete: {fraction * 100:.0f}% measured")
    if not results.get("overall_passed"):
        names = ", ".join(str(c.name) for c in failed) or "verdict FAIL"
        return FAILED, f"verdict FAIL: {names}"
    return COMPLETE, "window measured to its end, verdict PASS"


def mark_rank_status(results: dict[str, Any]) -> dict[str, Any]:
    """Set `rank_status` and `rank_status_reason` on a run's document (after its verdict); returns it."""
    results["rank_status"], results["rank_status_reason"] = rank_status(results)
    return results


def ranks_not_to_average(rows: list[dict[str, Any]], lost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The merged document's `ranks_not_to_average`: each rank whose document is not complete (its
    rank_status and reason) and each missing rank (status "missing", how it ended), in rank order."""
    out = [{"rank": r["rank"], "status": r["rank_status"], "reason": r["rank_status_reason"]}
           for r in rows if r["rank_status"] != COMPLETE]
    return sorted(out + _missing_entries(lost), key=lambda x: x["rank"])


def _missing_entries(lost: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"rank": x["rank"], "status": MISSING, "reason": f"no results document: {x['ended']}"} for x in lost]
