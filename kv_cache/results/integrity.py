"""The integrity verdict of a result: can its storage figures be what the storage did? (`kv-cache audit`)

One engine for every document kind (a run of ours, a merge of ranks, the MLPerf tool's rank files): an adapter
per kind reads its counters into `IntegrityFacts` (`facts_from_ours`, `facts_from_mlperf_tool`, the only place
that reads the MLPerf tool's raw keys), and each check below is a physical inequality recomputed from those
counters, never from a stored verdict, printed with its numbers. Each check is `ok`, `suspect`, `invalid`,
`unverifiable` (an input the document's kind records is missing) or `n/a` (the kind never records it, said why):

1. bandwidth: reported GiB/s = bytes / window, per tier and direction, within BANDWIDTH_TOLERANCE (1 %).
2. device_time: mean bytes per operation / device P95 <= the per-operation ceiling (128 GB/s), with the
   tier's own operation count (the MLPerf tool's read_iops counts every tier's hits: with bytes in another
   tier it is a lower bound only, so an OK is unverifiable there).
3. window: summed device time / window <= workers (one request in flight each); operations in flight at the
   window's end <= workers x 1 chunk each (ours, measured); bytes counted from outside the window <= the
   bound the run measured (ours: measurement.window_edge, the chunks of each edge operation completed by the
   window's end; only a store that marks no chunk adds its operation whole) or, for the MLPerf tool, the span
   the counted bytes took: max(window, longest request, summed storage time / workers).
4. interposers: LD_PRELOAD (text, environment mappings, `-x LD_PRELOAD`, wrappers such as eatmydata) and, for
   our runs, the mapped shared objects that define fsync, fdatasync, posix_fadvise or open.
5. page_cache: storage-tier bytes read <= what the narrowest counter saw move from the device (x 1/0.9):
   the run's own cgroup (io.stat / blkio), else the process (/proc/<pid>/io read_bytes), else the whole
   block device (/proc/diskstats), which alone is "unverifiable on a shared device" when other I/O
   (device - process bytes) exceeded the tolerance. A remote tier: its interface's received bytes.
6. io_setup: I/O mode, fsync, filesystem type and host; a RAM filesystem is invalid.
7. verify: --verify mismatches == 0 (every byte of every block compared, storage/buffers.py).
8. device_limit: storage bandwidth <= the device's (or its link's) rated GB/s (--device-limit-gbs, a host
   YAML, or the drive's sysfs model and PCIe link); n/a where no limit is known.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kv_cache.results.figures import CacheStats, Figures
from kv_cache.results.mlperf_tool import rank_view
from kv_cache.storage.tiername import TierName

OK, SUSPECT, INVALID, UNVERIFIABLE, NA = "ok", "suspect", "invalid", "unverifiable", "n/a"
UNKNOWN = UNVERIFIABLE  # the earlier name
_RANK = {OK: 0, NA: 0, SUSPECT: 1, UNVERIFIABLE: 2, INVALID: 3}
GIB = 1024 ** 3
PCIE_GEN5_X16_BYTES_PER_S = 64e9
DEFAULT_CEILING = 2 * PCIE_GEN5_X16_BYTES_PER_S
BANDWIDTH_TOLERANCE = 0.01  # reported against bytes / window
WINDOW_TOLERANCE = 0.05  # span beyond the window (or bytes from outside it) that is still "suspect"
IN_FLIGHT_TOLERANCE = 0.05  # summed device time / window above the workers by more: impossible
DEVICE_SHARE_MIN = 0.9  # bytes the device / process / cgroup saw / counted reads under this: served from memory
SERIES_GAP_INVALID = 0.25  # counted bytes that no time-series bucket holds, beyond this share: not the window's
BLOCK_BYTES = 4096
DEVICE_LIMIT_TOLERANCE = 0.02  # above a device's rated GB/s by more: impossible
# No-op shims and what they defeat; allocators are interposed too, but touch no I/O call.
KNOWN_SHIMS = {"libeatmydata": "turns fsync/fdatasync/sync into no-ops (writes end in the page cache)",
               "eatmydata": "turns fsync/fdatasync/sync into no-ops (writes end in the page cache)",
               "libnofadvise": "turns posix_fadvise(DONTNEED) into a no-op (reads can hit the page cache)",
               "nofadvise": "turns posix_fadvise(DONTNEED) into a no-op (reads can hit the page cache)",
               "nocache": "rewrites open/close to drop or keep cache pages"}
BENIGN_PRELOADS = ("libtcmalloc", "libjemalloc", "libmimalloc", "libhoard")


@dataclass(frozen=True)
class IntegrityFacts:
    """What the checks need, read from one rank's (or one run's) document by an adapter. None: not recorded."""

    source: str  # "kv-cache", "kv-cache merge" or "mlperf-tool"
    window_s: float | None = None
    window_alt_s: float | None = None  # the same window recorded a second time (summary.elapsed_time)
    workers: int | None = None
    workers_meaning: str = ""
    workers_recorded_twice: tuple[int, int] | None = None  # ours: (io_workers, io_workers_choice.count) that differ
    read_bytes: float | None = None  # the storage tier's
    write_bytes: float | None = None
    read_ops: int | None = None  # the storage tier's operations
    write_ops: int | None = None
    ops_scope: str = "tier"  # "tier": the storage tier's own counts; "all tiers": every tier's (a lower bound)
    read_device_p95_ms: float | None = None
    write_device_p95_ms: float | None = None
    read_device_p50_ms: float | None = None
    write_device_p50_ms: float | None = None
    write_device_is_fsync_only: bool = False
    reported_read_gibs: float | None = None
    reported_write_gibs: float | None = None
    # (tier, op, bytes, reported GiB/s) for every tier and direction the document records
    bandwidth_rows: tuple[tuple[str, str, float | None, float | None], ...] = ()
    other_tier_read_bytes: float | None = None  # bytes read from tiers other than storage
    window_edge: dict[str, Any] | None = None  # ours: measurement.window_edge
    # ours: the time series summed (storage read bytes, write bytes, seconds, bucket seconds): a second record
    # of the window's bytes and length, bucket by bucket
    series: tuple[float, float, float, float] | None = None
    max_entry_bytes: float | None = None  # ours: measurement.entry_size_mib.max
    summed_storage_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_max_s: float | None = None
    in_flight_at_stop: int | None = None
    users: int | None = None  # closed loop: requests in flight at most one per user
    ld_preload: tuple[str, ...] = ()
    preload_recorded: bool = False
    interposers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    mapped_recorded: bool = False
    device_read_bytes: float | None = None
    device_write_bytes: float | None = None
    process_read_bytes: float | None = None  # /proc/<pid>/io over the run, summed over processes
    process_write_bytes: float | None = None
    process_run_read_bytes: float | None = None  # the same counters over the block device's interval
    process_run_write_bytes: float | None = None
    cgroup_read_bytes: float | None = None  # the run's own cgroup, its storage device only
    cgroup_write_bytes: float | None = None
    cgroup_source: str | None = None
    io_mode: str | None = None
    fsync: bool | None = None
    filesystem: str | None = None
    filesystem_kind: str | None = None
    host: str | None = None
    # a remote tier (io_mode "network"): what its interface received against the tier's bytes it should carry
    net_interface: str | None = None
    net_received_bytes: float | None = None
    net_expected_bytes: float | None = None
    block_device: str | None = None  # the device's name where known, with or without counters
    storage_backend: str | None = None  # ours: measurement.tier_backends.storage (file, s3, redis)
    verify_enabled: bool | None = None
    verify_mismatches: int | None = None
    device_limit_gbs: float | None = None  # decimal GB/s
    device_limit_source: str | None = None
    device_write_limit_gbs: float | None = None  # a drive's rated write GB/s where it differs (host YAML)
    notes: tuple[str, ...] = field(default_factory=tuple)


def _finding(check: str, status: str, reason: str, **numbers: Any) -> dict[str, Any]:
    return {"check": check, "status": status, "reason": reason,
            "numbers": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in numbers.items()}}


def _worse(a: str, b: str) -> str:
    return max(a, b, key=_RANK.get)


def check_bandwidth(f: IntegrityFacts) -> dict[str, Any]:
    """1. Reported GiB/s against bytes / window, per tier and direction (BANDWIDTH_TOLERANCE)."""
    nums: dict[str, Any] = {"window_s": f.window_s, "tolerance": BANDWIDTH_TOLERANCE}
    if not f.window_s or f.window_s <= 0:
        return _finding("bandwidth", UNVERIFIABLE, "no measured window: bytes / window cannot be recomputed", **nums)
    status, reasons = OK, []
    if f.window_alt_s is not None and abs(f.window_alt_s - f.window_s) > max(1e-6, 1e-3 * f.window_s):
        status = INVALID
        reasons.append(f"the window is recorded as {f.window_s:.4g} s and as {f.window_alt_s:.4g} s")
    seen = 0
    for tier, op, nbytes, rep in f.bandwidth_rows:
        if nbytes is None and rep is None:
            if tier == str(TierName.STORAGE):  # the tier the document is about: never absent in either kind
                status = _worse(status, UNVERIFIABLE)
                reasons.append(f"storage {op}: neither bytes nor bandwidth recorded")
            continue
        if nbytes is None or rep is None:
            status = _worse(status, UNVERIFIABLE)
            reasons.append(f"{tier} {op}: {'bytes' if nbytes is None else 'bandwidth'} not recorded")
            continue
        seen += 1
        recomputed = nbytes / GIB / f.window_s
        nums[f"{tier}_{op}_reported_gib_per_s"] = rep
        nums[f"{tier}_{op}_recomputed_gib_per_s"] = recomputed
        if abs(rep - recomputed) > BANDWIDTH_TOLERANCE * max(rep, recomputed) + 1e-9:
            status = INVALID
            reasons.append(f"{tier} {op}: {rep:.4g} GiB/s reported, {nbytes / GIB:.4g} GiB / {f.window_s:.4g} s "
                           f"= {recomputed:.4g} GiB/s")
    if f.series is not None:
        s_read, s_write, s_seconds, bucket = f.series
        nums.update(series_read_bytes=s_read, series_write_bytes=s_write, series_seconds=s_seconds)
        if not f.window_s - bucket - 1e-3 <= s_seconds <= f.window_s * (1 + BANDWIDTH_TOLERANCE) + 1e-3:
            status = INVALID
            reasons.append(f"the time series covers {s_seconds:.4g} s, not the {f.window_s:.4g} s window (its "
                           f"{bucket:g} s buckets record the window a second time)")
        edge = f.window_edge or {}
        slack = float(_num(edge.get("counted_bytes")) or 0) + float(_num(edge.get("unmeasured_bytes")) or 0)
        for op, counted, in_series, ops in (("read", f.read_bytes, s_read, f.read_ops),
                                            ("write", f.write_bytes, s_write, f.write_ops)):
            if counted is None:
                continue
            over = counted - in_series - slack  # bytes in the total that no bucket and no edge operation holds
            # the driver leaves a tail under a tenth of a bucket unbucketed (scheduler._last_bucket): what each
            # worker can finish there, one operation of the largest entry (else of the mean operation) each
            size = f.max_entry_bytes or (counted / ops if ops else 0.0)
            over -= (f.workers or 1) * size
            nums[f"series_{op}_unexplained_bytes"] = max(0.0, over)
            if in_series > counted * (1 + BANDWIDTH_TOLERANCE) + BLOCK_BYTES or over > SERIES_GAP_INVALID * counted:
                status = INVALID
                reasons.append(f"storage {op}: {counted / GIB:.4g} GiB counted, {in_series / GIB:.4g} GiB in the time "
                               f"series' buckets (+{slack / GIB:.3g} GiB of edge operations): the totals are not "
                               "the window's operations")
            elif over > WINDOW_TOLERANCE * counted:
                status = _worse(status, SUSPECT)
                reasons.append(f"storage {op}: {over / GIB:.3g} GiB counted that no time-series bucket or edge "
                               "operation holds")
    if not seen and status == OK:
        return _finding("bandwidth", UNVERIFIABLE, "no tier's bytes and bandwidth recorded", **nums)
    return _finding("bandwidth", status, "; ".join(reasons) or
                    f"every tier's reported bandwidth is its bytes / window (within {BANDWIDTH_TOLERANCE:.0%})",
                    **nums)


def check_device_time(f: IntegrityFacts, ceiling: float = DEFAULT_CEILING) -> dict[str, Any]:
    """2. A device P95 that would need more than `ceiling` bytes/s for one operation of the tier's mean size."""
    status, nums, reasons, seen = OK, {"ceiling_gb_per_s": ceiling / 1e9, "ops_scope": f.ops_scope}, [], False
    for op, nbytes, ops, p95 in (("read", f.read_bytes, f.read_ops, f.read_device_p95_ms),
                                 ("write", f.write_bytes, f.write_ops, f.write_device_p95_ms)):
        if nbytes is None:
            status = _worse(status, UNVERIFIABLE)
            reasons.append(f"storage {op} bytes not recorded")
            continue
        if nbytes == 0:
            continue
        if not ops or p95 is None:
            status = _worse(status, UNVERIFIABLE)
            reasons.append(f"storage {op}: {nbytes / GIB:.3g} GiB moved but its "
                           f"{'operation count' if not ops else 'device P95'} is not recorded")
            continue
        seen = True
        mean = nbytes / ops
        rate = mean / (p95 / 1000.0) if p95 > 0 else float("inf")
        nums.update({f"{op}_ops": ops, f"{op}_mean_bytes_per_op": round(mean), f"{op}_device_p95_ms": p95,
                     f"{op}_implied_gb_per_s": rate / 1e9 if rate != float("inf") else "inf"})
        lower = op == "read" and f.ops_scope != "tier" and (f.other_tier_read_bytes or 0) > 0
        if rate > ceiling:
            status = INVALID
            what = " (its 'device' time is the fsync alone)" if op == "write" and f.write_device_is_fsync_only else ""
            reasons.append(f"{op} device P95 {p95:.3g} ms for {mean / 1e6:.0f} MB per operation = "
                           f"{rate / 1e9:.0f} GB/s, above the {ceiling / 1e9:.0f} GB/s ceiling{what}"
                           + (" (a lower bound: its operation count covers every tier)" if lower else ""))
        elif p50 := (f.read_device_p50_ms if op == "read" else f.write_device_p50_ms):
            # the median operation: above the link ceiling is impossible; above the device's limit, suspect (the
            # median operation may be smaller than the mean), twice it impossible
            rate50 = mean / (p50 / 1000.0) if p50 > 0 else float("inf")
            nums[f"{op}_device_p50_ms"] = p50
            nums[f"{op}_p50_implied_gb_per_s"] = rate50 / 1e9 if rate50 != float("inf") else "inf"
            what = " (the fsync alone: the flush path)" if op == "write" and f.write_device_is_fsync_only else ""
            limit = f.device_limit_gbs * 1e9 if f.device_limit_gbs else None
            if rate50 > ceiling or (limit and rate50 > 2 * limit):
                status = INVALID
                bound = ceiling if rate50 > ceiling else 2 * limit
                reasons.append(f"{op} device P50 {p50:.3g} ms for {mean / 1e6:.0f} MB per operation = "
                               f"{rate50 / 1e9:.1f} GB/s{what}, more than {bound / 1e9:.1f} GB/s can deliver")
            elif limit and rate50 > limit * (1 + DEVICE_LIMIT_TOLERANCE):
                status = _worse(status, SUSPECT)
                reasons.append(f"{op} device P50 {p50:.3g} ms for {mean / 1e6:.0f} MB per operation = "
                               f"{rate50 / 1e9:.1f} GB/s{what}, above the device's {limit / 1e9:g} GB/s")
        if lower and status not in (INVALID,):
            status = _worse(status, UNVERIFIABLE)
            reasons.append(f"read: {ops} operations counted over every tier ({f.other_tier_read_bytes / GIB:.3g} GiB "
                           f"read from the faster ones), so {rate / 1e9:.3g} GB/s per operation is a lower bound "
                           "only: the storage tier's own count is not recorded")
    if not seen and status == OK:
        return _finding("device_time", NA, "no storage bytes moved", **nums)
    return _finding("device_time", status, "; ".join(reasons) or "device times are possible for their bytes", **nums)


