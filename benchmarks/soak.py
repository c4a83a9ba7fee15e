#!/usr/bin/env python3
"""One-hour soak of the real CLI (run by hand, never in CI): samples the run's RSS every `--interval`
seconds from /proc/<pid>/status and says whether memory grows over the run, with the 24-hour projection of
that growth.

    python benchmarks/soak.py /mnt/nvme                  # 3600 s, 60 s samples
    python benchmarks/soak.py /tmp/soak --duration 120 --interval 10   # a short check
    python benchmarks/soak.py /tmp/soak -- --request-rate 20 --io-workers 2   # flags after -- go to kv-cache
    # past the 200,000-value cap of every per-request list (390,681 requests in 55 min):
    python benchmarks/soak.py /dev/shm/soak --duration 3300 --model tiny-1b --users 32 --cpu-mem-gb 0.25 -- \
        --config benchmarks/soak_small_requests.yaml --generation-mode none --request-rate 120 --storage-capacity-gb 1

Writes `--out` (default soak_<time>.json): every sample (s, RSS MiB), the run's exit status and its
results' peak RSS, requests and errors; prints first / last / max RSS and the least-squares growth of RSS
over the second half of the run (MiB per hour; the first half includes the RAM tier and cache filling up).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def growth_mib_per_hour(samples: list[tuple[float, float]], until_s: float | None = None,
                        whole: bool = False) -> float | None:
    """Least-squares RSS growth over the second half of the samples taken up to `until_s` (the run's
    duration: the clean-up after it frees the tiers and would read as a fall); `whole`: from the second
    sample on (the first is the interpreter starting)."""
    kept = [s for s in samples if until_s is None or s[0] <= until_s]
    half = kept[1:] if whole else kept[len(kept) // 2:]
    if len(half) < 3:
        return None
    t, r = np.array(half).T
    return float(np.polyfit(t, r, 1)[0] * 3600)


FLAT_PCT_PER_DAY = 1.0


def flatness(samples: list[tuple[float, float]], until_s: float | None = None) -> dict:
    """"Flat": RSS grown at the second half's least-squares slope for a whole day adds less than
    FLAT_PCT_PER_DAY of the second half's mean RSS (the earlier definition, 1 % per hour, let a day add
    24 %). Beside it: the slope as a share of RSS per hour, its standard error (ordinary least squares; the
    1-MiB steps are not independent noise, so it is a lower bound of the slope's uncertainty) and the
    residuals' SD around the fitted line (the per-sample noise)."""
    kept = [s for s in samples if until_s is None or s[0] <= until_s]
    half = kept[len(kept) // 2:]
    if len(half) < 3:
        return {}
    t, r = np.array(half).T
    slope, icpt = np.polyfit(t, r, 1)
    resid = r - (slope * t + icpt)
    se = float(np.sqrt(np.sum(resid ** 2) / (len(t) - 2) / np.sum((t - t.mean()) ** 2)) * 3600)
    day_mib = float(slope * 3600 * 24)
    limit_mib = float(r.mean() * FLAT_PCT_PER_DAY / 100)
    return {"growth_second_half_pct_of_rss_per_hour": float(slope * 3600 / r.mean() * 100),
            "growth_second_half_se_mib_per_hour": se,
            "growth_24h_at_second_half_slope_mib": day_mib, "flat_limit_24h_mib": limit_mib,
            "residual_sd_mib": float(np.std(resid)),
            "flat_definition": f"24 h at the second half's slope add or take < {FLAT_PCT_PER_DAY:g} % of its mean RSS",
            # two-sided: a fall extrapolated over a day is not a flat day either (it read "flat" before)
            "flat": abs(day_mib) < limit_mib,
            # the data bound the slope under the limit: |slope| + 2 SE over a day (a slope near 0 whose SE is
            # many times the limit is "flat" by the point estimate, not shown flat)
            "flat_shown_at_2se": abs(day_mib) + 2 * 24 * se < limit_mib}


def loadavg() -> float | None:
    try:
        with open("/proc/loadavg") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path)
    p.add_argument("--duration", type=int, default=3600)
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--poll", type=float, default=1.0,
                   help="also poll RSS every S s, and keep each interval's min and max (0 = off): a sample that "
                        "lands in a periodic results document's build is a transient, the min is the floor")
    p.add_argument("--model", default="llama3.1-8b")
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--cpu-mem-gb", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=Path(f"soak_{datetime.now():%Y%m%d_%H%M%S}.json"))
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra  # more kv-cache flags, after --
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results_path = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "kv_cache", "--model", args.model, "--num-users", str(args.users),
               "--duration", str(args.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", str(args.cpu_mem_gb),
               "--generation-mode", "realistic", "--seed", "1", "--cache-dir", str(Path(tmp) / "cache"),
               "--output", str(results_path), *args.extra]
        log = open(Path(tmp) / "console.log", "w")  # noqa: SIM115  (closed below)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        samples: list[tuple[float, float]] = []
        loads: list[float | None] = []
        spans: list[tuple[float, float]] = []  # (min, max) of the RSS polled every --poll s since the last sample
        polled: list[float] = []
        next_s = 0.0
        while proc.poll() is None:
            rss = rss_mib(proc.pid)
            now = time.monotonic() - t0
            if rss is not None:
                polled.append(rss)
            if rss is not None and now >= next_s:
                samples.append((now, rss))
                loads.append(loadavg())
                spans.append((min(polled), max(polled)))
                polled = []
                next_s += args.interval
                print(f"{now:7.0f} s  RSS {rss:8.1f} MiB  (min {spans[-1][0]:.1f} max {spans[-1][1]:.1f} since the "
                      f"last)  load {loads[-1]}", flush=True)
            time.sleep(min(args.poll, args.interval) if args.poll > 0 else args.interval)
        log.close()
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
    meas = results.get("measurement", {})
    summary = {
        "command": cmd, "exit_status": proc.returncode, "interval_s": args.interval, "samples": samples,
        "rss_first_mib": samples[0][1] if samples else None, "rss_last_mib": samples[-1][1] if samples else None,
        "rss_max_mib": max((r for _, r in samples), default=None),
        "growth_second_half_mib_per_hour": growth_mib_per_hour(samples, args.duration),
        "growth_whole_run_mib_per_hour": growth_mib_per_hour(samples, args.duration, whole=True),
        "results_peak_rss_mib": meas.get("peak_rss_mib"), "requests_completed": results.get("requests_completed"),
        "storage_errors_total": meas.get("storage_errors_total"), "loadavg_1min": loads,
        "rss_min_max_per_interval_mib": spans, "growth_second_half_of_minima_mib_per_hour":
            growth_mib_per_hour([(t, lo) for (t, _), (lo, _) in zip(samples, spans, strict=True)], args.duration),
        "malloc": meas.get("malloc"),
    }
    g = summary["growth_second_half_mib_per_hour"]
    # "Flat": the second half's least-squares slope under FLAT_PCT_PER_HOUR of the RSS per hour (a 24-hour
    # run then grows less than a quarter), with the per-minute noise (residuals' SD) beside it
    summary.update(flatness(samples, args.duration))
    # each interval's floor (its polled minimum: outside the periodic document's transient) and peak
    minima = flatness([(t, lo) for (t, _), (lo, _) in zip(samples, spans, strict=True)], args.duration)
    maxima = flatness([(t, hi) for (t, _), (_, hi) in zip(samples, spans, strict=True)], args.duration)
    summary["minima"] = {k: minima.get(k) for k in ("growth_24h_at_second_half_slope_mib", "flat_limit_24h_mib",
                                                     "growth_second_half_se_mib_per_hour", "flat", "flat_shown_at_2se")}
    summary["maxima"] = {k: maxima.get(k) for k in ("growth_24h_at_second_half_slope_mib",
                                                     "growth_second_half_se_mib_per_hour", "flat")}
    summary["projected_24h_rss_mib"] = (summary["rss_last_mib"] + g * (24 - args.duration / 3600)
                                        if g is not None and summary["rss_last_mib"] is not None else None)
    w = summary["growth_whole_run_mib_per_hour"]
    summary["projected_24h_rss_mib_whole_run_slope"] = (summary["rss_last_mib"] + w * (24 - args.duration / 3600)
                                                        if w is not None and summary["rss_last_mib"] is not None
                                                        else None)
    args.out.write_text(json.dumps(summary, indent=1))
    print(f"exit {proc.returncode}; RSS first {summary['rss_first_mib']}, last {summary['rss_last_mib']}, max "
          f"{summary['rss_max_mib']} MiB; growth over the second half {summary['growth_second_half_mib_per_hour']}"
          f" MiB/h (whole run {summary['growth_whole_run_mib_per_hour']}); projected at 24 h "
          f"{summary['projected_24h_rss_mib']} MiB (whole-run slope: {summary['projected_24h_rss_mib_whole_run_slope']}); "
          f"malloc {summary['malloc']}; results peak RSS {summary['results_peak_rss_mib']} MiB; "
          f"flat ({summary.get('flat_definition')}): {summary.get('flat')}, shown at 2 SE: "
          f"{summary.get('flat_shown_at_2se')}; minima flat {summary['minima'].get('flat')} (shown "
          f"{summary['minima'].get('flat_shown_at_2se')}), maxima flat {summary['maxima'].get('flat')} "
          f"({summary.get('growth_second_half_pct_of_rss_per_hour')} %/h, residual SD {summary.get('residual_sd_mib')} MiB); "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
