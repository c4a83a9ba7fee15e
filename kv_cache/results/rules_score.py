"""The Rules' score (section 6) of a harness run directory, per option, from its rank files.

The layout is the harness's: `option_<O>/trial_<T>/rank_<N>/kvcache_results_*.json` (the newest per rank),
found at any depth; each file is ours or the MLPerf tool's, both read by the same keys (the tool's layout,
which ours keeps). Per option:
- aggregate storage read (and write) bandwidth: summed over the ranks within a trial, then the mean over
  the trials;
- aggregate storage throughput, tokens/s: the same sum then mean (`storage_throughput_tokens_per_sec`);
- aggregate device read and write P95: the maximum over ranks and trials, not a pooled percentile.
Beside them: the trial-to-trial spread of each sum (min, max, (max - min) / mean), and pooled figures where
samples exist: for our files, the per-trial merge of the ranks' recorders (results/merge.py: the P95 of the
union of every device time); for the MLPerf tool's, the P95 of the pooled per-request storage times
(`storage_latencies`; it keeps no per-operation samples). A rank with no file, or a file that lacks a key,
is named, never averaged in as 0: a trial short of ranks is left out of the score while complete trials
exist (`trials_left_out`), and with none complete the score says `incomplete`.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kv_cache.errors import DocumentError
from kv_cache.results.documents import MlperfToolDocument, RunDocument, load
from kv_cache.results.figures import Figures
from kv_cache.results.merge import MergeError, merge_documents
from kv_cache.results.mlperf_tool import harness_place, is_harness_summary
from kv_cache.results.verdict import COMPLETE, rank_status

__all__ = ["SUM_KEYS", "find_harness_files", "format_score", "is_harness_dir", "rules_score"]

# figure -> (the key in summary it is named by where a file lacks it, how it is read), by how it aggregates
SUM_KEYS: dict[str, tuple[str, Callable[[Figures], Any]]] = {
    "read_gibps": ("cache_stats.tier_storage_read_bandwidth_gbps", lambda f: f.cache.storage.read.bandwidth_gbps),
    "write_gibps": ("cache_stats.tier_storage_write_bandwidth_gbps", lambda f: f.cache.storage.write.bandwidth_gbps),
    "storage_tokens_per_s": ("storage_throughput_tokens_per_sec", lambda f: f.storage_tokens_per_sec),
    "avg_tokens_per_s": ("avg_throughput_tokens_per_sec", lambda f: f.tokens_per_sec)}
MAX_KEYS: dict[str, tuple[str, Callable[[Figures], Any]]] = {
    "read_device_p95_ms": ("cache_stats.storage_read_device_p95_ms", lambda f: f.cache.storage.read.ms("p95", "device")),
    "write_device_p95_ms": ("cache_stats.storage_write_device_p95_ms", lambda f: f.cache.storage.write.ms("p95", "device")),
    "request_storage_p95_ms": ("storage_io_latency_ms.p95", lambda f: f.storage_io.p95)}


def find_harness_files(root: str) -> list[tuple[int, int, int, str]]:
    """(option, trial, rank, file) of every `option_<O>/trial_<T>/rank_<N>/kvcache_results_*.json` under root,
    at any depth, the newest file per rank directory (a rank directory without one: its last *.json by name,
    as our runs given --output write)."""
    found = []
    for dirpath, dirnames, _files in os.walk(root):
        dirnames.sort()
        option, trial, rank = harness_place(dirpath)
        if rank is None or os.path.basename(dirpath) != f"rank_{rank}":
            continue
        files = sorted(glob.glob(os.path.join(dirpath, "kvcache_results_*.json")))
        if not files:  # our own runs may be written under any name (--output): the rank directory says the place
            files = sorted(f for f in glob.glob(os.path.join(dirpath, "*.json"))
                           if not f.endswith(("_metadata.json", "cluster_info.json")))
        if files:
            found.append((option, trial, rank, files[-1]))
    return sorted(found)


def is_harness_dir(path: str) -> bool:
    """A directory holding the harness layout (option_<O>/trial_<T>/rank_<N>/) somewhere under it."""
    return os.path.isdir(path) and bool(find_harness_files(path))


def _number(node: Any) -> float | None:
    ok = isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node)
    return float(node) if ok else None  # NaN (Python's json.dump writes it) is no figure: said as missing


def _rank_row(option: int, trial: int, rank: int, path: str) -> dict[str, Any]:
    row: dict[str, Any] = {"option": option, "trial": trial, "rank": rank, "file": path}
    try:
        doc = load(path)
    except DocumentError as exc:
        return row | {"format": None, "error": str(exc)}
    if not isinstance(doc, (RunDocument, MlperfToolDocument)):
        return row | {"format": doc.kind, "error": f"{path}: a {doc.kind} document, not a rank's results"}
    row["format"] = "mlperf-tool" if isinstance(doc, MlperfToolDocument) else "kv-cache"
    row["seed"] = doc.data.get("seed")
    row["missing"] = []
    figures = doc.figures
    for name, (key, read) in {**SUM_KEYS, **MAX_KEYS}.items():
        row[name] = _number(read(figures))
        if row[name] is None:
            row["missing"].append(f"summary.{key}")
    row["status"] = figures.cache.health.overall_status if figures.cache.health else None
    if row["format"] == "kv-cache":  # whether the rank counts (issue 18 item 1); the tool's files do not say
        status = doc.data.get("rank_status") or rank_status(doc.data)[0]
        reason = doc.data.get("rank_status_reason") if doc.data.get("rank_status") else rank_status(doc.data)[1]
        row["rank_status"], row["rank_status_reason"] = status, reason
    ws = doc.data.get("world_size")
    row["world_size"] = ws if isinstance(ws, int) and not isinstance(ws, bool) else None
    row["doc"] = doc
    return row


def _run_meta(path: str, cache: dict[str, tuple[int | None, int | None]]) -> tuple[int | None, int | None]:
    """(ranks, trials) the harness's `*_metadata.json` records for the run holding `path` (in the directory
    above its option_<O>/), so a rank or trial with no file at all is still named; (None, None) without one."""
    m = re.search(r"^(.*?)/option_\d+/trial_\d+/", Path(path).as_posix())
    if not m:
        return None, None
    run_dir = m.group(1)
    if run_dir not in cache:
        ranks = trials = None
        for meta in sorted(glob.glob(os.path.join(run_dir, "*_metadata.json")))[:1]:
            try:
                data = json.loads(Path(meta).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                break
            args = data.get("args") if isinstance(data, dict) and isinstance(data.get("args"), dict) else {}
            ranks = next((v for v in (args.get("num_processes"), data.get("num_processes"))
                          if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
            trials = args.get("trials") if isinstance(args.get("trials"), int) and args["trials"] > 0 else None
        # the harness's summary.json says how many ranks and trials it ran too (a run whose metadata is
        # missing, or gives no num_processes): the larger of the two counts is expected
        ranks, trials = _max_of(ranks, _summary_count(run_dir, "total_ranks", "rank_count")), _max_of(
            trials, _summary_count(run_dir, "trials_per_option", "trial_count"))
        cache[run_dir] = (ranks, trials)
    return cache[run_dir]


def _max_of(a: int | None, b: int | None) -> int | None:
    return max(x for x in (a, b) if x) if (a or b) else None


def _summary_count(run_dir: str, top: str, per_option: str) -> int | None:
    """A count the harness's `summary.json` in `run_dir` records (its top-level key, or the largest of its
    options'); None without the file."""
    try:
        data = json.loads(Path(run_dir, "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not is_harness_summary(data):
        return None
    counts = [data.get(top)] + [o.get(per_option) for o in data["options"].values() if isinstance(o, dict)]
    counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c > 0]
    return max(counts) if counts else None


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"trials": 0}
    mean = statistics.fmean(values)
    return {"trials": len(values), "per_trial": list(values), "min": min(values), "max": max(values),
            "range_pct": 100.0 * (max(values) - min(values)) / mean if mean else None,
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def _pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled figures where samples exist: ours merged per trial; the MLPerf tool's per-request lists."""
    ours = [r for r in rows if r.get("format") == "kv-cache"]
    theirs = [r for r in rows if r.get("format") == "mlperf-tool"]
    out: dict[str, Any] = {}
    if ours:
        out["kv_cache_merged_per_trial"] = _merged_trials(ours)
    if theirs:
        storage = np.asarray([x for r in theirs for x in r["doc"].view.latencies_s("storage_latencies")],
                             dtype=float) * 1e3
        out["mlperf_tool_request_storage_p95_ms"] = float(np.percentile(storage, 95)) if storage.size else None
        out["mlperf_tool_requests_pooled"] = int(storage.size)
    return out


def _merged_trials(rows: list[dict[str, Any]]) -> dict[str, Any]:
    trials: dict[str, Any] = {}
    for trial in sorted({r["trial"] for r in rows}):
        docs = [r["doc"] for r in rows if r["trial"] == trial]
        try:
            merged = merge_documents(docs, allow_missing=True)
        except MergeError as exc:
            trials[str(trial)] = {"error": str(exc)}
            continue
        storage = Figures.from_json(merged.get("summary")).cache.storage
        trials[str(trial)] = {"read_device_p95_ms": storage.read.ms("p95", "device"),
                              "write_device_p95_ms": storage.write.ms("p95", "device"),
                              "bandwidth_gibps": merged.get("bandwidth_gibps")}
    return trials


def _option(option: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rows if not r.get("error")]
    trials = sorted({r["trial"] for r in rows})
    meta = [r["run_meta"] for r in rows if r.get("run_meta")]
    # the ranks the run had: the highest rank seen, our documents' world_size, the harness's metadata
    ranks_expected = max([r["rank"] + 1 for r in rows] + [r["world_size"] for r in rows if r.get("world_size")]
                         + [m[0] for m in meta if m[0]])
    trials_expected = max([m[1] for m in meta if m[1]] + [max(trials) + 1])
    per_trial: dict[str, dict[str, Any]] = {}
    for t in trials:
        got = [r for r in good if r["trial"] == t]
        per_trial[str(t)] = {"ranks": len(got),
                             "missing_ranks": sorted(set(range(ranks_expected)) - {r["rank"] for r in got}),
                             **{k: (sum(r[k] for r in got) if got and all(r[k] is not None for r in got) else None)
                                for k in SUM_KEYS}}
    complete = [t for t, v in per_trial.items() if not v["missing_ranks"]]
    counted = complete or list(per_trial)  # a trial short of ranks is left out while complete ones exist
    score: dict[str, Any] = {"option": option, "trials": len(trials), "ranks_expected": ranks_expected,
                             "formats": sorted({r["format"] for r in good if r.get("format")}),
                             "trials_counted": [int(t) for t in counted],
                             "trials_left_out": [int(t) for t in per_trial if t not in counted],
                             "trials_without_files": sorted(set(range(trials_expected)) - set(trials)),
                             "trials_expected": trials_expected,
                             "no_complete_trial": not complete}
    # INCOMPLETE whenever a rank or a trial is missing, even with a complete trial scored
    score["incomplete"] = not complete or bool(score["trials_left_out"] or score["trials_without_files"])
    for k in SUM_KEYS:
        sums = [per_trial[t][k] for t in counted if per_trial[t][k] is not None]
        score[k] = statistics.fmean(sums) if sums else None
        score[f"{k}_spread"] = _spread(sums)
    for k in MAX_KEYS:
        vals = [r[k] for r in good if r[k] is not None and str(r["trial"]) in counted]
        score[k] = max(vals) if vals else None
    score["per_trial"] = per_trial
    score["pooled"] = _pooled(good)
    score["seeds"] = sorted({r["seed"] for r in good if r.get("seed") is not None})
    said = [str(r["status"]) if r["status"] is not None else "no verdict" for r in good]
    score["tool_status"] = {s: said.count(s) for s in sorted(set(said))}
    # ranks of ours whose document says it should not be averaged: named beside the sums they are in
    score["ranks_not_to_average"] = [{"trial": r["trial"], "rank": r["rank"], "status": r["rank_status"],
                                      "reason": r["rank_status_reason"]}
                                     for r in good if r.get("rank_status") not in (None, COMPLETE)]
    score["missing_keys"] = {r["file"]: r["missing"] for r in good if r["missing"]}
    score["unreadable"] = {r["file"]: r["error"] for r in rows if r.get("error")}
    return score


def rules_score(places: Iterable[tuple[int | None, int | None, int | None, str]]) -> dict[str, Any]:
    """The section 6 score per option of (option, trial, rank, file) tuples (None option/trial: one)."""
    rows = [_rank_row(o if o is not None else 0, t if t is not None else 0,
                      r if r is not None else _rank_in(f, i), f) for i, (o, t, r, f) in enumerate(places)]
    cache: dict[str, tuple[int | None, int | None]] = {}
    for row in rows:
        row["run_meta"] = _run_meta(row["file"], cache)
    options = {str(o): _option(o, [r for r in rows if r["option"] == o]) for o in sorted({r["option"] for r in rows})}
    return {"kind": "kv-cache-rules-score", "rules_section": 6, "files": len(rows), "options": options,
            "method": {"bandwidth_and_tokens": "sum over ranks within a trial, then mean over trials",
                       "device_p95": "maximum over ranks and trials (not a pooled percentile)",
                       "write_device_p95_mlperf_tool": "the MLPerf tool times only the fsync as a write's device time"}}


def _rank_in(path: str, index: int) -> int:
    found = re.findall(r"rank_?(\d+)", path)
    return int(found[-1]) if found else index


def _f(v: Any, digits: int = 3) -> str:
    return "missing" if v is None else f"{v:,.{digits}f}"


def format_score(score: dict[str, Any]) -> str:
    """The section 6 table, one block per option."""
    lines = ["MLPerf Storage Rules section 6 score (per option: sums over ranks within a trial, mean over trials;"
             " device P95 = max over ranks and trials)"]
    for key, s in score["options"].items():
        of = (f" of {s['trials_expected']}" if s.get("trials_expected", s["trials"]) != s["trials"] else "")
        lines += ["", f"Option {key}: {s['trials']}{of} trial(s) x {s['ranks_expected']} rank(s); files: "
                      f"{', '.join(s['formats']) or 'none readable'}"]
        if s["trials_left_out"]:
            lines.append(f"  trial(s) {', '.join(map(str, s['trials_left_out']))} left out of the score: ranks missing "
                         "(the complete trials are scored)")
        if s.get("trials_without_files"):
            lines.append(f"  trial(s) {', '.join(map(str, s['trials_without_files']))}: no rank file at all "
                         "(not in the score)")
        if s.get("no_complete_trial", s["incomplete"]):
            lines.append("  INCOMPLETE: no trial has every rank; the sums below are of the ranks there are")
        elif s["incomplete"]:
            lines.append(f"  INCOMPLETE: {s.get('trials_expected', s['trials'])} trial(s) x {s['ranks_expected']} "
                         "rank(s) expected, some missing (named here); the score is of the complete trials only")
        lines.append(f"  {'figure':<44} {'score':>14} {'trial min':>12} {'trial max':>12} {'spread':>8}")
        for k, label in (("read_gibps", "aggregate storage read bandwidth, GiB/s"),
                         ("write_gibps", "aggregate storage write bandwidth, GiB/s"),
                         ("storage_tokens_per_s", "aggregate storage throughput, tokens/s"),
                         ("avg_tokens_per_s", "aggregate throughput (wall clock), tokens/s")):
            sp = s[f"{k}_spread"]
            spread = "-" if sp.get("range_pct") is None else f"{sp['range_pct']:.1f}%"
            lines.append(f"  {label:<44} {_f(s[k]):>14} {_f(sp.get('min')):>12} {_f(sp.get('max')):>12} {spread:>8}")
        lines.append(f"  {'aggregate device read P95, ms (max)':<44} {_f(s['read_device_p95_ms']):>14}")
        lines.append(f"  {'aggregate device write P95, ms (max)':<44} {_f(s['write_device_p95_ms']):>14}"
                     + _write_device_note(s["formats"]))
        lines.append(f"  {'per-request storage time P95, ms (max)':<44} {_f(s['request_storage_p95_ms']):>14}")
        lines += _pooled_lines(s["pooled"])
        for t, v in s["per_trial"].items():
            gaps = f"; missing rank(s) {', '.join(map(str, v['missing_ranks']))}" if v["missing_ranks"] else ""
            lines.append(f"  trial {t}: {v['ranks']} rank(s), read {_f(v['read_gibps'])} GiB/s, write "
                         f"{_f(v['write_gibps'])} GiB/s, {_f(v['storage_tokens_per_s'], 1)} storage tokens/s{gaps}")
        if s["missing_keys"]:
            lines.append(f"  keys missing in {len(s['missing_keys'])} file(s): " + "; ".join(
                f"{f}: {', '.join(k)}" for f, k in list(s["missing_keys"].items())[:3]))
        for e in s["unreadable"].values():
            lines.append(f"  unreadable: {e}")
        for x in s.get("ranks_not_to_average") or []:
            lines.append(f"  not to average (its rank_status): trial {x['trial']} rank {x['rank']} {x['status']}: "
                         f"{x['reason']}")
        lines.append(f"  the files' own verdicts: {', '.join(f'{k} x{n}' for k, n in s['tool_status'].items())}")
    return "\n".join(lines) + "\n"


def _write_device_note(formats: list[str]) -> str:
    """What the write device P95 covers: the MLPerf tool times the fsync alone, we time the whole write."""
    if formats == ["mlperf-tool"]:
        return "   (MLPerf tool: fsync alone)"
    if "mlperf-tool" in formats:
        return "   (mixed: the MLPerf tool's ranks time the fsync alone, ours the whole write)"
    return ""


def _pooled_lines(pooled: dict[str, Any]) -> list[str]:
    lines = []
    if pooled.get("mlperf_tool_requests_pooled") == 0:
        lines.append(f"  {'pooled per-request storage time P95, ms':<44} {'n/a':>14}   (the files keep no "
                     "per-request lists)")
    elif "mlperf_tool_request_storage_p95_ms" in pooled:
        lines.append(f"  {'pooled per-request storage time P95, ms':<44} "
                     f"{_f(pooled['mlperf_tool_request_storage_p95_ms']):>14}   "
                     f"({pooled['mlperf_tool_requests_pooled']} requests; the tool keeps no per-I/O samples)")
    for t, v in (pooled.get("kv_cache_merged_per_trial") or {}).items():
        if "error" in v:
            lines.append(f"  pooled (our recorders merged), trial {t}: not available: {v['error']}")
        else:
            lines.append(f"  pooled (our recorders merged), trial {t}: device read P95 {_f(v['read_device_p95_ms'])}"
                         f" ms, device write P95 {_f(v['write_device_p95_ms'])} ms")
    return lines
