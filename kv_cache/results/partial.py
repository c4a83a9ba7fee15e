"""A rank's periodic document: what it has measured so far, marked INCOMPLETE, on disk while it runs.

Every `--partial-results-interval` seconds of the measured window a run rewrites its results file (the rank
file `X_rank<r>.json` under several ranks) with the document of the window so far (benchmarks/standard/
partial.py takes the snapshot and writes it); the final document replaces it at the end. Should the process
die without writing its final one (SIGKILL: mpirun's 0.25 s after its SIGTERM, an OOM kill, a crash), the
last periodic document is what it leaves: a whole rank document (the same keys, mergeable), with

- `verdict` INCOMPLETE, a failed "Measured Window Completed" criterion, `window_fraction` the share of the
  window measured by then, `rank_status` "incomplete" with the reason;
- `stop_reason` PARTIAL_STOP (the process ended, or is still running, without its final document);
- `partial_document`: when it was written (`written_unix`, `measured_until_s` into the window), its
  `sequence` number and the interval, and `missing`: what only the final document has (the window's end,
  the drain, the end-of-run counters).

A merge takes it as an incomplete rank, never as a whole window (results/merge.py `incomplete_ranks`).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from kv_cache.results.verdict import mark_incomplete, mark_rank_status, window_fraction

__all__ = ["PARTIAL_KEY", "PARTIAL_STOP", "is_partial", "mark_partial", "not_finished", "partial_until",
           "read_periodic"]

PARTIAL_KEY = "partial_document"
PARTIAL_STOP = "no final document (a periodic document of the window so far)"
MISSING = (
    "the window's end: measured until measured_until_s, not to its end (the rank ended, or was still running, "
    "without its final document)",
    "the drain after the window and the censored latencies of the requests in flight",
    "the entry-size distribution and the block device's, process's and tracer's end-of-run counters",
)


def mark_partial(results: dict[str, Any], measured_s: float, duration_s: float, written_unix: float,
                 interval_s: float, sequence: int) -> dict[str, Any]:
    """Make the document of the window so far a periodic one: INCOMPLETE (the fraction measured), its
    `partial_document` block and a note; returns it."""
    results["stop_reason"] = PARTIAL_STOP
    results["interrupted"] = True
    results[PARTIAL_KEY] = {
        "kind": "periodic (replaced by the rank's final document when the run ends)",
        "sequence": sequence, "interval_s": interval_s, "written_unix": written_unix,
        "measured_until_s": measured_s, "window_duration_s": duration_s, "window_end": None,
        "missing": list(MISSING),
    }
    measurement = results.setdefault("measurement", {})
    measurement["stop_reason"] = PARTIAL_STOP
    measurement.setdefault("notes", []).append(
        f"periodic document {sequence}: the window measured until {measured_s:.1f} s of {duration_s:g} s; "
        "if it is still here, the rank ended without its final document (SIGKILL, out of memory, a crash)")
    mark_incomplete(results, window_fraction(measured_s, duration_s),
                    f"no final document: measured until {measured_s:.1f} s, its last periodic document")
    return mark_rank_status(results)


def is_partial(doc: dict[str, Any]) -> bool:
    """Whether a rank document is a periodic one (its process never wrote its final document)."""
    return isinstance(doc.get(PARTIAL_KEY), dict)


def partial_until(doc: dict[str, Any]) -> dict[str, Any] | None:
    """How far a periodic document measured (`measured_until_s`, `written_unix`, `window_duration_s`,
    `sequence`); None for a final document."""
    block = doc.get(PARTIAL_KEY)
    if not isinstance(block, dict):
        return None
    return {k: block.get(k) for k in ("measured_until_s", "written_unix", "window_duration_s", "sequence")}


def read_periodic(path: str, run_ids: Collection[str] = (), since_unix: float = 0.0) -> dict[str, Any] | None:
    """The periodic document at `path` when it is one of this run's (written at or after `since_unix`, and
    of one of `run_ids` when any is given): what a lost rank left, for the writer of the merged document.
    None when there is none (killed before its first one), it does not parse, it is a final document, or it
    is an earlier run's."""
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    until = partial_until(doc) if isinstance(doc, dict) else None
    if until is None or float(until.get("written_unix") or 0.0) < since_unix:
        return None
    if run_ids and doc.get("run_id") not in run_ids:
        return None
    return doc


def not_finished(doc: dict[str, Any]) -> str | None:
    """What a document of ours that is not a whole run is (None: a whole one): a periodic document (its
    run ended, or was still running, without its final one), an INCOMPLETE run, or a merge with incomplete
    or missing ranks (`kv-cache audit`, whose checks judge the figures it holds and so may be ok, and
    `kv-cache compare`, whose ratios would compare a part of a window, say it)."""
    until = partial_until(doc)
    if until is not None:
        measured, of = until.get("measured_until_s"), until.get("window_duration_s")
        span = (f"measured until {measured:.1f} s of the {of:g} s window" if isinstance(measured, (int, float))
                and isinstance(of, (int, float)) else "measured for part of its window")
        return (f"a periodic document (verdict INCOMPLETE): its run ended, or was still running, without its final "
                f"document; {span}; its figures cover that part only, not a finished run")
    if doc.get("verdict") != "INCOMPLETE":
        return None
    fraction = doc.get("window_fraction")
    ranks = [r.get("rank") for r in doc.get("incomplete_ranks") or [] if isinstance(r, dict)]
    missing = doc.get("missing_ranks") or []
    return ("an INCOMPLETE run" + (f" ({fraction * 100:.0f} % of its window measured)"
                                   if isinstance(fraction, (int, float)) else "")
            + (f"; incomplete rank(s) {', '.join(map(str, ranks))}" if ranks else "")
            + (f"; missing rank(s) {', '.join(map(str, missing))}" if missing else "")
            + ": its figures cover what was measured, not a finished run")
