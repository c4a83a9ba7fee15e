"""The printed report, in the MLPerf tool's section order, plus what was timed and how.

Each section is a function of the results document that returns its lines (empty when the section does
not apply), so a section can be checked on its own and the text never depends on anything the document
does not hold: a report reprinted from a saved JSON file reads exactly as the one printed by the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TextIO

from kv_cache.core.autoscale import summarise
from kv_cache.metrics.recorder import GIB
from kv_cache.render import catalogue_section
from kv_cache.render.measurement_section import measurement
from kv_cache.results import blocklatency
from kv_cache.results.figures import CacheStats, Figures, RequestTotals
from kv_cache.results.measurement import RAM_BACKED, filesystem_kind
from kv_cache.storage import backends as storage_backends
from kv_cache.storage.tiername import TierName
from kv_cache.workload.traces.model import skip_kind

LINE = "=" * 80
TIERS = tuple(TierName)
OPS = ("read", "write")
LATENCY_NAMES = {"mean": "Mean", "p50": "P50", "p95": "P95", "p99": "P99", "p999": "P99.9", "p9999": "P99.99"}

Results = dict[str, Any]
Section = Callable[[Results], list[str]]


def _summary(results: Results) -> dict[str, Any]:
    return results.get("summary") or {}


def _cache_stats(results: Results) -> dict[str, Any]:
    return _summary(results)["cache_stats"]


def _figures(results: Results) -> CacheStats:
    return Figures.from_json(_summary(results)).cache


def _params(results: Results) -> dict[str, Any]:
    return results.get("run_parameters", {})


def _rate(v: float | None, spec: str = ".2f", undefined: bool = False) -> str:
    """A rate, or why there is none: the window was shorter than a second (`undefined`: the results'
    rates_undefined_reason is set and the rate is 0.0; documents written before it hold null)."""
    return "n/a (window < 1 s)" if v is None or undefined else format(v, spec)


def _mark(passed: bool) -> str:
    return "[OK]" if passed else "[X]"


def latency_lines(block: dict[str, float], keys: Iterable[str] = ("mean", "p50", "p95", "p99")) -> list[str]:
    return [f"  {LATENCY_NAMES[k]}: {block.get(k, 0.0):.2f} ms" for k in keys]


def header(results: Results) -> list[str]:
    params = _params(results)
    return ["", LINE, "BENCHMARK RESULTS - MLPerf KV Cache Storage Benchmark",
            f"Generation Mode: {params.get('generation_mode')} ({params.get('generation_ms_per_token', 0):.1f}ms/token)",
            LINE]


def no_requests(results: Results) -> list[str]:
    return ["WARNING: No requests completed during benchmark!"]


def run_facts(results: Results) -> list[str]:
    meas, params = results.get("measurement", {}), _params(results)
    lines = ["Latencies are per KV entry (whole entry, streamed in "
             f"{(meas.get('chunk_bytes') or 0) / 2**20:.0f} MiB chunks).",
             f"Model: {params.get('model')}  ({params.get('bytes_per_token', 0):,} bytes/token)"]
    sizes = meas.get("entry_size_mib", {})
    if sizes.get("count"):
        lines.append(f"Entries cached at end: {sizes['count']}  size MiB: min {sizes['min']:.1f}  mean {sizes['mean']:.1f}"
                     f"  p95 {sizes['p95']:.1f}  max {sizes['max']:.1f}")
    return lines


def _criterion(c: dict[str, Any]) -> str:
    mark = _mark(c["passed"])
    if c["unit"] == "ratio":
        return f"  {mark} {c['name']}: {float(c['actual']) * 100:.1f}% (target: {float(c['target']) * 100:.0f}%)"
    if isinstance(c["actual"], str):
        return f"  {mark} {c['name']}: {c['actual']}{c['unit']} (target: {c['target']}{c['unit']})"
    return f"  {mark} {c['name']}: {c['actual']:.2f}{c['unit']} (target: {c['target']}{c['unit']})"


def ram_tier_reason(results: Results) -> str | None:
    """Why a storage tier on RAM (tmpfs, ramfs: `--cache-dir /dev/shm/...`) makes the integrity INVALID, in one
    sentence; None when the storage tier is not RAM-backed or the integrity is not invalid."""
    block = results.get("integrity") if isinstance(results.get("integrity"), dict) else {}
    fs = (results.get("measurement") or {}).get("filesystem")
    if str(block.get("verdict", "")).lower() != "invalid" or filesystem_kind(fs) != RAM_BACKED:
        return None
    return (f"the storage tier is on {fs}, which is RAM: no storage device was measured, so these figures are a "
            "RAM baseline, not a storage result (point --cache-dir at the storage to measure)")


def storage_assessment(results: Results) -> list[str]:
    health = _cache_stats(results)["storage_health"]
    block = results.get("integrity") if isinstance(results.get("integrity"), dict) else {}
    integ = str(block.get("verdict", "ok")).lower()
    ram = ram_tier_reason(results)
    # the integrity beside PASS on the same line when it is not OK, with the first reason in one sentence (a
    # storage tier on RAM first: whatever else the checks found, no storage was measured)
    fs = (results.get("measurement") or {}).get("filesystem")
    first = f"the storage tier is on {fs}, which is RAM" if ram else (block.get("reasons") or ["see kv-cache audit"])[0]
    beside = (f" - but integrity {integ.upper()}: {first}"
              if integ not in ("ok", "n/a") and health["overall_status"] == "PASS" else "")
    return ["", f"### STORAGE PERFORMANCE ASSESSMENT: {health['overall_status']} "
                f"{_mark(health['overall_status'] == 'PASS')} ###{beside}",
            *([f"  INVALID because {ram}"] if ram else []),
            f"  Criteria Passed: {health['passed_count']}/{health['total_count']}",
            *(_criterion(c) for c in health["criteria"]), *integrity_line(results)]


def integrity_line(results: Results) -> list[str]:
    """The `integrity` verdict beside PASS/FAIL (kv-cache audit; results written before it carry none)."""
    block = results.get("integrity")
    if not isinstance(block, dict) or "verdict" not in block:
        return []
    reasons = block.get("reasons") or []
    return [f"  Integrity: {str(block['verdict']).upper()}"
            + (f" - {'; '.join(reasons)}" if reasons else " (kv-cache audit RESULT.json for the checks)")]


def storage_never_exercised(results: Results) -> list[str]:
    """Loud: a storage verdict whose storage tier moved no bytes is no verdict (the run FAILs)."""
    if _summary(results).get("storage_tier_exercised", True):
        return []
    return ["", "!" * 80, "!!! STORAGE TIER NEVER EXERCISED: 0 bytes read or written to storage in the window."
            " The verdict is FAIL.", "!!! Everything fitted in a faster tier or nothing ran: lower --cpu-mem-gb,"
            " raise --num-users or --duration.", "!" * 80]


def overall_performance(results: Results) -> list[str]:
    s = _summary(results)
    u = bool(s.get("rates_undefined_reason"))
    return ["", "### OVERALL PERFORMANCE ###",
            f"  Requests Completed: {s['total_requests']}",
            f"  Total Tokens Generated: {s['total_tokens']}",
            f"  Measured window: {s['elapsed_time']:.2f} s",
            f"  Avg Throughput (wall-clock): {_rate(s['avg_throughput_tokens_per_sec'], undefined=u)} tok/s",
            f"  Storage Throughput (tokens / summed storage time): {s['storage_throughput_tokens_per_sec']:.2f} tok/s",
            f"  Requests/sec: {_rate(s['requests_per_second'], undefined=u)}"]


def latencies(results: Results) -> list[str]:
    s, params = _summary(results), _params(results)
    lines = ["", "### END-TO-END LATENCY (Queue Wait + Storage I/O + Generation) ###",
             *latency_lines(s["end_to_end_latency_ms"]),
             "", "### PER-REQUEST STORAGE LATENCY (All I/O ops for one request, incl. evictions it caused) ###",
             *latency_lines(s["storage_io_latency_ms"])]
    if params.get("generation_mode") != "none":
        lines += ["", f"### TOKEN GENERATION LATENCY (Simulated @ {params.get('generation_ms_per_token', 0):.1f}"
                      " ms/token) ###",
                  *latency_lines(s["generation_latency_ms"], keys=("mean", "p50", "p95"))]
    return lines


def read_write_ratio(r: RequestTotals) -> str:
    """The ratio as a reader expects it: a run that wrote nothing is read-only, not a huge number."""
    if r.write_bytes == 0 and r.read_bytes > 0:
        return "∞ (read-only)"
    if r.read_write_ratio < 1e-9:
        return "0 (write-only)"
    return f"{r.read_write_ratio:.2f}"


def request_traffic(results: Results) -> list[str]:
    """What the requests asked the cache for, whichever tier answered: cache hits and entry writes, not I/Os."""
    cs = _figures(results)
    r, u = cs.requests, bool(cs.rates_undefined_reason)
    return ["", "### REQUEST TRAFFIC (KV entries requests read and wrote, any tier: RAM bytes included) ###",
            f"  Cache Hit Rate: {cs.hit_rate * 100:.1f}% (entry lookups that found the entry in any tier;"
            " every decode re-read is a lookup)",
            f"  Total Read: {r.read_gb:.2f} GiB (all tiers)",
            f"  Total Write: {r.write_gb:.2f} GiB (all tiers)",
            f"  Read/Write Ratio: {read_write_ratio(r)}",
            f"  Read Operations: {r.read_ops} cache hits ({_rate(r.read_ops_per_sec, undefined=u)}/s over the measured window)",
            f"  Write Operations: {r.write_ops} entry writes ({_rate(r.write_ops_per_sec, undefined=u)}/s over the measured"
            " window)",
            "  (demotions between tiers are not requests: they are in the tier sections below)"]


def _gpu_mark(results: Results) -> str:
    tier = results.get("measurement", {}).get("gpu_tier")
    return " [SIMULATED GPU tier: host RAM, modelled copy times]" if isinstance(tier, dict) and \
        tier.get("mode") == "simulated" else ""


TIER_TITLES = {
    TierName.GPU: "### GPU TIER (device memory copies: GPU bytes, not storage I/O) ###",
    TierName.CPU: "### CPU TIER (RAM: memcpy of RAM bytes, not storage I/O) ###",
    TierName.STORAGE: "### STORAGE PERFORMANCE (storage tier only: file I/O operations on the cache directory) ###",
}


def tier_title(results: Results, tier: str) -> str:
    """A tier section's header; the storage tier's says what its I/O is: files on the cache directory, or
    requests to a remote server (measurement.tier_backends)."""
    backends = results.get("measurement", {}).get("tier_backends") or {}
    backend = storage_backends.find(backends.get(str(TierName.STORAGE))) if isinstance(backends, dict) else None
    if tier == TierName.STORAGE and backend is not None and backend.title:
        return f"### STORAGE PERFORMANCE (storage tier only: {backend.title}) ###"
    return TIER_TITLES[tier]


def _tier_op_line(cs: dict[str, Any], window: float, tier: str, op: str) -> str | None:
    word = "written" if op == "write" else "read"
    gib = cs.get(f"tier_{tier}_kv_bytes_{word}_gb", 0.0)
    rate = cs.get(f"tier_{tier}_{op}_ops_per_sec", 0.0)
    if gib <= 0 and not rate:
        return None
    ops = cs.get(f"tier_{tier}_{op}_ops", round((rate or 0.0) * window))
    unit = "I/O operations" if tier == TierName.STORAGE else "copies"
    u = bool(cs.get("rates_undefined_reason"))
    demo = cs.get(f"tier_{tier}_demotion_{op}_gb", 0.0)
    line = (f"  {op.capitalize()}: {gib:.2f} GiB in {ops} {unit} ({_rate(rate, undefined=u)}/s),"
            f" {_rate(cs.get(f'tier_{tier}_{op}_bandwidth_gbps', 0.0), '.3f', u)} GiB/s")
    if demo > 0:
        line += f", of which demotion {demo:.2f} GiB"
    if f"{tier}_{op}_p95_ms" in cs:
        line += (f"; latency P50 {cs[f'{tier}_{op}_p50_ms']:.2f}, P95 {cs[f'{tier}_{op}_p95_ms']:.2f},"
                 f" P99 {cs[f'{tier}_{op}_p99_ms']:.2f} ms")
    return line


def _shaped_line(results: Results, tier: str) -> list[str]:
    """The tier's shaping (--tier-bandwidth / --tier-latency), from measurement.tier_shaping; none unshaped."""
    st = (results.get("measurement", {}).get("tier_shaping") or {}).get(str(tier))
    if not st:
        return []
    return [f"  Shaped: {st.get('described')}; held back {st.get('read_held_s', 0.0):.2f} s reading, "
            f"{st.get('write_held_s', 0.0):.2f} s writing (since the tiers opened, summed over the I/O workers; "
            "the sleeps are in the latencies)"]


