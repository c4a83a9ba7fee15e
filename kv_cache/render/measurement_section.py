"""The report's MEASUREMENT section: what was timed and how, where (storage path, filesystem, block device,
I/O mode, per rank where a merge's ranks differ), the device's bytes against the tool's, and the storage
errors. A reader of the results document only, like every section (render/console.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kv_cache.core.io_workers import probe_text
from kv_cache.metrics.recorder import GIB
from kv_cache.results.measurement import RAM_BACKED, filesystem_kind

__all__ = ["gpu_tier_lines", "measurement", "storage_error_lines", "storage_lines"]

Results = dict[str, Any]


def gpu_tier_lines(tier: Any) -> list[str]:
    """The GPU tier's own account: simulated (modelled vs host memcpy) or real (CUDA events vs wall clock)."""
    if not isinstance(tier, dict):
        return []
    if tier.get("mode") == "simulated":
        lines = [f"  GPU tier: SIMULATED {tier['gpu']} ({tier['host_link']}, {tier['host_link_gbs_per_direction']:g}"
                 f" GB/s per direction; data in host RAM)"]
        for d in ("h2d", "d2h"):
            x = tier[d]
            lines.append(f"    {d.upper()}: {x['operations']} ops, {x['bytes'] / GIB:.3f} GiB, modelled "
                         f"{x['modelled_seconds']:.3f} s; host memcpy standing in {x['host_memcpy_seconds']:.3f} s "
                         f"({x['host_memcpy_gbs']:.1f} GB/s, not in latencies)")
        return lines
    lines = [f"  GPU tier: real, {tier.get('backend')} on {', '.join(tier.get('devices', []))}"]
    if "replicas" in tier:
        lines.append(f"    tensor parallel {tier['tensor_parallel']}: {tier['replicas']} group(s), each entry on every "
                     f"GPU of one; {tier.get('gpus_chosen_by', '')}")
    for d in ("h2d", "d2h"):
        x = tier[d]
        plain = x.get("plain_pinned_copy_gbs")
        lines.append(f"    {d.upper()}: {x['copies']} copies, {x['bytes'] / GIB:.3f} GiB per GPU, CUDA events "
                     f"{x['device_gbs']:.1f} GB/s, wall clock {x['copy_wall_gbs']:.1f} GB/s"
                     + (f" (plain pinned copy: {plain:.1f} GB/s)" if plain is not None else ""))
    return lines


def _io_line(meas: dict[str, Any]) -> str:
    kind = filesystem_kind(meas.get("filesystem"))
    if meas.get("io_mode") == "network":
        why = meas.get('io_mode_reason') or (meas.get('storage_location') or {}).get('io_mode_reason')
        return (f"  I/O: network ({why}), {(meas.get('chunk_bytes') or 0) / 2**20:.0f} MiB "
                f"chunks, {meas.get('io_workers')} I/O workers; device time = inside the client's calls")
    if kind == RAM_BACKED:
        how = f"files in RAM on {meas.get('filesystem')}: no device below, no page cache to bypass"
    elif meas.get("io_mode") == "direct":
        how = "O_DIRECT"
    else:
        how = "page cache bypassed by fadvise(DONTNEED)"
    return (f"  I/O: {meas.get('io_mode')} ({how}), {(meas.get('chunk_bytes') or 0) / 2**20:.0f} MiB chunks,"
            f" fdatasync per entry: {meas.get('fsync')}, {meas.get('io_workers')} I/O workers")


GAP_GIB = 1 / 1024  # a device/tool difference under 1 MiB needs no explanation


def remote_lines(rt: dict[str, Any] | None) -> list[str]:
    """A remote tier's counters and the bytes its server's interface carried (measurement.remote_tier)."""
    if not isinstance(rt, dict):
        return []
    net = rt.get("network") or {}
    lines = [f"  Remote tier: {rt.get('backend')} via {rt.get('client')}; throttled requests "
             f"{rt.get('throttled_requests', 0)} (backoff {rt.get('throttle_wait_s', 0):.2f} s), lost connections "
             f"{rt.get('lost_connections', 0)}"]
    if rt.get("outages") or rt.get("stopped_answering") or rt.get("abandoned_at_stop_signal"):
        lines.append(f"  Server lost {rt.get('outages', 0)} time(s): {rt.get('failover_retries', 0)} request(s) sent "
                     f"again after backoffs ({rt.get('failover_wait_s', 0):.2f} s), longest outage "
                     f"{rt.get('longest_outage_s', 0):.1f} s, {rt.get('failover_gave_up', 0)} given up at the failover "
                     f"budget; {rt.get('stopped_answering', 0)} abandoned past the deadline (the server stopped "
                     f"answering), {rt.get('abandoned_at_stop_signal', 0)} at a stop signal")
    tls = rt.get("tls")
    if isinstance(tls, dict) and tls.get("on"):
        lines.append(f"  TLS ({rt.get('scheme')}): the server's certificate "
                     + ("verified" if tls.get("verify") else "NOT verified") + (f", CA {tls['ca']}" if tls.get("ca") else ""))
    tool = (net.get("tool_bytes_read", 0) + net.get("tool_bytes_written", 0)) / GIB
    if "bytes_received" in net:
        lines.append(f"  Interface {net['interface']} saw: {net['bytes_received'] / GIB:.3f} GiB received, "
                     f"{net['bytes_sent'] / GIB:.3f} GiB sent (tier: {net['tool_bytes_read'] / GIB:.3f} GiB read, "
                     f"{net['tool_bytes_written'] / GIB:.3f} GiB written, {tool:.3f} GiB in all"
                     + ("; loopback counts each byte both ways" if net["interface"] == "lo" else "") + ")")
        if net.get("other_traffic"):
            lines.append("    more on the interface than the tier's bytes and protocol overhead: other traffic "
                         "shares it")
    lines.append(f"  Client: {net.get('client_cpu_seconds', 0):.2f} s CPU, {net.get('in_client_calls_seconds', 0):.2f} s "
                 "waiting in the client's calls (summed over workers)")
    return lines


