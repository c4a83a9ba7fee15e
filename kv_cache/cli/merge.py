"""`kv-cache merge DIR|FILES`: one merged results document from per-rank documents, after the fact.

Reads the mlpstorage harness's layout (`DIR/rank_<N>/kvcache_results_*.json`), kv-cache's own per-rank files
(`X_rank<r>.json`) or the files given; refuses ranks of different runs, a rank twice or a missing one
(results/merge.py check_one_run); writes the merged document under the one write policy (an existing file is
kept as PATH.1) and prints its table, or with --json one JSON object for scripts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys

from kv_cache.benchmarks.standard.outputs import write_merged_document
from kv_cache.errors import UsageError
from kv_cache.results.documents import MergedDocument
from kv_cache.results.merge import MergeError, find_rank_files, merge_documents

__all__ = ["add_merge_flags", "default_output", "merge_command"]


def add_merge_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DIR|FILE",
                   help="a directory (rank_<N>/kvcache_results_*.json or *_rank<r>.json) or per-rank files")
    p.add_argument("--output", default=None,
                   help="merged JSON (default: kvcache_merged.json in the directory, or beside the first file); "
                        "an existing file there is kept as PATH.1")
    p.add_argument("--allow-missing-ranks", action="store_true",
                   help="merge the ranks there are when some are missing (the document names them; verdict FAIL)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object for scripts instead of the table: the path written, the merged "
                        "summary, window and per-rank rows")


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


def merge_command(args: argparse.Namespace, argv: list[str], out=None) -> int:
    out = out or sys.stdout
    try:
        files = find_rank_files(args.paths)
        output = os.path.abspath(args.output or default_output(args.paths))
        # never merge a previous merge (or a kept one, PATH.1) into itself
        files = [f for f in files if os.path.abspath(f) != output and not _is_merged(f)]
        if not files:
            raise MergeError(f"no per-rank results in {', '.join(args.paths)} (only merged documents)")
        merged = merge_documents(files, allow_missing=args.allow_missing_ranks)
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    table = io.StringIO() if args.json else out
    written = write_merged_document(output, merged, table)
    if args.json:
        json.dump({"path": written.path, "kept_as": written.kept_as, "error": written.error,
                   "run_id": merged["run_id"], "ranks": merged["ranks"], "missing_ranks": merged["missing_ranks"],
                   "window": merged["window"], "bandwidth_gibps": merged["bandwidth_gibps"],
                   "percentile_method": merged["percentile_method"], "overall_passed": merged["overall_passed"],
                   "summary": {k: v for k, v in merged["summary"].items() if k != "per_turn"},
                   "per_rank": merged["per_rank"]}, out, indent=2)
        out.write("\n")
    return 0
