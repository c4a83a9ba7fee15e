#!/usr/bin/env python3
"""Median of the MLPerf v3 primary metrics over the trials of each submission configuration.

Reads every ``mlperf_v3_<config>_trial<n>.json`` in DIR (written by ``kv-cache-wrapper.sh -w
mlperf_submission`` or by hand, as in the seed README), prints one table per configuration (each
trial's value and the median over trials) and writes ``DIR/mlperf_submission_summary.json``.

    python3 utils/summarize_trials.py DIR [--json PATH]

Metrics (all read from the result JSON's ``summary``):

- Decode Bytes Read (GiB)        cache_stats.tier_storage_kv_bytes_read_gb
- Wall-Clock Throughput (tok/s)  avg_throughput_tokens_per_sec
- Storage Throughput (tok/s)     storage_throughput_tokens_per_sec
- Storage Read / Write (GiB/s)   cache_stats.tier_storage_{read,write}_bandwidth_gbps

Which of them are *primary* depends on the configuration (seed README, "MLPerf v3.0"): the cpu_mem=0
stress tests are judged on decode bytes read and wall-clock throughput, the cpu_mem=4 throughput test
on storage throughput; the 70B test reports all three. Configurations other than the three known ones
(e.g. ``mlperf_v3_prefill_llama3.1-8b_trial1.json``) are summarised too, with no metric marked primary.

Needs the kv_cache package (its statistics module computes the medians, so the tool and this summary
agree): the checkout this script lives in, else the installed one. Exit status: 0 when at least one
trial file was summarised, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_ROOT, "kv_cache")):  # the checkout's own package: the same version as this script
    sys.path.insert(0, _ROOT)
from kv_cache.metrics.stats import median as _median  # noqa: E402

SUMMARY_FILE = "mlperf_submission_summary.json"
TRIAL_RE = re.compile(r"^mlperf_v3_(?P<config>.+)_trial(?P<trial>\d+)\.json$")

# key -> (label, path inside the result JSON, printf format)
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "decode_bytes_read_gib": ("Decode Bytes Read (GiB)", ("summary", "cache_stats", "tier_storage_kv_bytes_read_gb"), "{:.3f}"),
    "wall_clock_throughput_tok_s": ("Wall-Clock Throughput (tok/s)", ("summary", "avg_throughput_tokens_per_sec"), "{:.1f}"),
    "storage_throughput_tok_s": ("Storage Throughput (tok/s)", ("summary", "storage_throughput_tokens_per_sec"), "{:.1f}"),
    "storage_read_gib_s": ("Storage Read (GiB/s)", ("summary", "cache_stats", "tier_storage_read_bandwidth_gbps"), "{:.3f}"),
    "storage_write_gib_s": ("Storage Write (GiB/s)", ("summary", "cache_stats", "tier_storage_write_bandwidth_gbps"), "{:.3f}"),
}

# The three closed configurations of the seed README, in run order.
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "stress_8b": {
        "title": "Maximum Storage Stress (8B)",
        "description": "llama3.1-8b, 200 users, gpu 0, cpu 0 GiB, max-concurrent-allocs 16, generation none",
        "primary": ["decode_bytes_read_gib", "wall_clock_throughput_tok_s"],
    },
    "throughput_8b": {
        "title": "Storage Throughput (8B)",
        "description": "llama3.1-8b, 100 users, gpu 0, cpu 4 GiB, max-concurrent-allocs 0, generation none",
        "primary": ["storage_throughput_tok_s"],
    },
    "stress_70b": {
        "title": "Large Model Storage Stress (70B)",
        "description": "llama3.1-70b-instruct, 70 users, gpu 0, cpu 0 GiB, max-concurrent-allocs 4, generation none",
        "primary": ["decode_bytes_read_gib", "wall_clock_throughput_tok_s", "storage_throughput_tok_s"],
    },
}


def _lookup(doc: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    if isinstance(doc, bool) or not isinstance(doc, (int, float)):
        return None
    return float(doc)


def find_trials(directory: str) -> dict[str, list[tuple[int, str]]]:
    """{config: [(trial number, file name), ...]} sorted by trial number; known configs first."""
    found: dict[str, list[tuple[int, str]]] = {}
    for name in sorted(os.listdir(directory)):
        m = TRIAL_RE.match(name)
        if m and os.path.isfile(os.path.join(directory, name)):
            found.setdefault(m.group("config"), []).append((int(m.group("trial")), name))
    order = [c for c in CONFIGURATIONS if c in found] + sorted(c for c in found if c not in CONFIGURATIONS)
    return {c: sorted(found[c]) for c in order}


def read_trial(path: str) -> dict[str, Any]:
    """One trial's metrics (None where absent), its PASS/FAIL status, and an error if unreadable."""
    out: dict[str, Any] = {"metrics": {k: None for k in METRICS}, "status": None, "error": None}
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        out["error"] = f"unreadable: {exc}"
        return out
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
        out["error"] = "no summary (no request completed?)"
        return out
    for key, (_label, path_, _fmt) in METRICS.items():
        out["metrics"][key] = _lookup(doc, path_)
    health = doc["summary"].get("cache_stats", {}).get("storage_health", {})
    if isinstance(health, dict):
        out["status"] = health.get("overall_status")
    return out


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return _median(present) if present else None