def _block_device_line(bd: dict[str, Any]) -> list[str]:
    if not bd.get("name") or "bytes_read" not in bd:  # (a merge names the device: no one rank's counters)
        return []
    gap_r = (bd["bytes_read"] - bd["tool_bytes_read"]) / GIB
    gap_w = (bd["bytes_written"] - bd["tool_bytes_written"]) / GIB
    lines = [f"  Block device {bd['name']} saw: {bd['bytes_read'] / GIB:.3f} GiB read, "
             f"{bd['bytes_written'] / GIB:.3f} GiB written during the run "
             f"(benchmark storage tier: {bd['tool_bytes_read'] / GIB:.3f} GiB read,"
             f" {bd['tool_bytes_written'] / GIB:.3f} GiB written)",
             f"  Device minus tool: {gap_r:+.3f} GiB read, {gap_w:+.3f} GiB written (the device's counters cover"
             f" the whole run phase and every process using {bd['name']})"]
    if bd.get("periodic_document_bytes"):
        lines.append(f"    of the device's written bytes, {bd['periodic_document_bytes'] / 2**20:.1f} MiB are this run's "
                     "periodic results documents (--output on this device)")
    if max(gap_r, gap_w) > GAP_GIB:
        lines.append("    more on the device = other processes' I/O, filesystem metadata and journal, readahead")
    if min(gap_r, gap_w) < -GAP_GIB:
        lines.append("    less on the device = bytes the page cache absorbed or had not written back yet")
    return lines


# A merged document's measurement holds a fact once when every rank says the same, else None, with each
# rank's under `per_rank` (results/merge.py measurement_facts): those lines are then printed per rank.
STORAGE_FACTS = ("run_dir", "filesystem", "filesystem_kind", "block_device")
IO_FACTS = ("io_mode", "chunk_bytes", "fsync", "io_workers")


def _differing_ranks(meas: dict[str, Any], keys: Iterable[str]) -> list[dict[str, Any]]:
    """The per-rank facts of a merged measurement where one of `keys` differs between ranks; [] otherwise."""
    ranks = [r for r in meas.get("per_rank") or [] if isinstance(r, dict)]
    return ranks if any(len({repr(r.get(k)) for r in ranks}) > 1 for k in keys) else []


def _storage_line(meas: dict[str, Any], device: Any, label: str = "") -> str:
    if meas.get("filesystem_kind") == "remote":
        return f"  Storage tier{label}: {meas.get('run_dir')} (a {meas.get('filesystem')} server, over the network)"
    return (f"  Storage tier{label}: {meas.get('run_dir')} on {meas.get('filesystem')} "
            f"({filesystem_kind(meas.get('filesystem')) or 'unknown kind'} filesystem;"
            f" block device: {device or 'n/a'})")


def storage_lines(meas: dict[str, Any]) -> list[str]:
    """Where it measured, the backend behind each tier (when the document records it), and how: one line
    each, or one per rank of a merge where the ranks differ."""
    ranks = _differing_ranks(meas, STORAGE_FACTS)
    lines = ([_storage_line(r, r.get("block_device"), f" (rank {r.get('rank')})") for r in ranks] if ranks else
             [_storage_line(meas, (meas.get("block_device") or {}).get("name"))])
    lines += _backends_line(meas.get("tier_backends"))
    io_ranks = _differing_ranks(meas, IO_FACTS)
    lines += ([_io_line(r).replace("  I/O:", f"  I/O (rank {r.get('rank')}):", 1) for r in io_ranks] if io_ranks
              else [_io_line(meas)])
    return lines


def timed_lines(meas: dict[str, Any]) -> list[str]:
    """What was timed and with which timer (measurement.timed, which names measurement.device_timer's):
    one line, or one per rank of a merge whose ranks timed differently (one rank on the Python fallback:
    the merged `timed` is None, and 'Timed: None' said nothing of it)."""
    ranks = _differing_ranks(meas, ("timed", "device_timer"))
    if ranks:
        return [f"  Timed (rank {r.get('rank')}): {r.get('timed')}" for r in ranks]
    return [f"  Timed: {meas.get('timed')}"]


