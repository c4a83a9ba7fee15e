"""The `measurement` block of the results document: what was timed, how, and what it cost the host."""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Sequence
from typing import Any

import numpy as np

from kv_cache.host.blockdev import BlockDeviceCounter, mount_info
from kv_cache.metrics.recorder import GIB, RunMetrics
from kv_cache.metrics.stats import percentile
from kv_cache.storage import backends, timedio
from kv_cache.storage.shaped import Shaping
from kv_cache.storage.tiername import TierName

TIMED = ("device = open + pwritev/preadv + fdatasync + posix_fadvise + close syscalls of each entry, "
         f"timer: {timedio.TIMER_DESCRIPTION}; host = the rest of the operation (block stamping, bookkeeping); total = both "
         "(time.perf_counter_ns). RAM tier: device = the memcpy. GPU tier: see gpu_tier.timed (simulated: "
         "device = modelled copy time; real: CUDA events).")
REMOTE = "remote"
TIMED_REMOTE = ("device = time inside the remote client's calls (waiting for the network and the server, and the "
                "client's own work there); host = the rest (block stamping, the copies into the read buffer, "
                "--verify, bookkeeping); total = both (time.perf_counter_ns). RAM tier: device = the memcpy.")
DISK_NOTE = ("deltas of /proc/diskstats over the whole run phase (includes other processes' I/O and "
             "filesystem metadata); tool bytes include work finished after the window")


def block_device(metrics: RunMetrics, name: str | None, before: tuple[int, int] | None,
                 after: tuple[int, int] | None) -> dict[str, Any]:
    """What the block device under the storage tier saw, next to what this tool says it moved there.

    The tool's bytes include I/O finished or aborted after the window, since the device counters cannot
    tell those apart either."""
    if name is None or before is None or after is None:
        return {"name": None}
    late = metrics.late
    st_read, st_write = metrics.tier_op(TierName.STORAGE, "read"), metrics.tier_op(TierName.STORAGE, "write")
    return {
        "name": name,
        "bytes_read": after[0] - before[0],
        "bytes_written": after[1] - before[1],
        "tool_bytes_read": st_read.device_bytes + late.get("storage_read_device_bytes", 0)
        + late.get("storage_read_aborted_device_bytes", 0),
        "tool_bytes_written": st_write.device_bytes + late.get("storage_write_device_bytes", 0)
        + late.get("storage_write_aborted_device_bytes", 0),
        "note": DISK_NOTE,
    }


NET_NOTE = ("deltas of /proc/net/dev (and of this process's CPU time) over the span of the tier's bytes (a "
            "standard run: from the window's opening to the end of its drain; a sessions rung: from its start): "
            "every process's traffic on that interface, and the protocol's own bytes (HTTP or RESP headers, TCP/IP)")
OTHER_TRAFFIC = 1.10  # interface bytes above the tier's by more than this: more than the protocol's overhead


def network(metrics: RunMetrics, interface: str | None, before: tuple[int, int] | None,
            after: tuple[int, int] | None, rusage0: Any) -> dict[str, Any]:
    """What the interface carrying a remote tier's traffic saw, next to the tier's bytes; and the time
    split that tells a slow client from a slow store: process CPU against time spent waiting in the
    client's calls. On loopback each byte is counted once received and once sent."""
    st_read, st_write = metrics.tier_op("storage", "read"), metrics.tier_op("storage", "write")
    late = metrics.late
    # as block_device(): operations finished or aborted after the window moved their bytes over the wire too
    tool_r = (st_read.device_bytes + late.get("storage_read_device_bytes", 0)
              + late.get("storage_read_aborted_device_bytes", 0))
    tool_w = (st_write.device_bytes + late.get("storage_write_device_bytes", 0)
              + late.get("storage_write_aborted_device_bytes", 0))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru.ru_utime - rusage0.ru_utime) + (ru.ru_stime - rusage0.ru_stime)
    out: dict[str, Any] = {"interface": interface, "tool_bytes_read": tool_r, "tool_bytes_written": tool_w,
                           "client_cpu_seconds": cpu_s,
                           "in_client_calls_seconds": (st_read.busy_ns + st_write.busy_ns) / 1e9,  # summed over workers
                           "note": NET_NOTE}
    if interface is None or before is None or after is None:
        return out
    rx, tx = after[0] - before[0], after[1] - before[1]
    tool = tool_r + tool_w
    # loopback: both directions of the tier's traffic are received (and sent) on lo
    expected = (tool, tool) if interface == "lo" else (tool_r, tool_w)
    ratio = [round(got / want, 4) if want else None for got, want in zip((rx, tx), expected, strict=True)]
    shared = any(r is not None and r > OTHER_TRAFFIC for r in ratio) or (tool == 0 and rx + tx > (1 << 20))
    out.update(bytes_received=rx, bytes_sent=tx, received_over_tool=ratio[0], sent_over_tool=ratio[1],
               other_traffic=shared)
    return out