def corrected_span(f: IntegrityFacts) -> float | None:
    """The least time the counted bytes can have taken: max(window, longest end-to-end latency, summed storage
    time / workers); None without a window."""
    if not f.window_s:
        return None
    span = f.window_s
    if f.e2e_max_s is not None:
        span = max(span, f.e2e_max_s)
    if f.summed_storage_s is not None and f.workers:
        span = max(span, f.summed_storage_s / f.workers)
    return span


def _window_ours(f: IntegrityFacts, nums: dict[str, Any]) -> tuple[str, list[str]]:
    """Our documents: the measured edge (measurement.window_edge)."""
    edge = f.window_edge
    if not isinstance(edge, dict):
        return UNVERIFIABLE, ["no measurement.window_edge: the bytes counted from outside the window are not "
                              "measured (a result written before it was recorded)"]
    status, reasons = OK, []
    total = (f.read_bytes or 0) + (f.write_bytes or 0)
    counted, unmeasured = float(edge.get("counted_bytes") or 0), float(edge.get("unmeasured_bytes") or 0)
    ops = int(edge.get("edge_ops") or 0)
    negative = [k for k, v in edge.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0]
    if negative:
        status = INVALID
        reasons.append(f"measurement.window_edge holds negative counts ({', '.join(negative)}): no counter can")
    nums.update(edge_ops=ops, edge_counted_bytes=counted, edge_excluded_bytes=edge.get("excluded_bytes"),
                outside_bound_bytes=unmeasured)
    if f.workers and ops > f.workers:
        status = INVALID
        reasons.append(f"{ops} operations in flight at the window's end, more than the {f.workers} I/O workers x 1 "
                       "chunk in flight each")
    if counted + unmeasured > total * (1 + 1e-9) + 1:
        status = INVALID
        reasons.append(f"the edge operations' counted bytes ({(counted + unmeasured) / GIB:.3g} GiB) exceed the "
                       f"storage bytes counted ({total / GIB:.3g} GiB)")
    if total and unmeasured > WINDOW_TOLERANCE * total:
        status = _worse(status, SUSPECT)
        reasons.append(f"{unmeasured / GIB:.3g} GiB of {edge.get('unmeasured_ops', 0)} edge operation(s) counted "
                       "whole (a store that marks no chunk times): up to that may lie outside the window")
    for op, nbytes in (("read", f.read_bytes), ("write", f.write_bytes)):
        if nbytes is not None and f.window_s:
            share = nbytes / total if total else 0
            nums[f"corrected_{op}_gib_per_s"] = max(0.0, nbytes - unmeasured * share) / GIB / f.window_s
    if not reasons:
        reasons.append(f"bytes counted from outside the window <= {unmeasured / GIB:.3g} GiB (measured: {ops} edge "
                       f"operation(s) added only their chunks completed by the window's end)")
    return status, reasons


