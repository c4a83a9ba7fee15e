"""`kv-cache compare A.json B.json ...`: key metrics side by side with ratios to A and 95 % CIs, each side's
storage named.

Refuses (exit 2) when the workloads differ, naming the settings (merged documents: from their ranks'
parameters; unknown counts as different); --allow-different-workloads compares anyway with a warning on
stderr. --plots DIR overlays the runs (render/compare_plots.py); --json [PATH] writes the comparison as JSON
(render/compare.py `to_json`) to PATH, or to stdout instead of the table when no PATH (or `-`) is given.
All of it is checked before anything is written: bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from kv_cache.cli.report_cmd import check_plots_dir
from kv_cache.errors import UsageError
from kv_cache.render.compare import (
    CompareError,
    compare_rows,
    format_table,
    layout_notes,
    no_rows_reason,
    to_json,
    workload_differences,
)
from kv_cache.results.documents import HarnessSummaryDocument, MlperfToolDocument, RunDocument, load
from kv_cache.results.mlperf_tool import rank_view
from kv_cache.results.partial import not_finished
from kv_cache.results.storage_info import storage_label

STDOUT = "-"


def add_compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULT.json", nargs="+",
                   help="Two or more results files of the same kind (standard or merged runs, or sessions runs); "
                        "the first is the baseline of the ratios.")
    p.add_argument("--allow-different-workloads", action="store_true",
                   help="Compare even when the workloads differ (a warning names the differences).")
    p.add_argument("--plots", metavar="DIR", default=None,
                   help="Also draw the runs overlaid (latency CDFs, throughput over time; one line per run, "
                        "labelled with its storage) as PNGs and an index.html page in this directory.")
    p.add_argument("--json", metavar="PATH", nargs="?", const=STDOUT, default=None,
                   help="Write the comparison as JSON (each side's storage, the metrics, ratios and intervals) "
                        "to PATH; without PATH, or with -, to stdout instead of the table.")


def _check_json_path(path: str | None) -> None:
    if path in (None, STDOUT):
        return
    from kv_cache.results.outputs import OutputPathError, check_output_path  # noqa: PLC0415

    try:
        check_output_path(path, example="compare.json")
    except OutputPathError as exc:
        raise UsageError(f"--json {exc}") from None


def _refuse_or_warn(args: argparse.Namespace, diffs: list[str], refusal: str, err: TextIO) -> None:
    """Runs whose workloads differ are refused (`refusal`, its {} the differences) unless
    --allow-different-workloads, which makes each difference a warning."""
    if diffs and not args.allow_different_workloads:
        raise UsageError(refusal.format("; ".join(diffs)) + ". Pass --allow-different-workloads to compare anyway")
    for d in diffs:
        err.write(f"kv-cache compare: warning: workloads differ: {d}\n")


def compare_command(args: argparse.Namespace, argv: list[str], out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    plots_dir, json_path = getattr(args, "plots", None), getattr(args, "json", None)
    typed = [load(path) for path in args.results]
    if all(isinstance(d, HarnessSummaryDocument) for d in typed):
        return _compare_summaries(args, typed, out)
    if any(isinstance(d, (MlperfToolDocument, HarnessSummaryDocument)) for d in typed):
        return _compare_rank_files(args, typed, out, err)
    docs = [d.to_json() for d in typed]
    check_plots_dir(plots_dir)
    _check_json_path(json_path)
    names = list(args.results)
    try:
        diffs = workload_differences(docs)
        _refuse_or_warn(args, diffs, "the workloads differ ({}); a comparison would compare workloads, not storage",
                        err)
        for note in layout_notes(docs):
            err.write(f"kv-cache compare: note: {note}\n")
        for name, doc in zip(names, docs, strict=True):  # (a killed run leaves its periodic document: compared, and said)
            why = not_finished(doc)
            if why:
                err.write(f"kv-cache compare: warning: {name} is {why}\n")
        rows = compare_rows(docs)
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    table = format_table(names, rows, [storage_label(d) for d in docs])
    if not rows:  # an empty table says why
        table.append(no_rows_reason(docs))
    if json_path is not None:
        _write_json(json_path, to_json(names, docs, rows, diffs), out)
    if json_path != STDOUT:
        out.write("\n".join(table) + "\n")
    if plots_dir:
        _plots(names, docs, table, plots_dir, err if json_path == STDOUT else out)
    return 0


def _write_json(path: str, doc: dict, out: TextIO) -> None:
    if path == STDOUT:
        out.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return
    from kv_cache.results.write import write_document  # noqa: PLC0415

    written = write_document(path, doc)  # the one write policy: an earlier file kept as PATH.1, atomic, fallback
    if written.error:
        out.write(f"Comparison could not be written to {written.error}; written to {written.path} instead\n")
        return
    out.write(f"Comparison written to {path}"
              + (f" (an earlier file was kept as {written.kept_as})" if written.kept_as else "") + "\n")


def _plots(names: list[str], docs: list[dict], table: list[str], plots_dir: str, out: TextIO) -> None:
    from kv_cache.render.compare_plots import draw_compare_plots, write_compare_html  # noqa: PLC0415  (matplotlib)
    from kv_cache.render.plots import PlotsUnavailable, folder_listing, kept_clause, kept_since  # noqa: PLC0415

    before = folder_listing(plots_dir)
    try:
        pngs = draw_compare_plots(names, docs, plots_dir)
        page = write_compare_html(names, docs, table, pngs, plots_dir)
    except PlotsUnavailable as exc:
        raise UsageError(f"--plots: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--plots: cannot write to {plots_dir}: {exc.strerror or exc}") from None
    out.write(f"Plots written to {plots_dir}: {', '.join(p.name for p in pngs) or 'none (no data)'}; page {page}"
              f"{kept_clause(kept_since(plots_dir, before))}\n")


def _compare_summaries(args: argparse.Namespace, typed: list, out: TextIO) -> int:
    """The harness's summary.json files: their per-option aggregates side by side with the ratios to A (no
    seeds there to check; no plots: aggregates only)."""
    from kv_cache.render.mlperf_tool import summary_compare_rows, summary_compare_table  # noqa: PLC0415

    if getattr(args, "plots", None):
        raise UsageError("--plots: a harness summary.json holds aggregates only, nothing to plot; compare rank files")
    json_path = getattr(args, "json", None)
    _check_json_path(json_path)
    names, options = list(args.results), [d.view.options for d in typed]
    if json_path is not None:
        _write_json(json_path, {"runs": [{"label": chr(65 + i), "path": n, "kind": d.kind}
                                         for i, (n, d) in enumerate(zip(names, typed, strict=True))],
                                "rows": summary_compare_rows(options)}, out)
    if json_path != STDOUT:
        out.write("\n".join(summary_compare_table(names, options)) + "\n")
    return 0


def _compare_rank_files(args: argparse.Namespace, typed: list, out: TextIO, err: TextIO) -> int:
    """The MLPerf tool's rank files (beside ours, read by the same keys): the figures side by side with their
    ratios to A; different seeds are refused like different workloads (--allow-different-workloads: a
    warning)."""
    from kv_cache.render.mlperf_tool import compare_rows, compare_table, draw_mlperf_compare, seed_differences  # noqa: PLC0415

    names = list(args.results)
    wrong = [f"{n} is a {d.kind} document" for n, d in zip(names, typed, strict=True)
             if not isinstance(d, (MlperfToolDocument, RunDocument))]
    if wrong:
        raise UsageError("the MLPerf tool's rank files compare with rank files (theirs or ours) only, and "
                         "harness summary.json files with each other: " + "; ".join(wrong))
    plots_dir, json_path = getattr(args, "plots", None), getattr(args, "json", None)
    check_plots_dir(plots_dir)
    _check_json_path(json_path)
    views = [rank_view(d.data, d.source) for d in typed]
    diffs = seed_differences(views)
    _refuse_or_warn(args, diffs, "the seeds differ ({}): the runs offered different request streams", err)
    if json_path is not None:
        _write_json(json_path, {"runs": [{"label": chr(65 + i), "path": n, "kind": d.kind, "missing": v.missing}
                                         for i, (n, d, v) in enumerate(zip(names, typed, views, strict=True))],
                                "differences": diffs, "rows": compare_rows(views)}, out)
    if json_path != STDOUT:
        out.write("\n".join(compare_table(names, views)) + "\n")
    if plots_dir:
        from kv_cache.render.plots import PlotsUnavailable  # noqa: PLC0415

        try:
            pngs = draw_mlperf_compare(names, views, plots_dir)
        except PlotsUnavailable as exc:
            raise UsageError(f"--plots: {exc}") from None
        (err if json_path == STDOUT else out).write(
            f"Plots written to {plots_dir}: {', '.join(p.name for p in pngs) or 'none (no per-request lists)'}\n")
    return 0
