#!/usr/bin/env python3
"""The cost of `--verify` (run by hand, not in CI): the real CLI with and without it, alternating
(off, on, off, on, ... `--pairs` pairs) so that drift of a shared disk hits both sides alike.

Each run: pure storage (GPU 0, generation none), the given model and users, `--duration` seconds, in DIR.
Throughput = summary.cache_stats tier_{storage,cpu}_read_bandwidth_gbps (GiB/s of the measured window).

    python benchmarks/verify_cost.py /tmp/verify-bench --pairs 3 --duration 6
    python benchmarks/verify_cost.py --micro            # the checks alone, in memory, per chunk size

--micro times WorkerBuffers.check_stamp (16 bytes per 4 KiB block) and check_payload (the other 4080 bytes:
numpy not_equal against the fill into a preallocated array) on a read buffer that holds what a write laid
out, best of 5 x 20 calls per chunk size; GiB/s of chunk bytes checked per second on one core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(directory: Path, verify: bool, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "kv_cache", "--model", args.model, "--num-users", str(args.users),
               "--duration", str(args.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", str(args.cpu_mem_gb),
               "--generation-mode", "none", "--seed", "1", "--cache-dir", str(Path(tmp) / "cache"),
               "--output", str(out)] + (["--verify"] if verify else [])
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        res = json.loads(out.read_text())
    cs = res["summary"]["cache_stats"]
    return {"storage_read_gibps": float(cs.get("tier_storage_read_bandwidth_gbps", 0.0)),
            "cpu_read_gibps": float(cs.get("tier_cpu_read_bandwidth_gbps", 0.0)),
            "mismatches": res["measurement"]["verify"]["mismatches"],
            "cpu_s_per_gib": res["measurement"]["cpu_seconds_per_gib"]}


def micro() -> None:
    import time  # noqa: PLC0415

    from kv_cache.storage.buffers import WorkerBuffers  # noqa: PLC0415

    for mib in (1, 4, 16, 64):
        b = WorkerBuffers(mib << 20, 1, 0)
        b.stamp(7, 0, b.nblocks)
        b.read_buf[:] = b.write_buf
        for name, call in (("stamps", lambda b=b: b.check_stamp(7, 0, b.nblocks)),
                           ("payload", lambda b=b: b.check_payload(0, b.nblocks, (0,)))):
            assert call() == -1
            best = min(_timed(call, 20, time.perf_counter) for _ in range(5))
            print(f"{mib:3d} MiB chunk, {name:7s}: {best * 1e3:7.3f} ms per chunk = "
                  f"{(mib << 20) / best / 2**30:6.2f} GiB/s", flush=True)
        b.close()


def _timed(call, n: int, clock) -> float:
    t = clock()
    for _ in range(n):
        call()
    return (clock() - t) / n


def main() -> None:
    if "--micro" in sys.argv[1:]:
        micro()
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--duration", type=int, default=6)
    p.add_argument("--model", default="llama3.1-8b")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--cpu-mem-gb", type=float, default=0.0)
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(args.pairs):
        for verify in (False, True):
            r = one_run(args.dir, verify, args)
            runs[verify].append(r)
            print(f"pair {i + 1} verify={'on ' if verify else 'off'}: storage read {r['storage_read_gibps']:.3f}"
                  f" GiB/s, cpu read {r['cpu_read_gibps']:.3f} GiB/s, {r['cpu_s_per_gib']:.3f} CPU-s/GiB,"
                  f" mismatches {r['mismatches']}", flush=True)
    for key in ("storage_read_gibps", "cpu_read_gibps", "cpu_s_per_gib"):
        off = statistics.median(r[key] for r in runs[False])
        on = statistics.median(r[key] for r in runs[True])
        change = f"{100 * (on - off) / off:+.1f} %" if off else "n/a"
        print(f"median {key}: off {off:.3f}, on {on:.3f} ({change})")


if __name__ == "__main__":
    main()