def check_window(f: IntegrityFacts) -> dict[str, Any]:
    """3. I/O counted outside the window and operations in flight: average in flight against the workers,
    edge operations (ours), the span and corrected bandwidth (the MLPerf tool)."""
    if not f.window_s:
        return _finding("window", UNVERIFIABLE, "no measured window recorded")
    nums: dict[str, Any] = {"window_s": f.window_s, "workers": f.workers, "in_flight_at_stop": f.in_flight_at_stop}
    avg = f.summed_storage_s / f.window_s if f.summed_storage_s is not None else None
    nums.update(average_in_flight=avg, end_to_end_p95_s=f.e2e_p95_s, end_to_end_max_s=f.e2e_max_s)
    for op, nbytes, rep in (("read", f.read_bytes, f.reported_read_gibs), ("write", f.write_bytes, f.reported_write_gibs)):
        if nbytes is not None:
            nums[f"reported_{op}_gib_per_s"] = rep if rep is not None else nbytes / GIB / f.window_s
    reasons, status = [], OK
    if avg is None:
        status = UNVERIFIABLE
        reasons.append("no summed storage time: the requests in flight on average cannot be recomputed")
    elif not f.workers:
        status = UNVERIFIABLE
        reasons.append(f"{avg:.1f} requests in flight on average, against an unrecorded number of workers")
    elif avg > f.workers * (1 + IN_FLIGHT_TOLERANCE):
        status = INVALID
        reasons.append(f"summed storage time / window = {avg:.1f} requests in flight on average, more than the "
                       f"{f.workers} {f.workers_meaning or 'workers'}: time from outside the window is counted")
    # at least half of a tier's operations took at least its device P50: their summed device time is a lower
    # bound on the device time the window recorded (the storage tier's own counts only)
    floor = sum(ops * p50 / 1000.0 / 2 for ops, p50 in ((f.read_ops, f.read_device_p50_ms),
                                                         (f.write_ops, f.write_device_p50_ms))
                if ops and p50 and p50 > 0) if f.ops_scope == "tier" else 0.0
    if floor and f.summed_storage_s is not None:
        nums["least_summed_device_s"] = floor
        if floor > f.summed_storage_s * (1 + IN_FLIGHT_TOLERANCE) + 1e-6:
            status = INVALID
            reasons.append(f"half the storage operations at their device P50 alone take {floor:.3g} s of device "
                           f"time, more than the {f.summed_storage_s:.3g} s the window recorded (operation counts "
                           "and device time do not fit)")
    if f.workers_recorded_twice:
        status = INVALID
        reasons.append(f"the I/O workers are recorded as {f.workers_recorded_twice[0]} (measurement.io_workers) and "
                       f"as {f.workers_recorded_twice[1]} (measurement.io_workers_choice.count): the bound the "
                       "in-flight checks use is not the run's")
    if f.users and f.in_flight_at_stop is not None and f.in_flight_at_stop > f.users:
        status = INVALID
        reasons.append(f"{f.in_flight_at_stop} requests in flight at the stop, more than the {f.users} users of a "
                       "closed loop (one request each)")
    if f.source.startswith("kv-cache"):
        s, why = _window_ours(f, nums)
        status = _worse(status, s)
        reasons += why
        nums["span_s"] = f.window_s
    else:
        span = corrected_span(f)
        nums["span_s"] = span
        for op, nbytes in (("read", f.read_bytes), ("write", f.write_bytes)):
            if nbytes is not None and span:
                nums[f"corrected_{op}_gib_per_s"] = nbytes / GIB / span
        if span and span > f.window_s:
            excess = span / f.window_s - 1
            status = _worse(status, INVALID if excess > WINDOW_TOLERANCE else SUSPECT)
            corrected = nums.get("corrected_read_gib_per_s")
            reasons.append(f"the counted bytes took at least {span:.1f} s, not the {f.window_s:.1f} s window they "
                           f"are divided by (+{excess:.0%}); " + (
                               f"corrected read bandwidth at most {corrected:.2f} GiB/s against "
                               f"{nums['reported_read_gib_per_s']:.2f} reported" if corrected is not None else
                               "the bytes read are not recorded, so no corrected bandwidth"))
        if f.e2e_p95_s is not None and f.e2e_p95_s > f.window_s:
            status = _worse(status, SUSPECT)
            reasons.append(f"end-to-end P95 {f.e2e_p95_s:.1f} s is longer than the {f.window_s:.1f} s window")
        if f.e2e_max_s is None and f.e2e_p95_s is None:
            status = _worse(status, UNVERIFIABLE)
            reasons.append("no end-to-end latencies: the span the bytes took cannot be bounded")
    return _finding("window", status, "; ".join(reasons) or "I/O within the window", **nums)