def summarize(directory: str) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for config, trials in find_trials(directory).items():
        known = CONFIGURATIONS.get(config, {})
        rows = []
        for number, name in trials:
            rows.append({"trial": number, "file": name, **read_trial(os.path.join(directory, name))})
        configs[config] = {
            "title": known.get("title", config),
            "description": known.get("description", ""),
            "primary_metrics": list(known.get("primary", [])),
            "trial_count": len(rows),
            "trials": rows,
            "median": {k: median([r["metrics"][k] for r in rows]) for k in METRICS},
        }
    return {
        "directory": os.path.abspath(directory),
        "metric_definitions": {k: {"label": label, "source": ".".join(path)} for k, (label, path, _f) in METRICS.items()},
        "configurations": configs,
    }


def _fmt(key: str, value: float | None) -> str:
    return "n/a" if value is None else METRICS[key][2].format(value)


def format_tables(result: dict[str, Any]) -> str:
    lines: list[str] = []
    for config, block in result["configurations"].items():
        trials = block["trials"]
        head = f"=== {config}: {block['title']} ({block['trial_count']} trial{'s' if block['trial_count'] != 1 else ''}) ==="
        lines.append(head)
        if block["description"]:
            lines.append(f"    {block['description']}")
        headers = [f"trial{t['trial']}" for t in trials] + ["MEDIAN"]
        label_w = max(len(label) for label, _p, _f in METRICS.values()) + len(" [primary]")
        col_w = max(12, *(len(h) for h in headers))
        lines.append(f"{'Metric':<{label_w}}" + "".join(f"{h:>{col_w}}" for h in headers))
        lines.append("-" * (label_w + col_w * len(headers)))
        primary = block["primary_metrics"]
        ordered = primary + [k for k in METRICS if k not in primary]
        for key in ordered:
            label = METRICS[key][0] + (" [primary]" if key in primary else "")
            cells = [_fmt(key, t["metrics"][key]) for t in trials] + [_fmt(key, block["median"][key])]
            lines.append(f"{label:<{label_w}}" + "".join(f"{c:>{col_w}}" for c in cells))
        status = [t["status"] or "-" for t in trials]
        lines.append(f"{'Performance assessment':<{label_w}}" + "".join(f"{s:>{col_w}}" for s in status))
        for t in trials:
            if t["error"]:
                lines.append(f"  note: {t['file']}: {t['error']}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Median of the MLPerf v3 primary metrics over trials.",
                                     allow_abbrev=False)
    parser.add_argument("directory", help="directory holding mlperf_v3_<config>_trial<n>.json files")
    parser.add_argument("--json", dest="json_path", default=None,
                        help=f"summary JSON to write (default: DIR/{SUMMARY_FILE})")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print(f"summarize_trials.py: error: not a directory: {args.directory}", file=sys.stderr)
        return 2
    result = summarize(args.directory)
    if not result["configurations"]:
        print(f"summarize_trials.py: no mlperf_v3_<config>_trial<n>.json files in {args.directory}", file=sys.stderr)
        return 1
    print(format_tables(result), end="")
    out = args.json_path or os.path.join(args.directory, SUMMARY_FILE)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, out)
    print(f"Summary written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
