"""`kv-cache compare A.json B.json ...`: key metrics side by side with ratios to A and 95 % CIs.

Refuses (exit 2) when the workloads differ, naming the settings; --allow-different-workloads compares anyway
with a warning on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from kv_cache.cli.report_cmd import load_results
from kv_cache.errors import UsageError
from kv_cache.report.compare import CompareError, compare_rows, format_table, workload_differences


def add_compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="RESULT.json", nargs="+",
                   help="Two or more results files of the same kind (standard runs, or sessions runs); the first"
                        " is the baseline of the ratios.")
    p.add_argument("--allow-different-workloads", action="store_true",
                   help="Compare even when the workloads differ (a warning names the differences).")


def compare_command(args: argparse.Namespace, argv: list[str], out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    docs = [load_results(path) for path in args.results]
    try:
        diffs = workload_differences(docs)
        if diffs and not args.allow_different_workloads:
            raise UsageError("the workloads differ (" + "; ".join(diffs) + "); a comparison would compare "
                             "workloads, not storage. Pass --allow-different-workloads to compare anyway")
        for d in diffs:
            err.write(f"kv-cache compare: warning: workloads differ: {d}\n")
        rows = compare_rows(docs)
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    out.write("\n".join(format_table(list(args.results), rows)) + "\n")
    return 0
