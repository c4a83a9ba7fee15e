"""A finished run's outputs: the results JSON (never lost), the console report, the spreadsheet, and under
MPI the merged document that rank 0 writes from every rank's results."""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from kv_cache.core.group import GroupBroken, RankGroup
from kv_cache.errors import RanksLost
from kv_cache.render import xlsx
from kv_cache.render.console import print_report, what_it_measured
from kv_cache.render.merged_table import merged_table
from kv_cache.results.merge import merge_documents
from kv_cache.results.outputs import write_results
from kv_cache.results.partial import read_periodic
from kv_cache.results.write import Written, write_document, write_json_atomic
from kv_cache.settings.run import RunSettings

__all__ = ["lost_rank_documents", "write_merged", "write_merged_document", "write_outputs"]

log = logging.getLogger("kv_cache")

LOST_UNDER_MPI = "lost (an MPI process failure: killed, out of memory or crashed)"


def write_outputs(settings: RunSettings, results: dict[str, Any], out, keep: bool = True) -> None:
    """The JSON (always, even when interrupted), the console report, the optional spreadsheet. An older file
    at --output is kept under a suffix (said in the notes); if the JSON cannot be written where asked, the report is still
    printed and the results go to a fallback path that the message names. `keep` False: the file there is
    this run's own periodic document (benchmarks/standard/partial.py), which the final one replaces."""
    written = write_results(settings.outputs.output, results, keep)
    if written.error and not keep:  # the periodic document there stays: INCOMPLETE, and it says "if it is still
        # here, the rank ended without its final document", which is not so: this document says where it is
        stale = (f"the results file {settings.outputs.output} could not be replaced ({written.error}): what is "
                 "there is this run's last periodic document (INCOMPLETE, the window until then), superseded by "
                 f"this final document at {written.path}")
        results.setdefault("measurement", {}).setdefault("notes", []).append(stale)
        write_json_atomic(written.path, results)
        log.warning("%s", stale)
    print_report(results, out, closing=False)
    if written.error:
        log.error("could not write the results to %s; they are in %s", written.error, written.path)
    out.write(f"\nResults written to {written.path}\n")
    if settings.outputs.xlsx_output:
        _write_sheet(results, settings.outputs.xlsx_output, written.path, out)
    # the last lines are the two sentences saying what the run measured (issue 33.5), after where it went
    out.write("".join(line + "\n" for line in what_it_measured(results)))
    out.flush()


def _write_sheet(results: dict[str, Any], path: str, json_path: str, out) -> None:
    """The --xlsx-output spreadsheet of a run's (or a merge's) results, under the one write policy."""
    if "summary" not in results:
        return
    try:
        sheet = xlsx.write_spreadsheet(results, path)
        out.write(f"Spreadsheet written to {sheet.path}"
                  + (f" (an earlier file was kept as {sheet.kept_as})" if sheet.kept_as else "") + "\n")
    except OSError as exc:
        log.error("could not write the spreadsheet %s (%s); the JSON %s has every figure",
                  path, exc.strerror or exc, json_path)


def write_merged(settings: RunSettings, group: RankGroup, results: dict[str, Any], out) -> list[int]:
    """Every rank's document goes to rank 0, which writes the merged one beside the rank files. Returns
    the ranks lost (on every live rank).

    Under MPI the live ranks first agree who they are (`survivors`, fault tolerant): when a rank was lost
    (killed, out of memory, crashed; the launcher let the others live: `mpirun --with-ft ulfm`), the lowest
    live rank merges the others' documents into one that names the missing ranks (`missing_ranks`,
    `lost_ranks`, verdict INCOMPLETE); a lost rank whose last periodic document it can read (its rank
    file, this run's id: `lost_rank_documents`) is merged from it as an incomplete rank instead. A rank lost
    during this gather too raises RanksLost: each rank's own file is written by then, and `kv-cache merge
    --allow-missing-ranks` merges them afterwards."""
    world = group.size
    lost: list[int] = []
    survivors = getattr(group, "survivors", None)
    try:
        if survivors is not None:
            group, lost = survivors()
        docs = group.gather({**results, "_source": settings.outputs.output})
    except GroupBroken as exc:
        raise RanksLost(f"a rank was lost while the ranks' results were gathered ({exc}); each live rank's "
                        "file is written: merge them with `kv-cache merge --allow-missing-ranks`") from None
    if lost:
        log.error("rank(s) %s of %d lost before the results were gathered; the others' are merged",
                  ", ".join(map(str, lost)), world)
    if docs is None:
        return lost
    path = settings.merged_output or os.path.join(os.path.dirname(settings.outputs.output) or ".", "kvcache_merged.json")
    periodic = lost_rank_documents(settings, lost, results.get("run_id"))
    docs = [*docs, *({**doc, "_source": source} for source, doc in periodic.values())]
    merged = merge_documents(docs, allow_missing=len(periodic) < len(lost), ended={r: LOST_UNDER_MPI for r in lost})
    if lost:
        what = f"Merged results of {world - len(lost)} of {world} ranks"
        if periodic:
            what += (f" and the last periodic document of rank(s) {', '.join(map(str, sorted(periodic)))} "
                     "(incomplete)")
    else:
        what = f"Merged results of {world} ranks"
    write_merged_document(path, merged, out, what)
    return lost


def lost_rank_documents(settings: RunSettings, lost: list[int], run_id: str | None) -> dict[int, tuple[str, dict]]:
    """What each lost rank left where this rank can read it: its last periodic document (results/partial.py),
    of this run's id, at its rank file (`X_rank<r>.json` beside the merged output, or the harness layout's
    `<base>/rank_<r>/kvcache_results_*.json`, the newest first). Rank -> (path, document); a rank on another
    host's disk is not found here (`kv-cache merge` adds it afterwards)."""
    if not lost or not run_id:
        return {}
    found: dict[int, tuple[str, dict]] = {}
    for r in lost:
        for path in _rank_file_candidates(settings, r):
            doc = read_periodic(path, (run_id,))
            if doc is not None:
                found[r] = (path, doc)
                break
    return found


def _rank_file_candidates(settings: RunSettings, rank: int) -> list[str]:
    out = []
    merged = getattr(settings, "merged_output", None)
    if merged:  # the rule cli/resolve.py names the ranks' files by
        stem, dot, ext = merged.rpartition(".")
        out.append(f"{stem}_rank{rank}.{ext}" if dot and "/" not in ext else f"{merged}_rank{rank}")
    folder = os.path.dirname(os.path.abspath(settings.outputs.output))
    if os.path.basename(folder).startswith("rank_"):  # mlperf_wrapper.py: <base>/rank_<N>/kvcache_results_<time>.json
        out += sorted(glob.glob(os.path.join(os.path.dirname(folder), f"rank_{rank}", "kvcache_results_*.json")),
                      reverse=True)
    return out


def write_merged_document(path: str, merged: dict[str, Any], out, what: str = "Merged results",
                          xlsx_path: str | None = None) -> Written:
    """A merged document to `path` under the one write policy (an existing file kept as PATH.1, atomic, a
    fallback file when the target fails), its table, where it went, and its spreadsheet when `xlsx_path`
    (the --xlsx-output of a --processes run) is given."""
    written = write_document(path, merged)
    out.write(merged_table(merged))
    if written.kept_as:
        out.write(f"Note: an earlier {path} was kept as {written.kept_as}\n")
    if written.error:
        log.error("could not write the merged results to %s; they are in %s", written.error, written.path)
    out.write(f"{what} written to {written.path}\n")
    if xlsx_path:
        _write_sheet(merged, xlsx_path, written.path, out)
    out.flush()
    return written
