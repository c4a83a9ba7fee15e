"""The printed report: each section from a hand-made results dict, and the whole text unchanged.

tests/fixtures/report/*.txt are the report rendered from *.json, so any difference in wording, spacing or
rounding shows up here. They were regenerated deliberately when the report gained per-tier sections (issue 13):
regenerate them only for an intended change of the text, and read the diff.
"""

import io
import json
from pathlib import Path

import pytest

from kv_cache.render import console, measurement_section
from kv_cache.render.console import print_report

FIXTURES = Path(__file__).parent / "fixtures" / "report"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", CASES)
def test_printed_report_is_byte_for_byte_unchanged(name):
    out = io.StringIO()
    print_report(load(name), out)
    assert out.getvalue() == (FIXTURES / f"{name}.txt").read_text()


def test_report_is_the_sections_in_order():
    results = load("full")
    expected = [line for section in console.SECTIONS for line in section(results)]
    assert console.report_lines(results) == expected
    assert expected[1] == console.LINE and expected[-1] == console.LINE


def test_no_completed_requests_prints_warning_and_measurement_only():
    lines = console.report_lines(load("no_requests"))
    assert "WARNING: No requests completed during benchmark!" in lines
    assert "### MEASUREMENT (what was timed and how) ###" in lines
    assert not any(line.startswith("### OVERALL") for line in lines)
    # a run interrupted before its window has no measurement either
    assert console.report_lines({"interrupted": True})[-1] == "WARNING: No requests completed during benchmark!"


def cache_stats(**overrides) -> dict:
    cs = {"total_read_bytes": 10, "total_write_bytes": 5, "read_write_ratio": 2.0, "cache_hit_rate": 0.5,
          "total_read_gb": 1.0, "total_write_gb": 0.5, "read_iops": 3, "read_ops_per_sec": 1.5, "write_iops": 2,
          "write_ops_per_sec": 1.0}
    cs.update(overrides)
    return {"summary": {"cache_stats": cs}}


@pytest.mark.parametrize("overrides, shown", [
    ({}, "2.00"),
    ({"total_write_bytes": 0, "read_write_ratio": 10.0}, "∞ (read-only)"),
    ({"total_read_bytes": 0, "read_write_ratio": 0.0}, "0 (write-only)"),
])
def test_request_traffic_read_write_ratio(overrides, shown):
    lines = console.request_traffic(cache_stats(**overrides))
    assert lines[1].startswith("### REQUEST TRAFFIC")
    assert f"  Read/Write Ratio: {shown}" in lines
    assert "  Read Operations: 3 cache hits (1.50/s over the measured window)" in lines


def tier_stats(**cs) -> dict:
    return {"summary": {"elapsed_time": 2.0, "cache_stats": cs}}


def test_tier_sections_keep_storage_bytes_and_ram_bytes_apart():
    results = tier_stats(tier_cpu_kv_bytes_read_gb=90.0, tier_cpu_read_ops_per_sec=10.0, tier_cpu_read_ops=20,
                         tier_storage_kv_bytes_read_gb=40.0, tier_storage_read_ops_per_sec=2.0,
                         tier_storage_read_bandwidth_gbps=20.0, storage_read_p50_ms=1.0, storage_read_p95_ms=2.0,
                         storage_read_p99_ms=3.0)
    lines = console.tier_sections(results)
    storage = lines[lines.index(console.TIER_TITLES["storage"]) + 1:]
    assert storage == ["  Read: 40.00 GiB in 4 I/O operations (2.00/s), 20.000 GiB/s;"
                       " latency P50 1.00, P95 2.00, P99 3.00 ms"]  # count from the rate when the key is absent
    cpu = lines[lines.index(console.TIER_TITLES["cpu"]) + 1]
    assert cpu.startswith("  Read: 90.00 GiB in 20 copies") and console.TIER_TITLES["gpu"] not in lines
    assert console.tier_sections(tier_stats())[-1] == "  No storage-tier I/O in the measured window"


def test_common_phrase_hits_are_not_printed():
    cs = {"system_prompt_hits": 1, "common_phrase_hits": 0, "user_cache_hits": 2, "multi_turn_hits": 3}
    assert not any("Common Phrase" in line for line in console.cache_types({"summary": {"cache_stats": cs}}))


@pytest.mark.parametrize("fs, kind", [("tmpfs", "RAM-backed"), ("nfs4", "network"), ("fuse.sshfs", "network"),
                                      ("ext4", "block device"), ("xfs", "block device"), (None, None)])
def test_filesystem_kind(fs, kind):
    assert measurement_section.filesystem_kind(fs) == kind


def test_tmpfs_is_not_reported_as_bypassing_the_page_cache():
    meas = {"filesystem": "tmpfs", "io_mode": "buffered", "chunk_bytes": 1 << 20}
    line = measurement_section._io_line(meas)
    assert "fadvise" not in line and "files in RAM on tmpfs" in line
    assert "fadvise" in measurement_section._io_line({**meas, "filesystem": "ext4"})


