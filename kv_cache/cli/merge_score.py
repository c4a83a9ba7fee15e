"""`kv-cache merge` of a harness run directory, of the MLPerf tool's rank files, or of the harness's
`summary.json`: the Rules' section 6 score per option (results/rules_score.py) instead of one merged run.

Chosen when a path given is a directory with `option_<O>/trial_<T>/rank_<N>/` at any depth, a directory or
files holding the MLPerf tool's rank files (they carry no recorders to merge: their figures are summed as
one trial), or a harness `summary.json` (its own aggregates are shown, beside ours when its run directory
holds the rank files). The table is printed; --json prints the score as one JSON object instead; --output
PATH also writes it there (an existing file kept as PATH.1). Nothing is written without --output.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, TextIO

from kv_cache.errors import DocumentError, UsageError
from kv_cache.results.documents import HarnessSummaryDocument, MlperfToolDocument, load
from kv_cache.results.merge import find_rank_files
from kv_cache.results.mlperf_tool import harness_place
from kv_cache.results.rules_score import find_harness_files, format_score, rules_score

__all__ = ["format_harness_summary", "score_places", "score_command"]


def _kind(path: str) -> str | None:
    try:
        return load(path).kind
    except DocumentError:
        return None


def score_places(paths: list[str]) -> tuple[list[tuple[Any, Any, Any, str]], list[str]] | None:
    """(rank files as (option, trial, rank, file), summary.json files) when `paths` call for a score; None for
    an ordinary merge of one run's ranks."""
    places: list[tuple[Any, Any, Any, str]] = []
    summaries: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = find_harness_files(path)
            if found:
                places += found
                continue
            try:
                files = find_rank_files([path])
            except DocumentError:
                return None
            if not any(_kind(f) == MlperfToolDocument.kind for f in files):
                return None
            places += [(*harness_place(f), f) for f in files]
        elif os.path.isfile(path):
            kind = _kind(path)
            if kind == HarnessSummaryDocument.kind:
                summaries.append(path)
                places += find_harness_files(os.path.dirname(os.path.abspath(path)))
            else:
                places.append((*harness_place(path), path))
        else:
            return None
    scored = (summaries or any(p[0] is not None for p in places)
              or any(_kind(p[3]) == MlperfToolDocument.kind for p in places))
    if not scored:
        return None
    return places, summaries


def _said(v: Any) -> str:
    """A count as the summary wrote it; `missing` where it has none."""
    return "missing" if v is None else str(v)


def format_harness_summary(doc: HarnessSummaryDocument) -> str:
    """The harness's own aggregates from its summary.json, per option, with what each one is."""
    view = doc.view
    lines = [f"mlpstorage harness summary {doc.source}: {_said(view.total_ranks)} rank(s), {_said(view.trials)} "
             f"trial(s) per "
             f"option, partial_failure {doc.data.get('partial_failure')}"]
    for key, o in view.options.items():
        missing = [str(m) for m in o.get("missing_files")] if isinstance(o.get("missing_files"), list) else []

        def f(name: str, o: dict[str, Any] = o) -> str:
            v = o.get(name)
            if v is None:
                return "missing"
            return f"{v:,.3f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"not a number ({v!r})"
        lines += [f"Option {key}: {o.get('trial_count', '?')} trial(s) x {o.get('rank_count', '?')} rank(s)",
                  f"  aggregated read bandwidth, GiB/s (sum over ranks, mean over trials): "
                  f"{f('aggregated_read_bandwidth_gbps')}",
                  f"  aggregated write bandwidth, GiB/s: {f('aggregated_write_bandwidth_gbps')}",
                  f"  aggregated storage throughput, tokens/s: {f('aggregated_storage_throughput_tokens_per_sec')}",
                  f"  max per-request storage time P95, ms: {f('aggregated_p95_latency_ms')}",
                  f"  max storage read P95 (host + device), ms: {f('aggregated_storage_read_p95_ms')}",
                  f"  missing files: {len(missing)}" + (f" ({', '.join(missing[:3])})" if missing else "")]
    return "\n".join(lines) + "\n"


def score_command(args: argparse.Namespace, places: list[tuple[Any, Any, Any, str]], summaries: list[str],
                  out: TextIO) -> int:
    docs = [load(p) for p in summaries]
    score = rules_score(places) if places else None
    if score is not None:
        score["harness_summaries"] = {d.source: d.data.get("options") for d in docs}
    written = None
    if args.output and score is not None:
        from kv_cache.results.write import write_document  # noqa: PLC0415

        written = write_document(args.output, score, keep=True)
    if args.json:
        if score is None:
            raise UsageError("--json: the summary.json has no rank files beside it to score; "
                             "`kv-cache report SUMMARY.json` shows its figures")
        json.dump({"path": written.path if written else None, "kept_as": written.kept_as if written else None,
                   "score": score}, out, indent=2, default=str)
        out.write("\n")
        return 0
    for d in docs:
        out.write(format_harness_summary(d))
    if score is not None:
        out.write(("\n" if docs else "") + format_score(score))
    if written:
        out.write(f"Score written to {written.path}" + (f" (an earlier file was kept as {written.kept_as})"
                                                         if written.kept_as else "") + "\n")
    return 0
