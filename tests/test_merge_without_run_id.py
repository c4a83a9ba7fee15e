"""Rank files without a run id (stripped, or written before kv-cache recorded one) merge only when they
are one run's by every other sign: the same command and totals, and windows that overlap in time."""

from __future__ import annotations

import pytest
from test_merge import _ranks

from kv_cache.cli import main
from kv_cache.results.merge import MergeError, merge_documents
from kv_cache.results.write import dumps


def _strip(docs, command="kv-cache --num-users 8"):
    for d in docs:
        d.pop("run_id")
        d["run_parameters"]["command"] = command
    return docs


def _write(tmp_path, docs):
    for rank, d in enumerate(docs):
        (tmp_path / f"kvcache_rank{rank}.json").write_text(dumps(d))


def test_one_runs_ranks_without_a_run_id_still_merge():
    docs, _ = _ranks()
    merged = merge_documents(_strip(docs))
    assert merged["ranks"] == 3 and merged["missing_ranks"] == []


def test_disjoint_ranks_of_two_runs_are_refused_naming_the_files(tmp_path, capsys):
    first, _ = _ranks(spans=[(1000.0, 1010.0)] * 3)
    second, _ = _ranks(spans=[(5000.0, 5010.0)] * 3)
    docs = _strip([first[0], second[1], first[2]])  # ranks 0, 1, 2: none twice, none missing
    _write(tmp_path, docs)
    assert main(["merge", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "without a run id" in err and "do not overlap" in err
    assert "kvcache_rank1.json" in err  # the file of the other run is named
    assert not (tmp_path / "kvcache_merged.json").exists()


def test_ranks_without_a_run_id_and_different_commands_are_refused():
    docs, _ = _ranks()
    _strip(docs)
    docs[1]["run_parameters"]["command"] = "kv-cache --num-users 16"
    for r, d in enumerate(docs):
        d["_source"] = f"r{r}.json"
    with pytest.raises(MergeError, match=r"not one run's .*r0.json, r2.json; r1.json"):
        merge_documents(docs)