REMOTE_SUMS = ("throttled_requests", "throttle_wait_s", "throttled_gave_up", "lost_connections")
NET_SUMS = ("tool_bytes_read", "tool_bytes_written", "client_cpu_seconds", "in_client_calls_seconds")


SHAPING_SUMS = ("bandwidth_gbps", "read_held_s", "write_held_s", "read_bytes", "write_bytes")


def merge_shaping(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' measurement.tier_shaping as one, per tier: each rank's share of the rate (the rate is a
    total the ranks split), its held seconds and paced bytes summed; the rest (latency, unit) rank 0's."""
    out: dict[str, Any] = {}
    for rank in ranks:
        for tier, st in (rank or {}).items():
            if tier not in out:
                out[tier] = {**st, **dict.fromkeys(SHAPING_SUMS, 0)}
            for k in SHAPING_SUMS:
                out[tier][k] += st.get(k) or 0
    for st in out.values():
        st["bandwidth_gbps"] = st["bandwidth_gbps"] or None
        st["described"] = Shaping(st["bandwidth_gbps"] or 0.0, st.get("latency_ms") or 0.0).describe()
        st["merged"] = "the ranks' shares of the rate, held seconds and bytes summed"
    return out


def merge_remote(ranks: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranks' measurement.remote_tier as one: counters and the tier's bytes summed; the interface's
    bytes the largest rank's, since every rank's counters cover the whole interface (the other ranks'
    traffic included) over run phases that overlap."""
    if not ranks:
        return None
    out = {k: v for k, v in ranks[0].items() if k not in (*REMOTE_SUMS, "network", "prefix")}
    out.update({k: sum(r.get(k) or 0 for r in ranks) for k in REMOTE_SUMS})
    nets = [r.get("network") or {} for r in ranks]
    net: dict[str, Any] = {"interface": nets[0].get("interface"), **{k: sum(n.get(k) or 0 for n in nets) for k in NET_SUMS}}
    for k in ("bytes_received", "bytes_sent"):
        values = [n[k] for n in nets if isinstance(n.get(k), int)]
        if values:
            net[k] = max(values)
    tool = net["tool_bytes_read"] + net["tool_bytes_written"]
    if "bytes_received" in net and tool:
        net["received_over_tool"] = round(net["bytes_received"] / tool, 4) if net["interface"] == "lo" else round(
            net["bytes_received"] / max(1, net["tool_bytes_read"]), 4)
        net["other_traffic"] = any(n.get("other_traffic") for n in nets) and net["received_over_tool"] > OTHER_TRAFFIC
    net["note"] = NET_NOTE + "; merged: the ranks' tier bytes summed, the interface's the largest rank's"
    out["network"] = net
    out["per_rank_prefix"] = [r.get("prefix") for r in ranks]
    return out


def entry_size_mib(entry_sizes: Sequence[int]) -> dict[str, Any]:
    sizes = np.asarray(entry_sizes, dtype=np.float64) / 2**20
    out: dict[str, Any] = {"count": int(sizes.size)}
    if sizes.size:
        out.update(min=float(sizes.min()), mean=float(sizes.mean()), p95=percentile(sizes, 95),
                   max=float(sizes.max()))
    return out


def after_window(metrics: RunMetrics) -> dict[str, int]:
    late = metrics.late
    return {
        "requests": int(late.get("requests", 0)),
        "aborted_ops": int(sum(v for k, v in late.items() if k.endswith("_aborted_ops"))),
        **{k: int(v) for k, v in late.items()},
    }


WINDOW_EDGE_METHOD = ("each operation's chunk completion times (perf_counter_ns after every chunk, every chunk of "
                      "the operation kept): an operation that straddles the window's end or is aborted after it adds "
                      "the bytes of its chunks completed by the end; a store that marks no chunk (S3, Redis, GDS) "
                      "adds its operation whole, counted in unmeasured_*")


def window_edge(metrics: RunMetrics) -> dict[str, Any]:
    """measurement.window_edge: the operations at the window's end and their bytes, as measured (kv-cache
    audit's window check reads it: bytes counted from outside the window <= the unmeasured ones)."""
    return {**metrics.edge_record(), "method": WINDOW_EDGE_METHOD}


def queue_depth(metrics: RunMetrics) -> dict[str, float]:
    """Achieved storage queue depth: device-busy time over the window's length."""
    window = metrics.window_seconds
    return {op: metrics.tier_op(TierName.STORAGE, op).busy_ns / 1e9 / window if window > 0 else 0.0
            for op in ("read", "write")}


def host_cost(metrics: RunMetrics, rusage0: Any) -> dict[str, float]:
    """Process CPU time since `rusage0` (a resource.getrusage result) and peak RSS, now."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru.ru_utime - rusage0.ru_utime) + (ru.ru_stime - rusage0.ru_stime)
    moved = sum(s.bytes for s in metrics.io.values())
    return {
        "process_cpu_seconds": cpu_s,
        "cpu_seconds_per_gib": cpu_s / (moved / GIB) if moved else 0.0,
        "peak_rss_mib": ru.ru_maxrss / 1024,
    }


def storage_capacity_bytes(usage: dict[str, dict[str, float]]) -> float | None:
    limit = usage[TierName.STORAGE.legacy]["limit_bytes"]
    return None if math.isinf(limit) else limit


VERIFY_CHECKED = ("file and RAM tiers: every byte of every block read (its 16-byte stamp, key and block index, and "
                  "the 4080 payload bytes after it, compared with the fill written); remote tiers (S3, Redis): "
                  "the stamps of every block")


def storage_errors(metrics: RunMetrics, retries: int, max_errors: int, verify: bool) -> dict[str, Any]:
    """Storage errors per tier and operation (failed for good, and retried), the policy, --verify's count."""
    table = metrics.storage_error_table()
    return {
        "storage_errors": table,
        "storage_errors_total": sum(c["failed"] for ops in table.values() for c in ops.values()),
        "storage_retries_total": sum(c["retried"] for ops in table.values() for c in ops.values()),
        "storage_error_policy": {
            "transient_errors_retried": ["EIO", "ENOTCONN", "EAGAIN"], "retries": retries,
            "fatal_errors": ["ENOSPC", "EROFS", "EDQUOT", "EACCES", "EPERM", "ETIMEDOUT", "EHOSTDOWN"],
            "max_storage_errors": max_errors,
        },
        "verify": {"enabled": verify, "mismatches": metrics.verify_mismatches,
                   **({"checked": VERIFY_CHECKED} if verify else {})},
    }


def storage_fill(usage: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Whether the storage tier reached its capacity and started evicting (over the whole run, phases
    before the window included), and a warning when it did not: then no steady state was measured."""
    tier = usage[TierName.STORAGE.legacy]
    limit, peak, evictions = tier["limit_bytes"], tier.get("peak_bytes", 0), int(tier.get("evictions", 0))
    out: dict[str, Any] = {"capacity_bytes": None if math.isinf(limit) else limit, "peak_used_bytes": peak,
                           "evictions": evictions, "reached_capacity": evictions > 0, "warning": None}
    if evictions == 0 and "peak_bytes" in tier and not peak:  # (the cache always says its peak)
        out["warning"] = ("the storage tier stored nothing, so no storage was measured; if every entry fit in the "
                          "tiers above it, give a smaller --cpu-mem-gb (and --gpu-mem-gb) so that entries reach it")
    elif evictions == 0:
        cap = "no capacity limit" if math.isinf(limit) else f"peak {peak / GIB:.2f} of {limit / GIB:.2f} GiB"
        out["warning"] = (f"the storage tier never reached its capacity ({cap}) and evicted nothing: this run "
                          "measured a filling cache, not a steady state; give a smaller --storage-capacity-gb "
                          "or a longer --duration")
    return out


def tier_skips(usage: dict[str, dict[str, float]]) -> tuple[dict[str, int], list[str]]:
    """Entries that skipped an upper tier, larger than its share (one GPU's, or the whole tier), over the
    whole run, per tier (MLPerf name), and the note for each tier skipped: the waterfall put them in the
    next tier that could hold them, as the MLPerf tool does."""
    words = {"gpu": "GPU", "cpu": "CPU"}
    counts: dict[str, int] = {}
    notes: list[str] = []
    for name, u in usage.items():
        n = int(u.get("skipped_entries", 0) or 0)
        if name == TierName.STORAGE.legacy or n <= 0:
            continue
        counts[name] = n
        per_entry = u.get("max_entry_bytes", math.inf)
        share = (f"{per_entry / GIB:.3g} GiB per GPU" if name == "gpu" and not math.isinf(per_entry)
                 else f"{min(per_entry, u['limit_bytes']) / GIB:.3g} GiB")
        what = "1 entry" if n == 1 else f"{n} entries"
        notes.append(f"the {words.get(name, name)} tier ({share}) was skipped by {what} larger than its "
                     "share: each went to the next tier that could hold it (the MLPerf tool's waterfall)")
    return counts, notes


def merged_tier_skips(ranks: Sequence[tuple[int, dict[str, Any] | None]]) -> tuple[dict[str, int], list[str]]:
    """The merged document's `tier_skipped_entries` (each tier's skips summed over the ranks) and a note per
    tier skipped, naming each rank's count (each rank's own document names its tier's share)."""
    words = {"gpu": "GPU", "cpu": "CPU"}
    counts: dict[str, int] = {}
    by_rank: dict[str, list[str]] = {}
    for rank, skips in ranks:
        for name, n in (skips or {}).items():
            if n:
                counts[name] = counts.get(name, 0) + int(n)
                by_rank.setdefault(name, []).append(f"rank {rank}: {int(n)}")
    notes = [f"the {words.get(name, name)} tier was skipped by {'1 entry' if n == 1 else f'{n} entries'} larger "
             f"than its share over the ranks ({', '.join(by_rank[name])}): each went to the next tier that could "
             "hold it (the MLPerf tool's waterfall; each rank's document names its share)"
             for name, n in counts.items()]
    return counts, notes


def _json_count(n: float) -> int | float:
    """A count as a JSON number every reader can hold: an int up to 2^53, a float beyond."""
    return int(n) if n < 2**53 else float(n)


def _rate_flag(rate: float, total_rate: float | None) -> str:
    if total_rate and total_rate != rate:  # several ranks: the flag is the total they split
        return f"this rank's share ({rate:g}/s) of --request-rate {total_rate:g}"
    return f"--request-rate {rate:g}"


def merged_offered_load(ranks: Sequence[tuple[int, dict[str, Any]]], window_s: float,
                        notes: list[str]) -> dict[str, Any]:
    """The merged open loop's load: each rank's `offered_load` figures summed (`requested_request_rate`: the
    ranks' shares of --request-rate summed, the flag's total when no rank is missing), `generator_saturated`
    when any rank's was, with a note naming the ranks. `ranks`: (rank, measurement) of each rank document; {} for a closed loop."""
    loads = [(rank, m) for rank, m in ranks if m.get("requested_request_rate")]
    if not loads:
        return {}
    offered = sum(int(m.get("arrivals_offered") or 0) for _, m in loads)
    missed = _json_count(sum(m.get("arrivals_not_offered") or 0 for _, m in loads))
    requested = sum(float(m["requested_request_rate"]) for _, m in loads)
    saturated = [rank for rank, m in loads if m.get("generator_saturated")]
    out: dict[str, Any] = {"requested_request_rate": requested, "arrivals_offered": offered,
                           "arrivals_not_offered": missed, "generator_saturated": bool(saturated)}
    if saturated:
        rate = offered / window_s if window_s > 0 else 0.0
        notes.append(f"the open-loop generator saturated on rank(s) {', '.join(map(str, saturated))}: --request-rate "
                     f"{requested:g} asked for about {requested * window_s:.4g} arrivals in the {window_s:.2f} s "
                     f"window; the ranks offered {offered} ({rate:.4g}/s) and {missed} fell due while they were "
                     "behind (not offered, not rejected); offered_request_rate is the rate really offered")
    return out


def offered_load(outcome: Any, rate: float, window_s: float, notes: list[str],
                 total_rate: float | None = None) -> dict[str, Any]:
    """The open loop's load as really offered: `offered_request_rate` is the arrivals the generator offered
    (admitted or rejected) per second of the window, `requested_request_rate` the --request-rate given (this
    rank's share of it under several ranks; `total_rate`: the flag's total, which the note then names). When
    the loop could not dispatch arrivals as fast as they were due, the ones it fell behind by are counted
    in `arrivals_not_offered`, and a note says the generator saturated."""
    if not rate:
        return {"offered_request_rate": None}
    offered = outcome.requests_issued + outcome.requests_rejected
    missed = _json_count(getattr(outcome, "arrivals_not_offered", 0) or 0)
    out: dict[str, Any] = {"offered_request_rate": offered / window_s if window_s > 0 else 0.0,
                           "requested_request_rate": rate, "arrivals_offered": offered,
                           "arrivals_not_offered": missed,
                           "generator_saturated": missed > 0}
    if missed:
        note = (f"the open-loop generator saturated: {_rate_flag(rate, total_rate)} asked for about {rate * window_s:.4g} "
                f"arrivals in the {window_s:.2f} s window; the loop offered {offered} "
                f"({out['offered_request_rate']:.4g}/s) and {missed} fell due while it was behind (not offered, "
                f"not rejected); offered_request_rate is the rate really offered")
        if note not in notes:
            notes.append(note)
    return out


CENSORED_NOTE = ("requests started on a worker or in modelled generation when the run stopped: each latency is "
                 "only known to exceed stop - submission (the value given), so they are kept out of the latency "
                 "percentiles; requests still queued are counted in requests_abandoned_at_stop")


def in_flight_at_stop(outcome: Any) -> dict[str, Any]:
    """The requests in flight at the stop and their censored latencies (lower bounds, ms)."""
    censored = list(getattr(outcome, "censored_ns", []) or [])
    lat: dict[str, Any] = {"count": len(censored), "note": CENSORED_NOTE}
    if censored:
        ms = np.asarray(censored, dtype=np.float64) / 1e6
        lat.update(min=float(ms.min()), p50=percentile(ms, 50), max=float(ms.max()))
    return {
        "requests_in_flight_at_stop": int(getattr(outcome, "requests_in_flight_at_stop", 0)),
        "requests_finished_after_stop": int(getattr(outcome, "requests_finished_after_stop", 0)),
        "censored_latency_ms": lat,
    }


RAM_BACKED, NETWORK, BLOCK = "RAM-backed", "network", "block device"
RAM_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs")
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs",
                       "9p", "virtiofs", "fuse.sshfs", "afs", "ocfs2", "weka", "fuse.juicefs")


def filesystem_kind(fs: str | None) -> str | None:
    """RAM-backed, network or block device, from the filesystem type (None when unknown or trace mode)."""
    if not fs:
        return None
    if fs in RAM_FILESYSTEMS:
        return RAM_BACKED
    if fs in backends.remote_names():  # storage tiers spoken to over the network, not through a filesystem
        return REMOTE
    if fs in NETWORK_FILESYSTEMS or fs.startswith(("nfs", "fuse.")):
        return NETWORK
    return BLOCK


def storage_location(cache_dir: str | os.PathLike[str] | None, io_mode: str | None,
                     io_mode_reason: str | None = None) -> dict[str, Any]:
    """Which storage the storage tier's files were on, so that two results can be told apart by reading them:
    the cache directory (absolute), the mount point holding it, its filesystem type and kind, the mount's
    source, the block device under it (None for tmpfs, overlay, network filesystems...) and the I/O mode
    (direct = O_DIRECT, buffered = page cache; a requested mode for a sessions run, whose rungs each probe
    it) with the reason it is in force. `cache_dir` None: no storage tier files (trace mode)."""
    if cache_dir is None:
        return {"cache_dir": None, "mount_point": None, "filesystem": None, "filesystem_kind": None,
                "mount_source": None, "block_device": None, "io_mode": io_mode, "io_mode_reason": io_mode_reason}
    path = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    probe = next((p for p in (path, *_parents(path)) if os.path.exists(p)), path)  # not created yet: its parent
    mi = mount_info(probe)
    device = BlockDeviceCounter.for_path(probe)
    fs = mi.fs_type if mi is not None else None
    return {"cache_dir": path, "mount_point": mi.mount_point if mi is not None else None, "filesystem": fs,
            "filesystem_kind": filesystem_kind(fs), "mount_source": mi.source if mi is not None else None,
            "block_device": device.name if device is not None else None, "io_mode": io_mode,
            "io_mode_reason": io_mode_reason}


def _parents(path: str) -> list[str]:
    out = []
    while (up := os.path.dirname(path)) != path:
        out.append(up)
        path = up
    return out
