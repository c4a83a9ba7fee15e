"""One merged results document from the per-rank documents of one run (mpirun, --processes, the harness).

A merge is the single-run summary run on merged data: each rank's document carries its recorder
(`recorder`: counters, per-tier operation and byte counts, errors; `latency_samples`: the per-operation
lists; the per-request lists; `latency_histograms`: the HdrHistograms; `time_series`), the merge adds
them up into one RunMetrics, and the summary code of a single run (results/summary.py build_summary) makes
`summary` from it, with the inputs the ranks were run with (`summary_inputs`). There is no second
implementation of any figure:
- totals are the recorders' sums; rates are merged totals over the merged window;
- percentiles: exact, of the union of the ranks' samples, while every rank kept every sample of a list
  (and the union is under `exact_cap` samples); else from the merged HdrHistograms (3 significant digits,
  1 ns floor: within 0.1 % of the union's exact value at the same rank (HdrHistogram's round(q/100 n)); tests/test_histograms.py holds it
  for medians from 800 ns to 0.9 s). `latency_ms.<list>.method` says which, `percentile_precision` what
  that means. Never from unweighted subsamples;
- the window runs from the earliest rank start to the latest rank end. How far apart the ranks' starts
  and ends were is measured (`window.start_spread_s`, `end_spread_s`, `overlap_seconds`): the window is
  called "common (barrier-aligned)" only when every rank of the run is there, barriers opened and closed
  every rank's window (each rank's own record: `window_wallclock.barrier_aligned`, and no note of a broken
  closing barrier) and the spreads are within COMMON_TOLERANCE of it;
- `max_of_rank_p95_ms`: the maximum of the ranks' P95 that the Rules (and the mlpstorage harness) take,
  and `sum_of_ranks`, the harness's sum of the ranks' rates, beside the merged figures; `per_rank` rows.

Before anything is added up, the ranks are checked to be one run's, complete: one `run_id`, one world
size, no rank twice and none missing (MergeError names the files; `allow_missing` lets a run that lost a
rank merge what it has, naming the missing ranks, and its verdict is then INCOMPLETE).

Every writer of a merged document (`--processes`, mpirun rank 0, `kv-cache merge`) gets the same shape from
`merge_documents`: `verdict` (PASS / FAIL / INCOMPLETE), `window_fraction`, `missing_ranks`,
`ranks_expected`, `lost_ranks` (results/verdict.py conclude_merge); `run_parameters` holding the run's
totals (each SPLIT setting as given for the whole run, the base seed, mpi_world_size N; the per-rank shares
under `settings_split`); a `measurement` with the ranks' common facts (chunk size, I/O mode, filesystem...)
and `per_rank` facts where they differ.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from kv_cache import __version__
from kv_cache.metrics import catalogue
from kv_cache.metrics.histograms import SIGNIFICANT_DIGITS, percentile_values
from kv_cache.metrics.histograms import summary as histogram_summary
from kv_cache.metrics.recorder import GIB, PERCENTILES, RunMetrics
from kv_cache.metrics.stats import percentiles
from kv_cache.metrics.timeseries import merge_rows
from kv_cache.results import measurement as meas
from kv_cache.results.documents import MERGED_SCHEMA_VERSION, RunDocument
from kv_cache.results.figures import CacheStats, Figures
from kv_cache.results.integrity import audit_facts, facts_from_ours, merged_integrity
from kv_cache.results.parameters import merged_settings_split
from kv_cache.results.partial import partial_until
from kv_cache.results.rank_files import (
    MergeError,
    check_one_run,
    find_rank_files,
    load_documents,
    rank_doc,
    rank_of,
)
from kv_cache.results.series import SERIES_NOTE
from kv_cache.results.summary import block_stats, build_summary, harness_keys, per_turn_stats
from kv_cache.results.verdict import (
    INCOMPLETE,
    conclude_merge,
    rank_status,
    ranks_not_to_average,
    window_fraction,
)
from kv_cache.storage.tiername import TierName

__all__ = ["EXACT_CAP", "MERGED_SCHEMA_VERSION", "MergeError", "find_rank_files", "load_documents",
           "merge_documents"]

# Per-request lists of the MLPerf tool's layout (seconds): recorder name, merged latency block name.
_REQUEST_LISTS = {"end_to_end_latencies": ("e2e", "end_to_end"), "storage_latencies": ("storage", "storage_io"),
                  "generation_latencies": ("generation", "generation"), "prefill_latencies": ("prefill", None),
                  "decode_latencies": ("decode", None)}
_PARTS = ("total", "device", "host")
_ROW_ONLY = ("sums", "usage", "rag_stats", "requests_issued", "requests_failed", "stop_reason",
             "facts", "counts")  # not in per_rank
# What each rank's measurement says of how it measured: the merged measurement holds a fact once when every
# rank says the same, else None there and each rank's value under measurement.per_rank.
FACTS = ("run_dir", "filesystem", "filesystem_kind", "io_mode", "chunk_bytes", "fsync", "io_workers", "timed",
         "device_timer", "run_mode", "tier_backends")
# Per-rank measurement figures that add up across ranks.
COUNTS = ("requests_issued", "requests_rejected", "requests_failed", "process_cpu_seconds", "offered_request_rate")
CLOSING_BARRIER_BROKE = "closing barrier"  # in a rank's measurement note (benchmarks/standard/run.py)
_OP_LISTS = [(t, o) for t in (TierName.STORAGE, TierName.CPU) for o in ("read", "write")]
EXACT_CAP = 50_000_000  # samples per merged list kept for exact percentiles (8 bytes each: 400 MB)
COMMON_TOLERANCE = 0.01  # starts and ends this close (fraction of the window, or 0.5 s) make a common window
PRECISION = (f"HdrHistogram, {SIGNIFICANT_DIGITS} significant digits: a percentile is within "
             f"{100 * 10.0 ** -SIGNIFICANT_DIGITS:g} % of the value of the exact union")
EXACT = "exact (the union of every rank's samples)"
FROM_HISTOGRAMS = "merged HdrHistograms"


@dataclass
class _Lists:
    """Per (tier, op): whether the union of the ranks' samples is still exact."""

    exact: dict[tuple[str, str], bool] = field(default_factory=dict)