def _preload_status(path: str) -> tuple[str, str]:
    if path.startswith("("):  # a form without a library path: -x LD_PRELOAD, a wrapper command
        inner = path.strip("()")  # -x LD_PRELOAD: a library was preloaded, which one is not recorded
        return (INVALID if any(w in inner for w in ("eatmydata", "nocache")) else UNVERIFIABLE), inner
    name = os.path.basename(path)
    for shim, what in KNOWN_SHIMS.items():
        if name.startswith(shim):
            return INVALID, f"{name} {what}"
    if name.startswith(BENIGN_PRELOADS):
        return OK, f"{name} (a memory allocator; no I/O call)"
    return SUSPECT, f"{name} (unknown preloaded library)"


def check_interposers(f: IntegrityFacts) -> dict[str, Any]:
    """4. LD_PRELOAD and, for our runs, mapped libraries that define fsync/fdatasync/posix_fadvise/open."""
    status, reasons = OK, []
    for path in f.ld_preload:
        s, why = _preload_status(path)
        status = _worse(status, s)
        reasons.append(f"LD_PRELOAD {why}" if not path.startswith("(") else why)
    for path, symbols in f.interposers:
        status = INVALID
        reasons.append(f"{path} interposes {', '.join(symbols)}")
    if not f.preload_recorded and not f.mapped_recorded:
        if f.source == "kv-cache merge":
            return _finding("interposers", NA, "a merge keeps no mapped libraries: each rank's own document "
                            "checks them (per_rank)")
        why = ("the rank file records no parameters: give the run directory, with its *_metadata.json"
               if f.source == "mlperf-tool" else
               "no measurement.process_libraries (a result written before they were recorded)")
        return _finding("interposers", UNVERIFIABLE, why)
    if f.source == "kv-cache" and not f.mapped_recorded and status != INVALID:
        status = _worse(status, UNVERIFIABLE)
        reasons.append("the mapped libraries were not scanned (measurement.process_libraries.recorded): an "
                       "interposer loaded other than by LD_PRELOAD would go unseen")
    nums = {"ld_preload": list(f.ld_preload), "interposers": [{"path": p, "symbols": list(s)} for p, s in f.interposers],
            "mapped_libraries_checked": f.mapped_recorded}
    return _finding("interposers", status, "; ".join(reasons) or "no LD_PRELOAD and no interposing library", **nums)


def page_cache_source(f: IntegrityFacts) -> tuple[str, float | None]:
    """The narrowest counter of bytes read from the device: ("cgroup", n), ("process", n), ("device", n) or
    ("none", None)."""
    if f.cgroup_read_bytes is not None:
        return "cgroup", f.cgroup_read_bytes
    if f.process_read_bytes is not None:
        return "process", f.process_read_bytes
    if f.device_read_bytes is not None:
        return "device", f.device_read_bytes
    return "none", None