def tier_sections(results: Results) -> list[str]:
    """One section per tier that moved bytes: its own bytes, operations, bandwidth and latency (host + device).

    An operation is one whole KV entry (streamed in chunks); storage bytes and RAM bytes never mix."""
    cs, window = _cache_stats(results), _summary(results).get("elapsed_time", 0.0)
    lines = []
    for tier in TIERS:
        body = [line for op in OPS if (line := _tier_op_line(cs, window, tier, op)) is not None]
        if body or tier == TierName.STORAGE:
            lines += ["", tier_title(results, tier), *(body or ["  No storage-tier I/O in the measured window"])]
            lines += _shaped_line(results, tier)
    if _gpu_mark(results) and any(line == TIER_TITLES[TierName.GPU] for line in lines):
        lines.append("  (GPU: simulated tier, device time modelled from the host link, not measured)")
    return lines


def tier_distribution(results: Results) -> list[str]:
    cs = _figures(results)
    return _section("CACHE TIER DISTRIBUTION (entries held at the end of the run)", [
        f"GPU Entries: {cs.gpu.entries} ({cs.gpu.memory_used_gb:.2f} GiB){_gpu_mark(results)}",
        f"CPU Entries: {cs.cpu.entries} ({cs.cpu.memory_used_gb:.2f} GiB)",
        f"Storage Entries: {cs.storage.entries} ({cs.storage.memory_used_gb:.2f} GiB)"])