def _absorb(metrics: RunMetrics, lists: _Lists, doc: dict[str, Any], exact_cap: int) -> None:
    """Add one rank's recorder, samples and histograms to `metrics`."""
    metrics.absorb_state(doc["recorder"])
    for key, (name, _) in _REQUEST_LISTS.items():
        listed = doc.get(key)  # a list as read from a file, a float64 array in a document built here
        seconds = np.asarray(listed if listed is not None else (), dtype=float)
        metrics.absorb_request_samples(name, np.rint(seconds * 1e9))
    for key, block in (doc.get("latency_histograms") or {}).items():
        a, b, kind = key.split("_")
        metrics.absorb_histogram((a, b, kind), block["hdr"])
    samples = doc.get("latency_samples") or {}
    io = doc["recorder"].get("io", {})
    for tier, op in {tuple(k.split("/")) for k in io} | set(lists.exact):
        ops = io.get(f"{tier}/{op}", {}).get("ops", 0)
        parts = [samples.get(f"{tier}_{op}_{p}_ns") for p in _PARTS]
        kept_all = all(p is not None and p["stride"] == 1 and p["count"] == ops for p in parts) or ops == 0
        held = len(metrics.tier_op(tier, op).total_ns)
        exact = lists.exact.get((tier, op), True) and kept_all and held + ops <= exact_cap
        if exact and ops:
            for part, block in zip(_PARTS, parts, strict=True):
                metrics.absorb_samples(tier, op, part, block["values"])
        elif not exact and lists.exact.get((tier, op), True):
            s = metrics.io[(tier, op)]
            s.total_ns.clear(), s.device_ns.clear(), s.host_ns.clear()  # from here on the histograms
            metrics.subsampled.add((tier, op))
        lists.exact[(tier, op)] = exact