def check_page_cache(f: IntegrityFacts) -> dict[str, Any]:
    """5. The storage tier's counted reads against the narrowest counter that saw bytes move from the device
    (cgroup, process, device); a remote tier's equivalent: its interface (check_network)."""
    if f.io_mode == "network":
        if (f.storage_backend or "remote") == "file" or f.filesystem_kind == "block device":
            return _finding("page_cache", INVALID, f"the I/O mode says a remote tier, but the storage tier is a "
                            f"{f.storage_backend or 'file'} backend on {f.filesystem or 'a block device'}: a file "
                            "tier's page-cache check cannot be skipped", io_mode=f.io_mode,
                            storage_backend=f.storage_backend, filesystem=f.filesystem,
                            filesystem_kind=f.filesystem_kind)
        return check_network(f)
    if f.filesystem_kind == "memory" or (f.filesystem or "") in ("tmpfs", "ramfs"):
        return _finding("page_cache", NA, f"the storage tier is on {f.filesystem} (RAM): no block device to count "
                        "(io_setup says why the run is invalid)")
    source, seen = page_cache_source(f)
    nums: dict[str, Any] = {"source": source, "counted_read_bytes": f.read_bytes,
                            "process_read_bytes": f.process_read_bytes, "cgroup_read_bytes": f.cgroup_read_bytes,
                            "device_read_bytes": f.device_read_bytes, "counted_write_bytes": f.write_bytes,
                            "process_write_bytes": f.process_write_bytes, "device_write_bytes": f.device_write_bytes,
                            "tolerance": 1 - DEVICE_SHARE_MIN}
    if seen is None:
        if f.source == "mlperf-tool":
            return _finding("page_cache", NA, "the MLPerf tool records no block-device or process counters (its "
                            "metadata holds one snapshot per host): its reads follow posix_fadvise(DONTNEED), which "
                            "the interposer check guards", **nums)
        if f.source == "kv-cache merge":
            return _finding("page_cache", NA, f"block device {f.block_device or '?'}: a merge holds no counters over "
                            "the run; each rank's own document checks them (per_rank)", **nums)
        where = (f"block device {f.block_device}: no counters over the run recorded (block device, process or "
                 "cgroup)" if f.block_device else "no block-device, process or cgroup counters recorded")
        return _finding("page_cache", UNVERIFIABLE, where, **nums)
    if f.read_bytes is None:
        return _finding("page_cache", UNVERIFIABLE, "the storage tier's bytes read are not recorded", **nums)
    other = None
    pr = f.process_run_read_bytes if f.process_run_read_bytes is not None else f.process_read_bytes
    pw = f.process_run_write_bytes if f.process_run_write_bytes is not None else f.process_write_bytes
    if f.device_read_bytes is not None and pr is not None:
        other = max(0.0, f.device_read_bytes - pr) + max(0.0, (f.device_write_bytes or 0) - (pw or 0))
        nums["other_io_bytes"] = other  # what the device moved for anyone else
    if not f.read_bytes:
        return _finding("page_cache", OK, "no storage reads to serve from memory", **nums)
    share = seen / f.read_bytes
    nums["source_read_share"] = share
    # every counter recorded must have seen the reads, not only the narrowest: the cgroup's and the device's
    # bytes include the process's, so a process that fetched less than counted was served from memory
    # whatever a wider counter says
    for name, n in (("cgroup", f.cgroup_read_bytes), ("process", f.process_read_bytes),
                    ("device", f.device_read_bytes)):
        if n is not None and n / f.read_bytes < share:
            source, seen, share = name, n, n / f.read_bytes
    if share < DEVICE_SHARE_MIN:
        return _finding("page_cache", INVALID, f"the {source} counters saw {share:.0%} of the {f.read_bytes / GIB:.3g} "
                        f"GiB the storage tier counted as read ({seen / GIB:.3g} GiB): the rest came from memory",
                        **nums)
    if source == "device":
        counted = f.read_bytes + (f.write_bytes or 0)
        if other is None:
            return _finding("page_cache", UNVERIFIABLE, "unverifiable on a shared device: only whole-device counters, "
                            "and the other I/O on the device is not measured (no process counters)", **nums)
        if other > (1 - DEVICE_SHARE_MIN) * counted:
            return _finding("page_cache", UNVERIFIABLE, f"unverifiable on a shared device: other I/O moved "
                            f"{other / GIB:.3g} GiB during the run", **nums)
    return _finding("page_cache", OK, f"the {source} counters saw at least the bytes counted ({seen / GIB:.3g} GiB "
                    f"against {f.read_bytes / GIB:.3g} GiB read)", **nums)


def check_network(f: IntegrityFacts) -> dict[str, Any]:
    """A remote tier has no page cache on the client: bytes the tier counted that its interface never
    received did not cross the network (a client cache, or the wrong interface watched)."""
    if f.net_received_bytes is None or not f.net_expected_bytes:
        return _finding("page_cache", NA if not f.net_expected_bytes and f.net_received_bytes is not None
                        else UNVERIFIABLE, "a remote tier (S3, Redis): no block device or page cache on the client; "
                        "its interface counters (measurement.remote_tier) are not recorded")
    share = f.net_received_bytes / f.net_expected_bytes
    nums = {"source": "interface", "interface": f.net_interface, "interface_received_bytes": f.net_received_bytes,
            "tier_bytes_expected": f.net_expected_bytes, "interface_share": share}
    if share < DEVICE_SHARE_MIN:
        return _finding("page_cache", SUSPECT, f"interface {f.net_interface} received {share:.0%} of the bytes the "
                        "remote tier counted: the rest did not cross it", **nums)
    return _finding("page_cache", OK, f"a remote tier (no block device or page cache on the client): interface "
                    f"{f.net_interface} received at least the bytes it counted", **nums)


def check_io_setup(f: IntegrityFacts) -> dict[str, Any]:
    """6. I/O mode, fsync, filesystem type, host."""
    nums = {"io_mode": f.io_mode, "fsync": f.fsync, "filesystem": f.filesystem, "host": f.host}
    status, reasons = OK, []
    if f.filesystem_kind == "memory" or (f.filesystem or "") in ("tmpfs", "ramfs"):
        status = INVALID
        reasons.append(f"INVALID because the storage tier is on {f.filesystem}, which is RAM, so no storage was "
                       "measured")
    tool_design = f.source == "mlperf-tool"
    if f.io_mode is not None and f.io_mode not in ("direct", "network") and not tool_design:
        status = _worse(status, SUSPECT)
        reasons.append(f"I/O mode {f.io_mode}: the page cache sits between the tool and the device")
    if f.fsync is False:
        status = _worse(status, SUSPECT)
        reasons.append("no fsync: writes can end in the page cache")
    flushers = [p for p, syms in f.interposers if {"fsync", "fdatasync"} & set(syms)]
    flushers += [p for p in f.ld_preload if "eatmydata" in os.path.basename(p)]
    nums["fsync_really_issued"] = None if f.fsync is None else bool(f.fsync) and not flushers
    if f.fsync and flushers:
        status = INVALID
        reasons.append(f"fsync is asked for but {', '.join(os.path.basename(p) for p in flushers)} answers it: "
                       "no flush reaches the device")
    if f.source == "kv-cache" and (f.io_mode is None or f.fsync is None or (f.filesystem is None and
                                                                          f.filesystem_kind is None)):
        status = _worse(status, UNVERIFIABLE)
        missing = [n for n, v in (("I/O mode", f.io_mode), ("fsync", f.fsync),
                                  ("filesystem", f.filesystem or f.filesystem_kind)) if v is None]
        reasons.append(f"{', '.join(missing)} not recorded: the I/O setup cannot be judged")
    reasons.extend(f.notes)
    plain = ("a remote tier over the network (no page cache on the client)" if f.io_mode == "network"
             else "direct I/O with fsync on a device filesystem")
    return _finding("io_setup", status, "; ".join(reasons) or plain, **nums)


