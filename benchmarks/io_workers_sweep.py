"""The I/O worker count against bandwidth, memory and CPU, and where the default lands (run by hand).

For each directory (ext4 with O_DIRECT, /dev/shm, ...) runs the real CLI with `--io-workers N` for N in
`--counts`, then once with the default (the probe, core/io_workers.py), alternating nothing else: each run
is `--duration` s of llama3.1-8b, `--users` users, `--gpu-mem-gb 0 --cpu-mem-gb 0` (every byte through the
storage tier). Prints storage read + write GiB/s, peak RSS and CPU-s per GiB for each, and marks the
default: its count, its bandwidth against the sweep's best, and its memory against that of the smallest
count that reached 95 % of the best.

    python benchmarks/io_workers_sweep.py /tmp /dev/shm --counts 1,2,4,8,16,32,64 --duration 15
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(dir_: Path, workers: int | None, a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=dir_, prefix="kv-sweep-") as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "kv_cache", "--model", a.model, "--num-users", str(a.users),
               "--duration", str(a.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--seed", "1",
               "--cache-dir", str(Path(tmp) / "cache"), "--output", str(out), *a.extra]
        if workers is not None:
            cmd += ["--io-workers", str(workers)]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if not out.exists():
            return {"workers": workers, "error": (p.stderr or p.stdout)[-300:]}
        d = json.loads(out.read_text())
    cs, m = d["summary"]["cache_stats"], d["measurement"]
    return {"workers": m["io_workers"], "default": workers is None,
            "read_gibps": cs["tier_storage_read_bandwidth_gbps"], "write_gibps": cs["tier_storage_write_bandwidth_gbps"],
            "gibps": cs["tier_storage_read_bandwidth_gbps"] + cs["tier_storage_write_bandwidth_gbps"],
            "peak_rss_mib": m.get("peak_rss_mib"), "cpu_s_per_gib": m.get("cpu_seconds_per_gib"),
            "choice": m.get("io_workers_choice")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--counts", default="1,2,4,8,16,32,64")
    ap.add_argument("--duration", type=int, default=15)
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--out", type=Path, default=None)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.extra = extra  # more kv-cache flags, after --
    report = {}
    for d in a.dirs:
        rows = [run(d, int(n), a) for n in a.counts.split(",")]
        default = run(d, None, a)
        good = [r for r in rows if "gibps" in r]
        best = max(r["gibps"] for r in good)
        reached = min((r for r in good if r["gibps"] >= 0.95 * best), key=lambda r: r["workers"])
        print(f"\n{d}: {'workers':>7} {'read':>6} {'write':>6} {'GiB/s':>6} {'RSS MiB':>8} {'CPU-s/GiB':>9}")
        for r in [*rows, default]:
            if "gibps" not in r:
                print(f"  {r['workers']}: failed: {r['error']}")
                continue
            mark = " <- default" if r["default"] else (" <- smallest at 95 % of best" if r is reached else "")
            print(f"  {r['workers']:>7} {r['read_gibps']:6.2f} {r['write_gibps']:6.2f} {r['gibps']:6.2f} "
                  f"{r['peak_rss_mib']:8.0f} {r['cpu_s_per_gib']:9.3f}{mark}")
        if "gibps" in default:
            print(f"  default {default['workers']} workers: {100 * default['gibps'] / best:.1f} % of the best "
                  f"({best:.2f} GiB/s), memory x{default['peak_rss_mib'] / reached['peak_rss_mib']:.2f} that of "
                  f"{reached['workers']} workers (the smallest at 95 %)")
            if default.get("choice"):
                print(f"  probe: {default['choice'].get('probe')}")
        report[str(d)] = {"rows": rows, "default": default, "best_gibps": best, "reached": reached["workers"]}
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
