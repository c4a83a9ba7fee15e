#!/usr/bin/env python3
"""End-of-suite comparison report of ``kv-cache-wrapper.sh`` (the reference's embedded report, reading
only keys that kv-cache writes).

    python3 utils/report_results.py DIR [WORKLOAD ...]

For each workload (default: all that have a file) reads ``DIR/results_<workload>.json`` and prints
throughput, latencies, where the cache entries ended up, the bytes each tier moved, the storage
tier's bandwidth and per-operation P95, the PASS/FAIL criteria and the autoscaling outcome.
Standard library only.

Every value comes from a path listed in FIELDS or OPTIONAL_FIELDS below; FIELDS are always present in
a result document that has a ``summary`` (the test suite checks this against a real run), the others
only when the run exercised them (a tier's percentiles exist only if it saw operations).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

WORKLOADS = {
    "gpu-only": ("Tier: GPU Only", "All KV cache in GPU memory: a latency baseline."),
    "cpu-only": ("Tier: CPU Only", "Cache entirely in system RAM (typical production baseline)."),
    "storage-only": ("Tier: Storage Only", "Small RAM tier: most entries go to the storage under test."),
    "gpu-cpu": ("Tier: GPU + CPU", "Two-tier hot/warm cache without backing storage."),
    "cpu-storage": ("Tier: CPU + Storage", "RAM backed by storage spillover for larger working sets."),
    "gpu-cpu-storage": ("Tier: GPU + CPU + Storage", "Full three-tier hierarchy."),
    "storage-saturation": ("Stress: Storage Saturation", "High concurrency with a small RAM tier."),
    "production": ("Stress: Realistic Production", "Balanced configuration, steady-state inference load."),
    "autoscale": ("Discovery: QoS Autoscaling", "Users scaled to hold the storage saturation target."),
    "capacity-autoscale": ("Discovery: Capacity Autoscaling", "Users scaled up until throughput stops growing."),
}

S, CS = ("summary",), ("summary", "cache_stats")
# Always present when `summary` is.
FIELDS: dict[str, tuple[str, ...]] = {
    "requests": S + ("total_requests",),
    "tokens": S + ("total_tokens",),
    "elapsed": S + ("elapsed_time",),
    "throughput": S + ("avg_throughput_tokens_per_sec",),
    "storage_throughput": S + ("storage_throughput_tokens_per_sec",),
    "req_per_sec": S + ("requests_per_second",),
    "e2e": S + ("end_to_end_latency_ms",),
    "storage_lat": S + ("storage_io_latency_ms",),
    "gen_lat": S + ("generation_latency_ms",),
    "gpu_entries": CS + ("gpu_entries",),
    "cpu_entries": CS + ("cpu_entries",),
    "storage_entries": CS + ("storage_entries",),
    "hit_rate": CS + ("cache_hit_rate",),
    "total_read_gb": CS + ("total_read_gb",),
    "total_write_gb": CS + ("total_write_gb",),
    "read_write_ratio": CS + ("read_write_ratio",),
    "prefill_writes": CS + ("prefill_writes",),
    "decode_reads": CS + ("decode_reads",),
    "storage_health": CS + ("storage_health",),
    "qos": S + ("qos_metrics",),
    "autoscaling_stats": S + ("autoscaling_stats",),
    "autoscaling_summary": S + ("autoscaling_summary",),
    **{f"{t}_{w}_gb": CS + (f"tier_{t}_kv_bytes_{w}_gb",) for t in ("gpu", "cpu", "storage") for w in ("written", "read")},
    **{f"{t}_{o}_gbps": CS + (f"tier_{t}_{o}_bandwidth_gbps",) for t in ("gpu", "cpu", "storage") for o in ("read", "write")},
}
# Present only when the run exercised them.
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    **{f"{t}_{o}_p95": CS + (f"{t}_{o}_p95_ms",) for t in ("gpu", "cpu", "storage") for o in ("read", "write")},
    **{f"storage_{o}_device_p95": CS + (f"storage_{o}_device_p95_ms",) for o in ("read", "write")},
    "io_mode": ("measurement", "io_mode"),
    "notes": ("measurement", "notes"),
}
# P95 above which a tier is called a bottleneck (the reference's thresholds; storage judged on device time).
THRESHOLDS_MS = {"gpu": 50.0, "cpu": 150.0, "storage_read": 200.0, "storage_write": 500.0}


def lookup(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rate(v: Any, spec: str) -> str:
    return format(v, spec) if _num(v) else "n/a"


def fmt_ms(ms: Any) -> str:
    if not _num(ms):
        return "n/a"
    if ms < 1:
        return f"{ms * 1000:.1f}us"
    return f"{ms:.1f}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def fmt_gib(v: Any) -> str:
    return f"{v:.2f} GiB" if _num(v) else "n/a"


def fmt_pct(v: Any) -> str:
    return f"{v * 100:.1f}%" if _num(v) else "n/a"


def load(path: str) -> dict[str, Any] | None:
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
        return None
    out = {k: lookup(doc, p) for k, p in FIELDS.items()}
    out.update({k: lookup(doc, p) for k, p in OPTIONAL_FIELDS.items()})
    out["overall_passed"] = doc.get("overall_passed")
    return out


def _latency_line(name: str, block: Any) -> str:
    block = block if isinstance(block, dict) else {}
    return (f"{name}: mean {fmt_ms(block.get('mean'))}, P50 {fmt_ms(block.get('p50'))}, "
            f"P95 {fmt_ms(block.get('p95'))}, P99 {fmt_ms(block.get('p99'))}")


def describe(r: dict[str, Any]) -> list[str]:
    lines = [
        f"Requests completed: {r['requests']}  |  Tokens generated: {r['tokens']}  |  Window: {r['elapsed']:.1f}s"
        if _num(r["elapsed"]) else f"Requests completed: {r['requests']}  |  Tokens generated: {r['tokens']}",
        f"Throughput: {_rate(r['throughput'], '.1f')} tok/s wall-clock ({_rate(r['req_per_sec'], '.2f')} req/s), "
        f"storage throughput {r['storage_throughput']:.1f} tok/s",
        _latency_line("End-to-end latency", r["e2e"]),
        _latency_line("Storage I/O latency (per request)", r["storage_lat"]),
    ]
    gen = r["gen_lat"] if isinstance(r["gen_lat"], dict) else {}
    if _num(gen.get("mean")) and gen["mean"] > 0:
        lines.append(_latency_line("Simulated generation", gen))
    e2e, st = (r["e2e"] or {}), (r["storage_lat"] or {})
    if all(_num(x) for x in (e2e.get("mean"), st.get("mean"), gen.get("mean"))):
        lines.append(f"Approximate mean queue wait: {fmt_ms(max(0.0, e2e['mean'] - st['mean'] - gen['mean']))}")

    counts = [(label, r[f"{key}_entries"] or 0) for key, label in (("gpu", "GPU"), ("cpu", "CPU"), ("storage", "Storage"))]
    total = sum(c for _l, c in counts)
    residency = ", ".join(f"{label}: {c} ({c / total * 100:.0f}%)" for label, c in counts if c) if total else "no entries"
    lines.append(f"Cache hit rate: {fmt_pct(r['hit_rate'])}  |  Entries at the end: {residency}")
    ratio = r["read_write_ratio"]
    ratio_s = f"{ratio:.2f}" if _num(ratio) and ratio < 1e9 else "read-only" if _num(ratio) else "n/a"
    lines.append(f"Request I/O: read {fmt_gib(r['total_read_gb'])} / write {fmt_gib(r['total_write_gb'])} "
                 f"(R/W {ratio_s})  |  prefill writes {r['prefill_writes']}, decode reads {r['decode_reads']}")
    moved = [f"{label} W {r[f'{t}_written_gb']:.2f} / R {r[f'{t}_read_gb']:.2f}"
             for t, label in (("gpu", "GPU"), ("cpu", "CPU"), ("storage", "Storage"))
             if _num(r[f"{t}_written_gb"]) and _num(r[f"{t}_read_gb"]) and (r[f"{t}_written_gb"] or r[f"{t}_read_gb"])]
    lines.append("Tier KV bytes (GiB): " + ("; ".join(moved) if moved else "none moved"))
    if _num(r["storage_read_gbps"]) and _num(r["storage_write_gbps"]):
        lines.append(f"Storage bandwidth: read {r['storage_read_gbps']:.3f} GiB/s, write {r['storage_write_gbps']:.3f} GiB/s")
    p95 = []
    for t, label in (("gpu", "GPU"), ("cpu", "CPU"), ("storage", "Storage")):
        for o in ("read", "write"):
            if _num(r[f"{t}_{o}_p95"]):
                extra = f" (device {fmt_ms(r[f'storage_{o}_device_p95'])})" if t == "storage" and _num(r[f"storage_{o}_device_p95"]) else ""
                p95.append(f"{label} {o} {fmt_ms(r[f'{t}_{o}_p95'])}{extra}")
    if p95:
        lines.append("Per-operation P95: " + ", ".join(p95))

    issues = []
    for t in ("gpu", "cpu"):
        for o in ("read", "write"):
            v = r[f"{t}_{o}_p95"]
            if _num(v) and v > THRESHOLDS_MS[t]:
                issues.append(f"{t.upper()} {o} P95 {fmt_ms(v)} (> {fmt_ms(THRESHOLDS_MS[t])})")
    for o in ("read", "write"):
        v = r[f"storage_{o}_device_p95"]
        if _num(v) and v > THRESHOLDS_MS[f"storage_{o}"]:
            issues.append(f"Storage {o} device P95 {fmt_ms(v)} (> {fmt_ms(THRESHOLDS_MS['storage_' + o])})")
    lines.extend(["Potential bottlenecks:"] + [f"  - {i}" for i in issues] if issues else ["No tier P95 above its threshold."])

    health = r["storage_health"] if isinstance(r["storage_health"], dict) else {}
    if health:
        lines.append(f"Storage assessment: {health.get('overall_status')} "
                     f"({health.get('passed_count')}/{health.get('total_count')} criteria met)")
        for crit in health.get("criteria", []):
            unit, actual, target = crit.get("unit", ""), crit.get("actual"), crit.get("target")
            if unit == "ratio" and _num(actual) and _num(target):
                a, t = f"{actual:.1%}", f"{target:.1%}"
            else:
                a = f"{actual:.2f}{unit}" if _num(actual) else str(actual)
                t = f"{target}{unit}"
            lines.append(f"  [{'OK' if crit.get('passed') else 'X'}] {crit.get('name')}: {a} (target {t})")

    auto = r["autoscaling_summary"]
    if isinstance(auto, dict):
        stats = r["autoscaling_stats"] if isinstance(r["autoscaling_stats"], list) else []
        ups = sum(1 for s in stats if isinstance(s, dict) and s.get("action") == "scale_up")
        downs = sum(1 for s in stats if isinstance(s, dict) and s.get("action") == "scale_down")
        text = (f"Autoscaling ({auto.get('mode', '?')}): {ups} up / {downs} down; "
                f"users {auto.get('initial_users')} -> {auto.get('final_users')}")
        if _num(auto.get("peak_throughput_tokens_per_sec")):
            text += f"; peak {auto['peak_throughput_tokens_per_sec']:.1f} tok/s at {auto.get('peak_user_count')} users"
        lines.append(text)
    if isinstance(r["notes"], list) and r["notes"]:
        lines.extend(f"Note: {n}" for n in r["notes"])
    return lines


def report(directory: str, workloads: list[str]) -> str:
    out = ["", "=" * 100, "COMPREHENSIVE BENCHMARK ANALYSIS", "=" * 100]
    for name in workloads:
        title, desc = WORKLOADS.get(name, (name, ""))
        out += ["", title, "-" * len(title)] + ([desc] if desc else [])
        path = os.path.join(directory, f"results_{name}.json")
        if not os.path.exists(path):
            out.append("Result file not found.")
            continue
        try:
            r = load(path)
        except (OSError, ValueError) as exc:
            out.append(f"Unreadable result file: {exc}")
            continue
        out += describe(r) if r is not None else ["No request completed (no summary in the result file)."]
    out += ["", "=" * 100, ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: report_results.py DIR [WORKLOAD ...]"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    directory, names = argv[0], argv[1:]
    if not names:
        names = [w for w in WORKLOADS if os.path.exists(os.path.join(directory, f"results_{w}.json"))]
    print(report(directory, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