def _section(title: str, rows: list[str]) -> list[str]:
    """A blank line, the ``### title ###`` heading and its rows indented by two spaces."""
    return ["", f"### {title} ###", *(f"  {row}" for row in rows)]


def storage_latency_breakdown(results: Results) -> list[str]:
    storage = _figures(results).storage
    lines = ["", "### STORAGE TIER LATENCY BREAKDOWN (Device = syscalls, Host = everything else) ###"]
    for op in OPS:
        if (s := storage.op(op)).ms("p95") is not None:
            lines.append(f"  {op.capitalize()}: device P95 {s.ms('p95', 'device'):.2f} ms,"
                         f" host P95 {s.ms('p95', 'host'):.2f} ms, total P95 {s.ms('p95'):.2f} ms")
    return lines


def cache_types(results: Results) -> list[str]:
    h = _figures(results).hits_by_kind
    return _section("CACHE TYPE BREAKDOWNS (which kind of entry each cache hit was)", [
        f"System Prompt Hits: {h.system_prompt}", f"User Cache Hits: {h.user_cache}",
        f"Multi-turn Hits: {h.multi_turn}"])


def prefix_caching(results: Results) -> list[str]:
    pc = _summary(results)["prefix_cache_stats"]
    if pc.get("prefix_hits", 0) <= 0:
        return []
    return ["", "### PREFIX CACHING ###",
            f"  Prefix Hits: {pc['prefix_hits']}",
            f"  Prefix Misses (written): {pc['prefix_misses']}",
            f"  System Prompt Reuse: {pc['system_prompt_reuse']}",
            f"  Bytes Saved: {pc['bytes_saved'] / GIB:.3f} GiB"]


