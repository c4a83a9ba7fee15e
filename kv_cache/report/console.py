"""The printed report, in the reference's section order (spec 12.2), plus what was timed and how."""

from __future__ import annotations

from typing import Any, TextIO

from kv_cache.metrics.recorder import GIB

LINE = "=" * 80


def _p(out: TextIO, text: str = "") -> None:
    out.write(text + "\n")


def print_report(results: dict[str, Any], out: TextIO) -> None:
    s = results.get("summary")
    meas = results.get("measurement", {})
    params = results.get("run_parameters", {})
    _p(out)
    _p(out, LINE)
    _p(out, "BENCHMARK RESULTS - MLPerf KV Cache Storage Benchmark")
    _p(out, f"Generation Mode: {params.get('generation_mode')} ({params.get('generation_ms_per_token', 0):.1f}ms/token)")
    _p(out, LINE)
    if not s:
        _p(out, "WARNING: No requests completed during benchmark!")
        _print_measurement(meas, out)
        return
    cs = s["cache_stats"]
    _p(out, "Latencies are per KV entry (whole entry, streamed in "
            f"{meas.get('chunk_bytes', 0) / 2**20:.0f} MiB chunks).")
    _p(out, f"Model: {params.get('model')}  ({params.get('bytes_per_token', 0):,} bytes/token)")
    sizes = meas.get("entry_size_mib", {})
    if sizes.get("count"):
        _p(out, f"Entries cached at end: {sizes['count']}  size MiB: min {sizes['min']:.1f}  mean {sizes['mean']:.1f}"
                f"  p95 {sizes['p95']:.1f}  max {sizes['max']:.1f}")

    health = cs["storage_health"]
    ok = health["overall_status"] == "PASS"
    _p(out)
    _p(out, f"### STORAGE PERFORMANCE ASSESSMENT: {health['overall_status']} {'[OK]' if ok else '[X]'} ###")
    _p(out, f"  Criteria Passed: {health['passed_count']}/{health['total_count']}")
    for c in health["criteria"]:
        mark = "[OK]" if c["passed"] else "[X]"
        if c["unit"] == "ratio":
            _p(out, f"  {mark} {c['name']}: {float(c['actual']) * 100:.1f}% (target: {float(c['target']) * 100:.0f}%)")
        elif isinstance(c["actual"], str):
            _p(out, f"  {mark} {c['name']}: {c['actual']}{c['unit']} (target: {c['target']}{c['unit']})")
        else:
            _p(out, f"  {mark} {c['name']}: {c['actual']:.2f}{c['unit']} (target: {c['target']}{c['unit']})")

    _p(out)
    _p(out, "### OVERALL PERFORMANCE ###")
    _p(out, f"  Requests Completed: {s['total_requests']}")
    _p(out, f"  Total Tokens Generated: {s['total_tokens']}")
    _p(out, f"  Measured window: {s['elapsed_time']:.2f} s")
    _p(out, f"  Avg Throughput (wall-clock): {s['avg_throughput_tokens_per_sec']:.2f} tok/s")
    _p(out, f"  Storage Throughput (tokens / summed storage time): {s['storage_throughput_tokens_per_sec']:.2f} tok/s")
    _p(out, f"  Requests/sec: {s['requests_per_second']:.2f}")

    _p(out)
    _p(out, "### END-TO-END LATENCY (Queue Wait + Storage I/O + Generation) ###")
    _lat(out, s["end_to_end_latency_ms"])
    _p(out)
    _p(out, "### PER-REQUEST STORAGE LATENCY (All I/O ops for one request, incl. evictions it caused) ###")
    _lat(out, s["storage_io_latency_ms"])
    if params.get("generation_mode") != "none":
        _p(out)
        _p(out, f"### TOKEN GENERATION LATENCY (Simulated @ {params.get('generation_ms_per_token', 0):.1f} ms/token) ###")
        _lat(out, s["generation_latency_ms"], keys=("mean", "p50", "p95"))

    _p(out)
    _p(out, "### STORAGE PERFORMANCE ###")
    _p(out, f"  Cache Hit Rate: {cs['cache_hit_rate'] * 100:.1f}%")
    _p(out, f"  Total Read: {cs['total_read_gb']:.2f} GiB")
    _p(out, f"  Total Write: {cs['total_write_gb']:.2f} GiB")
    ratio = cs["read_write_ratio"]
    if cs["total_write_bytes"] == 0 and cs["total_read_bytes"] > 0:
        ratio_s = "∞ (read-only)"
    elif ratio < 1e-9:
        ratio_s = "0 (write-only)"
    else:
        ratio_s = f"{ratio:.2f}"
    _p(out, f"  Read/Write Ratio: {ratio_s}")
    _p(out, f"  Read Operations: {cs['read_iops']} ({cs['read_ops_per_sec']:.2f} ops/sec over the measured window)")
    _p(out, f"  Write Operations: {cs['write_iops']} ({cs['write_ops_per_sec']:.2f} ops/sec over the measured window)")

    _p(out)
    _p(out, "### CACHE TIER DISTRIBUTION ###")
    _p(out, f"  GPU Entries: {cs['gpu_entries']} ({cs['gpu_memory_used_gb']:.2f} GiB)")
    _p(out, f"  CPU Entries: {cs['cpu_entries']} ({cs['cpu_memory_used_gb']:.2f} GiB)")
    _p(out, f"  Storage Entries: {cs['storage_entries']} ({cs['storage_memory_used_gb']:.2f} GiB)")

    _p(out)
    _p(out, "### TIER-SPECIFIC KV BYTES ###")
    for tier in ("gpu", "cpu", "storage"):
        for word in ("written", "read"):
            v = cs[f"tier_{tier}_kv_bytes_{word}_gb"]
            if v > 0:
                op = "write" if word == "written" else "read"
                demo = cs.get(f"tier_{tier}_demotion_{op}_gb", 0.0)
                extra = f" (of which demotion {demo:.2f} GiB)" if demo > 0 else ""
                _p(out, f"  {tier.upper() if tier != 'storage' else 'Storage'} KV Bytes {word.capitalize()}: {v:.2f} GiB{extra}")

    _p(out)
    _p(out, "### STORAGE KV BANDWIDTH ###")
    for tier in ("gpu", "cpu", "storage"):
        for op in ("read", "write"):
            v = cs[f"tier_{tier}_{op}_bandwidth_gbps"]
            if v > 0:
                _p(out, f"  {tier.upper() if tier != 'storage' else 'Storage'} {op.capitalize()} Bandwidth: {v:.3f} GiB/s")

    _p(out)
    _p(out, "### TIER-SPECIFIC LATENCIES (Total = Host + Device) ###")
    for tier in ("gpu", "cpu", "storage"):
        for op in ("read", "write"):
            k = f"{tier}_{op}_p95_ms"
            if k in cs:
                _p(out, f"  {tier.upper() if tier != 'storage' else 'Storage'} {op.capitalize()} P95: {cs[k]:.2f} ms"
                        f"  (P50 {cs[f'{tier}_{op}_p50_ms']:.2f}, P99 {cs[f'{tier}_{op}_p99_ms']:.2f})")

    _p(out)
    _p(out, "### STORAGE TIER LATENCY BREAKDOWN (Device = syscalls, Host = everything else) ###")
    for op in ("read", "write"):
        if f"storage_{op}_p95_ms" in cs:
            _p(out, f"  {op.capitalize()}: device P95 {cs[f'storage_{op}_device_p95_ms']:.2f} ms,"
                    f" host P95 {cs[f'storage_{op}_host_p95_ms']:.2f} ms, total P95 {cs[f'storage_{op}_p95_ms']:.2f} ms")

    _p(out)
    _p(out, "### CACHE TYPE BREAKDOWNS ###")
    _p(out, f"  System Prompt Hits: {cs['system_prompt_hits']}")
    _p(out, f"  Common Phrase Hits: {cs['common_phrase_hits']}")
    _p(out, f"  User Cache Hits: {cs['user_cache_hits']}")
    _p(out, f"  Multi-turn Hits: {cs['multi_turn_hits']}")

    pc = s["prefix_cache_stats"]
    if pc.get("prefix_hits", 0) > 0:
        _p(out)
        _p(out, "### PREFIX CACHING ###")
        _p(out, f"  Prefix Hits: {pc['prefix_hits']}")
        _p(out, f"  Prefix Misses (written): {pc['prefix_misses']}")
        _p(out, f"  System Prompt Reuse: {pc['system_prompt_reuse']}")
        _p(out, f"  Bytes Saved: {pc['bytes_saved'] / GIB:.3f} GiB")

    mt = s["multi_turn_stats"]
    if mt["cache_hits"] > 0:
        _p(out)
        _p(out, "### MULTI-TURN CONVERSATIONS ###")
        _p(out, f"  History Hits: {mt['cache_hits']}  Misses: {mt['cache_misses']}  Hit Rate: {mt['hit_rate'] * 100:.1f}%")

    if params.get("performance_profile") == "latency":
        _p(out)
        _p(out, "### QOS LATENCY METRICS (Informational - includes simulated generation) ###")
        for level, q in s["qos_metrics"].items():
            if q.get("no_data"):
                continue
            sla = q["sla"]
            _p(out, f"  {level.capitalize()}: {q['total_requests']} requests, P95 {q['latency_ms']['p95']:.2f} ms,"
                    f" P99 {q['latency_ms']['p99']:.2f} ms, SLA {'[OK]' if sla['met'] else '[X]'}"
                    f" ({sla['compliance'] * 100:.1f}% within {sla['target_p95_ms']:.0f} ms)")

    auto = s.get("autoscaling_summary")
    if auto:
        _p(out)
        _p(out, f"### AUTOSCALING ({auto['mode']} mode) ###")
        _p(out, f"  Users: {auto['initial_users']} -> {auto['final_users']} over {auto['samples']} samples,"
                f" {auto['total_scale_events']} scale events")
        for h in s.get("autoscaling_stats", []):
            rp = h.get("read_p95_ms")
            _p(out, f"  t={h['t_s']:7.1f}s users {h['users']:5d} -> {h['users_after']:5d}  {h['action']:<10}"
                    f" {h['tokens_per_sec']:10.1f} tok/s  storage {h['storage_read_gbps'] + h['storage_write_gbps']:.3f} GiB/s"
                    f"  read p95 {rp if rp is None else round(rp, 1)} ms  saturation {h['saturation_level']:.2f}")
        if auto["mode"] == "capacity":
            _p(out, f"  Peak: {auto['peak_throughput_tokens_per_sec']:.1f} tok/s at {auto['peak_user_count']} users"
                    f" ({'found' if auto.get('peak_found') else 'not reached within the duration'})")
        else:
            _p(out, f"  Most users within target saturation {auto['target_saturation']:.2f}:"
                    f" {auto.get('max_users_within_target')}")

    rag = s.get("rag_stats")
    if rag:
        _p(out)
        _p(out, "### RAG ###")
        _p(out, f"  Documents retrievable: {rag['documents_retrievable']}; chunk reads that hit: {rag['chunk_hits']},"
                f" missed (recomputed and stored): {rag['chunk_misses']}")

    val = results.get("validation")
    if val:
        _p(out)
        _p(out, "### VALIDATION ###")
        hr = val["comparison"]["cache_hit_rate"]
        _p(out, f"  {'[OK]' if val['passed'] else '[X]'} cache hit rate: benchmark {hr['benchmark'] * 100:.1f}% vs trace"
                f" {hr['trace'] * 100:.1f}% (error {hr['error_pct']:.1f}%, limit 5%)")
        rw = val["comparison"]["read_write_ratio"]
        _p(out, f"  read/write ratio: benchmark {rw['benchmark']:.2f} vs trace {rw['trace']:.2f} (informational)")

    _print_measurement(meas, out)
    for name, ph in (results.get("phases") or {}).items():
        if "skipped" in ph:
            _p(out, f"  Before the window, {name}: skipped ({ph['skipped']})")
        else:
            _p(out, f"  Before the window, {name}: {ph.get('entries', ph.get('chunks', 0))} entries,"
                    f" {ph['gib']:.2f} GiB in {ph['seconds']:.1f} s (not counted above)")
    _p(out)
    _p(out, "NOTES:")
    if params.get("generation_mode") == "none":
        _p(out, "  - Pure storage I/O benchmark (no generation simulation)")
    else:
        _p(out, "  - End-to-end latency includes simulated GPU inference (modelled time; it holds no I/O worker)")
    _p(out, LINE)


