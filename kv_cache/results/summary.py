"""The measured parts of the results document: the `summary`, the harness keys and per-request lists.

Every number here is derived from RunMetrics of this run. Key names and units are the MLPerf tool's:
"GB" means GiB, "_gbps" means GiB/s, "_ms" milliseconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kv_cache.metrics import catalogue, names
from kv_cache.metrics.catalogue import MIN_RATE_WINDOW_S as MIN_RATE_WINDOW_S  # where tests and readers look
from kv_cache.metrics.catalogue import per_second, rates_undefined_reason
from kv_cache.metrics.histograms import merge as merge_histograms
from kv_cache.metrics.histograms import percentiles_ms as histogram_percentiles_ms
from kv_cache.metrics.recorder import GIB, PERCENTILES, RunMetrics, mean_ms, percentiles_ms
from kv_cache.metrics.stats import percentile
from kv_cache.results.verdict import run_criteria
from kv_cache.storage.tiername import TierName
from kv_cache.workload.qos import QOS_LEVELS

TIERS = tuple(TierName)
OPS = ("read", "write")


def _latency_block(samples_ns) -> dict[str, float]:
    """{mean, p50, p95, p99, p999, p9999} in ms (the MLPerf JSON's per-request latency blocks)."""
    out = {"mean": mean_ms(samples_ns)}
    p = percentiles_ms(samples_ns)
    for k in PERCENTILES:
        out[k] = p.get(k, 0.0)
    return out


def _seconds(samples_ns) -> np.ndarray:
    """A per-request list in seconds: every request's while the list holds them all (SAMPLE_CAP, 200,000),
    a uniform reservoir of that many beyond (a 24-hour run's JSON does not grow with its length).

    A float64 array, not a list of Python floats: a periodic document built every 10 s then makes no
    200,000 float objects per list, which left Python's small-object arenas larger after each build (the
    1-hour soak's RSS growth). Both writers (results/write.py) write it as the list it stands for, the
    same bytes (tests/test_request_arrays.py); a reader of the in-memory document takes it with
    np.asarray, never `or []`."""
    return samples_ns.array() / 1e9  # (a view of the held values, then the one new array)


def cache_stats(metrics: RunMetrics, usage: dict[str, dict[str, float]], window_s: float) -> dict[str, Any]:
    """`cache_stats`: the MLPerf tool's keys plus ours, computed from this run's window."""
    c = metrics.snapshot_counters()
    hits, misses = int(c.get(names.CACHE_HITS, 0)), int(c.get(names.CACHE_MISSES, 0))
    stats: dict[str, Any] = {
        "cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "cache_hits": hits,
        "cache_misses": misses,
        "gpu_entries": int(usage.get(TierName.GPU, {}).get("entries", 0)),
        "cpu_entries": int(usage.get(TierName.CPU, {}).get("entries", 0)),
        "storage_entries": int(usage.get(TierName.STORAGE.legacy, {}).get("entries", 0)),
        "gpu_memory_used_gb": usage.get(TierName.GPU, {}).get("used_bytes", 0) / GIB,
        "cpu_memory_used_gb": usage.get(TierName.CPU, {}).get("used_bytes", 0) / GIB,
        "storage_memory_used_gb": usage.get(TierName.STORAGE.legacy, {}).get("used_bytes", 0) / GIB,
        "offloads_cpu": int(c.get(names.OFFLOADS_CPU, 0)),
        "offloads_storage": int(c.get(names.OFFLOADS_STORAGE, 0)),
        "evictions": int(c.get(names.EVICTIONS, 0)),
        "storage_deletions": int(c.get(names.tier_deletions(TierName.STORAGE), 0)),
    }
    by_cause = metrics.io_by_cause
    stats["prefill_writes"] = sum(v[0] for (t, op, cause), v in by_cause.items() if op == "write" and cause == "prefill")
    stats["decode_reads"] = sum(v[0] for (t, op, cause), v in by_cause.items() if op == "read" and cause == "decode")

    for tier in TIERS:
        for op, word in (("write", "written"), ("read", "read")):
            s = metrics.tier_op(tier, op)
            stats[f"tier_{tier}_kv_bytes_{word}_gb"] = s.window_bytes / GIB
    for tier in TIERS:
        for op in OPS:
            s = metrics.tier_op(tier, op)
            stats[f"tier_{tier}_{op}_bandwidth_gbps"] = per_second(s.window_bytes / GIB, window_s)
    # Our additions: demotion traffic and per-second operation rates over the measured window.
    for tier in TIERS:
        for op in OPS:
            ops_, bytes_ = by_cause.get((tier, op, "demotion"), (0, 0))
            stats[f"tier_{tier}_demotion_{op}_gb"] = bytes_ / GIB
            stats[f"tier_{tier}_demotion_{op}_ops"] = ops_
            s = metrics.tier_op(tier, op)
            stats[f"tier_{tier}_{op}_ops_per_sec"] = per_second(s.ops, window_s)
            stats[f"tier_{tier}_{op}_ops"] = s.ops

    stats["system_prompt_hits"] = int(c.get(names.SYSTEM_PROMPT_HITS, 0))
    stats["common_phrase_hits"] = int(c.get(names.COMMON_PHRASE_HITS, 0))
    stats["user_cache_hits"] = int(c.get(names.USER_CACHE_HITS, 0))
    stats["multi_turn_hits"] = int(c.get(names.MULTI_TURN_HITS, 0))

    # Request-level traffic (what requests asked for); demotion I/O is in the tier figures above.
    read_ops = sum(v[0] for (t, op, cause), v in by_cause.items() if op == "read" and cause != "demotion")
    write_ops = sum(v[0] for (t, op, cause), v in by_cause.items() if op == "write" and cause != "demotion")
    read_bytes = sum(v[1] for (t, op, cause), v in by_cause.items() if op == "read" and cause != "demotion")
    write_bytes = sum(v[1] for (t, op, cause), v in by_cause.items() if op == "write" and cause != "demotion")
    stats["total_read_bytes"] = read_bytes
    stats["total_write_bytes"] = write_bytes
    stats["total_read_gb"] = read_bytes / GIB
    stats["total_write_gb"] = write_bytes / GIB
    stats["read_write_ratio"] = read_bytes / max(write_bytes, 1)
    stats["read_iops"] = read_ops  # MLPerf-compatible meaning: operation COUNTS, not rates
    stats["write_iops"] = write_ops
    stats["read_ops_per_sec"] = per_second(read_ops, window_s)
    stats["write_ops_per_sec"] = per_second(write_ops, window_s)
    stats["storage_tokens_processed"] = int(c.get(names.STORAGE_TOKENS_PROCESSED, 0))
    stats["rates_undefined_reason"] = rates_undefined_reason(window_s)  # None: every rate above is measured

    for tier in TIERS:
        for op in OPS:
            for k, v in metrics.op_percentiles_ms(tier, op).items():
                stats[f"{tier}_{op}_{k}_ms"] = v
    for op in OPS:
        for part in ("device", "host"):
            for k, v in metrics.op_percentiles_ms(TierName.STORAGE, op, part).items():
                stats[f"storage_{op}_{part}_{k}_ms"] = v
    return stats


def storage_health(stats: dict[str, Any], profile: str, criteria_cfg=None, cpu_p95_ms: float | None = None,
                   error_rate: float = 0.0, fatal_error: str | None = None,
                   storage_expected: bool = False, completed: int | None = None) -> dict[str, Any]:
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
        criteria.append({"name": name, "target": target, "actual": actual, "unit": unit, "passed": bool(passed)})

    if profile == "throughput":
        read_gbps = stats.get("tier_storage_read_bandwidth_gbps") or 0.0  # None: window too short for a rate
        write_gbps = stats.get("tier_storage_write_bandwidth_gbps") or 0.0
        read_bytes = stats.get("tier_storage_kv_bytes_read_gb", 0.0)
        write_bytes = stats.get("tier_storage_kv_bytes_written_gb", 0.0)
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
            key = f"storage_{op}_device_p95_ms"
            word = "Device"
            if key not in stats:
                key, word = f"storage_{op}_p95_ms", "Total"
            if key in stats:
                add(f"Storage Tier {op.capitalize()} {word} P95 < {limit:g}ms", limit, stats[key], "ms",
                    stats[key] < limit)
        if cpu_p95_ms is not None:
            add(f"CPU RAM P95 < {c.cpu_p95_ms:g}ms", c.cpu_p95_ms, cpu_p95_ms, "ms", cpu_p95_ms < c.cpu_p95_ms)
        if stats.get("cache_hits", 0) + stats.get("cache_misses", 0) > 0:
            add(f"Cache Hit Rate > {c.min_cache_hit_rate * 100:g}%", c.min_cache_hit_rate, stats["cache_hit_rate"],
                "ratio", stats["cache_hit_rate"] > c.min_cache_hit_rate)
    criteria += run_criteria(stats, error_rate, c.max_error_rate, fatal_error, storage_expected, completed)
    passed = sum(1 for x in criteria if x["passed"])
    return {
        "overall_status": "PASS" if passed == len(criteria) else "FAIL",
        "criteria": criteria,
        "passed_count": passed,
        "total_count": len(criteria),
    }


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
    stats["storage_health"] = storage_health(stats, profile, criteria_cfg, cpu_combined_p95_ms(metrics), error_rate,
                                             fatal_error, storage_expected, r.completed)
    total_storage_s = r.storage_ns.sum / 1e9
    c = metrics.snapshot_counters()
    mt_hits, mt_misses = int(c.get(names.MULTI_TURN_CACHE_HITS, 0)), int(c.get(names.MULTI_TURN_CACHE_MISSES, 0))
    prefix_hits = int(c.get(names.PREFIX_HITS, 0))
    return {
        "total_requests": r.completed,
        "total_tokens": r.tokens_generated,
        "elapsed_time": window_s,
        "avg_throughput_tokens_per_sec": per_second(r.tokens_generated, window_s),
        "total_storage_io_time": total_storage_s,
        # MLPerf-compatible formula: generated tokens / SUM of per-request storage seconds (not wall-clock).
        "storage_throughput_tokens_per_sec": r.tokens_generated / total_storage_s if total_storage_s > 0 else 0.0,
        "requests_per_second": per_second(r.completed, window_s),
        "rates_undefined_reason": rates_undefined_reason(window_s),  # why the rates are 0.0 (None: measured)
        "end_to_end_latency_ms": _latency_block(r.e2e_ns),
        "storage_io_latency_ms": _latency_block(r.storage_ns),
        "generation_latency_ms": _latency_block(r.generation_ns),
        "cache_stats": stats,
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
    cs = summary["cache_stats"]
    # (0.0 rates when the window was under a second, as documents written before this held null)
    storage_gibps = (cs["tier_storage_read_bandwidth_gbps"] or 0.0) + (cs["tier_storage_write_bandwidth_gbps"] or 0.0)
    return {
        "overall_passed": cs["storage_health"]["overall_status"] == "PASS",
        "total_requests": summary["total_requests"],
        "avg_latency_ms": summary["end_to_end_latency_ms"]["mean"],
        "p99_latency_ms": summary["end_to_end_latency_ms"]["p99"],
        "throughput_req_per_sec": summary["requests_per_second"] or 0.0,
        "storage_throughput_mbps": storage_gibps * GIB / 1e6,
        "cache_hit_rate": cs["cache_hit_rate"],
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