def multi_turn(results: Results) -> list[str]:
    mt = _summary(results)["multi_turn_stats"]
    if mt["cache_hits"] <= 0:
        return []
    return ["", "### MULTI-TURN CONVERSATIONS ###",
            f"  History Hits: {mt['cache_hits']}  Misses: {mt['cache_misses']}  Hit Rate: {mt['hit_rate'] * 100:.1f}%"]


def qos(results: Results) -> list[str]:
    """Only the latency profile judges per-class latency; the throughput profile would mislead with it."""
    if _params(results).get("performance_profile") != "latency":
        return []
    lines = ["", "### QOS LATENCY METRICS (Informational - includes simulated generation) ###"]
    for level, q in _summary(results)["qos_metrics"].items():
        if q.get("no_data"):
            continue
        sla = q["sla"]
        lines.append(f"  {level.capitalize()}: {q['total_requests']} requests, P95 {q['latency_ms']['p95']:.2f} ms,"
                     f" P99 {q['latency_ms']['p99']:.2f} ms, SLA {_mark(sla['met'])}"
                     f" ({sla['compliance'] * 100:.1f}% within {sla['target_p95_ms']:.0f} ms)")
    return lines


def _autoscale_sample(h: dict[str, Any]) -> str:
    """One autoscaling_stats entry: its contract fields (t_s, users, users_after, action), then the sample's
    figures when the entry has them (every entry of the qos and capacity shapes does)."""
    users = h.get("users")
    after = h.get("users_after", users)
    t_s = h.get("t_s")
    line = (f"  t={t_s if t_s is None else format(t_s, '7.1f')}s users {users if users is None else format(users, '5d')}"
            f" -> {after if after is None else format(after, '5d')}  {str(h.get('action', '')):<10}")
    if any(k not in h for k in ("tokens_per_sec", "storage_read_gbps", "storage_write_gbps", "saturation_level")):
        return line.rstrip()
    rp = h.get("read_p95_ms")
    return (f"{line} {h['tokens_per_sec']:10.1f} tok/s  storage {h['storage_read_gbps'] + h['storage_write_gbps']:.3f} GiB/s"
            f"  read p95 {rp if rp is None else round(rp, 1)} ms  saturation {h['saturation_level']:.2f}")