def _lat(out: TextIO, block: dict[str, float], keys=("mean", "p50", "p95", "p99")) -> None:
    names = {"mean": "Mean", "p50": "P50", "p95": "P95", "p99": "P99", "p999": "P99.9", "p9999": "P99.99"}
    for k in keys:
        _p(out, f"  {names[k]}: {block.get(k, 0.0):.2f} ms")


def _print_measurement(meas: dict[str, Any], out: TextIO) -> None:
    if not meas:
        return
    _p(out)
    _p(out, "### MEASUREMENT (what was timed and how) ###")
    _p(out, f"  Storage tier: {meas.get('run_dir')} on {meas.get('filesystem')} "
            f"(block device: {meas.get('block_device', {}).get('name') or 'n/a'})")
    _p(out, f"  I/O: {meas.get('io_mode')} ({'O_DIRECT' if meas.get('io_mode') == 'direct' else 'page cache bypassed by fadvise(DONTNEED)'}),"
            f" {meas.get('chunk_bytes', 0) / 2**20:.0f} MiB chunks, fdatasync per entry: {meas.get('fsync')},"
            f" {meas.get('io_workers')} I/O workers")
    _p(out, f"  Timed: {meas.get('timed')}")
    bd = meas.get("block_device") or {}
    if bd.get("name"):
        _p(out, f"  Block device {bd['name']} saw: {bd['bytes_read'] / GIB:.3f} GiB read, "
                f"{bd['bytes_written'] / GIB:.3f} GiB written during the run "
                f"(benchmark storage tier: {bd['tool_bytes_read'] / GIB:.3f} GiB read, {bd['tool_bytes_written'] / GIB:.3f} GiB written)")
    _p(out, f"  Achieved storage queue depth (device-busy time / window): read {meas.get('achieved_queue_depth', {}).get('read', 0):.2f},"
            f" write {meas.get('achieved_queue_depth', {}).get('write', 0):.2f}")
    _p(out, f"  CPU: {meas.get('process_cpu_seconds', 0):.1f} s process CPU time,"
            f" {meas.get('cpu_seconds_per_gib', 0):.2f} CPU-s per GiB moved")
    _p(out, f"  Mode: {meas.get('run_mode')}")
    _p(out, f"  Stop reason: {meas.get('stop_reason')}; window {meas.get('window_seconds', 0):.2f} s")
    if meas.get("offered_request_rate"):
        _p(out, f"  Open loop: {meas['requests_issued']} arrivals admitted, {meas.get('requests_rejected', 0)} rejected"
                f" (admission queue full)")
    late = meas.get("after_window", {})
    if late.get("requests") or late.get("aborted_ops"):
        _p(out, f"  Not counted (finished after the window or aborted at stop): {late.get('requests', 0)} requests,"
                f" {late.get('aborted_ops', 0)} aborted I/O operations")
    for note in meas.get("notes", []):
        _p(out, f"  Note: {note}")
    if meas.get("errors"):
        _p(out, f"  ERRORS: {meas['errors']} (first: {meas.get('first_error')})")
