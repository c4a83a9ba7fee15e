"""`kv-cache merge DIR|FILES`: one merged results document from per-rank documents, after the fact.

Reads the mlpstorage harness's layout (`DIR/rank_<N>/kvcache_results_*.json`), kv-cache's own per-rank files
(`X_rank<r>.json`) or the files given; refuses ranks of different runs, a rank twice or a missing one
(results/merge.py check_one_run); writes the merged document under the one write policy (an existing file is
kept as PATH.1) and prints its table, or with --json one JSON object for scripts.

Merged documents given as files are accepted too:
- one merged document alone is shown as it is (its table, or its JSON object with --json); nothing is
  written;
- several merged documents (or merged documents beside rank files) stand for the rank files they were
  merged from (`merged_from`, resolved beside each merged document): those are merged again, with the same
  checks, so merged documents of disjoint rank sets of one run merge into one (overlapping ones are a rank
  twice; a rank file that is gone is named). A merge never adds up merged figures: only the ranks'
  recorders.
A merged document found while searching a directory (a previous merge, or one kept as PATH.1) is skipped.

A harness run directory (`option_<O>/trial_<T>/rank_<N>/` at any depth), the MLPerf tool's rank files or
the harness's summary.json get the Rules' section 6 score per option instead (cli/merge_score.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import Any

from kv_cache.benchmarks.standard.outputs import write_merged_document
from kv_cache.cli.merge_score import score_command, score_places
from kv_cache.errors import DocumentError, UsageError
from kv_cache.render.merged_table import merged_table
from kv_cache.results.documents import MergedDocument, load
from kv_cache.results.merge import MergeError, find_rank_files, merge_documents

__all__ = ["add_merge_flags", "default_output", "merge_command"]


def add_merge_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DIR|FILE",
                   help="a directory (rank_<N>/kvcache_results_*.json or *_rank<r>.json), per-rank files, or merged "
                        "documents (one alone is shown as it is; several are merged again from their rank files); a "
                        "harness run directory (option_<O>/trial_<T>/rank_<N>/ at any depth), the MLPerf tool's rank "
                        "files or the harness's summary.json print the Rules' section 6 score per option instead")
    p.add_argument("--output", default=None,
                   help="merged JSON (default: kvcache_merged.json in the directory, or beside the first file); "
                        "an existing file there is kept as PATH.1. For a section 6 score: written only when given")
    p.add_argument("--allow-missing-ranks", action="store_true",
                   help="merge the ranks there are when some are missing (the document names them in missing_ranks "
                        "and lost_ranks; verdict INCOMPLETE). A rank whose file is INCOMPLETE (cut short, or its "
                        "last periodic document: it died before its final one) is not missing: it is merged "
                        "either way and named in incomplete_ranks with how long it measured")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object for scripts instead of the table: the path written, the merged "
                        "summary, verdict, window and per-rank rows")


def default_output(paths: list[str]) -> str:
    first = paths[0]
    folder = first if os.path.isdir(first) else os.path.dirname(os.path.abspath(first))
    return os.path.join(folder, "kvcache_merged.json")


def _is_merged(path: str) -> bool:
    """A merged document (its schema_version, the first key every kv-cache document starts with)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(256)
    except OSError:
        return False
    return f'"schema_version": "{MergedDocument.schema}"' in head


def _merged_from(path: str) -> list[str]:
    """The rank files a merged document was merged from, resolved beside it (MergeError naming a gone one)."""
    try:
        doc = load(path)
    except DocumentError as exc:
        raise MergeError(str(exc)) from None
    folder = os.path.dirname(os.path.abspath(path))
    files = []
    for name in doc.data.get("merged_from") or []:
        candidates = [name] if os.path.isabs(str(name)) else [os.path.join(folder, str(name)), str(name)]
        candidates.append(os.path.join(folder, os.path.basename(str(name))))
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            raise MergeError(f"{path}: a merged document holds no recorders to add up, and its rank file {name} "
                             "is gone; give the rank files")
        files.append(found)
    if not files:
        raise MergeError(f"{path}: a merged document that does not name the rank files it was merged from")
    return files


def _rank_files(paths: list[str], output: str) -> tuple[list[str], str | None]:
    """The rank files to merge, or (no files, the one merged document to show as it is)."""
    given = [p for p in paths if os.path.isfile(p) and _is_merged(p)]
    if len(given) == 1 and len(paths) == 1:
        return [], given[0]
    files: list[str] = []
    for path in paths:
        if path in given:
            files += _merged_from(path)
        else:
            # never merge a previous merge (or a kept one, PATH.1) found in a directory into itself
            files += [f for f in find_rank_files([path]) if os.path.abspath(f) != output and not _is_merged(f)]
    if not files:
        raise MergeError(f"no per-rank results in {', '.join(paths)} (only merged documents)")
    unique = {os.path.abspath(f): f for f in reversed(files)}  # a file named twice (a merge and its ranks) once
    return [unique[k] for k in dict.fromkeys(os.path.abspath(f) for f in files)], None


def _json_object(merged: dict[str, Any], path: str, kept_as: str | None, error: str | None) -> dict[str, Any]:
    return {"path": path, "kept_as": kept_as, "error": error,
            "run_id": merged.get("run_id"), "ranks": merged.get("ranks"), "missing_ranks": merged.get("missing_ranks"),
            "ranks_expected": merged.get("ranks_expected"), "lost_ranks": merged.get("lost_ranks"),
            "incomplete_ranks": merged.get("incomplete_ranks"),
            "verdict": merged.get("verdict"), "window_fraction": merged.get("window_fraction"),
            "window": merged.get("window"), "bandwidth_gibps": merged.get("bandwidth_gibps"),
            "percentile_method": merged.get("percentile_method"), "overall_passed": merged.get("overall_passed"),
            "summary": {k: v for k, v in (merged.get("summary") or {}).items() if k != "per_turn"},
            "per_rank": merged.get("per_rank")}


def merge_command(args: argparse.Namespace, argv: list[str], out=None) -> int:
    out = out or sys.stdout
    scored = score_places(list(args.paths))  # a harness run directory, the MLPerf tool's files, a summary.json
    if scored is not None:
        return score_command(args, *scored, out)
    try:
        output = os.path.abspath(args.output or default_output(args.paths))
        files, shown = _rank_files(list(args.paths), output)
        if shown is not None:
            merged = load(shown).to_json()
        else:
            merged = merge_documents(files, allow_missing=args.allow_missing_ranks)
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    if shown is not None:  # one merged document: shown as it is, nothing written
        if args.json:
            json.dump(_json_object(merged, shown, None, None), out, indent=2)
            out.write("\n")
        else:
            out.write(merged_table(merged))
        return 0
    table = io.StringIO() if args.json else out
    written = write_merged_document(output, merged, table)
    if args.json:
        json.dump(_json_object(merged, written.path, written.kept_as, written.error), out, indent=2)
        out.write("\n")
    return 0