def autoscaling(results: Results) -> list[str]:
    """The autoscaling section, from the shape-summary contract alone (core/autoscale.py SUMMARY_KEYS: a
    document of any shape, or one written before the contract, is completed by the same summarise); the
    qos and capacity lines are printed when their shape's own keys are there."""
    s = _summary(results)
    if not s.get("autoscaling_summary"):
        return []
    history = s.get("autoscaling_stats") or []
    params = results.get("run_parameters") or {}
    auto = summarise(s["autoscaling_summary"], history, params.get("autoscaler_mode") or "unknown",
                     params.get("num_users"))
    lines = ["", f"### AUTOSCALING ({auto['mode']} mode) ###",
             f"  Users: {auto['initial_users']} -> {auto['final_users']} over {auto['samples']} samples,"
             f" {auto['total_scale_events']} scale events",
             *(_autoscale_sample(h) for h in history)]
    if "peak_user_count" in auto:
        lines.append(f"  Peak: {auto['peak_throughput_tokens_per_sec']:.1f} tok/s at {auto['peak_user_count']} users"
                     f" ({'found' if auto.get('peak_found') else 'not reached within the duration'})")
    elif "target_saturation" in auto:
        lines.append(f"  Most users within target saturation {auto['target_saturation']:.2f}:"
                     f" {auto.get('max_users_within_target')}")
    return lines


def rag(results: Results) -> list[str]:
    stats = _summary(results).get("rag_stats")
    if not stats:
        return []
    return ["", "### RAG ###",
            f"  Documents retrievable: {stats['documents_retrievable']}; chunk reads that hit: {stats['chunk_hits']},"
            f" missed (recomputed and stored): {stats['chunk_misses']}"]


