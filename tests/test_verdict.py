"""The run's own verdict criteria: every profile FAILs on failed requests, a storage-error stop, or a storage
tier that moved nothing; a failed read is a miss. Summaries built from hand-filled RunMetrics (no I/O)."""

from __future__ import annotations

import threading

import pytest

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.console import report_lines
from kv_cache.results.summary import build_summary, harness_keys
from kv_cache.results.verdict import NEVER_EXERCISED, run_criteria
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.schema import BenchConfig
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.base import IOResult

MIB = 1 << 20
MS = 1_000_000


def _metrics(storage_bytes: int) -> RunMetrics:
    m = RunMetrics()
    m.open_window(0)
    t = 1_000_000_000
    if storage_bytes:
        m.record_io("storage", "write", IOResult(storage_bytes, storage_bytes, 5 * MS, 4 * MS, MS), t, "prefill")
        m.record_io("storage", "read", IOResult(storage_bytes, storage_bytes, 4 * MS, 3 * MS, MS), t, "decode")
    else:
        m.record_io("cpu", "write", IOResult(MIB, MIB, MS, MS, 0), t, "prefill")
    m.count("cache_hits", 3, end_ns=t)
    m.count("cache_misses", 1, end_ns=t)
    m.record_request("interactive", t, e2e_ns=10 * MS, storage_ns=MS, generation_ns=MS, prefill_ns=MS,
                     decode_ns=None, generate_tokens=10, context_tokens=100, turn=1, read_bytes=MIB, written_bytes=MIB)
    m.close_window(2_000_000_000)
    return m


def _health(m: RunMetrics, profile: str, **kw) -> dict:
    cfg = BenchConfig()
    crit = cfg.performance_criteria
    s = build_summary(m, {}, cfg.qos_profiles, profile, crit, storage_expected=True, **kw)
    return s


@pytest.mark.parametrize("profile", ["latency", "throughput"])
@pytest.mark.parametrize("case, storage, kw, failing", [
    ("clean", MIB, {}, None),
    ("failed requests", MIB, {"error_rate": 14 / 35}, "Failed Requests <= 0%"),
    ("storage stop", MIB, {"fatal_error": "ENOSPC: no space left"}, "Not Stopped By A Storage Error"),
    ("never exercised", 0, {}, "Storage Tier Exercised (bytes moved > 0)"),
])
def test_every_profile_fails_what_it_cannot_vouch_for(profile, case, storage, kw, failing):
    s = _health(_metrics(storage), profile, **kw)
    health = s["cache_stats"]["storage_health"]
    failed = {c["name"] for c in health["criteria"] if not c["passed"]}
    if profile == "throughput":  # a few MiB in 2 s is under the 0.1 GiB/s floors: ignore those here
        failed = {n for n in failed if "Bandwidth" not in n}
    if failing is None:
        assert failed == set()
    else:
        assert failing in failed and health["overall_status"] == "FAIL"
        assert harness_keys(s)["overall_passed"] is False


def test_never_exercised_is_named_in_criteria():
    crit = run_criteria({"tier_storage_kv_bytes_read_gb": 0.0}, 0.0, 0.0, None, True, 5)
    assert crit[-1]["actual"] == NEVER_EXERCISED and crit[-1]["passed"] is False
    assert [c["name"] for c in run_criteria({}, 0.0, 0.0, None, False)] == [
        "Failed Requests <= 0%", "Not Stopped By A Storage Error"]


def test_console_says_never_exercised_loudly():
    s = _health(_metrics(0), "latency")
    s["storage_tier_exercised"] = False
    text = "\n".join(report_lines({"summary": s}))
    assert "STORAGE TIER NEVER EXERCISED" in text and "FAIL" in text


class _FailingStore:
    name = "nvme"

    def read(self, key, bufs, stop=None, verify=False):
        raise OSError(5, "Input/output error")

    def write(self, key, nbytes, bufs, stop=None):
        return IOResult(nbytes, nbytes, 1, 1, 0)

    def delete(self, key):
        pass


def test_a_failed_read_is_a_miss_never_a_hit():
    m = RunMetrics()
    m.open_window()
    cache = MultiTierCache([Tier("nvme", _FailingStore(), float("inf"))], EvictionConfig(), m, 2,
                           threading.Event())
    cache.allocate("k", 10, 1024, bufs=None)
    with pytest.raises(OSError):
        cache.read("k", bufs=None)
    c = m.snapshot_counters()
    assert c.get("cache_hits", 0) == 0 and c.get("cache_misses", 0) == 1
    assert m.errors["storage_read"] == 1


def test_an_incomplete_run_is_never_pass():
    from kv_cache.results.verdict import mark_incomplete, verdict_keys, window_fraction

    health = {"overall_status": "PASS", "criteria": [{"name": "x", "passed": True}], "passed_count": 1,
              "total_count": 1}
    results = {"overall_passed": True, "summary": {"cache_stats": {"storage_health": health}}}
    assert verdict_keys(results) == {"verdict": "PASS", "window_fraction": 1.0}
    mark_incomplete(results, window_fraction(5.5, 20.0), "interrupted")
    assert results["overall_passed"] is False and results["verdict"] == "INCOMPLETE"
    assert results["window_fraction"] == 0.275
    assert health["overall_status"] == "INCOMPLETE" and (health["passed_count"], health["total_count"]) == (1, 2)
    assert health["criteria"][-1] == {"name": "Measured Window Completed", "target": "100%",
                                      "actual": "28% (interrupted)", "unit": "", "passed": False}
    assert window_fraction(30.0, 20.0) == 1.0 and window_fraction(1.0, 0.0) == 1.0


def test_marking_missing_ranks_twice_lists_the_criterion_once():
    """The --processes writer names how a lost rank ended after the merge has marked it: one criterion."""
    from kv_cache.results.verdict import RANKS_CRITERION, mark_missing_ranks

    merged = {"summary": {"cache_stats": {"storage_health": {"criteria": [], "overall_status": "PASS"}}}}
    mark_missing_ranks(merged, [1], 2)
    mark_missing_ranks(merged, [1], 2, {1: "killed by SIGKILL"})
    criteria = merged["summary"]["cache_stats"]["storage_health"]["criteria"]
    assert [c["name"] for c in criteria] == [RANKS_CRITERION] and len(merged["notes"]) == 1
    assert merged["lost_ranks"] == [{"rank": 1, "ended": "killed by SIGKILL"}]
