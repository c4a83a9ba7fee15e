"""Which registered backend served each tier: run documents carry measurement.tier_backends, and so do
sessions documents (per rung and per tier configuration) and merged documents (measurement.tier_backends
when every rank agrees, each rank's under measurement.per_rank)."""

from __future__ import annotations

import json

import pytest
from test_merge import _ranks
from test_sessions_tiers import argv  # noqa: F401  (the sessions tests' fixture)

from kv_cache.cli import main
from kv_cache.results.merge import merge_documents
from kv_cache.results.sessions_document import tier_backends

BACKENDS = {"cpu": "memory", "storage": "file"}


def _with_backends(docs, per_rank):
    for doc, backends in zip(docs, per_rank, strict=True):
        doc["measurement"]["tier_backends"] = backends
    return docs


def test_a_merge_names_the_backends_the_ranks_agree_on():
    docs, _ = _ranks()
    merged = merge_documents(_with_backends(docs, [BACKENDS] * len(docs)))
    assert merged["measurement"]["tier_backends"] == BACKENDS
    assert [r["tier_backends"] for r in merged["measurement"]["per_rank"]] == [BACKENDS] * len(docs)


def test_a_merge_of_ranks_with_different_backends_keeps_each_ranks():
    docs, _ = _ranks()
    other = {"cpu": "memory", "storage": "gds"}
    merged = merge_documents(_with_backends(docs, [BACKENDS, other, BACKENDS]))
    assert merged["measurement"]["tier_backends"] is None  # no one answer for the run
    assert [r["tier_backends"] for r in merged["measurement"]["per_rank"]] == [BACKENDS, other, BACKENDS]


def test_the_sessions_document_key_per_tier_configuration():
    rungs = [{"tiers": "none", "tier_backends": {}}, {"tiers": "dram+storage", "tier_backends": BACKENDS},
             {"tiers": "dram+storage", "tier_backends": BACKENDS}]
    assert tier_backends(rungs) == {"none": {}, "dram+storage": BACKENDS}


@pytest.mark.slow  # runs one rung in real time
def test_a_sessions_run_records_its_tier_backends(argv, tmp_path):  # noqa: F811
    assert main(["sessions", *argv("--ladder", "2", "--tiers", "dram+storage", "--cpu-mem-gb", "0.05")]) == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["tier_backends"] == {"dram+storage": BACKENDS}
    assert all(r["tier_backends"] == BACKENDS for r in data["rungs"])