def _window(rows: Sequence[dict[str, Any]], missing: Sequence[int] = ()) -> dict[str, Any]:
    """The merged window, and whether it was one common window: only when every rank is there and each
    rank's own record says barriers opened and closed its window."""
    rank_seconds = [r["window_seconds"] for r in rows]
    clocks = [r["_window"] for r in rows]
    if not all(c.get("start_unix") is not None and c.get("end_unix") is not None for c in clocks):
        return {"kind": "longest rank window (documents without wall-clock window times)",
                "seconds": max(rank_seconds), "start_unix": None, "end_unix": None, "rank_seconds": rank_seconds}
    starts, ends = [c["start_unix"] for c in clocks], [c["end_unix"] for c in clocks]
    start, end = min(starts), max(ends)
    seconds = max(0.0, end - start)
    spread_start, spread_end = max(starts) - min(starts), max(ends) - min(ends)
    overlap = max(0.0, min(ends) - max(starts))
    tolerance = max(0.5, COMMON_TOLERANCE * seconds)
    broke = [r["rank"] for r in rows if r.get("_closing_broke")]
    cut = [r["rank"] for r in rows if r.get("verdict") == INCOMPLETE]
    unaligned = [r["rank"] for r, c in zip(rows, clocks, strict=True) if not c.get("barrier_aligned")]
    why = []
    if missing:
        why.append(f"rank(s) {', '.join(map(str, missing))} missing")
    if broke:
        why.append(f"the closing barrier broke on rank(s) {', '.join(map(str, broke))}")
    if cut:
        why.append(f"rank(s) {', '.join(map(str, cut))} incomplete (window cut short; see incomplete_ranks)")
    if not why and not unaligned and max(spread_start, spread_end) <= tolerance:
        kind = "common (barrier-aligned)"
    elif overlap > 0:
        kind = "union of the ranks' windows"
    else:
        kind = "union of the ranks' windows, which do not overlap (not one common window)"
    if why and overlap > 0:
        kind += f" (not common: {'; '.join(why)})"
    return {"kind": kind, "seconds": seconds, "start_unix": start, "end_unix": end, "rank_seconds": rank_seconds,
            "start_spread_s": spread_start, "end_spread_s": spread_end, "overlap_seconds": overlap,
            "common_tolerance_s": tolerance,
            "barriers": {"opened_and_closed_every_window": not (broke or unaligned or missing),
                         "closing_broke_on": broke, "not_barrier_aligned": unaligned}}


def _row(doc: RunDocument, index: int) -> dict[str, Any]:
    d = doc.data
    s, f = d.get("summary") or {}, doc.figures
    cs = f.cache
    return {
        "rank": rank_of(doc, index), "host": doc.parameters.get("host"), "file": doc.source, "seed": d.get("seed"),
        "window_seconds": doc.window["seconds"], "requests": d.get("requests_completed", 0),
        "storage_read_gib": _or(cs.storage.read.bytes_gb, 0.0),
        "storage_write_gib": _or(cs.storage.write.bytes_gb, 0.0),
        "storage_read_gibps": cs.storage.read.bandwidth_gbps or 0.0,
        "storage_write_gibps": cs.storage.write.bandwidth_gbps or 0.0,
        "e2e_p95_ms": f.e2e.p95, "storage_io_p95_ms": f.storage_io.p95,
        "storage_read_device_p95_ms": cs.storage.read.ms("p95", "device"),
        "overall_passed": bool(d.get("overall_passed")), "storage": doc.storage,
        "requests_issued": int(doc.measurement.get("requests_issued") or 0),
        "requests_failed": int(doc.measurement.get("requests_failed") or 0),
        "stop_reason": d.get("stop_reason"),
        # whether the rank counts: as its document says, or (documents written before it) from its verdict
        **dict(zip(("rank_status", "rank_status_reason"),
                   (d["rank_status"], d.get("rank_status_reason")) if d.get("rank_status") else rank_status(d),
                   strict=True)),
        "sums": {**{f"tier_storage_{op}_bandwidth_gbps": float(cs.storage.op(op).bandwidth_gbps or 0.0)
                    for op in ("read", "write")},
                 "avg_throughput_tokens_per_sec": float(f.tokens_per_sec or 0.0),
                 "storage_throughput_tokens_per_sec": float(f.storage_tokens_per_sec or 0.0)},
        "rag_stats": s.get("rag_stats"), "usage": _usage(cs), "_window": doc.window, "_run_id": doc.run_id,
        "_integrity": d.get("integrity"),
        "_verify": (d.get("measurement") or {}).get("verify") or {},
        "_edge": isinstance((d.get("measurement") or {}).get("window_edge"), dict),
        "_process_io": (d.get("measurement") or {}).get("process_io"),
        "_params": doc.parameters,
        "_trace_paths": (d.get("trace_replay") or {}).get("paths"),
        "_storage_location": _storage_of(doc.measurement or {}),
        "_series": (d.get("time_series") or {}).get("rows") or [],
        "_metrics": s.get("metrics"),  # the catalogue's values: its SUM and MAX entries merge from them
        "verdict": d.get("verdict"), "window_fraction": d.get("window_fraction"),
        "facts": {**{k: doc.measurement.get(k) for k in FACTS},
                  "block_device": (doc.measurement.get("block_device") or {}).get("name")},
        "counts": {k: doc.measurement.get(k) for k in COUNTS},
        "_depth": doc.measurement.get("achieved_queue_depth") or {},
        "_remote": doc.measurement.get("remote_tier"),
        "_shaping": doc.measurement.get("tier_shaping"),
        "_skips": doc.measurement.get("tier_skipped_entries"),
        "_load": {k: doc.measurement.get(k) for k in ("requested_request_rate", "arrivals_offered",
                                                      "arrivals_not_offered", "generator_saturated")},
        "_closing_broke": any(CLOSING_BARRIER_BROKE in str(n) for n in doc.measurement.get("notes") or []),
        "_partial": partial_until(d),  # a periodic document: the rank never wrote its final one
    }


