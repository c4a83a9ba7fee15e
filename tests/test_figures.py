"""The summary's typed figures (kv_cache/results/figures.py): built once, written out at the edge with the
keys, order and bytes the documents had before the tree existed, and read back from documents of any age."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kv_cache.results.documents import load
from kv_cache.results.figures import CacheStats, Figures, Percentiles, StorageHealth, TierOp
from kv_cache.storage.tiername import TierName
from tests.golden_summary_cases import cases, dumps

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden" / "summary_figures.json"


@pytest.fixture(scope="module")
def built() -> dict:
    return cases()


def test_built_summaries_are_byte_identical_to_the_golden(built):
    """The golden was written by the summary code before the figures were typed."""
    assert dumps(built) + "\n" == GOLDEN.read_text()


@pytest.mark.parametrize("name", ["merged", "rank0_alone", "empty_latency", "empty_throughput", "fatal"])
def test_round_trip(built, name):
    written = built[name]["cache_stats"]
    figures = CacheStats.from_json(written)
    assert CacheStats.from_json(figures.to_json()) == figures
    assert json.dumps(figures.to_json()) == json.dumps(written)  # keys, order and values as written
    whole = Figures.from_json(built[name])
    assert Figures.from_json(whole.to_json()) == whole and whole.cache == figures
    head = list(built[name])[:list(built[name]).index("cache_stats") + 1]  # the summary's keys the tree makes
    assert json.dumps(whole.to_json()) == json.dumps({k: built[name][k] for k in head})


def test_typed_reading_of_a_built_summary(built):
    f = Figures.from_json(built["merged"])
    assert f.e2e.p95 == built["merged"]["end_to_end_latency_ms"]["p95"] and f.e2e.count == 2  # a merge adds count
    assert f.total_requests == 2 and f.tokens_per_sec == built["merged"]["avg_throughput_tokens_per_sec"]
    assert Figures.from_json(built["empty_latency"]).e2e.count is None  # a run's own block has no count
    cs = f.cache
    raw = built["merged"]["cache_stats"]
    assert cs.storage.read.bytes_gb == raw["tier_storage_kv_bytes_read_gb"]
    assert cs.tier("nvme") is cs.storage and cs.tier(TierName.CPU) is cs.cpu
    assert cs.storage.write.ms("p95", "device") == raw["storage_write_device_p95_ms"]
    assert cs.cpu.read.latency is None and "cpu_read_p50_ms" not in raw  # no samples, no block, no keys
    assert cs.requests.read_ops == raw["read_iops"] and cs.hits == raw["cache_hits"]
    assert cs.health is not None and cs.health.overall_status == raw["storage_health"]["overall_status"]
    assert [c.name for c in cs.health.criteria] == [c["name"] for c in raw["storage_health"]["criteria"]]


def test_documents_give_their_figures():
    doc = load(FIXTURES / "results" / "kv-cache-results-1.json")
    raw = doc.data["summary"]["cache_stats"]
    assert doc.figures.cache.storage.read.bandwidth_gbps == raw.get("tier_storage_read_bandwidth_gbps")
    merged = load(FIXTURES / "results" / "kv-cache-merged-1.json")
    assert merged.figures == Figures.from_json(merged.data["summary"])


def test_an_older_document_s_missing_keys_read_as_none():
    """A document written before a figure existed (or the MLPerf tool's, or none at all) reads None there, so
    each reader keeps the default it had with `.get(key, default)`."""
    old = {"cache_hit_rate": 0.5, "tier_storage_kv_bytes_read_gb": 2.0, "storage_read_p95_ms": 3.0}
    cs = CacheStats.from_json(old)
    assert cs.hit_rate == 0.5 and cs.hits is None and cs.storage.read.bytes_gb == 2.0
    assert cs.storage.write.bytes_gb is None and cs.storage.read.bandwidth_gbps is None
    assert cs.storage.read.latency == Percentiles(p95=3.0) and cs.storage.read.device is None
    assert cs.storage.read.ms("p95", "device") is None and cs.storage.read.ms("p95") == 3.0
    assert cs.health is None and cs.storage_gb_moved == 2.0
    assert Figures.from_json(None) == Figures() == Figures.from_json({"cache_stats": "not a block"})
    assert Figures.from_json({"end_to_end_latency_ms": {"p95": 4.0}}).e2e.p95 == 4.0
    assert CacheStats.from_json({"storage_health": {"overall_status": "PASS"}}).health == StorageHealth("PASS")


def test_a_tier_op_without_samples_writes_no_percentile_keys():
    cs = CacheStats()
    assert TierOp().ms() is None
    assert not any(k.endswith("_ms") for k in cs.to_json()) and "storage_health" not in cs.to_json()


def _written_cache_stats():
    for path in sorted(FIXTURES.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        summary = doc.get("summary") if isinstance(doc, dict) else None
        if isinstance(summary, dict) and isinstance(summary.get("cache_stats"), dict):
            yield path.relative_to(FIXTURES), summary["cache_stats"]


def test_every_fixture_s_cache_stats_reads_back_whole():
    """Documents of older kv-cache versions and the MLPerf tool's own rank files under tests/fixtures: each key
    they hold is a figure of the tree, read back with its value (nothing dropped, nothing misread)."""
    seen = 0
    for path, written in _written_cache_stats():
        again = CacheStats.from_json(written).to_json()
        assert [k for k in written if k not in again] == [], path
        assert {k: again[k] for k in written} == written, path
        seen += 1
    assert seen >= 20