def validation(results: Results) -> list[str]:
    val = results.get("validation")
    if not val:
        return []
    hr, rw = val["comparison"]["cache_hit_rate"], val["comparison"]["read_write_ratio"]
    return ["", "### VALIDATION ###",
            f"  {_mark(val['passed'])} cache hit rate: benchmark {hr['benchmark'] * 100:.1f}% vs trace"
            f" {hr['trace'] * 100:.1f}% (error {hr['error_pct']:.1f}%, limit 5%)",
            f"  read/write ratio: benchmark {rw['benchmark']:.2f} vs trace {rw['trace']:.2f} (informational)"]


_SKIP_KIND_WORDS = {"malformed": "malformed", "absurd": "absurd", "beyond_context_window": "beyond the context window",
                    "beyond_max_conversations": "beyond the conversation limit", "failed_request": "failed requests",
                    "other": "other"}


def trace_rows(results: Results) -> list[str]:
    """Each replayed trace file: its own rows and skips, by kind (malformed, absurd, beyond the window,
    ...) with the reasons of each, from the pass that read the whole file (or the furthest one, said so);
    then what the run replayed of it over every pass."""
    replay = results.get("trace_replay")
    if not replay or not replay.get("stats"):
        return []
    lines = ["", "### TRACE ROWS ###"]
    for st in replay.get("stats", []):
        lines.append(f"  {st.get('path')} ({st.get('format')}): {_file_rows(st)}{_replayed(st.get('replayed'))}")
    return lines


def _file_rows(st: dict[str, Any]) -> str:
    """`10 rows read: 2 used, 8 skipped (malformed 8: bad_json 8)`, of the whole file or of what was read."""
    rows = int(st.get("rows", 0))
    skipped = int(st.get("skipped_malformed", 0)) + int(st.get("skipped_other", 0))
    reasons: dict[str, int] = st.get("skipped_reasons") or {}
    by_kind: dict[str, dict[str, int]] = {}
    for reason, count in reasons.items():  # (a reason of no known kind is a malformed row's)
        by_kind.setdefault(skip_kind(reason, True), {})[reason] = int(count)
    counts = st.get("skipped_by_kind") or {kind: sum(r.values()) for kind, r in by_kind.items()}
    parts = [f"{_SKIP_KIND_WORDS.get(kind, kind)} {n:,}"
             + (f" ({', '.join(f'{r} {c:,}' for r, c in by_kind[kind].items())})"
                if set(by_kind.get(kind, ())) - {kind} else "")
             for kind, n in counts.items() if n]
    if not st.get("complete", True):
        whole = "not the whole file: the run stopped reading it there"
    elif st.get("stopped_at"):
        whole = f"up to the {st['stopped_at'].replace('_', ' ')} limit: the rest of the file was not read"
    else:
        whole = "the whole file"
    text = f"{rows + skipped:,} rows read ({whole}): {rows:,} used, {skipped:,} skipped"
    return text + (f": {'; '.join(parts)}" if parts else "")


def _replayed(tally: dict[str, Any] | None) -> str:
    """`; 25 rows sent to the load generator over 3 passes (2 complete)` (the generator may hold the last
    one still when the window ends: `measurement.requests_issued` says what was issued)."""
    if not tally:
        return ""
    passes, done = int(tally.get("passes", 0)), int(tally.get("passes_complete", 0))
    over = f"in {passes} pass ({'complete' if done else 'not complete'})" if passes == 1 else \
        f"over {passes} passes ({done} complete)"
    return f"; {int(tally.get('rows_sent', 0)):,} rows sent to the load generator {over}"


def phases(results: Results) -> list[str]:
    lines = []
    for name, ph in (results.get("phases") or {}).items():
        if "skipped" in ph:
            lines.append(f"  Before the window, {name}: skipped ({ph['skipped']})")
        else:
            lines.append(f"  Before the window, {name}: {ph.get('entries', ph.get('chunks', 0))} entries,"
                         f" {ph['gib']:.2f} GiB in {ph['seconds']:.1f} s (not counted above)")
    return lines