def _usage(cs: CacheStats) -> dict[str, dict[str, float]]:
    """A rank's cache at its end, as the summary code takes it (tier -> entries, used bytes)."""
    return {t.legacy: {"entries": _or(cs.tier(t).entries, 0), "used_bytes": _or(cs.tier(t).memory_used_gb, 0.0) * GIB}
            for t in TierName}


def _or(value: Any, default: Any) -> Any:
    """`value`, or `default` where the document lacked it (None): what `.get(key, default)` gave."""
    return default if value is None else value


def _inputs(first: dict[str, Any]) -> tuple[str, Any, dict[str, Any], int]:
    """The performance profile, criteria and QoS profiles the ranks were run with (their summary_inputs)."""
    inputs = first.get("summary_inputs") or {}
    criteria = SimpleNamespace(**inputs["performance_criteria"]) if "performance_criteria" in inputs else None
    qos = {level: SimpleNamespace(**p) for level, p in (inputs.get("qos_profiles") or {}).items()}
    return inputs.get("performance_profile", "latency"), criteria, qos, int(inputs.get("kv_block_tokens") or 0)


def _op_block(metrics: RunMetrics, tier: str, op: str, part: str) -> dict[str, Any]:
    s = metrics.tier_op(tier, op)
    if (tier, op) in metrics.subsampled:
        h = metrics.histograms.get((tier, op, part))
        if h is None or h.get_total_count() == 0:
            return {"count": 0}
        ps = percentile_values(h, list(PERCENTILES.values()))
        return {"count": int(h.get_total_count()), "mean": h.get_mean_value() / 1e6,
                **{k: ps[q] / 1e6 for k, q in PERCENTILES.items()}, "max": h.get_max_value() / 1e6,
                "samples": int(h.get_total_count()), "method": FROM_HISTOGRAMS, "precision": PRECISION}
    values = getattr(s, f"{part}_ns").array()
    if not len(values):
        return {"count": 0}
    return {"count": len(values), "mean": float(values.mean()) / 1e6, **metrics.op_percentiles_ms(tier, op, part),
            "max": float(values.max()) / 1e6, "samples": len(values), "method": EXACT}


def _block(values_ms: np.ndarray) -> dict[str, Any]:
    if not len(values_ms):
        return {"count": 0}
    ps = percentiles(values_ms, list(PERCENTILES.values()))
    return {"count": int(len(values_ms)), "mean": float(values_ms.mean()),
            **dict(zip(PERCENTILES, ps, strict=True)), "max": float(values_ms.max())}