def test_block_device_gap_is_explained():
    bd = {"name": "vda", "bytes_read": 3 << 30, "bytes_written": 1 << 30, "tool_bytes_read": 1 << 30,
          "tool_bytes_written": 2 << 30}
    lines = measurement_section._block_device_line(bd)
    assert "Device minus tool: +2.000 GiB read, -1.000 GiB written" in lines[1]
    assert any("other processes" in line for line in lines) and any("page cache" in line for line in lines)


def test_autoscaling_absent_or_present():
    assert console.autoscaling({"summary": {"autoscaling_summary": None, "autoscaling_stats": []}}) == []
    auto = {"mode": "capacity", "initial_users": 2, "final_users": 5, "samples": 0, "total_scale_events": 3,
            "peak_throughput_tokens_per_sec": 10.0, "peak_user_count": 4, "peak_found": False}
    lines = console.autoscaling({"summary": {"autoscaling_summary": auto}})
    assert lines == ["", "### AUTOSCALING (capacity mode) ###", "  Users: 2 -> 5 over 0 samples, 3 scale events",
                     "  Peak: 10.0 tok/s at 4 users (not reached within the duration)"]
    qos_mode = console.autoscaling(load("full"))
    assert qos_mode[-1] == "  Most users within target saturation 0.80: 4"
    assert "read p95 None ms" in qos_mode[-2]  # a sample without reads says so rather than inventing 0


def test_storage_assessment_formats_each_unit():
    health = {"overall_status": "FAIL", "passed_count": 1, "total_count": 3, "criteria": [
        {"name": "Hit", "target": 0.3, "actual": 0.25, "unit": "ratio", "passed": False},
        {"name": "Lat", "target": 200.0, "actual": 1.234, "unit": "ms", "passed": True},
        {"name": "Word", "target": "ok", "actual": "bad", "unit": "", "passed": False}]}
    assert console.storage_assessment({"summary": {"cache_stats": {"storage_health": health}}}) == [
        "", "### STORAGE PERFORMANCE ASSESSMENT: FAIL [X] ###", "  Criteria Passed: 1/3",
        "  [X] Hit: 25.0% (target: 30%)", "  [OK] Lat: 1.23ms (target: 200.0ms)", "  [X] Word: bad (target: ok)"]


def test_generation_and_qos_sections_follow_the_parameters():
    full = load("full")
    assert any("TOKEN GENERATION LATENCY" in line for line in console.latencies(full))
    assert console.qos(full)[1].startswith("### QOS LATENCY METRICS")
    none = load("capacity_readonly")  # generation none, throughput profile
    assert not any("TOKEN GENERATION LATENCY" in line for line in console.latencies(none))
    assert console.qos(none) == []
    assert console.notes(none)[2] == "  - Pure storage I/O benchmark (no generation simulation)"


def test_optional_sections_are_empty_when_absent():
    results = load("writeonly")
    for section in (console.prefix_caching, console.multi_turn, console.rag, console.validation, console.phases):
        assert section(results) == []
    assert console.measurement({}) == []


def test_measurement_section():
    lines = console.measurement(load("full"))
    assert lines[1] == "### MEASUREMENT (what was timed and how) ###"
    assert "  Open loop: 14 arrivals admitted, 2 rejected (admission queue full)" in lines
    assert lines[-1] == "  ERRORS: 2 (first: OSError: boom)"
    plain = console.measurement(load("capacity_readonly"))
    assert not any(line.startswith(("  Block device", "  Open loop", "  ERRORS")) for line in plain)


def test_latency_lines():
    assert console.latency_lines({"mean": 1.0, "p999": 2.5}, keys=("mean", "p999", "p99")) == [
        "  Mean: 1.00 ms", "  P99.9: 2.50 ms", "  P99: 0.00 ms"]


GIB_ = 2**30


def _with_fill(fill: dict) -> dict:
    results = load("full")
    results.setdefault("measurement", {})["storage_fill"] = fill
    return results


def test_a_filling_cache_is_said_in_the_reports_last_two_sentences():
    """Issue 33.5: the quick start's last lines say what it measured: a filling cache, how full the tier got, and
    the flag for a steady state."""
    results = _with_fill({"capacity_bytes": 68.55 * GIB_, "peak_used_bytes": 13.55 * GIB_, "evictions": 0,
                          "reached_capacity": False, "warning": "never reached"})
    last = console.report_lines(results)[-2:]
    assert last[0] == ("This run measured a filling cache, not a steady state: the storage tier grew to 13.55 GiB "
                       "of its 68.55 GiB (20 %) and evicted nothing.")
    assert last[1].startswith("For a steady state, give --storage-capacity-gb below 13.55 ")
    assert "--duration" in last[1]
    out = io.StringIO()
    print_report(results, out)
    assert out.getvalue().rstrip("\n").endswith(last[1])