def notes(results: Results) -> list[str]:
    if _params(results).get("generation_mode") == "none":
        note = "  - Pure storage I/O benchmark (no generation simulation)"
    else:
        note = "  - End-to-end latency includes simulated GPU inference (modelled time; it holds no I/O worker)"
    return ["", "NOTES:", note, LINE]


def what_it_measured(results: Results) -> list[str]:
    """The report's last lines, two sentences a first run can act on: whether it measured a filling cache or one
    at capacity, how full the storage tier got, and the flag for a steady state (measurement.storage_fill)."""
    meas = results.get("measurement") or {}
    fill = meas.get("storage_fill")
    if not isinstance(fill, dict) or "peak_used_bytes" not in fill:
        return []
    if str(meas.get("stop_reason") or "").startswith("storage error"):  # not a cache question: the error is
        return ["", "This run measured no steady state: a storage error stopped it (the reason is in the verdict "
                    "above, under Not Stopped By A Storage Error).",
                "Its figures cover only the time before the error; correct what the reason names and run again."]
    peak, cap = fill.get("peak_used_bytes") or 0, fill.get("capacity_bytes")
    of = f"{peak / GIB:.2f} GiB" + (f" of its {cap / GIB:.2f} GiB ({100 * peak / cap:.0f} %)" if cap else
                                     " (no capacity limit)")
    if fill.get("reached_capacity"):
        return ["", f"This run measured a cache at capacity: the storage tier filled {of} and evicted "
                    f"{fill.get('evictions', 0)} entries, so its writes also paid for evictions.",
                "Its figures are a steady state from the first eviction on; --precondition fills the tier before "
                "the window, so that all of the window is."]
    if not peak:  # every entry stayed in the tiers above: a smaller --storage-capacity-gb changes nothing
        return ["", "This run measured no storage: the storage tier stored nothing, as every entry fit in the tiers "
                    "above it (GPU and CPU memory).",
                "To measure the storage tier, give a smaller --cpu-mem-gb (and --gpu-mem-gb), or more --num-users "
                "or a longer --duration, so that entries reach it."]
    return ["", f"This run measured a filling cache, not a steady state: the storage tier grew to {of} and "
                "evicted nothing.",
            f"For a steady state, give --storage-capacity-gb below {max(peak / GIB, 0.01):.2f} (what this run "
            "stored) or a longer --duration, so that writes evict older entries as on a full cache."]


# A run that completed requests gets every section; one that completed none says so and shows how it ran.
SECTIONS: tuple[Section, ...] = (
    header, run_facts, storage_assessment, storage_never_exercised, overall_performance, latencies, request_traffic,
    tier_sections, tier_distribution, storage_latency_breakdown, catalogue_section.report_lines, cache_types,
    prefix_caching, multi_turn, qos,
    autoscaling, rag, validation, trace_rows, measurement, blocklatency.report_lines, phases, notes,
    what_it_measured,
)
EMPTY_RUN_SECTIONS: tuple[Section, ...] = (header, no_requests, measurement)
EMPTY_RUN_VERDICT: tuple[Section, ...] = (header, no_requests, storage_assessment, storage_never_exercised,
                                          catalogue_section.report_lines, trace_rows, measurement, phases)


def report_lines(results: Results, closing: bool = True) -> list[str]:
    """The report's lines; `closing=False` leaves out its last two sentences (what_it_measured), for a caller that
    prints where the results went before them, so that they stay the last lines."""
    summary = results.get("summary")
    if summary and not summary.get("total_requests"):  # a summary of an empty window: its verdict, not its zeros
        sections = EMPTY_RUN_VERDICT
    else:
        sections = SECTIONS if summary else EMPTY_RUN_SECTIONS
    return [line for section in sections for line in section(results) if closing or section is not what_it_measured]


def print_report(results: Results, out: TextIO, closing: bool = True) -> None:
    out.write("".join(line + "\n" for line in report_lines(results, closing)))