def _latencies(metrics: RunMetrics) -> dict[str, Any]:
    out: dict[str, Any] = {}
    r = metrics.requests
    for name, block in (("e2e", "end_to_end"), ("storage", "storage_io"), ("generation", "generation")):
        b = _block(getattr(r, f"{name}_ns").array() / 1e6)
        out[block] = {**b, "method": EXACT} if b["count"] else b
    for tier, op in _OP_LISTS:
        for part in ("total", "device"):
            block = _op_block(metrics, tier, op, part)
            if block["count"]:
                out[f"{tier}_{op}_{part}"] = block
    return out


def _max_of(values: Iterable[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return max(vals) if vals else None


def merge_documents(docs: Iterable[dict[str, Any] | str | RunDocument], allow_missing: bool = False,
                    exact_cap: int = EXACT_CAP, ended: dict[int, str] | None = None) -> dict[str, Any]:
    """The merged results document of one run's rank documents (dicts, paths or RunDocuments; see the
    module docstring). Documents in memory are checked to be one run's before anything is added up; paths
    are read one at a time, added up and let go (so a merge of hundreds of ranks holds the merged recorder,
    not every rank's document), and checked once all are read, before anything is written. `ended`: how
    each missing rank ended, where the writer knows it (its `lost_ranks`)."""
    items = list(docs)
    if not items:
        raise MergeError("no per-rank results to merge")
    in_memory = not any(isinstance(d, (str, os.PathLike)) for d in items)
    heads = [rank_doc(d) for d in items] if in_memory else []
    missing = check_one_run(heads, allow_missing) if in_memory else []
    metrics, lists, rows, seen = RunMetrics(EXACT_CAP, request_histograms=False), _Lists(), [], []
    inputs = None
    for i, item in enumerate(items):
        doc = heads[i] if in_memory else rank_doc(item)
        if doc.mergeable:
            _absorb(metrics, lists, doc.data, exact_cap)
        rows.append(_row(doc, i))
        inputs = inputs or _inputs(doc.data)
        seen.append(RunDocument({**{k: doc.data.get(k) for k in ("run_id", "world_size", "run_parameters", "recorder")},
                                 "measurement": {k: doc.measurement.get(k) for k in ("window_seconds",
                                                                                    "window_wallclock")}},
                                doc.source))
        del doc  # the rank's lists go now
    if not in_memory:
        missing = check_one_run(seen, allow_missing)
    return _merged(metrics, rows, inputs, missing, ended)


def _summary(metrics: RunMetrics, rows: list[dict[str, Any]], inputs, error_rate: float) -> dict[str, Any]:
    """The single-run summary (results/summary.py) of the merged recorder, with the inputs the ranks were run
    with; catalogue metrics with a merge rule of their own, per-turn, block and RAG figures beside it."""
    profile, criteria, qos, block_tokens = inputs or ("latency", None, {}, 0)
    usage: dict[str, dict[str, float]] = {}
    for r in rows:
        for tier, u in r["usage"].items():
            cell = usage.setdefault(tier, {"entries": 0, "used_bytes": 0.0})
            cell["entries"] += u["entries"]
            cell["used_bytes"] += u["used_bytes"]
    # a missing rank is not a storage error: it is a criterion of its own (verdict.py conclude_merge)
    fatal = next((r["stop_reason"] for r in rows if str(r["stop_reason"] or "").startswith("storage error")), None)
    summary = build_summary(metrics, usage, qos or _default_qos(), profile, criteria, error_rate,
                            fatal_error=fatal, storage_expected=True)
    summary["metrics"] = catalogue.merged_values(summary["metrics"], (r["_metrics"] for r in rows))
    summary["per_turn"] = per_turn_stats(metrics)
    if block_tokens > 0:
        summary["block_stats"] = block_stats(metrics, block_tokens)
    rags = [r["rag_stats"] for r in rows if r["rag_stats"]]
    if rags:
        summary["rag_stats"] = {k: sum(x.get(k, 0) for x in rags) for k in rags[0]}
    return summary


def _merged(metrics: RunMetrics, rows: list[dict[str, Any]], inputs, missing: list[int],
            ended: dict[int, str] | None = None) -> dict[str, Any]:
    rows.sort(key=lambda r: r["rank"])
    window = _window(rows, missing)
    w = window["seconds"]
    metrics.open_window(0)
    metrics.close_window(int(round(w * 1e9)))
    metrics.freeze()
    issued, failed = sum(r["requests_issued"] for r in rows), sum(r["requests_failed"] for r in rows)
    summary = _summary(metrics, rows, inputs, failed / max(1, issued))
    lat = _latencies(metrics)
    for name, block in (("end_to_end_latency_ms", "end_to_end"), ("storage_io_latency_ms", "storage_io"),
                        ("generation_latency_ms", "generation")):
        summary[name].update(count=lat[block]["count"], max=lat[block].get("max", 0.0))
    f = Figures.from_json(summary)
    cs = f.cache
    read_gibps, write_gibps = cs.storage.read.bandwidth_gbps or 0.0, cs.storage.write.bandwidth_gbps or 0.0
    r = metrics.requests
    read_b, write_b = metrics.tier_op(TierName.STORAGE, "read").window_bytes, metrics.tier_op(TierName.STORAGE, "write").window_bytes
    harness = harness_keys(summary)
    harness["overall_passed"] = harness["overall_passed"] and all(x["overall_passed"] for x in rows)
    per_rank = [{k: v for k, v in x.items() if not k.startswith("_") and k not in _ROW_ONLY} for x in rows]
    methods = {k: v.get("method") for k, v in lat.items() if v.get("count")}
    split = merged_settings_split([{"run_parameters": x["_params"]} for x in rows])
    world = len(rows) + len(missing)
    merged = {
        "schema_version": MERGED_SCHEMA_VERSION,
        "run_id": rows[0]["_run_id"],
        "world_size": len(rows) + len(missing),
        "missing_ranks": missing,
        "merged_from": [x["file"] for x in rows],
        "stop_reason": "; ".join(sorted({str(x["stop_reason"]) for x in rows})),
        # The run's parameters: the totals given (run_totals); per rank: `per_rank`, `settings_split`.
        "run_parameters": run_totals(rows, split, world),
        "ranks": len(rows),
        "settings_split": split,
        "window": window,
        "totals": {
            "requests_completed": r.completed, "tokens_generated": r.tokens_generated,
            "storage_io_seconds": f.storage_io_s,
            "storage_read_bytes": read_b, "storage_write_bytes": write_b,
            "cache_hits": cs.hits, "cache_misses": cs.misses,
            "requests_failed": failed, "requests_issued": issued, "errors": int(sum(metrics.errors.values())),
        },
        "bandwidth_gibps": {"storage_read": read_gibps, "storage_write": write_gibps,
                            "storage_total": read_gibps + write_gibps},
        "latency_ms": lat,
        "percentile_method": methods,
        "percentile_precision": {EXACT: "exact", FROM_HISTOGRAMS: PRECISION},
        "max_of_rank_p95_ms": {
            "storage_io_latency": _max_of(x["storage_io_p95_ms"] for x in rows),
            "storage_read_device": _max_of(x["storage_read_device_p95_ms"] for x in rows),
            "end_to_end_latency": _max_of(x["e2e_p95_ms"] for x in rows),
        },
        "sum_of_ranks": {k: sum(x["sums"][k] for x in rows) for k in rows[0]["sums"]},
        "per_rank": per_rank,
        "measurement": {"tool": f"kv-cache {__version__}", "window_seconds": w, "run_mode": "merge of ranks",
                        **measurement_facts(rows, w, read_b + write_b),
                        "counters": metrics.snapshot_counters(), "errors": int(sum(metrics.errors.values())),
                        "errors_by_kind": dict(metrics.errors), "first_error": metrics.first_error,
                        "storage": {str(x["rank"]): x["storage"] for x in rows},
                        "process_io": _summed_process_io(rows),
                        # summed over the ranks; None when a rank's document predates the record
                        "window_edge": ({**metrics.edge_record(), "method": "the ranks' window_edge summed"}
                                        if all(x["_edge"] for x in rows) else None),
                        "verify": {"enabled": any(x["_verify"].get("enabled") for x in rows),
                                   "mismatches": metrics.verify_mismatches},
                        "stop_reason": "; ".join(sorted({str(x["stop_reason"]) for x in rows})),
                        "notes": [f"merge of {len(rows)} rank(s); window: {window['kind']}"]},
        "time_series": {"bucket_seconds": 1.0, "note": SERIES_NOTE + "; merged: the ranks' rows summed, "
                        "percentiles the highest rank's", "rows": merge_rows([x["_series"] for x in rows])},
        "latency_histograms": {f"{a}_{b}_{k}": histogram_summary(h) for (a, b, k), h in sorted(metrics.histograms.items())},
        "summary": summary,
        # The seven top-level keys the mlpstorage harness reads, from the merged figures; passed = every rank too.
        **harness,
        **rank_facts(rows),
    }
    # what each rank's measurement says of the load it offered and the tiers its entries skipped, for the run
    notes = merged["measurement"]["notes"]
    merged["measurement"].update(meas.merged_offered_load([(x["rank"], x["_load"]) for x in rows], w, notes))
    skips, skip_notes = meas.merged_tier_skips([(x["rank"], x["_skips"]) for x in rows])
    merged["measurement"]["tier_skipped_entries"] = skips
    notes.extend(skip_notes)
    fractions = [float(x["window_fraction"]) for x in rows if x.get("window_fraction") is not None]
    duration = float(merged["run_parameters"].get("duration") or 0.0)
    fraction = min(fractions) if fractions else window_fraction(w, duration)
    incomplete = [x["rank"] for x in rows if x.get("verdict") == INCOMPLETE]
    # the checks recomputed from the merged counters, with each rank's own verdict (interposers, page cache)
    merged["integrity"] = merged_integrity({x["rank"]: x["_integrity"] for x in rows},
                                           audit_facts(facts_from_ours(merged)))
    conclude_merge(merged, missing, world, fraction, incomplete, ended)
    merged["incomplete_ranks"] = incomplete_ranks(rows, ended)
    merged["ranks_not_to_average"] = ranks_not_to_average(rows, merged["lost_ranks"])
    return merged


PERIODIC = "periodic (the rank ended without its final document: its last periodic one)"
CUT_SHORT = "final (the rank's window was cut short: a signal, a storage error)"


def incomplete_ranks(rows: Sequence[dict[str, Any]], ended: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The merged document's `incomplete_ranks`: each rank whose document is INCOMPLETE, up to when it was
    measured (`measured_s` of its window, `measured_until_unix` its end on the wall clock), which document
    it is (PERIODIC: the last one the rank wrote before it died, its `sequence` and `written_unix`; or
    CUT_SHORT, its final one), and how it ended where the writer knows it (`ended`). Its figures are in the
    merged totals for that part of the window only: no merged figure is a full window of it."""
    out = []
    for x in rows:
        if x.get("verdict") != INCOMPLETE:
            continue
        partial = x.get("_partial")
        out.append({"rank": x["rank"], "document": PERIODIC if partial else CUT_SHORT,
                    "measured_s": x["window_seconds"], "measured_until_unix": (x.get("_window") or {}).get("end_unix"),
                    "window_fraction": x.get("window_fraction"), "stop_reason": x.get("stop_reason"),
                    "reason": x.get("rank_status_reason"),
                    **({"sequence": partial.get("sequence"), "written_unix": partial.get("written_unix")}
                       if partial else {}),
                    **({"ended": ended[x["rank"]]} if ended and x["rank"] in ended else {})})
    return out


def _summed_process_io(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' /proc/<pid>/io bytes summed (every rank a process of its own); None when one lacks them."""
    blocks = [x["_process_io"] for x in rows]
    if not blocks or not all(isinstance(b, dict) for b in blocks):
        return None
    return {"read_bytes": sum(int(b.get("read_bytes") or 0) for b in blocks),
            "write_bytes": sum(int(b.get("write_bytes") or 0) for b in blocks), "processes": len(blocks),
            "source": "the ranks' /proc/<pid>/io read_bytes/write_bytes over their windows, summed"}


def run_totals(rows: Sequence[dict[str, Any]], split: dict[str, Any] | None, world: int) -> dict[str, Any]:
    """The merged `run_parameters`: rank 0's (the flags every rank shares), with every SPLIT setting the
    total given for the whole run (settings_split.totals, which each rank records: settings/ranks.py), the
    base seed, `mpi_world_size` the run's N, the tier sizes in force (`*_effective`) summed over the ranks;
    `mpi_rank` None (no one rank). Rank 0's parameters as they are when the ranks predate the record."""
    params = {**rows[0]["_params"], "merged_ranks": len(rows)}
    if split is None:
        return params
    for name, total in (split.get("totals") or {}).items():
        if name in params and params[name] is not None:
            params[name] = total
    params.update(mpi_world_size=world, mpi_rank=None)
    for key in ("gpu_mem_gb_effective", "cpu_mem_gb_effective", "storage_capacity_gb_effective"):
        values = [(r["_params"] or {}).get(key) for r in rows]
        if values and all(isinstance(v, (int, float)) for v in values):
            params[key] = sum(values)
    return params


def measurement_facts(rows: Sequence[dict[str, Any]], window_s: float, moved_bytes: float) -> dict[str, Any]:
    """How the ranks measured, for the merged `measurement` (the console's MEASUREMENT section): each of
    FACTS once when every rank says the same (None when they differ), every rank's under `per_rank`; the
    COUNTS and queue depths summed; the block device by name (its counters cover every process using it,
    so no rank's are the run's)."""
    facts: dict[str, Any] = {}
    for key in (*FACTS, "block_device"):
        values = [r["facts"].get(key) for r in rows]
        if any(v is not None for v in values):  # (rank documents that never said it: not said here either)
            facts[key] = values[0] if all(v == values[0] for v in values) else None
    facts["run_mode"] = "merge of ranks" + (f": {facts['run_mode']}" if facts.get("run_mode") else "")
    facts["block_device"] = {"name": facts["block_device"]} if facts.get("block_device") else {}
    for key in COUNTS:
        values = [r["counts"].get(key) for r in rows if r["counts"].get(key) is not None]
        if values:
            facts[key] = sum(values)
    facts["achieved_queue_depth"] = {op: sum(float(r["_depth"].get(op) or 0.0) for r in rows)
                                     for op in ("read", "write")}
    if facts.get("process_cpu_seconds") is not None and moved_bytes > 0:
        facts["cpu_seconds_per_gib"] = facts["process_cpu_seconds"] / (moved_bytes / GIB)
    facts["per_rank"] = [{"rank": r["rank"], **r["facts"]} for r in rows]
    remote = meas.merge_remote([r["_remote"] for r in rows if r.get("_remote")])
    if remote:
        facts["remote_tier"] = remote
    shaping = meas.merge_shaping([r["_shaping"] for r in rows if r.get("_shaping")])
    if shaping:  # --tier-bandwidth / --tier-latency: each shaped tier's, the ranks' summed
        facts["tier_shaping"] = shaping
    return facts


def rank_facts(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What readers of a merged document need from its ranks (render/compare.py): each rank's
    `run_parameters` and replayed trace files (`rank_parameters`, `rank_trace_paths`: the workload check of
    `kv-cache compare`) and the storage it measured (`rank_storage`: its measurement.storage_location, or
    what older rank documents said of it), in rank order (`rows` are sorted by rank)."""
    return {"rank_parameters": [r["_params"] or {} for r in rows],
            "rank_trace_paths": [r["_trace_paths"] for r in rows],
            "rank_storage": [r["_storage_location"] for r in rows]}


def _storage_of(m: dict[str, Any]) -> dict[str, Any]:
    if m.get("storage_location"):
        return m["storage_location"]
    return {"cache_dir": m.get("run_dir"), "filesystem": m.get("filesystem"), "filesystem_kind": m.get("filesystem_kind"),
            "block_device": (m.get("block_device") or {}).get("name"), "io_mode": m.get("io_mode")}


def _default_qos() -> dict[str, Any]:
    from kv_cache.settings.sections import BenchConfig  # noqa: PLC0415  (documents without summary_inputs)

    return dict(BenchConfig().qos_profiles)
