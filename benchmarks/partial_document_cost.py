"""What one periodic document costs at its largest: a recorder whose lists are full (SAMPLE_CAP values each).

A run's periodic INCOMPLETE document (--partial-results-interval; benchmarks/standard/partial.py) costs the
scheduler thread one snapshot of the recorder (its lock held while the lists and histograms are copied),
and its own thread one build of the document (build_results, as the final one) plus one atomic write
(orjson, fsync, rename). Both grow with the lists until they are full, then stay there: this fills a
recorder to the cap (`--reads` storage reads and writes, `--requests` requests) and times each part
`--repeat` times, printing JSON (median and max, ms; the document's size).

    python benchmarks/partial_document_cost.py                # full lists: 200,000 reads/writes/requests
    python benchmarks/partial_document_cost.py --reads 20000  # a short run's
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kv_cache.benchmarks.standard.scheduler import DriverOutcome  # noqa: E402
from kv_cache.cli import parse_settings  # noqa: E402
from kv_cache.metrics.recorder import RunMetrics  # noqa: E402
from kv_cache.results.partial import mark_partial  # noqa: E402
from kv_cache.results.run_document import RunRecord, build_results  # noqa: E402
from kv_cache.results.write import replace_document  # noqa: E402
from kv_cache.storage.base import IOResult  # noqa: E402


def _fill(args: argparse.Namespace) -> RunMetrics:
    rng = np.random.default_rng(1)
    m = RunMetrics()
    m.open_window(0)
    dev = rng.lognormal(np.log(5e5), 0.6, max(args.reads, args.requests)).astype(np.int64).tolist()
    for i in range(args.reads):
        m.record_io("storage", "read", IOResult(1 << 24, 1 << 24, dev[i] + 20_000, dev[i], 20_000), 1_000 + i, "decode")
        m.record_io("storage", "write", IOResult(1 << 24, 1 << 24, dev[i] + 30_000, dev[i], 30_000), 1_000 + i,
                    "prefill")
    for i in range(args.requests):
        m.record_request(("interactive", "responsive", "batch")[i % 3], 1_000 + i, 3 * dev[i], dev[i], dev[i],
                         None, None, 100, 4000, turn=i % 8)
    for t in range(args.seconds):
        m.close_bucket(int((t + 1) * 1e9), {"queue_depth": 4.0})
    return m


def _ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": 1e3 * statistics.median(values), "max_ms": 1e3 * max(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reads", type=int, default=200_000)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--seconds", type=int, default=300)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    t0 = time.perf_counter()
    m = _fill(args)
    fill_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        settings = parse_settings(["--model", "llama3.1-8b", "--num-users", "10", "--duration", "300",
                                   "--cache-dir", tmp, "--output", os.path.join(tmp, "X.json")])
        snap_s, build_s, write_s, size = [], [], [], 0
        for k in range(args.repeat):
            t = time.perf_counter()
            snap = m.snapshot(at_ns=int(args.seconds * 1e9))
            snap_s.append(time.perf_counter() - t)
            outcome = DriverOutcome("partial", snap.window_seconds, args.requests, args.requests, 0, 0)
            usage = {"nvme": {"used_bytes": 1 << 34, "limit_bytes": 1 << 36, "entries": 1000, "peak_bytes": 1 << 34,
                              "evictions": 0, "skipped_entries": 0, "max_entry_bytes": 1 << 24}}
            record = RunRecord(settings, snap, outcome, usage, [], 8, datetime.now(),
                               resource.getrusage(resource.RUSAGE_SELF))
            t = time.perf_counter()
            doc = mark_partial(build_results(record), float(args.seconds), 300.0, time.time(), 10.0, k + 1)
            build_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            size = replace_document(os.path.join(tmp, "X.json"), doc)
            write_s.append(time.perf_counter() - t)
    print(json.dumps({"reads": args.reads, "writes": args.reads, "requests": args.requests, "rows": args.seconds,
                      "fill_s": round(fill_s, 1), "snapshot (scheduler thread, recorder lock held)": _ms(snap_s),
                      "build_results": _ms(build_s), "write (orjson, fsync, rename)": _ms(write_s),
                      "document_mib": round(size / 2**20, 1), "load_average": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
