"""The measured parts of the results document: the `summary`, the harness keys and per-request lists.

Every number here is derived from RunMetrics of this run. Key names and units are the MLPerf tool's:
"GB" means GiB, "_gbps" means GiB/s, "_ms" milliseconds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kv_cache.metrics import catalogue, names
from kv_cache.metrics.catalogue import MIN_RATE_WINDOW_S as MIN_RATE_WINDOW_S  # where tests and readers look
from kv_cache.metrics.catalogue import per_second, rates_undefined_reason
from kv_cache.metrics.histograms import merge as merge_histograms
from kv_cache.metrics.histograms import percentiles_ms as histogram_percentiles_ms
from kv_cache.metrics.recorder import GIB, PERCENTILES, RunMetrics, mean_ms, percentiles_ms
from kv_cache.metrics.stats import percentile
from kv_cache.results.figures import (
    CacheStats,
    Criterion,
    Figures,
    Hits,
    LatencyBlock,
    Percentiles,
    RequestTotals,
    StorageHealth,
    TierFigures,
    TierOp,
)
from kv_cache.results.verdict import run_criteria
from kv_cache.storage.tiername import TierName
from kv_cache.workload.qos import QOS_LEVELS

TIERS = tuple(TierName)
OPS = ("read", "write")


def _latency_block(samples_ns) -> LatencyBlock:
    """mean, p50 ... p9999 in ms (the MLPerf JSON's per-request latency blocks; 0.0 without samples)."""
    p = percentiles_ms(samples_ns)
    return LatencyBlock(mean_ms(samples_ns), **{k: p.get(k, 0.0) for k in PERCENTILES})


def _seconds(samples_ns) -> np.ndarray:
    """A per-request list in seconds: every request's while the list holds them all (SAMPLE_CAP, 200,000),
    a uniform reservoir of that many beyond (a 24-hour run's JSON does not grow with its length).

    A float64 array, not a list of Python floats: a periodic document built every 10 s then makes no
    200,000 float objects per list, which left Python's small-object arenas larger after each build (the
    1-hour soak's RSS growth). Both writers (results/write.py) write it as the list it stands for, the
    same bytes (tests/test_request_arrays.py); a reader of the in-memory document takes it with
    np.asarray, never `or []`."""
    return samples_ns.array() / 1e9  # (a view of the held values, then the one new array)


def cache_stats(metrics: RunMetrics, usage: dict[str, dict[str, float]], window_s: float) -> CacheStats:
    """`cache_stats`: the MLPerf tool's figures plus ours, computed from this run's window (not yet judged:
    `health` None)."""
    c = metrics.snapshot_counters()
    count = lambda name: int(c.get(name, 0))  # noqa: E731
    by_cause = metrics.io_by_cause

    def moved(op: str, keep, at: int) -> int:  # operations (at 0) or bytes (at 1) of `op` by the causes kept
        return sum(v[at] for (_t, o, cause), v in by_cause.items() if o == op and keep(cause))

    def tier_op(tier: TierName, op: str) -> TierOp:
        s, (d_ops, d_bytes) = metrics.tier_op(tier, op), by_cause.get((tier, op, "demotion"), (0, 0))
        parts = {p: Percentiles.of(metrics.op_percentiles_ms(tier, op, p)) for p in ("device", "host")
                 if tier is TierName.STORAGE}
        return TierOp(s.window_bytes / GIB, per_second(s.window_bytes / GIB, window_s), d_bytes / GIB, d_ops,
                      per_second(s.ops, window_s), s.ops, Percentiles.of(metrics.op_percentiles_ms(tier, op)), **parts)

    def tier(t: TierName) -> TierFigures:
        held = usage.get(t.legacy, {})
        return TierFigures(int(held.get("entries", 0)), held.get("used_bytes", 0) / GIB, tier_op(t, "read"),
                           tier_op(t, "write"))

    hits, misses = count(names.CACHE_HITS), count(names.CACHE_MISSES)
    # Request-level traffic (what requests asked for); demotion I/O is in the tier figures.
    asked = lambda cause: cause != "demotion"  # noqa: E731
    read_ops, write_ops = moved("read", asked, 0), moved("write", asked, 0)
    read_bytes, write_bytes = moved("read", asked, 1), moved("write", asked, 1)
    return CacheStats(
        hits / (hits + misses) if hits + misses else 0.0, hits, misses, *(tier(t) for t in TIERS),
        offloads_cpu=count(names.OFFLOADS_CPU), offloads_storage=count(names.OFFLOADS_STORAGE),
        evictions=count(names.EVICTIONS), storage_deletions=count(names.tier_deletions(TierName.STORAGE)),
        prefill_writes=moved("write", lambda cause: cause == "prefill", 0),
        decode_reads=moved("read", lambda cause: cause == "decode", 0),
        hits_by_kind=Hits(count(names.SYSTEM_PROMPT_HITS), count(names.COMMON_PHRASE_HITS),
                          count(names.USER_CACHE_HITS), count(names.MULTI_TURN_HITS)),
        requests=RequestTotals(read_bytes, write_bytes, read_bytes / GIB, write_bytes / GIB,
                               read_bytes / max(write_bytes, 1), read_ops, write_ops,  # MLPerf's iops: COUNTS
                               per_second(read_ops, window_s), per_second(write_ops, window_s)),
        storage_tokens_processed=count(names.STORAGE_TOKENS_PROCESSED),
        rates_undefined_reason=rates_undefined_reason(window_s))  # None: every rate is measured


def storage_health(stats: CacheStats, profile: str, criteria_cfg=None, cpu_p95_ms: float | None = None,
                   error_rate: float = 0.0, fatal_error: str | None = None,
                   storage_expected: bool = False, completed: int | None = None) -> StorageHealth:
    """PASS/FAIL criteria. Latency profile: the MLPerf tool's criteria, thresholds from config.
    Throughput profile: storage-tier bandwidth above the configured floors in each direction that moved
    data. Every profile then adds the run's own criteria
    (results/verdict.py): failed requests at most allowed, no stop by a storage error, and, when
    `storage_expected`, a storage tier that moved bytes."""
    if criteria_cfg is None:
        from kv_cache.settings.schema import PerformanceCriteria

        criteria_cfg = PerformanceCriteria()
    c = criteria_cfg
    criteria = []

    def add(name, target, actual, unit, passed):
        criteria.append(Criterion(name, target, actual, unit, bool(passed)))

    storage = stats.storage
    if profile == "throughput":
        read_gbps = storage.read.bandwidth_gbps or 0.0
        write_gbps = storage.write.bandwidth_gbps or 0.0
        read_bytes, write_bytes = storage.read.bytes_gb or 0.0, storage.write.bytes_gb or 0.0
        if read_bytes > 0 or write_bytes == 0:
            floor = c.min_storage_read_gbps
            add(f"Storage KV Read Bandwidth >= {floor:g} GiB/s", floor, read_gbps, "GiB/s",
                read_gbps > 0 and read_gbps >= floor)
        if write_bytes > 0 or read_bytes == 0:
            floor = c.min_storage_write_gbps
            add(f"Storage KV Write Bandwidth >= {floor:g} GiB/s", floor, write_gbps, "GiB/s",
                write_gbps > 0 and write_gbps >= floor)
    else:
        for op, limit in (("write", c.storage_write_device_p95_ms), ("read", c.storage_read_device_p95_ms)):
            block, word = storage.op(op).device, "Device"
            if block is None:
                block, word = storage.op(op).latency, "Total"
            if block is not None:
                add(f"Storage Tier {op.capitalize()} {word} P95 < {limit:g}ms", limit, block.p95, "ms",
                    block.p95 < limit)
        if cpu_p95_ms is not None:
            add(f"CPU RAM P95 < {c.cpu_p95_ms:g}ms", c.cpu_p95_ms, cpu_p95_ms, "ms", cpu_p95_ms < c.cpu_p95_ms)
        if (stats.hits or 0) + (stats.misses or 0) > 0:
            add(f"Cache Hit Rate > {c.min_cache_hit_rate * 100:g}%", c.min_cache_hit_rate, stats.hit_rate,
                "ratio", stats.hit_rate > c.min_cache_hit_rate)
    criteria += map(Criterion.from_json, run_criteria(stats, error_rate, c.max_error_rate, fatal_error,
                                                      storage_expected, completed))
    return StorageHealth.of(criteria)


def cpu_combined_p95_ms(metrics: RunMetrics) -> float | None:
    r, w = metrics.tier_op(TierName.CPU, "read"), metrics.tier_op(TierName.CPU, "write")
    if {(TierName.CPU, "read"), (TierName.CPU, "write")} & metrics.subsampled:  # a merge of subsampled ranks
        hists = [h for op in OPS if (h := metrics.histograms.get((TierName.CPU, op, "total"))) is not None]
        return histogram_percentiles_ms(merge_histograms(hists), (95.0,)).get("p95") if hists else None
    if not len(r.total_ns) and not len(w.total_ns):
        return None
    both = np.concatenate([r.total_ns.array(), w.total_ns.array()])
    return percentile(both, 95) / 1e6


def qos_metrics(metrics: RunMetrics, qos_profiles) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level in QOS_LEVELS:
        samples = metrics.qos_e2e_ns.get(level)
        if not samples:
            out[level] = {"no_data": True}
            continue
        # exact while the level's list holds every request; past SAMPLE_CAP the percentiles are the
        # histogram's (within 0.1 %) and the compliance the reservoir's (a uniform sample)
        arr = samples.array() / 1e6
        target = float(qos_profiles[level].target_latency_p95_ms)
        qs = [50.0, 95.0, 99.0, 99.9, 99.99]
        p50, p95, p99, p999, p9999 = (v / 1e6 for v in samples.percentiles(qs))
        compliance = 1.0 - float(np.count_nonzero(arr > target)) / len(arr)
        prof = qos_profiles[level]
        tails = {}
        for key, actual in (("p99", p99), ("p999", p999), ("p9999", p9999)):
            tail_target = float(getattr(prof, f"target_latency_{key}_ms"))
            tails[key] = {"target_ms": tail_target, "actual_ms": actual, "met": actual <= tail_target}
        out[level] = {
            "total_requests": len(samples),
            "latency_ms": {"mean": samples.mean() / 1e6, "p50": p50, "p95": p95, "p99": p99,
                           "max": samples.max / 1e6},
            "sla": {"target_p95_ms": target, "actual_p95_ms": p95, "compliance": compliance, "met": compliance >= 0.95,
                    "tail_targets": tails},
        }
    return out


def build_summary(metrics: RunMetrics, usage: dict, qos_profiles, profile: str, criteria_cfg=None,
                  error_rate: float = 0.0, fatal_error: str | None = None,
                  storage_expected: bool = False) -> dict[str, Any]:
    window_s = metrics.window_seconds
    r = metrics.requests
    stats = cache_stats(metrics, usage, window_s)
    stats = replace(stats, health=storage_health(stats, profile, criteria_cfg, cpu_combined_p95_ms(metrics),
                                                 error_rate, fatal_error, storage_expected, r.completed))
    total_storage_s = r.storage_ns.sum / 1e9
    c = metrics.snapshot_counters()
    mt_hits, mt_misses = int(c.get(names.MULTI_TURN_CACHE_HITS, 0)), int(c.get(names.MULTI_TURN_CACHE_MISSES, 0))
    prefix_hits = int(c.get(names.PREFIX_HITS, 0))
    figures = Figures(
        r.completed, r.tokens_generated, window_s, per_second(r.tokens_generated, window_s), total_storage_s,
        # MLPerf-compatible formula: generated tokens / SUM of per-request storage seconds (not wall-clock).
        r.tokens_generated / total_storage_s if total_storage_s > 0 else 0.0, per_second(r.completed, window_s),
        rates_undefined_reason(window_s),  # why the rates are 0.0 (None: measured)
        _latency_block(r.e2e_ns), _latency_block(r.storage_ns), _latency_block(r.generation_ns), stats)
    return {
        **figures.to_json(),  # the typed figures, written out at the edge (results/figures.py)
        "qos_metrics": qos_metrics(metrics, qos_profiles),
        "prefix_cache_stats": {
            "prefix_hits": prefix_hits,
            "prefix_misses": int(c.get(names.PREFIX_MISSES, 0)),
            "system_prompt_reuse": prefix_hits,
            "common_phrase_reuse": 0,
            "bytes_saved": int(c.get(names.PREFIX_BYTES_SAVED, 0)),
        },
        "autoscaling_stats": [],
        "autoscaling_summary": None,
        "multi_turn_stats": {
            "cache_hits": mt_hits,
            "cache_misses": mt_misses,
            "hit_rate": mt_hits / max(mt_hits + mt_misses, 1),
        },
        "metrics": catalogue.values(metrics),  # the metric catalogue's entries (kv_cache/metrics/catalogue)
    }


def harness_keys(summary: dict[str, Any] | None) -> dict[str, Any]:
    """The seven top-level keys the mlpstorage harness reads."""
    if not summary:
        return {"overall_passed": False, "total_requests": 0, "avg_latency_ms": 0.0, "p99_latency_ms": 0.0,
                "throughput_req_per_sec": 0.0, "storage_throughput_mbps": 0.0, "cache_hit_rate": 0.0}
    f = Figures.from_json(summary)
    cs = f.cache
    # (0.0 rates when the window was under a second, as documents written before this held null)
    storage_gibps = (cs.storage.read.bandwidth_gbps or 0.0) + (cs.storage.write.bandwidth_gbps or 0.0)
    return {
        "overall_passed": cs.health is not None and cs.health.overall_status == "PASS",
        "total_requests": f.total_requests,
        "avg_latency_ms": f.e2e.mean,
        "p99_latency_ms": f.e2e.p99,
        "throughput_req_per_sec": f.requests_per_second or 0.0,
        "storage_throughput_mbps": storage_gibps * GIB / 1e6,
        "cache_hit_rate": cs.hit_rate,
    }


def request_lists(metrics: RunMetrics) -> dict[str, Any]:
    """Top-level per-request lists (seconds) and totals, as in the MLPerf tool's JSON."""
    r = metrics.requests
    c = metrics.snapshot_counters()
    return {
        "requests_completed": r.completed,
        "total_tokens_generated": r.tokens_generated,
        "total_storage_io_latency": r.storage_ns.sum / 1e9,
        "total_generation_latency": r.generation_ns.sum / 1e9,
        "end_to_end_latencies": _seconds(r.e2e_ns),
        "storage_latencies": _seconds(r.storage_ns),
        "generation_latencies": _seconds(r.generation_ns),
        "throughput_timeline": [],
        "prefill_latencies": _seconds(r.prefill_ns),
        "decode_latencies": _seconds(r.decode_ns),
        "multi_turn_cache_hits": int(c.get(names.MULTI_TURN_CACHE_HITS, 0)),
        "multi_turn_cache_misses": int(c.get(names.MULTI_TURN_CACHE_MISSES, 0)),
    }


def per_turn_stats(metrics: RunMetrics, limit: int = 200) -> list[dict[str, Any]]:
    """Mean context and bytes moved per turn number: how a session's context growth shows in the I/O."""
    out = []
    for turn in sorted(metrics.turns)[:limit]:
        n, tokens, read_b, written_b = metrics.turns[turn]
        out.append({"turn": turn, "requests": n, "mean_context_tokens": tokens / n,
                    "mean_bytes_read": read_b / n, "mean_bytes_written": written_b / n})
    return out


def block_stats(metrics: RunMetrics, kv_block_tokens: int) -> dict[str, Any]:
    """Block-layout runs: how many KV blocks were loaded rather than stored, and from which tier."""
    c = metrics.snapshot_counters()
    hits, stores = int(c.get(names.BLOCK_HITS, 0)), int(c.get(names.BLOCK_STORES, 0))
    total = hits + stores
    return {
        "kv_block_tokens": kv_block_tokens,
        "blocks": total,
        "loads": hits,
        "stores": stores,
        "block_hit_rate": hits / total if total else 0.0,
        "hit_rate_by_tier": {t: int(c.get(names.block_hits_in(t), 0)) / total if total else 0.0
                             for t in TierName},
        "bytes_saved_by_reuse": int(c.get(names.BLOCK_BYTES_REUSED, 0)),
    }