def check_verify(f: IntegrityFacts) -> dict[str, Any]:
    """7. --verify: any read whose bytes differ from those written makes the result invalid."""
    if f.source == "mlperf-tool":
        return _finding("verify", NA, "the MLPerf tool has no --verify")
    if f.verify_enabled is None:
        return _finding("verify", UNVERIFIABLE, "no measurement.verify recorded")
    if not f.verify_enabled and f.verify_mismatches:
        return _finding("verify", INVALID, f"--verify is recorded as off, yet with {f.verify_mismatches} "
                        "mismatch(es): the record contradicts itself", enabled=False, mismatches=f.verify_mismatches)
    if not f.verify_enabled:
        return _finding("verify", NA, "--verify was off: the bytes read back were not compared", enabled=False)
    if f.verify_mismatches is None:
        return _finding("verify", UNVERIFIABLE, "--verify was on but its mismatch count is not recorded")
    if f.verify_mismatches > 0:
        return _finding("verify", INVALID, f"--verify: {f.verify_mismatches} read(s) did not return the bytes "
                        "written", enabled=True, mismatches=f.verify_mismatches)
    return _finding("verify", OK, "--verify: every byte of every block read matched the payload written",
                    enabled=True, mismatches=0)


def check_device_limit(f: IntegrityFacts) -> dict[str, Any]:
    """8. Storage bandwidth against the device's (or its link's) rated limit."""
    if not f.device_limit_gbs and not f.device_write_limit_gbs:
        return _finding("device_limit", NA, "no device limit known (give --device-limit-gbs or a host YAML)")
    limits = {"read": f.device_limit_gbs, "write": f.device_write_limit_gbs or f.device_limit_gbs}
    nums: dict[str, Any] = {"limit_gb_per_s": f.device_limit_gbs, "write_limit_gb_per_s": limits["write"],
                            "limit_source": f.device_limit_source, "tolerance": DEVICE_LIMIT_TOLERANCE}
    if not f.window_s:
        return _finding("device_limit", UNVERIFIABLE, "no measured window", **nums)
    status, reasons = OK, []
    for op, nbytes in (("read", f.read_bytes), ("write", f.write_bytes)):
        if nbytes is None:
            status = _worse(status, UNVERIFIABLE)
            reasons.append(f"storage {op} bytes not recorded")
            continue
        rate = nbytes / f.window_s / 1e9
        nums[f"{op}_gb_per_s"] = rate
        lim = limits[op]
        if lim and rate > lim * (1 + DEVICE_LIMIT_TOLERANCE):
            status = INVALID
            reasons.append(f"storage {op} {rate:.2f} GB/s ({nbytes / GIB:.4g} GiB / {f.window_s:.4g} s) is above the "
                           f"{lim:g} GB/s {op} limit of {f.device_limit_source or 'the device'} by "
                           f"{rate - lim:.2f} GB/s ({rate / lim - 1:+.1%})")
    shown = " / ".join(f"{op} {v:g}" for op, v in limits.items() if v)
    return _finding("device_limit", status, "; ".join(reasons) or
                    f"storage bandwidth within the {shown} GB/s limits of "
                    f"{f.device_limit_source or 'the device'}", **nums)


def audit_facts(f: IntegrityFacts, ceiling: float = DEFAULT_CEILING) -> dict[str, Any]:
    """The `integrity` block: every check, and the verdict: the worst status (n/a counts as ok; an
    unverifiable check makes the verdict unverifiable at least, never ok)."""
    checks = [check_bandwidth(f), check_device_time(f, ceiling), check_window(f), check_interposers(f),
              check_page_cache(f), check_io_setup(f), check_verify(f), check_device_limit(f)]
    worst = max((c["status"] for c in checks), key=_RANK.get)
    verdict = OK if worst == NA else worst
    window = next(c for c in checks if c["check"] == "window")["numbers"]
    return {"verdict": verdict, "source": f.source,
            # the worst first: the one sentence a console line quotes is the one that decided the verdict
            "reasons": [f"{c['check']}: {c['reason']}" for c in sorted(checks, key=lambda c: -_RANK[c["status"]])
                        if c["status"] in (SUSPECT, INVALID, UNVERIFIABLE)],
            "corrected_read_gib_per_s": window.get("corrected_read_gib_per_s"),
            "reported_read_gib_per_s": window.get("reported_read_gib_per_s"),
            "checks": checks}


def sessions_integrity(libraries: dict[str, Any]) -> dict[str, Any]:
    """The `integrity` block of a sessions document: the interposer check on the libraries mapped at its
    start (host/preload.py snapshot_at_start); its rungs keep no per-run device counters or device times of
    the kind the other checks read, so those are not judged (`scope` says so)."""
    f = IntegrityFacts(source="kv-cache sessions", ld_preload=tuple(libraries.get("ld_preload") or ()),
                       preload_recorded=bool(libraries),
                       interposers=tuple((i["path"], tuple(i["symbols"])) for i in libraries.get("interposers") or ()),
                       mapped_recorded=bool(libraries.get("recorded")))
    check = check_interposers(f)
    return {"verdict": check["status"] if check["status"] != NA else OK, "source": f.source,
            "reasons": [f"interposers: {check['reason']}"] if check["status"] in (SUSPECT, INVALID, UNVERIFIABLE) else [],
            "scope": "interposers only: a sessions document keeps no per-run device counters or device times",
            "checks": [check]}


def worst_verdict(verdicts: list[str]) -> str:
    """The overall verdict of several ranks: the worst of theirs."""
    return max(verdicts, key=_RANK.get) if verdicts else UNKNOWN


def merged_integrity(per_rank: dict[int, dict[str, Any] | None], own: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `integrity` block of a merge: the checks recomputed from the merged counters (`own`, audit_facts of
    the merged document) with each rank's verdict and reasons (from its own block: a rank without one is
    unverifiable) and the worst of all."""
    ranks = {str(r): ({"verdict": b.get("verdict", UNVERIFIABLE), "reasons": list(b.get("reasons") or [])}
                      if isinstance(b, dict) else {"verdict": UNVERIFIABLE, "reasons": ["no integrity block"]})
             for r, b in sorted(per_rank.items())}
    reasons = [f"rank {r}: {why}" for r, v in ranks.items() for why in v["reasons"]]
    verdicts = [v["verdict"] for v in ranks.values()]
    block: dict[str, Any] = {"source": "kv-cache merge"}
    if own is not None:
        block = {**own}
        verdicts.append(own["verdict"])
        reasons = list(own.get("reasons") or []) + reasons
    block.update(verdict=worst_verdict(verdicts) if verdicts else UNVERIFIABLE, reasons=reasons, per_rank=ranks)
    return block


# ---- adapters ---------------------------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    """A recorded figure; a non-number, NaN or infinity (no counter holds one) is not a figure."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    return float(v) if math.isfinite(v) else None


def _max_number(values: Any) -> float | None:
    """The largest finite number of a per-request list: a list as read from a file, or the float64 array of
    a document built in this process (results/summary.py `_seconds`; read without a Python float per
    value); None when it holds none."""
    if isinstance(values, np.ndarray):
        finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        return float(finite.max()) if finite.size else None
    numbers = [x for x in values if _num(x) is not None] if isinstance(values, list) else []
    return float(max(numbers)) if numbers else None


def _gib_bytes(v: Any) -> float | None:
    """Bytes of a `*_gb` figure (both tools write GiB under that name)."""
    n = _num(v)
    return n * GIB if n is not None else None


