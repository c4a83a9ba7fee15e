"""The integrity verdict of a result: can its storage figures be what the storage did? (`kv-cache audit`)

Pure functions over `IntegrityFacts`, a small record read from either tool's document by one adapter each:
`facts_from_ours(doc)` and `facts_from_mlperf_tool(raw, params)` (the only place that reads the MLPerf
tool's raw keys). Five checks, each `ok`, `suspect`, `invalid` or `unknown` with its reason and numbers:

1. device_time: a "device" P95 too short for the bytes of one operation. Implied rate = mean bytes per
   operation / P95 device time; above `ceiling_bytes_per_s` (default 128 GB/s: twice a PCIe Gen5 x16 link's
   ~64 GB/s, more than any single client's path to storage) it is physically impossible -> invalid. The
   MLPerf tool's write "device" time is the fsync alone, not the write.
2. window: I/O counted outside the measured window. Average in flight = summed storage time / window,
   against the workers that can have a request in flight (more is impossible inside the window). The span
   the counted bytes really took is at least max(window, longest request's end-to-end latency, summed
   storage time / workers), every request arriving once the window opened. Corrected bandwidth = bytes /
   that span = bytes x window / (window + excess), an upper bound on the true average; a span over 5 %
   beyond the window -> invalid, any excess -> suspect.
3. interposers: LD_PRELOAD in the recorded parameters or environment; for our runs the mapped shared objects
   that define fsync, fdatasync, posix_fadvise or open (host/preload.py). A known no-op shim -> invalid.
4. page_cache: bytes the block device moved against the bytes the tool counted (ours: /proc/diskstats);
   under 90 % of the reads on the device -> reads served from memory. A remote tier (S3, Redis): the bytes
   its interface received (/proc/net/dev) against the tier's, under 90 % -> suspect.
5. io_setup: I/O mode, fsync issued, filesystem type and host; a RAM filesystem -> invalid, buffered or
   no fsync -> suspect (a remote tier's "network" mode has no page cache on the client: not suspect).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from kv_cache.results.mlperf_tool import rank_view

OK, SUSPECT, INVALID, UNKNOWN = "ok", "suspect", "invalid", "unknown"
_RANK = {OK: 0, UNKNOWN: 0, SUSPECT: 1, INVALID: 2}
GIB = 1024 ** 3
PCIE_GEN5_X16_BYTES_PER_S = 64e9
DEFAULT_CEILING = 2 * PCIE_GEN5_X16_BYTES_PER_S
WINDOW_TOLERANCE = 0.05  # span beyond the window that is still "suspect", not "invalid"
DEVICE_SHARE_MIN = 0.9  # block-device reads / counted reads under this: served from memory
# No-op shims and what they defeat; allocators are interposed too, but touch no I/O call.
KNOWN_SHIMS = {"libeatmydata": "turns fsync/fdatasync/sync into no-ops (writes end in the page cache)",
               "libnofadvise": "turns posix_fadvise(DONTNEED) into a no-op (reads can hit the page cache)",
               "nocache": "rewrites open/close to drop or keep cache pages"}
BENIGN_PRELOADS = ("libtcmalloc", "libjemalloc", "libmimalloc", "libhoard")


@dataclass(frozen=True)
class IntegrityFacts:
    """What the checks need, read from one rank's (or one run's) document by an adapter. None: not recorded."""

    source: str  # "kv-cache" or "mlperf-tool"
    window_s: float | None = None
    workers: int | None = None
    workers_meaning: str = ""
    read_bytes: float | None = None
    write_bytes: float | None = None
    read_ops: int | None = None
    write_ops: int | None = None
    read_device_p95_ms: float | None = None
    write_device_p95_ms: float | None = None
    write_device_is_fsync_only: bool = False
    reported_read_gibs: float | None = None
    reported_write_gibs: float | None = None
    bytes_window_bounded: bool = False  # the tool counts only bytes moved inside the window
    summed_storage_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_max_s: float | None = None
    in_flight_at_stop: int | None = None
    ld_preload: tuple[str, ...] = ()
    preload_recorded: bool = False
    interposers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    mapped_recorded: bool = False
    device_read_bytes: float | None = None
    device_write_bytes: float | None = None
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
    notes: tuple[str, ...] = field(default_factory=tuple)


def _finding(check: str, status: str, reason: str, **numbers: Any) -> dict[str, Any]:
    return {"check": check, "status": status, "reason": reason,
            "numbers": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in numbers.items()}}


def check_device_time(f: IntegrityFacts, ceiling: float = DEFAULT_CEILING) -> dict[str, Any]:
    """1. A device P95 that would need more than `ceiling` bytes/s for one operation of the mean size."""
    worst, nums, seen = OK, {"ceiling_gb_per_s": ceiling / 1e9}, False
    reasons = []
    for op, nbytes, ops, p95 in (("read", f.read_bytes, f.read_ops, f.read_device_p95_ms),
                                 ("write", f.write_bytes, f.write_ops, f.write_device_p95_ms)):
        if not nbytes or not ops or p95 is None:
            continue
        seen = True
        mean = nbytes / ops
        rate = mean / (p95 / 1000.0) if p95 > 0 else float("inf")
        nums.update({f"{op}_mean_bytes_per_op": round(mean), f"{op}_device_p95_ms": p95,
                     f"{op}_implied_gb_per_s": rate / 1e9 if rate != float("inf") else "inf"})
        if rate > ceiling:
            worst = INVALID
            what = " (its 'device' time is the fsync alone)" if op == "write" and f.write_device_is_fsync_only else ""
            reasons.append(f"{op} device P95 {p95:.3g} ms for {mean / 1e6:.0f} MB per operation = "
                           f"{rate / 1e9:.0f} GB/s, above the {ceiling / 1e9:.0f} GB/s ceiling{what}")
    if not seen:
        return _finding("device_time", UNKNOWN, "no device percentiles with bytes and operation counts", **nums)
    return _finding("device_time", worst, "; ".join(reasons) or "device times are possible for their bytes", **nums)


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


def check_window(f: IntegrityFacts) -> dict[str, Any]:
    """2. I/O counted outside the window: average in flight against the workers, the span, corrected bandwidth."""
    if not f.window_s:
        return _finding("window", UNKNOWN, "no measured window recorded")
    nums: dict[str, Any] = {"window_s": f.window_s, "workers": f.workers, "in_flight_at_stop": f.in_flight_at_stop}
    avg = f.summed_storage_s / f.window_s if f.summed_storage_s is not None else None
    nums.update(average_in_flight=avg, end_to_end_p95_s=f.e2e_p95_s, end_to_end_max_s=f.e2e_max_s)
    span = corrected_span(f) if not f.bytes_window_bounded else f.window_s
    nums["span_s"] = span
    for op, nbytes, rep in (("read", f.read_bytes, f.reported_read_gibs), ("write", f.write_bytes, f.reported_write_gibs)):
        if nbytes is not None and span:
            nums[f"reported_{op}_gib_per_s"] = rep if rep is not None else nbytes / GIB / f.window_s
            nums[f"corrected_{op}_gib_per_s"] = nbytes / GIB / span
    reasons, status = [], OK
    if avg is not None and f.workers and avg > f.workers * (1 + 1e-3) and not f.bytes_window_bounded:
        status = INVALID
        reasons.append(f"summed storage time / window = {avg:.1f} requests in flight on average, more than the "
                       f"{f.workers} {f.workers_meaning or 'workers'}: time from outside the window is counted")
    if f.bytes_window_bounded:
        reasons.append("bytes are counted inside the window only"
                       + (f"; {f.in_flight_at_stop} request(s) in flight at the stop are left out"
                          if f.in_flight_at_stop else ""))
    elif span and span > f.window_s:
        excess = span / f.window_s - 1
        status = INVALID if excess > WINDOW_TOLERANCE else max(status, SUSPECT, key=_RANK.get)
        corrected = nums.get("corrected_read_gib_per_s")
        reasons.append(f"the counted bytes took at least {span:.1f} s, not the {f.window_s:.1f} s window they are "
                       f"divided by (+{excess:.0%}); " + (
                           f"corrected read bandwidth at most {corrected:.2f} GiB/s against "
                           f"{nums['reported_read_gib_per_s']:.2f} reported" if corrected is not None else
                           "the bytes read are not recorded, so no corrected bandwidth"))
    if f.e2e_p95_s is not None and f.e2e_p95_s > f.window_s and not f.bytes_window_bounded:
        status = max(status, SUSPECT, key=_RANK.get)
        reasons.append(f"end-to-end P95 {f.e2e_p95_s:.1f} s is longer than the {f.window_s:.1f} s window")
    return _finding("window", status, "; ".join(reasons) or "I/O within the window", **nums)


def _preload_status(path: str) -> tuple[str, str]:
    name = os.path.basename(path)
    for shim, what in KNOWN_SHIMS.items():
        if name.startswith(shim):
            return INVALID, f"{name} {what}"
    if name.startswith(BENIGN_PRELOADS):
        return OK, f"{name} (a memory allocator; no I/O call)"
    return SUSPECT, f"{name} (unknown preloaded library)"


def check_interposers(f: IntegrityFacts) -> dict[str, Any]:
    """3. LD_PRELOAD and, for our runs, mapped libraries that define fsync/fdatasync/posix_fadvise/open."""
    status, reasons = OK, []
    for path in f.ld_preload:
        s, why = _preload_status(path)
        status = max(status, s, key=_RANK.get)
        reasons.append(f"LD_PRELOAD {why}")
    for path, symbols in f.interposers:
        status = INVALID
        reasons.append(f"{path} interposes {', '.join(symbols)}")
    if not f.preload_recorded and not f.mapped_recorded:
        why = ("the rank file records no parameters: give the run directory, with its *_metadata.json"
               if f.source == "mlperf-tool" else
               "no measurement.process_libraries (a result written before they were recorded, or a merge)")
        return _finding("interposers", UNKNOWN, why)
    nums = {"ld_preload": list(f.ld_preload), "interposers": [{"path": p, "symbols": list(s)} for p, s in f.interposers],
            "mapped_libraries_checked": f.mapped_recorded}
    return _finding("interposers", status, "; ".join(reasons) or "no LD_PRELOAD and no interposing library", **nums)


def check_page_cache(f: IntegrityFacts) -> dict[str, Any]:
    """4. Device bytes against the tool's bytes: reads the device never saw came from memory. A remote
    tier's equivalent: the bytes its interface received against the tier's (check_network)."""
    if f.io_mode == "network":
        return check_network(f)
    if f.device_read_bytes is None:
        if f.source == "mlperf-tool":
            why = ("the MLPerf tool records no block-device counters over the run (its metadata holds one snapshot "
                   "per host, not deltas): page-cache service cannot be ruled out")
        elif f.block_device:  # a merge keeps the device's name; its ranks' documents hold the counters
            why = (f"block device {f.block_device}: this document holds no counters over the run (a merge: each "
                   "rank's own document checks them, its verdict below)")
        else:
            why = "no block device under the storage tier (network or RAM filesystem)"
        return _finding("page_cache", UNKNOWN, why)
    nums = {"device_read_bytes": f.device_read_bytes, "tool_read_bytes": f.read_bytes,
            "device_write_bytes": f.device_write_bytes, "tool_write_bytes": f.write_bytes}
    if f.read_bytes:
        share = f.device_read_bytes / f.read_bytes
        nums["device_read_share"] = share
        if share < DEVICE_SHARE_MIN:
            return _finding("page_cache", INVALID if f.io_mode == "direct" else SUSPECT,
                            f"the block device read {share:.0%} of the bytes the tool counted: the rest came from "
                            "memory", **nums)
    return _finding("page_cache", OK, "the block device moved at least the bytes counted", **nums)


def check_network(f: IntegrityFacts) -> dict[str, Any]:
    """A remote tier has no page cache on the client: bytes the tier counted that its interface never
    received did not cross the network (a client cache, or the wrong interface watched)."""
    if f.net_received_bytes is None or not f.net_expected_bytes:
        return _finding("page_cache", UNKNOWN, "a remote tier without interface counters (measurement.remote_tier)")
    share = f.net_received_bytes / f.net_expected_bytes
    nums = {"interface": f.net_interface, "interface_received_bytes": f.net_received_bytes,
            "tier_bytes_expected": f.net_expected_bytes, "interface_share": share}
    if share < DEVICE_SHARE_MIN:
        return _finding("page_cache", SUSPECT, f"interface {f.net_interface} received {share:.0%} of the bytes the "
                        "remote tier counted: the rest did not cross it", **nums)
    return _finding("page_cache", OK, f"interface {f.net_interface} received at least the bytes the remote tier "
                    "counted", **nums)


def check_io_setup(f: IntegrityFacts) -> dict[str, Any]:
    """5. I/O mode, fsync, filesystem type, host."""
    nums = {"io_mode": f.io_mode, "fsync": f.fsync, "filesystem": f.filesystem, "host": f.host}
    status, reasons = OK, []
    if f.filesystem_kind == "memory" or (f.filesystem or "") in ("tmpfs", "ramfs"):
        status = INVALID
        reasons.append(f"the storage tier is on {f.filesystem}, which is RAM")
    if f.io_mode is not None and f.io_mode not in ("direct", "network"):  # (a remote tier: no client page cache)
        status = max(status, SUSPECT, key=_RANK.get)
        reasons.append(f"I/O mode {f.io_mode}: the page cache sits between the tool and the device")
    if f.fsync is False:
        status = max(status, SUSPECT, key=_RANK.get)
        reasons.append("no fsync: writes can end in the page cache")
    flushers = [p for p, syms in f.interposers if {"fsync", "fdatasync"} & set(syms)]
    flushers += [p for p in f.ld_preload if os.path.basename(p).startswith("libeatmydata")]
    nums["fsync_really_issued"] = None if f.fsync is None else bool(f.fsync) and not flushers
    if f.fsync and flushers:
        status = INVALID
        reasons.append(f"fsync is asked for but {', '.join(os.path.basename(p) for p in flushers)} answers it: "
                       "no flush reaches the device")
    reasons.extend(f.notes)
    plain = ("a remote tier over the network (no page cache on the client)" if f.io_mode == "network"
             else "direct I/O with fsync on a device filesystem")
    return _finding("io_setup", status, "; ".join(reasons) or plain, **nums)


def audit_facts(f: IntegrityFacts, ceiling: float = DEFAULT_CEILING) -> dict[str, Any]:
    """The `integrity` block: every check, and the verdict (the worst status; unknown counts as ok)."""
    checks = [check_device_time(f, ceiling), check_window(f), check_interposers(f), check_page_cache(f),
              check_io_setup(f)]
    worst = max((c["status"] for c in checks), key=_RANK.get)
    verdict = worst if worst != UNKNOWN else OK
    window = checks[1]["numbers"]
    return {"verdict": verdict, "source": f.source,
            "reasons": [f"{c['check']}: {c['reason']}" for c in checks if c["status"] in (SUSPECT, INVALID)],
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
    return {"verdict": check["status"] if check["status"] != UNKNOWN else OK, "source": f.source,
            "reasons": [f"interposers: {check['reason']}"] if check["status"] in (SUSPECT, INVALID) else [],
            "scope": "interposers only: a sessions document keeps no per-run device counters or device times",
            "checks": [check]}


def worst_verdict(verdicts: list[str]) -> str:
    """The overall verdict of several ranks: the worst of theirs."""
    return max(verdicts, key=_RANK.get) if verdicts else UNKNOWN


def merged_integrity(per_rank: dict[int, dict[str, Any] | None]) -> dict[str, Any]:
    """The `integrity` block of a merge: each rank's verdict and reasons (from its own block; `unknown` for a
    rank written before they were recorded) and the worst of them."""
    ranks = {str(r): ({"verdict": b.get("verdict", UNKNOWN), "reasons": list(b.get("reasons") or [])}
                      if isinstance(b, dict) else {"verdict": UNKNOWN, "reasons": ["no integrity block"]})
             for r, b in sorted(per_rank.items())}
    known = [v["verdict"] for v in ranks.values() if v["verdict"] != UNKNOWN]
    reasons = [f"rank {r}: {why}" for r, v in ranks.items() for why in v["reasons"] if v["verdict"] != UNKNOWN]
    return {"verdict": worst_verdict(known) if known else UNKNOWN, "source": "kv-cache merge", "reasons": reasons,
            "per_rank": ranks}


# ---- adapters ---------------------------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _gib_bytes(v: Any) -> float | None:
    """Bytes of a `*_gb` figure (both tools write GiB under that name)."""
    n = _num(v)
    return n * GIB if n is not None else None


def facts_from_ours(doc: dict[str, Any]) -> IntegrityFacts:
    """IntegrityFacts of a kv-cache results document (a run's or a merge's)."""
    summary = doc.get("summary") or {}
    cs, m = summary.get("cache_stats") or {}, doc.get("measurement") or {}
    params, window = doc.get("run_parameters") or {}, _num(m.get("window_seconds")) or _num(summary.get("elapsed_time"))
    qd = m.get("achieved_queue_depth") or {}
    busy = sum(v for v in qd.values() if isinstance(v, (int, float))) * window if qd and window else None
    e2e = [x for x in doc.get("end_to_end_latencies") or [] if isinstance(x, (int, float))]
    bd = m.get("block_device") or {}
    net = (m.get("remote_tier") or {}).get("network") or {}
    tool_r, tool_w = _num(net.get("tool_bytes_read")) or 0, _num(net.get("tool_bytes_written")) or 0
    libs = m.get("process_libraries") or {}
    e2e_p95 = _num((summary.get("end_to_end_latency_ms") or {}).get("p95"))
    return IntegrityFacts(
        source="kv-cache", window_s=window, workers=m.get("io_workers"), workers_meaning="I/O workers",
        read_bytes=_gib_bytes(cs.get("tier_storage_kv_bytes_read_gb")),
        write_bytes=_gib_bytes(cs.get("tier_storage_kv_bytes_written_gb")),
        read_ops=cs.get("read_iops"), write_ops=cs.get("write_iops"),
        read_device_p95_ms=_num(cs.get("storage_read_device_p95_ms")),
        write_device_p95_ms=_num(cs.get("storage_write_device_p95_ms")),
        reported_read_gibs=_num(cs.get("tier_storage_read_bandwidth_gbps")),
        reported_write_gibs=_num(cs.get("tier_storage_write_bandwidth_gbps")),
        bytes_window_bounded=True, summed_storage_s=busy,
        e2e_p95_s=e2e_p95 / 1000 if e2e_p95 is not None else None, e2e_max_s=max(e2e) if e2e else None,
        in_flight_at_stop=m.get("requests_in_flight_at_stop"),
        ld_preload=tuple(libs.get("ld_preload") or ()), preload_recorded=bool(libs),
        interposers=tuple((i["path"], tuple(i["symbols"])) for i in libs.get("interposers") or ()),
        mapped_recorded=bool(libs.get("recorded")),
        device_read_bytes=_num(bd.get("bytes_read")), device_write_bytes=_num(bd.get("bytes_written")),
        io_mode=m.get("io_mode"), fsync=m.get("fsync"), filesystem=m.get("filesystem"),
        filesystem_kind=m.get("filesystem_kind"), host=params.get("host"),
        net_interface=net.get("interface"), net_received_bytes=_num(net.get("bytes_received")),
        # loopback receives both directions of the tier's traffic; another interface receives its reads
        net_expected_bytes=tool_r + tool_w if net.get("interface") == "lo" else tool_r,
        block_device=bd.get("name") if isinstance(bd.get("name"), str) else None)


def facts_from_mlperf_tool(raw: dict[str, Any], params: dict[str, Any] | None = None) -> IntegrityFacts:
    """IntegrityFacts of one rank file of the MLPerf tool (kv-cache.py), read through the one reader of its
    keys (results/mlperf_tool.py `rank_view`), with `params` from its run's metadata (`mlperf_run_params`:
    num_users, ld_preload, host) when known."""
    params = params or {}
    v = rank_view(raw)
    s = raw.get("summary") if isinstance(raw.get("summary"), dict) else {}
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
        read_ops=v.read_ops, write_ops=v.write_ops,  # its *_iops are counts of operations
        read_device_p95_ms=v.read_device_p95_ms,
        write_device_p95_ms=v.write_device_p95_ms, write_device_is_fsync_only=True,
        reported_read_gibs=v.read_gibps, reported_write_gibs=v.write_gibps,
        summed_storage_s=v.storage_io_s if v.storage_io_s is not None else _num(s.get("total_storage_io_time")),
        e2e_p95_s=v.e2e_p95_ms / 1000 if v.e2e_p95_ms is not None else None, e2e_max_s=max(e2e) if e2e else None,
        ld_preload=tuple(params.get("ld_preload") or ()), preload_recorded="ld_preload" in params,
        io_mode="buffered", fsync=True, host=params.get("host"),
        notes=("the MLPerf tool writes buffered, fsyncs each entry and calls posix_fadvise(DONTNEED) before "
               "reads; its I/O mode and fsync are its code's, not recorded per run",))


_PRELOAD_RE = re.compile(r"LD_PRELOAD=(\S+)")
_OPT_TRIAL_RE = re.compile(r"option_(\d+)/trial_(\d+)")


def _strings(node: Any):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def mlperf_run_params(metadata: dict[str, Any], option: int | None = None, trial: int | None = None) -> dict[str, Any]:
    """From the harness's `*_metadata.json`: LD_PRELOAD entries (args.mpi_params and the mpirun commands) and
    `--num-users` of the command that wrote option_<option>/trial_<trial> (the first command when not given)."""
    preload: list[str] = []
    for text in _strings(metadata.get("args") or {}):
        for m in _PRELOAD_RE.finditer(text):
            preload.extend(p for p in m.group(1).split(":") if p and p not in preload)
    users = None
    for text in _strings(metadata):
        if "--num-users" not in text:
            continue
        where = _OPT_TRIAL_RE.search(text)
        if option is not None and where and (int(where.group(1)), int(where.group(2))) != (option, trial):
            continue
        for m in _PRELOAD_RE.finditer(text):
            preload.extend(p for p in m.group(1).split(":") if p and p not in preload)
        words = shlex.split(text) if text.count('"') % 2 == 0 else text.split()
        if "--num-users" in words[:-1]:
            users = int(words[words.index("--num-users") + 1])
            break
    return {"ld_preload": preload, **({"num_users": users} if users else {})}


def as_dict(f: IntegrityFacts) -> dict[str, Any]:
    """The facts as JSON (audit --json)."""
    return dataclasses.asdict(f)
