"""`kv-cache merge DIR|FILES`: one merged results document from per-rank documents, after the fact.

Reads the mlpstorage harness's layout (`DIR/rank_<N>/kvcache_results_*.json`), kv-cache's own per-rank files
(`X_rank<r>.json`) or the files given; writes the merged document (report/merge.py) and prints its table.
"""

from __future__ import annotations

import argparse
import os
import sys

from kv_cache.errors import UsageError
from kv_cache.report.jsonfile import write_json_atomic
from kv_cache.report.merge import MergeError, find_rank_files, load_documents, merge_documents, merged_table

__all__ = ["add_merge_flags", "default_output", "merge_command"]


def add_merge_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DIR|FILE",
                   help="a directory (rank_<N>/kvcache_results_*.json or *_rank<r>.json) or per-rank files")
    p.add_argument("--output", default=None,
                   help="merged JSON (default: kvcache_merged.json in the directory, or beside the first file)")


def default_output(paths: list[str]) -> str:
    first = paths[0]
    folder = first if os.path.isdir(first) else os.path.dirname(os.path.abspath(first))
    return os.path.join(folder, "kvcache_merged.json")


def merge_command(args: argparse.Namespace, argv: list[str], out=None) -> int:
    out = out or sys.stdout
    try:
        files = find_rank_files(args.paths)
        output = os.path.abspath(args.output or default_output(args.paths))
        files = [f for f in files if os.path.abspath(f) != output]  # never merge a previous merge into itself
        merged = merge_documents(load_documents(files))
    except MergeError as exc:
        raise UsageError(str(exc)) from None
    write_json_atomic(output, merged)
    out.write(merged_table(merged))
    out.write(f"Merged results written to {output}\n")
    return 0