def test_a_cache_at_capacity_and_one_without_a_limit_say_so():
    full = console.what_it_measured(_with_fill({"capacity_bytes": 10 * GIB_, "peak_used_bytes": 9.5 * GIB_,
                                                "evictions": 42, "reached_capacity": True, "warning": None}))
    assert full[1].startswith("This run measured a cache at capacity: the storage tier filled 9.50 GiB of its "
                              "10.00 GiB (95 %) and evicted 42 entries")
    assert "--precondition" in full[2]
    unlimited = console.what_it_measured(_with_fill({"capacity_bytes": None, "peak_used_bytes": 2 * GIB_,
                                                     "evictions": 0, "reached_capacity": False, "warning": "w"}))
    assert "2.00 GiB (no capacity limit) and evicted nothing" in unlimited[1]
    assert console.what_it_measured({"measurement": {}}) == [] and console.what_it_measured({}) == []
    # the storage tier stored nothing: no "--storage-capacity-gb below 0.01" advice, the RAM tiers' flags instead
    unused = console.what_it_measured(_with_fill({"capacity_bytes": 10 * GIB_, "peak_used_bytes": 0, "evictions": 0,
                                                  "reached_capacity": False, "warning": "w"}))
    assert unused[1].startswith("This run measured no storage: the storage tier stored nothing")
    assert "--cpu-mem-gb" in unused[2] and "--storage-capacity-gb" not in "".join(unused)
    # a storage error stopped the run (an entry larger than the tier): neither a cache's fill nor RAM's fault
    stopped = _with_fill({"capacity_bytes": 2 * GIB_, "peak_used_bytes": 0, "evictions": 0,
                          "reached_capacity": False, "warning": "w"})
    stopped["measurement"]["stop_reason"] = "storage error"
    said = console.what_it_measured(stopped)
    assert said[1].startswith("This run measured no steady state: a storage error stopped it")
    assert "fit in the tiers above" not in "".join(said) and "--storage-capacity-gb below" not in "".join(said)


def test_the_results_path_comes_before_the_closing_sentences(tmp_path):
    """Issue 33.5: a run's last lines are the two sentences saying what it measured, so 'Results written to' (and
    the spreadsheet's line) come before them, not after."""
    from types import SimpleNamespace

    from kv_cache.benchmarks.standard.outputs import write_outputs

    results = _with_fill({"capacity_bytes": 68.55 * GIB_, "peak_used_bytes": 13.55 * GIB_, "evictions": 0,
                          "reached_capacity": False, "warning": "never reached"})
    settings = SimpleNamespace(outputs=SimpleNamespace(output=str(tmp_path / "r.json"), xlsx_output=None))
    out = io.StringIO()
    write_outputs(settings, results, out)
    lines = out.getvalue().rstrip("\n").split("\n")
    assert lines[-2:] == console.what_it_measured(results)[1:]
    assert lines[-4] == f"Results written to {tmp_path / 'r.json'}" and lines.count(lines[-1]) == 1


def _assessed(fs: str, verdict: str, reasons: list[str]) -> dict:
    health = {"overall_status": "PASS", "passed_count": 1, "total_count": 1,
              "criteria": [{"name": "Requests Completed > 0", "passed": True, "actual": 3, "target": "> 0",
                            "unit": ""}]}
    return {"summary": {"cache_stats": {"storage_health": health}}, "measurement": {"filesystem": fs},
            "integrity": {"verdict": verdict, "reasons": reasons}}


def test_a_storage_tier_on_ram_says_why_it_is_invalid_on_its_own_line():
    """`--cache-dir /dev/shm/x` printed `PASS [OK]` above `Integrity: INVALID` with another check's reason first:
    the RAM reason comes first beside the verdict and on a line of its own, right under it."""
    lines = console.storage_assessment(_assessed("tmpfs", "invalid", [
        "window: 11 operations in flight at the window's end",
        "io_setup: INVALID because the storage tier is on tmpfs, which is RAM, so no storage was measured"]))
    assert lines[1] == ("### STORAGE PERFORMANCE ASSESSMENT: PASS [OK] ### - but integrity INVALID: the storage "
                        "tier is on tmpfs, which is RAM")
    assert lines[2].startswith("  INVALID because the storage tier is on tmpfs, which is RAM: no storage device "
                               "was measured")
    assert "RAM baseline" in lines[2] and "--cache-dir" in lines[2]
    assert lines[-1].startswith("  Integrity: INVALID - window:")


@pytest.mark.parametrize(("fs", "verdict"), [("ext4", "invalid"), ("tmpfs", "ok"), (None, "invalid")])
def test_no_ram_line_unless_the_tier_is_on_ram_and_invalid(fs, verdict):
    lines = console.storage_assessment(_assessed(fs, verdict, ["window: too many in flight"]))
    assert not any(line.startswith("  INVALID because") for line in lines)
    assert console.ram_tier_reason(_assessed(fs, verdict, [])) is None
