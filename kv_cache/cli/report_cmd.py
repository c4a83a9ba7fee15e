"""`kv-cache report RESULT.json [--plots DIR]` and the `--plots DIR` flag of `run` and `sessions`.

Reprints the report of a saved results file of any kind, read by its schema version (results/documents.py):
a run, the console report; a merge of ranks, the same report of the merged figures and the per-rank table;
sessions, the table. And,
with --plots, draws the PNGs and one HTML page (kv_cache/render/plots.py, html.py) into DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kv_cache.errors import UsageError
from kv_cache.results.documents import (
    HarnessSummaryDocument,
    MergedDocument,
    MlperfToolDocument,
    SessionsDocument,
    load,
)

PLOTS_HELP = "Also draw PNG plots and an index.html page of the results into this directory."


def add_plots_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plots", metavar="DIR", default=None, help=PLOTS_HELP)


def add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("result", metavar="RESULT.json", help="A results file written by kv-cache or kv-cache sessions.")
    add_plots_flag(p)


def load_results(path: str) -> dict[str, Any]:
    """A results document of any kind (run, sessions, merged) as its mapping; DocumentError (a UsageError:
    one line, exit 2) when it is missing, unreadable or not ours (results/documents.py load)."""
    return load(path).to_json()


def _draw(draw: Callable[[Any, str], list[Path]], source: Any, plots_dir: str) -> list[Path]:
    """`draw(source, plots_dir)`, its failures (no matplotlib, a directory it cannot write) as one-line errors."""
    from kv_cache.render.plots import PlotsUnavailable  # noqa: PLC0415  (matplotlib is heavy and optional)

    try:
        return draw(source, plots_dir)
    except PlotsUnavailable as exc:
        raise UsageError(f"--plots: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--plots: cannot write to {plots_dir}: {exc.strerror or exc}") from None


def emit_plots(results: dict[str, Any], plots_dir: str, out: TextIO) -> None:
    from kv_cache.render.html import write_html  # noqa: PLC0415  (matplotlib is heavy and optional)
    from kv_cache.render.plots import draw_plots, folder_listing, kept_clause, kept_since  # noqa: PLC0415

    before = folder_listing(plots_dir)
    pngs = _draw(draw_plots, results, plots_dir)
    page = write_html(results, pngs, plots_dir, title=f"kv-cache {results.get('mode', 'run')} results")
    out.write(f"Plots written to {plots_dir}: {', '.join(p.name for p in pngs) or 'none (no data)'}; page {page}"
              f"{kept_clause(kept_since(plots_dir, before))}\n")


def check_plots_dir(plots_dir: str | None) -> None:
    """--plots on `run` / `sessions`, checked before anything runs (a run may take hours): a directory, or a
    path that can become one, somewhere this process can write, and matplotlib to draw with."""
    if plots_dir is None:
        return
    if not plots_dir.strip():
        raise UsageError("--plots is empty: give a directory such as plots/")
    target = Path(plots_dir).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"--plots {plots_dir} is a file, not a directory; give a directory (it is created if missing)")
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--plots {plots_dir}: {existing} is not a writable directory; choose a directory you can "
                         "write to")
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plots needs matplotlib: pip install 'kv-cache[plots]' (or run without --plots and draw "
                         "them later with `kv-cache report RESULT.json --plots DIR`)")


def plots_after_run(output: str, plots_dir: str | None, out: TextIO | None = None) -> None:
    """--plots on `run` / `sessions`: plot the results file the run has just written."""
    if plots_dir and Path(output).exists():
        emit_plots(load_results(output), plots_dir, out or sys.stdout)


def report_command(args: argparse.Namespace, argv: list[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    doc = load(args.result)
    if isinstance(doc, (MlperfToolDocument, HarnessSummaryDocument)):
        return _foreign_report(doc, args.plots, out)
    results = doc.to_json()
    if isinstance(doc, SessionsDocument):
        from kv_cache.render.sessions import print_grid, print_partial, print_table  # noqa: PLC0415

        _engine_lines(results, out)
        if results.get("grid") and results.get("summary"):  # every cell, not only the first one
            print_grid(results["grid"], results.get("method", ""), out)
        elif results.get("summary"):
            print_table(results, out)
        else:  # stopped early (interrupted, a storage error): why, and the rungs it completed
            print_partial(results, out, args.result)
    else:
        from kv_cache.render.console import print_report  # noqa: PLC0415

        print_report(results, out)
        if isinstance(doc, MergedDocument):
            from kv_cache.render.merged_table import merged_table  # noqa: PLC0415

            out.write("\n" + merged_table(results))
    if args.plots:
        emit_plots(results, args.plots, out)
    return 0


def _engine_lines(results: dict[str, Any], out: TextIO) -> None:
    """A sessions document's `Engine model:` line(s), as the run printed them (one per grid cell, named):
    the roofline's error on the published table and what it holds for the run's GPU. A document without
    parameters.engine_calibration (older, or partial) prints none."""
    from kv_cache.render.sessions import engine_line  # noqa: PLC0415

    cells = results.get("grid") or [results]
    for cell in cells:
        p = cell.get("parameters") or {}
        cal = p.get("engine_calibration")
        if not isinstance(cal, dict):
            continue
        try:
            line = engine_line(cal)
        except (KeyError, TypeError, ValueError):  # a document written before a key it needs existed
            continue
        name = f"[{p.get('model')} on {p.get('num_gpus')} x {p.get('gpu')}] " if len(cells) > 1 else ""
        out.write(name + line + "\n")


def _foreign_report(doc: MlperfToolDocument | HarnessSummaryDocument, plots_dir: str | None, out: TextIO) -> int:
    """The MLPerf tool's rank file (each key with its meaning, `missing` where it lacks one) or the harness's
    summary.json (its aggregates per option); --plots draws the rank file's per-request latency CDF."""
    if isinstance(doc, HarnessSummaryDocument):
        from kv_cache.cli.merge_score import format_harness_summary  # noqa: PLC0415

        out.write(format_harness_summary(doc))
        if plots_dir:
            out.write("No plots for a harness summary.json (it holds aggregates only); plot a rank file\n")
        return 0
    from kv_cache.render.mlperf_tool import draw_mlperf_plots, print_mlperf_report  # noqa: PLC0415

    view = doc.view
    print_mlperf_report(view, out)
    if plots_dir:
        check_plots_dir(plots_dir)
        pngs = _draw(draw_mlperf_plots, view, plots_dir)
        out.write(f"Plots written to {plots_dir}: {', '.join(p.name for p in pngs) or 'none (no per-request lists)'}\n")
    return 0