def _backends_line(backends: dict[str, str] | None) -> list[str]:
    """The storage backend behind each tier (measurement.tier_backends); documents written before it was
    recorded have none, and their report is unchanged."""
    if not backends:
        return []
    return ["  Tier backends: " + ", ".join(f"{tier} {name}" for tier, name in backends.items())]


def _workers_line(choice: dict | None) -> list[str]:
    """How the I/O worker count was chosen (core/io_workers.py), with the probe's figures."""
    if not isinstance(choice, dict):
        return []
    text = f"  I/O workers: {choice.get('count')} ({choice.get('how')}"
    if choice.get("probe"):
        text += "; " + probe_text(choice["probe"])
    text += ")"
    return [text + (f"; {choice['clamped']}" if choice.get("clamped") else "")]


def measurement(results: Results) -> list[str]:
    meas = results.get("measurement", {})
    if not meas:
        return []
    if "io_mode" not in meas:  # stopped before the storage tier was set up: only why, and what it noted
        lines = ["", "### MEASUREMENT ###", f"  Stop reason: {meas.get('stop_reason')}"]
        lines += [f"  Note: {note}" for note in meas.get("notes", [])]
        if meas.get("errors"):
            lines.append(f"  ERRORS: {meas['errors']} (first: {meas.get('first_error')})")
        return lines
    depth = meas.get("achieved_queue_depth", {})
    lines = ["", "### MEASUREMENT (what was timed and how) ###",
             *storage_lines(meas),
             *timed_lines(meas),
             *_workers_line(meas.get("io_workers_choice")),
             *_block_device_line(meas.get("block_device") or {}), *remote_lines(meas.get("remote_tier")),
             f"  Achieved storage queue depth (device-busy time / window): read {depth.get('read', 0):.2f},"
             f" write {depth.get('write', 0):.2f}",
             f"  CPU: {meas.get('process_cpu_seconds', 0):.1f} s process CPU time,"
             f" {meas.get('cpu_seconds_per_gib', 0):.2f} CPU-s per GiB moved",
             f"  Mode: {meas.get('run_mode')}",
             f"  Stop reason: {meas.get('stop_reason')}; window {meas.get('window_seconds', 0):.2f} s"]
    if meas.get("offered_request_rate"):
        lines.append(f"  Open loop: {meas['requests_issued']} arrivals admitted, {meas.get('requests_rejected', 0)}"
                     " rejected (admission queue full)")
    late = meas.get("after_window", {})
    if late.get("requests") or late.get("aborted_ops"):
        lines.append(f"  Not counted (finished after the window or aborted at stop): {late.get('requests', 0)}"
                     f" requests, {late.get('aborted_ops', 0)} aborted I/O operations")
    lines += gpu_tier_lines(meas.get("gpu_tier"))
    gds = meas.get("storage_gds")
    if isinstance(gds, dict):
        lines.append(f"  GPUDirect Storage: {gds['library']}, compat mode {gds['compat_mode']}: {gds['reads']} storage "
                     f"reads, {gds['bytes'] / GIB:.3f} GiB into GPU memory ({gds['pread_seconds']:.3f} s in pread)")
    lines += [f"  Note: {note}" for note in meas.get("notes", [])]
    if meas.get("errors"):
        lines.append(f"  ERRORS: {meas['errors']} (first: {meas.get('first_error')})")
    lines += storage_error_lines(meas)
    return lines


def storage_error_lines(meas: dict) -> list[str]:
    """Storage errors per tier and operation, and --verify's mismatches (nothing when there were none)."""
    lines = []
    for tier, ops in sorted((meas.get("storage_errors") or {}).items()):
        for op, cell in sorted(ops.items()):
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(cell["by_error"].items())) or "none left"
            lines.append(f"  Storage errors, {tier} {op}: {cell['failed']} failed ({kinds}),"
                         f" {cell['retried']} retried")
    if meas.get("requests_in_flight_at_stop"):
        cens = meas.get("censored_latency_ms") or {}
        lines.append(f"  In flight at the stop: {meas['requests_in_flight_at_stop']} requests (latency censored: "
                     f"> {cens.get('p50', 0):.1f} ms median, > {cens.get('max', 0):.1f} ms max; not in the percentiles)")
    fill = meas.get("storage_fill") or {}
    if fill.get("reached_capacity"):
        lines.append(f"  Storage tier reached its capacity: {fill['evictions']} entries evicted")
    elif fill.get("warning"):
        lines.append(f"  WARNING: {fill['warning']}")
    verify = meas.get("verify") or {}
    if verify.get("enabled"):
        lines.append(f"  --verify: {verify.get('mismatches', 0)} reads differed from the bytes written"
                     + (f" ({verify['checked']})" if verify.get("checked") else ""))
        if verify.get("mismatches"):
            lines.append("  --verify: the integrity verdict is INVALID (kv-cache audit: verify)")
    return lines
