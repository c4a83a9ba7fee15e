#!/usr/bin/env python3
"""Memory and scale checks of the real `kv-cache` CLI (run by hand, not in CI).

Suites (``--suites``, default both):

* ``rss``: peak RSS (``/usr/bin/time -v``, and the results' ``measurement.peak_rss_mib``) of pure-storage
  runs (GPU 0, CPU 0, generation none, default personas, multi-turn and prefix caching on) with
  ``--max-concurrent-allocs 0``: llama2-7b with 50 users (entries up to 25,000 tokens x 512 KiB = 12.2
  GiB) and llama3.1-8b with 200 users.  Goal: peak RSS <= 1 GiB + the configured buffer pool
  (I/O workers x 2 buffers x chunk).
* ``users``: 100 vs 10,000 simulated users at the same I/O concurrency (``--io-workers``), alternating
  (100, 10000, 100, 10000, ... ``--pairs`` pairs).  Throughput = storage-tier read + write GiB/s;
  goal: the 10,000-user median loses < 5 % against the 100-user median.

    python benchmarks/scale_checks.py /mnt/nvme
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import kv_cache  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _bench as B  # noqa: E402

SUITES = ("rss", "users")


def base_args(model: str, users: int, duration: float, cache_dir: Path, seed: int) -> list[str]:
    return [
        "--model", model, "--num-users", str(users), "--duration", f"{duration:g}",
        "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none",
        "--performance-profile", "throughput", "--seed", str(seed), "--cache-dir", str(cache_dir),
        "--log-level", "WARNING",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("directory", help="a directory on the device under test")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per run (20)")
    ap.add_argument("--pairs", type=int, default=3, help="users suite: alternating pairs (3)")
    ap.add_argument("--io-workers", type=int, default=32, help="users suite: I/O concurrency of both (32)")
    ap.add_argument("--users-model", default="llama3.1-8b")
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", help="summary JSON (default scale_checks_<time>.json)")
    ap.add_argument("--logs", help="per-run logs (default scale_checks_logs_<time>)")
    a = ap.parse_args(argv)
    suites = [s for s in a.suites.split(",") if s]
    if any(s not in SUITES for s in suites):
        ap.error(f"--suites: choose from {SUITES}")
    B.require_tools(need_fio=False)
    lock = B.exclusive("benchmarks/scale_checks.py")  # noqa: F841 (held until exit)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = Path(a.logs or f"scale_checks_logs_{stamp}").resolve()
    out_path = Path(a.out or f"scale_checks_{stamp}.json").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(a.directory).resolve() / f"kv-scale-{stamp}"
    cache_dir.mkdir(parents=True)
    results: dict = {"settings": vars(a)}
    verdicts: list[tuple[str, bool]] = []
    seq = 0

    def run(label: str, args: list[str]) -> dict:
        nonlocal seq
        seq += 1
        B.settle(a.settle)
        return B.run_kv_cache(args, f"{seq:02d}-{label}", logs)

    t0 = time.time()
    try:
        if "rss" in suites:
            print("== rss: peak RSS vs 1 GiB + buffer pool (I/O workers x 2 x chunk) ==", flush=True)
            rows = []
            for model, users in (("llama2-7b", 50), ("llama3.1-8b", 200)):
                r = run(f"rss-{model}-{users}u",
                        [*base_args(model, users, a.duration, cache_dir, a.seed), "--max-concurrent-allocs", "0"])
                d = json.loads(Path(r["json"]).read_text())
                m = d["measurement"]
                banner = re.search(r"max entry ([0-9.]+) MiB", (logs / f"{seq:02d}-rss-{model}-{users}u.log").read_text())
                planned = float(banner.group(1)) if banner else None
                pool = r["io_workers"] * 2 * r["chunk_bytes"]
                limit_mib = (B.GIB + pool) / B.MIB
                ok = r["peak_rss_mib"] <= limit_mib
                row = {"model": model, "users": users, "peak_rss_mib": r["peak_rss_mib"],
                       "peak_rss_mib_json": r["peak_rss_mib_json"], "io_workers": r["io_workers"],
                       "buffer_pool_mib": pool / B.MIB, "limit_mib": limit_mib, "pass": ok,
                       "entry_size_mib": m.get("entry_size_mib"), "largest_user_context_mib": planned,
                       "read_gibps": r["read_gibps"],
                       "write_gibps": r["write_gibps"], "requests": r["requests"],
                       "cpu_seconds_per_gib": r["cpu_seconds_per_gib"]}
                rows.append(row)
                verdicts.append((f"rss {model} {users} users", ok))
                es = m.get("entry_size_mib") or {}
                print(f"  {model:12s} {users:4d} users: peak RSS {r['peak_rss_mib']:.0f} MiB (JSON "
                      f"{r['peak_rss_mib_json']:.0f}); limit {limit_mib:.0f} MiB = 1024 + {r['io_workers']} "
                      f"workers x 2 x {r['chunk_bytes'] // B.MIB} MiB -> {'PASS' if ok else 'FAIL'}; "
                      f"largest user context {B.fmt(planned, 0)} MiB, largest stored entry "
                      f"{es.get('max', 0):.0f} MiB; read {r['read_gibps']:.3f} + write "
                      f"{r['write_gibps']:.3f} GiB/s", flush=True)
            results["rss"] = rows
        if "users" in suites:
            print(f"== users: 100 vs 10000 users, --io-workers {a.io_workers}, {a.pairs} alternating pairs ==",
                  flush=True)
            runs: dict[int, list[dict]] = {100: [], 10000: []}
            for i in range(a.pairs):
                for n in (100, 10000):
                    r = run(f"users-{n}", [*base_args(a.users_model, n, a.duration, cache_dir, a.seed),
                                           "--io-workers", str(a.io_workers)])
                    r["total_gibps"] = r["read_gibps"] + r["write_gibps"]
                    runs[n].append(r)
                    print(f"  pair {i + 1} {n:5d} users: {r['total_gibps']:.3f} GiB/s (read {r['read_gibps']:.3f}"
                          f" + write {r['write_gibps']:.3f}), {r['requests']} requests, achieved QD "
                          f"{sum(r['achieved_queue_depth'].values()):.2f}, {r['cpu_seconds_per_gib']:.4f} CPU-s/GiB,"
                          f" RSS {r['peak_rss_mib']:.0f} MiB", flush=True)
            m100 = B.mmm([r["total_gibps"] for r in runs[100]])
            m10k = B.mmm([r["total_gibps"] for r in runs[10000]])
            loss = 1 - m10k["median"] / m100["median"] if m100["median"] else None
            ok = loss is not None and loss < 0.05
            results["users"] = {"runs": runs, "100": m100, "10000": m10k, "loss": loss, "pass": ok}
            verdicts.append(("10000 vs 100 users", ok))
            print(f"  -> median 100 users {B.fmt(m100['median'])} GiB/s, 10000 users {B.fmt(m10k['median'])} "
                  f"GiB/s: loss {B.fmt(100 * loss if loss is not None else None, 1)} % "
                  f"({'PASS' if ok else 'FAIL'} < 5 %)", flush=True)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)  # our own fresh directory (kv-cache cleans its run dirs)
        results["elapsed_s"] = time.time() - t0
        out_path.write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {out_path}")
    for label, ok in verdicts:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
