"""A finished run's outputs: the results JSON (never lost), the console report, the spreadsheet, and under
MPI the merged document that rank 0 writes from every rank's results."""

from __future__ import annotations

import logging
import os
from typing import Any

from kv_cache.config.run import RunSettings
from kv_cache.driver.group import RankGroup
from kv_cache.report import xlsx
from kv_cache.report.console import print_report
from kv_cache.report.merge import merge_documents, merged_table
from kv_cache.report.outputs import write_results
from kv_cache.results.write import Written, write_document

__all__ = ["write_merged", "write_merged_document", "write_outputs"]

log = logging.getLogger("kv_cache")


def write_outputs(settings: RunSettings, results: dict[str, Any], out) -> None:
    """The JSON (always, even when interrupted), the console report, the optional spreadsheet. An older file
    at --output is kept under a suffix (said in the notes); if the JSON cannot be written where asked, the report is still
    printed and the results go to a fallback path that the message names."""
    written = write_results(settings.outputs.output, results)
    print_report(results, out)
    if written.error:
        log.error("could not write the results to %s; they are in %s", written.error, written.path)
    out.write(f"\nResults written to {written.path}\n")
    if settings.outputs.xlsx_output and "summary" in results:
        try:
            out.write(f"Spreadsheet written to {xlsx.export(results, settings.outputs.xlsx_output)}\n")
        except OSError as exc:
            log.error("could not write the spreadsheet %s (%s); the JSON %s has every figure",
                      settings.outputs.xlsx_output, exc.strerror or exc, written.path)
    out.flush()


def write_merged(settings: RunSettings, group: RankGroup, results: dict[str, Any], out) -> None:
    """Every rank's document goes to rank 0, which writes the merged one beside the rank files."""
    docs = group.gather({**results, "_source": settings.outputs.output})
    if docs is None:
        return
    path = settings.merged_output or os.path.join(os.path.dirname(settings.outputs.output) or ".", "kvcache_merged.json")
    merged = merge_documents(docs)
    write_merged_document(path, merged, out, f"Merged results of {group.size} ranks")


def write_merged_document(path: str, merged: dict[str, Any], out, what: str = "Merged results") -> Written:
    """A merged document to `path` under the one write policy (an existing file kept as PATH.1, atomic, a
    fallback file when the target fails), its table, and where it went."""
    written = write_document(path, merged)
    out.write(merged_table(merged))
    if written.kept_as:
        out.write(f"Note: an earlier {path} was kept as {written.kept_as}\n")
    if written.error:
        log.error("could not write the merged results to %s; they are in %s", written.error, written.path)
    out.write(f"{what} written to {written.path}\n")
    out.flush()
    return written
