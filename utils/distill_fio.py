#!/usr/bin/env python3
"""Distil a storage latency trace into a fio job file of the same shape.

    python3 utils/distill_fio.py TRACE [-o job.fio] [--runtime 60] [--filename /mnt/nvme/fio.dat]

TRACE is either bpftrace's output (utils/storage_latency_stack.sh, or any program with the same maps) or a
kv-cache results JSON written with --enable-latency-tracing (its `block_latency.histograms_us`). From the
block-request sizes (`bs_bytes`, keyed by rwbs: R... reads, W... writes) it takes the read share and the
most common request size per direction; from `inflight` the median requests in flight (iodepth); from
`lba_gib` the span of the device the workload touched (the file size). Output: one fio job, O_DIRECT,
random offsets, libaio, with the figures it was derived from in comments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kv_cache.host.bpftrace_hist import parse_output, quantile_bucket, total  # noqa: E402


def load_maps(path: str) -> dict:
    text = Path(path).read_text(errors="replace")
    if text.lstrip().startswith("{"):
        hist = (json.loads(text).get("block_latency") or {}).get("histograms_us")
        if not hist:
            raise ValueError(f"{path}: no block_latency.histograms_us (run kv-cache with --enable-latency-tracing)")
        return hist
    return {name.lstrip("@"): v for name, v in parse_output(text).items()}


def _direction(maps: dict, prefix: str) -> list[dict]:
    sizes = maps.get("bs_bytes") or {}
    return [b for key, buckets in sizes.items() if str(key).startswith(prefix) for b in buckets]


def _mode_size(buckets: list[dict]) -> int | None:
    """The most common power-of-two size bucket's lower bound (bpftrace's resolution), at least 512 bytes."""
    counted = [b for b in buckets if b["count"] and b["low"] is not None]
    if not counted:
        return None
    best = max(counted, key=lambda b: b["count"])
    return max(512, int(best["low"]))


def distill(maps: dict, runtime_s: int = 60, filename: str = "fio.dat") -> str:
    """The fio job text for the traced workload."""
    reads, writes = _direction(maps, "R"), _direction(maps, "W")
    n_r, n_w = total(reads), total(writes)
    if n_r + n_w == 0:
        raise ValueError("the trace has no block requests (bs_bytes is empty)")
    read_pct = round(100 * n_r / (n_r + n_w))
    bs_r, bs_w = _mode_size(reads), _mode_size(writes)
    depth = quantile_bucket(maps.get("inflight") or [], 0.5)
    iodepth = max(1, int(depth["low"])) if depth and depth["low"] is not None else 1
    lba = [b for b in (maps.get("lba_gib") or []) if b["count"] and b["low"] is not None]
    span_gib = max(1, int(max(b["high"] or b["low"] + 1 for b in lba) - min(b["low"] for b in lba))) if lba else 1
    rw = "randrw" if n_r and n_w else ("randread" if n_r else "randwrite")
    bs = ",".join(str(v) for v in (bs_r or bs_w, bs_w or bs_r))
    return "\n".join([
        "; distilled from a block-layer trace by utils/distill_fio.py",
        f"; block requests: {n_r} reads, {n_w} writes; most common size read {bs_r} B, write {bs_w} B;",
        f"; median in flight {iodepth}; device span touched ~{span_gib} GiB",
        "[global]", "ioengine=libaio", "direct=1", "time_based=1", f"runtime={runtime_s}", "group_reporting=1",
        "", "[traced]", f"filename={filename}", f"size={span_gib}g", f"rw={rw}",
        *([f"rwmixread={read_pct}"] if rw == "randrw" else []), f"bs={bs}", f"iodepth={iodepth}", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="distill_fio.py", allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("-o", "--output", help="job file (default: stdout)")
    p.add_argument("--runtime", type=int, default=60)
    p.add_argument("--filename", default="fio.dat")
    args = p.parse_args(argv)
    try:
        job = distill(load_maps(args.trace), args.runtime, args.filename)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"distill_fio.py: error: {exc}\n")
        return 2
    if args.output:
        Path(args.output).write_text(job)
    else:
        sys.stdout.write(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
