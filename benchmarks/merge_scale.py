"""The merge of many ranks at scale: 256 rank documents of a 300 s run, merged as `kv-cache merge DIR` does.

Synthesises the rank files (from the kept real rank document in tests/fixtures/results/ranks: every
block a rank writes, with its lists resized to a 300 s run), then merges them in a fresh process (so its
peak RSS is the merge's own) and prints the wall time and peak RSS (resource.getrusage) as JSON.

Sizes per rank (each a flag): `--reads` / `--writes` storage operations, each with its total, device and
host latency lists (capped at the real cap, SAMPLE_CAP, with the real stride when over it), `--requests`
requests with their five per-request lists, the encoded HdrHistograms of every list, and `--seconds`
one-second time-series rows. The defaults are a 300 s run of 16 MiB-class entries at ~2 GiB/s per rank
(~40 k reads). Goal: under 10 s and under 1 GiB for 256 ranks (published MLPerf v3.0 runs have up to 204).

    python benchmarks/merge_scale.py                      # 256 ranks in a temporary directory
    python benchmarks/merge_scale.py --ranks 64 --reads 250000   # over the cap: strided lists, histograms
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kv_cache.metrics.histograms import from_values, summary  # noqa: E402
from kv_cache.results.samples import SAMPLE_CAP  # noqa: E402

TEMPLATE = ROOT / "tests" / "fixtures" / "results" / "ranks" / "x_rank0.json"


def _lists(rng: np.random.Generator, n: int, median_ns: float) -> dict[str, np.ndarray]:
    device = rng.lognormal(np.log(median_ns), 0.6, n).astype(np.int64)
    host = rng.lognormal(np.log(2e5), 0.4, n).astype(np.int64)
    return {"total": device + host, "device": device, "host": host}


def _block(values: np.ndarray) -> dict:
    stride = max(1, -(-len(values) // SAMPLE_CAP))
    return {"values": values[::stride].tolist(), "count": len(values), "stride": stride}


def _histograms(rng: np.random.Generator, args: argparse.Namespace) -> dict[str, str]:
    """Encoded histograms of a rank's lists (4 templates are made and shared: recording millions of values
    one by one in Python is the slow part of making the files, not of merging them)."""
    out = {}
    for op, n, med in (("read", args.reads, 8e6), ("write", args.writes, 2e7)):
        for part, values in _lists(rng, min(n, 20_000), med).items():
            out[f"storage_{op}_{part}"] = summary(from_values(values))
    out["request_e2e_total"] = summary(from_values(rng.lognormal(np.log(3e8), 0.5, 5000).astype(np.int64)))
    return out


def _row(t: int, rng: np.random.Generator, args: argparse.Namespace) -> dict:
    reads, writes = args.reads // args.seconds, args.writes // args.seconds
    row = {"t_s": float(t + 1), "seconds": 1.0, "requests": args.requests // args.seconds}
    for op, n, size in (("read", reads, 16 << 20), ("write", writes, 16 << 20)):
        row |= {f"storage_{op}_ops": n, f"storage_{op}_bytes": n * size, f"storage_{op}_gibps": n * size / 2**30,
                f"storage_{op}_p50_ms": float(rng.uniform(5, 9)), f"storage_{op}_p95_ms": float(rng.uniform(20, 30)),
                f"storage_{op}_p99_ms": float(rng.uniform(30, 60))}
    return row | {"occupancy_cpu_bytes": 1 << 33, "occupancy_storage_bytes": 1 << 38, "queue_depth": 3,
                  "in_flight": 8, "active_users": 40}


def synthesise(folder: Path, args: argparse.Namespace) -> int:
    """Write `args.ranks` rank files into `folder`; returns their total size in bytes."""
    template = json.loads(TEMPLATE.read_text())
    rng = np.random.default_rng(1)
    hist_templates = [_histograms(rng, args) for _ in range(4)]
    total = 0
    for rank in range(args.ranks):
        doc = copy.deepcopy(template)
        doc["run_id"], doc["world_size"] = "merge-scale", args.ranks
        doc["run_parameters"] |= {"mpi_rank": rank, "mpi_world_size": args.ranks, "host": f"node{rank // 8}"}
        doc["measurement"]["window_seconds"] = float(args.seconds)
        doc["measurement"]["window_wallclock"] = {"start_unix": 1.7e9, "end_unix": 1.7e9 + args.seconds,
                                                  "barrier_aligned": True}
        samples = {"unit": "ns", "cap": SAMPLE_CAP}
        io = {}
        for op, n, med in (("read", args.reads, 8e6), ("write", args.writes, 2e7)):
            for part, values in _lists(rng, n, med).items():
                samples[f"storage_{op}_{part}_ns"] = _block(values)
            io[f"storage/{op}"] = {"ops": n, "bytes": n * (16 << 20), "device_bytes": n * (16 << 20),
                                   "busy_ns": int(n * med), "partial_bytes": 0}
        doc["latency_samples"] = samples
        doc["recorder"]["io"] = io
        doc["recorder"]["io_by_cause"] = {"storage/read/decode": [args.reads, args.reads * (16 << 20)],
                                          "storage/write/prefill": [args.writes, args.writes * (16 << 20)]}
        doc["recorder"]["requests"] = {"completed": args.requests, "tokens_generated": 200 * args.requests,
                                       "context_tokens": 4000 * args.requests}
        e2e = rng.lognormal(np.log(0.3), 0.5, args.requests)
        doc["recorder"]["qos_e2e_ns"] = {"interactive": (e2e * 1e9).astype(np.int64).tolist()}
        for key, scale in (("end_to_end_latencies", 1.0), ("storage_latencies", 0.8), ("generation_latencies", 0.1),
                           ("prefill_latencies", 0.3), ("decode_latencies", 0.6)):
            doc[key] = (e2e * scale).tolist()
        doc["requests_completed"] = args.requests
        doc["latency_histograms"] = hist_templates[rank % 4]
        doc["time_series"]["rows"] = [_row(t, rng, args) for t in range(args.seconds)]
        path = folder / f"kvcache_rank{rank}.json"
        path.write_text(json.dumps(doc))
        total += path.stat().st_size
    return total


def merge_only(folder: str) -> None:
    """In a fresh process: merge every rank file of `folder` as `kv-cache merge` does; print the figures."""
    from kv_cache.results.merge import find_rank_files, merge_documents  # noqa: PLC0415
    from kv_cache.results.write import write_document  # noqa: PLC0415

    t0 = time.perf_counter()
    files = find_rank_files([folder])
    merged = merge_documents(files)
    write_document(os.path.join(folder, "kvcache_merged.json"), merged)
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"ranks": merged["ranks"], "merge_seconds": round(seconds, 2),
                      "peak_rss_mib": round(peak_kib / 1024, 1), "percentile_method": merged["percentile_method"],
                      "window": merged["window"]["kind"], "requests": merged["total_requests"]}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--seconds", type=int, default=300, help="window length: one time-series row per second")
    p.add_argument("--reads", type=int, default=40_000, help="storage reads per rank")
    p.add_argument("--writes", type=int, default=10_000, help="storage writes per rank")
    p.add_argument("--requests", type=int, default=3_000, help="requests per rank")
    p.add_argument("--dir", default=None, help="where to write the rank files (default: a temporary directory)")
    p.add_argument("--merge-only", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.merge_only:
        merge_only(args.merge_only)
        return 0
    with tempfile.TemporaryDirectory(prefix="kv-merge-scale-", dir=args.dir) as tmp:
        t0 = time.perf_counter()
        size = synthesise(Path(tmp), args)
        sys.stderr.write(f"{args.ranks} rank files, {size / 2**20:.0f} MiB, made in {time.perf_counter() - t0:.0f} s\n")
        done = subprocess.run([sys.executable, __file__, "--merge-only", tmp], check=True, capture_output=True,
                              text=True)
        figures = json.loads(done.stdout)
        figures["rank_files_mib"] = round(size / 2**20)
        figures["goal"] = {"seconds": 10, "peak_rss_mib": 1024}
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