def _bandwidth_rows(cs: CacheStats) -> tuple[tuple[str, str, float | None, float | None], ...]:
    return tuple((str(t), op, _gib_bytes(cs.tier(t).op(op).bytes_gb), _num(cs.tier(t).op(op).bandwidth_gbps))
                 for t in TierName for op in ("read", "write"))


def _other_tier_read_bytes(cs: CacheStats) -> float:
    return sum(_gib_bytes(cs.tier(t).read.bytes_gb) or 0 for t in TierName if t is not TierName.STORAGE)


def _int(v: Any) -> int | None:
    n = _num(v)
    return int(n) if n is not None else None


def _series(doc: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(storage read bytes, write bytes, seconds, bucket seconds) summed over doc.time_series.rows; None when
    the document has no rows, or a row lacks its seconds."""
    ts = doc.get("time_series") if isinstance(doc.get("time_series"), dict) else {}
    rows = [r for r in ts.get("rows") or [] if isinstance(r, dict)]
    if not rows or any(_num(r.get("seconds")) is None for r in rows):
        return None
    total = [sum(_num(r.get(k)) or 0.0 for r in rows) for k in ("storage_read_bytes", "storage_write_bytes", "seconds")]
    return total[0], total[1], total[2], _num(ts.get("bucket_seconds")) or max(_num(r["seconds"]) or 0 for r in rows)


def facts_from_ours(doc: dict[str, Any], device_limit: tuple[float, str] | None = None) -> IntegrityFacts:
    """IntegrityFacts of a kv-cache results document (a run's or a merge's). `device_limit`: (GB/s, where the
    figure comes from), given to audit; else the run's own (measurement.device_limit)."""
    summary = doc.get("summary") or {}
    f, m = Figures.from_json(summary), doc.get("measurement") or {}
    cs = f.cache
    merged = "per_rank" in (doc.get("integrity") or {}) or "merged_from" in doc
    params = doc.get("run_parameters") or {}
    window = _num(m.get("window_seconds"))
    qd = m.get("achieved_queue_depth") or {}
    if merged and not qd:  # a merge: the ranks' summed device time / the common window
        busy = _num(f.storage_io_s)
    else:
        busy = sum(v for v in qd.values() if isinstance(v, (int, float))) * window if qd and window else None
    e2e_max = _max_number(doc.get("end_to_end_latencies"))
    bd = m.get("block_device") or {}
    net = (m.get("remote_tier") or {}).get("network") or {}
    tool_r, tool_w = _num(net.get("tool_bytes_read")) or 0, _num(net.get("tool_bytes_written")) or 0
    libs = m.get("process_libraries") or {}
    e2e_p95 = _num(f.e2e.p95)
    pio = m.get("process_io") or {}
    cg = pio.get("cgroup") if isinstance(pio.get("cgroup"), dict) and pio["cgroup"].get("own") else {}
    verify = m.get("verify") if isinstance(m.get("verify"), dict) else None
    limit = device_limit or ((_num((m.get("device_limit") or {}).get("gb_per_s")),
                              (m.get("device_limit") or {}).get("source")) if m.get("device_limit") else None)
    workers = _int(m.get("io_workers"))
    chosen = _int((m.get("io_workers_choice") or {}).get("count")) if isinstance(m.get("io_workers_choice"), dict) \
        else None
    workers_differ = workers is not None and chosen is not None and chosen != workers
    if merged:
        # a merge's queue depth and edge operations are the ranks' sums, and its io_workers is the ranks' common
        # value (merge FACTS): the bound is the ranks' workers summed, one rank's count only when no row says
        rows = m.get("per_rank") or {}
        per = [r.get("io_workers") for r in (rows.values() if isinstance(rows, dict) else rows) if isinstance(r, dict)]
        workers = sum(per) if per and all(isinstance(x, int) for x in per) else workers
    closed = not params.get("request_rate") and not params.get("trace_paths")
    read, write = cs.storage.read, cs.storage.write
    return IntegrityFacts(
        workers_recorded_twice=(workers, chosen) if workers_differ else None,
        source="kv-cache merge" if merged else "kv-cache", window_s=window,
        window_alt_s=_num(f.elapsed_time), workers=workers, workers_meaning="I/O workers",
        read_bytes=_gib_bytes(read.bytes_gb), write_bytes=_gib_bytes(write.bytes_gb),
        read_ops=_int(read.ops), write_ops=_int(write.ops),
        read_device_p95_ms=_num(read.ms("p95", "device")), write_device_p95_ms=_num(write.ms("p95", "device")),
        read_device_p50_ms=_num(read.ms("p50", "device")), write_device_p50_ms=_num(write.ms("p50", "device")),
        reported_read_gibs=_num(read.bandwidth_gbps), reported_write_gibs=_num(write.bandwidth_gbps),
        bandwidth_rows=_bandwidth_rows(cs), other_tier_read_bytes=_other_tier_read_bytes(cs),
        window_edge=m.get("window_edge") if isinstance(m.get("window_edge"), dict) else None,
        series=_series(doc),
        max_entry_bytes=(_num((m.get("entry_size_mib") or {}).get("max")) or 0) * 2 ** 20 or None
        if isinstance(m.get("entry_size_mib"), dict) else None,
        summed_storage_s=busy,
        e2e_p95_s=e2e_p95 / 1000 if e2e_p95 is not None else None, e2e_max_s=e2e_max,
        in_flight_at_stop=_int(m.get("requests_in_flight_at_stop")),
        users=_int(params.get("num_users")) if closed else None,
        ld_preload=tuple(libs.get("ld_preload") or ()), preload_recorded=bool(libs),
        interposers=tuple((i["path"], tuple(i["symbols"])) for i in libs.get("interposers") or ()),
        mapped_recorded=bool(libs.get("recorded")),
        device_read_bytes=_num(bd.get("bytes_read")), device_write_bytes=_num(bd.get("bytes_written")),
        process_read_bytes=_num(pio.get("read_bytes")), process_write_bytes=_num(pio.get("write_bytes")),
        process_run_read_bytes=_num(pio.get("run_read_bytes")), process_run_write_bytes=_num(pio.get("run_write_bytes")),
        cgroup_read_bytes=_num(cg.get("read_bytes")), cgroup_write_bytes=_num(cg.get("write_bytes")),
        cgroup_source=cg.get("source"),
        io_mode=m.get("io_mode"), fsync=m.get("fsync"), filesystem=m.get("filesystem"),
        filesystem_kind=m.get("filesystem_kind"), host=params.get("host"),
        net_interface=net.get("interface"), net_received_bytes=_num(net.get("bytes_received")),
        # loopback receives both directions of the tier's traffic; another interface receives its reads
        net_expected_bytes=tool_r + tool_w if net.get("interface") == "lo" else tool_r,
        block_device=bd.get("name") if isinstance(bd.get("name"), str) else None,
        storage_backend=(m.get("tier_backends") or {}).get("storage") if isinstance(m.get("tier_backends"), dict)
        else None,
        verify_enabled=verify.get("enabled") if verify is not None else None,
        verify_mismatches=_int(verify.get("mismatches")) if verify is not None else None,
        device_limit_gbs=limit[0] if limit else None, device_limit_source=limit[1] if limit else None)


def facts_from_mlperf_tool(raw: dict[str, Any], params: dict[str, Any] | None = None,
                           device_limit: tuple[float, str] | None = None) -> IntegrityFacts:
    """IntegrityFacts of one rank file of the MLPerf tool (kv-cache.py), read through the one reader of its
    keys (results/mlperf_tool.py `rank_view`), with `params` from its run's metadata (`mlperf_run_params`:
    num_users, ld_preload, host) when known."""
    params = params or {}
    v = rank_view(raw)
    s = raw.get("summary") if isinstance(raw.get("summary"), dict) else {}
    f = Figures.from_json(s)
    cs = f.cache
    e2e = v.latencies_s("end_to_end_latencies")
    # its QoS classes' `max` latencies are end-to-end too (ms): the longest request when the array is cut
    qos = s.get("qos_metrics") if isinstance(s.get("qos_metrics"), dict) else {}
    e2e += [m / 1000 for q in qos.values() if isinstance(q, dict)
            for m in [(q.get("latency_ms") if isinstance(q.get("latency_ms"), dict) else {}).get("max")]
            if isinstance(m, (int, float)) and not isinstance(m, bool)]
    return IntegrityFacts(
        source="mlperf-tool", window_s=v.elapsed_s, workers=params.get("num_users"),
        workers_meaning="users (one request in flight each)",
        read_bytes=_gib_bytes(v.read_gib), write_bytes=_gib_bytes(v.write_gib),
        # its read_iops / write_iops are counts of every tier's operations (decode_reads, prefill_writes)
        read_ops=v.read_ops, write_ops=v.write_ops, ops_scope="all tiers",
        other_tier_read_bytes=_other_tier_read_bytes(cs), bandwidth_rows=_bandwidth_rows(cs),
        read_device_p95_ms=v.read_device_p95_ms,
        write_device_p95_ms=v.write_device_p95_ms, write_device_is_fsync_only=True,
        read_device_p50_ms=_num(cs.storage.read.ms("p50", "device")),
        write_device_p50_ms=_num(cs.storage.write.ms("p50", "device")),
        reported_read_gibs=v.read_gibps, reported_write_gibs=v.write_gibps,
        summed_storage_s=v.storage_io_s if v.storage_io_s is not None else _num(f.storage_io_s),
        e2e_p95_s=v.e2e_p95_ms / 1000 if v.e2e_p95_ms is not None else None, e2e_max_s=max(e2e) if e2e else None,
        ld_preload=tuple(params.get("ld_preload") or ()), preload_recorded="ld_preload" in params,
        io_mode="buffered", fsync=True, host=params.get("host"),
        device_limit_gbs=device_limit[0] if device_limit else None,
        device_limit_source=device_limit[1] if device_limit else None,
        notes=("the MLPerf tool writes buffered, fsyncs each entry and calls posix_fadvise(DONTNEED) before "
               "reads (its code's design, not recorded per run): the page cache is kept out unless a shim defeats "
               "them (the interposer check)",))


_PRELOAD_RE = re.compile(r"LD_PRELOAD=(\"[^\"]*\"|'[^']*'|\S+)")
# `-x LD_PRELOAD` (mpirun exports the launcher's value, which the metadata does not hold) and wrappers
_EXPORTED_RE = re.compile(r"(?:^|\s)-x\s+LD_PRELOAD(?:\s|$)")
# MPICH / Intel MPI / Open MPI's spaced forms: -genv LD_PRELOAD /x.so, -env LD_PRELOAD /x.so
_SPACED_RE = re.compile(r"(?:^|\s)--?g?env\s+LD_PRELOAD\s+(\"[^\"]*\"|'[^']*'|\S+)")
_WRAPPERS = {"eatmydata": "eatmydata (a wrapper that preloads libeatmydata)",
             "nocache": "nocache (a wrapper that preloads its cache-dropping shim)"}
_OPT_TRIAL_RE = re.compile(r"option_(\d+)/trial_(\d+)")


def _strings(node: Any):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            if str(k).upper() == "LD_PRELOAD" and isinstance(v, str):  # an environment mapping
                yield f"LD_PRELOAD={v.replace(' ', ':')}"
            else:
                yield from _strings(v)
    elif isinstance(node, list):
        if node and all(isinstance(v, str) for v in node):  # an argv: `-x`, `LD_PRELOAD` as two elements
            yield " ".join(node)
        for v in node:
            yield from _strings(v)


def preloads_in(text: str) -> list[str]:
    """Every recorded form of an interposer in one command or value: LD_PRELOAD=..., `-x LD_PRELOAD` with no
    value (named as such), and wrapper commands (eatmydata, nocache)."""
    found: list[str] = []
    for m in (*_PRELOAD_RE.finditer(text), *_SPACED_RE.finditer(text)):
        found.extend(p for p in re.split(r"[:\s]+", m.group(1).strip("'\"")) if p)
    if _EXPORTED_RE.search(text):
        found.append("(-x LD_PRELOAD: mpirun exported the launcher's LD_PRELOAD, whose value is not recorded)")
    words = text.replace(";", " ").replace("&&", " ").split()
    for w in words:
        name = os.path.basename(w.strip("'\"()"))
        if name in _WRAPPERS:
            found.append(f"({_WRAPPERS[name]}: libeatmydata.so)" if name == "eatmydata" else f"({_WRAPPERS[name]})")
    return found


def mlperf_run_params(metadata: dict[str, Any], option: int | None = None, trial: int | None = None) -> dict[str, Any]:
    """From the harness's `*_metadata.json`: LD_PRELOAD entries (args.mpi_params, environment mappings and the
    mpirun commands, `-x LD_PRELOAD` and wrappers included) and `--num-users` of the command that wrote
    option_<option>/trial_<trial> (the first command when not given)."""
    preload: list[str] = []

    def add(text: str) -> None:
        preload.extend(p for p in preloads_in(text) if p not in preload)

    # every string of the metadata, wherever it is kept (args, env, a nested environment, an argv list), but
    # the commands that wrote another option or trial
    for text in _strings(metadata):
        where = _OPT_TRIAL_RE.search(text) if "--num-users" in text else None
        if option is not None and where and (int(where.group(1)), int(where.group(2))) != (option, trial):
            continue
        add(text)
    users = None
    for text in _strings(metadata):
        if "--num-users" not in text:
            continue
        where = _OPT_TRIAL_RE.search(text)
        if option is not None and where and (int(where.group(1)), int(where.group(2))) != (option, trial):
            continue
        add(text)
        words = shlex.split(text) if text.count('"') % 2 == 0 else text.split()
        if "--num-users" in words[:-1]:
            users = int(words[words.index("--num-users") + 1])
            break
    return {"ld_preload": preload, **({"num_users": users} if users else {})}


def as_dict(f: IntegrityFacts) -> dict[str, Any]:
    """The facts as JSON (audit --json)."""
    return dataclasses.asdict(f)
