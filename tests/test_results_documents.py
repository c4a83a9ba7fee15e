"""The results model: one kept file of each kind and version, read by `load` through the version map and
written back byte for byte; the one write policy, used by every writer (a kept earlier file each)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kv_cache.benchmarks.standard.outputs import write_merged
from kv_cache.cli import main
from kv_cache.errors import DocumentError, UsageError
from kv_cache.results.documents import VERSIONS, MergedDocument, RunDocument, SessionsDocument, load
from kv_cache.results.merge import merge_documents
from kv_cache.results.write import write_document

FIXTURES = Path(__file__).parent / "fixtures" / "results"
KINDS = {"kv-cache-results/1": RunDocument, "kv-cache-sessions/1": SessionsDocument,
         "kv-cache-merged/1": MergedDocument}


def test_every_version_in_the_map_has_a_kept_file():
    assert set(VERSIONS) == set(KINDS)
    for version in VERSIONS:
        assert (FIXTURES / f"{version.replace('/', '-')}.json").is_file()


@pytest.mark.parametrize("version, cls", KINDS.items())
def test_load_reads_each_kind_and_round_trips_byte_for_byte(version, cls, tmp_path):
    path = FIXTURES / f"{version.replace('/', '-')}.json"
    doc = load(path)
    assert type(doc) is cls and doc.schema_version == version and doc.source == str(path)
    assert doc.to_json() == json.loads(path.read_text())
    written = write_document(str(tmp_path / "again.json"), doc)
    assert Path(written.path).read_bytes() == path.read_bytes()  # every key, the same bytes
    assert type(load(json.loads(path.read_text()))) is cls  # a mapping, too


def test_typed_accessors_of_a_run_a_rank_and_a_merge():
    run = load(FIXTURES / "kv-cache-results-1.json")
    assert run.kind == "run" and run.rank is None and run.world_size == 1 and run.run_id and run.mergeable
    assert run.window["seconds"] == pytest.approx(2.0, abs=0.1) and run.window["start_unix"] is not None
    assert run.storage["io_mode"] and run.storage["run_dir"] and run.summary["total_requests"] >= 0
    ranks = [load(p) for p in sorted((FIXTURES / "ranks").glob("*.json"))]
    assert [r.rank for r in ranks] == [0, 1] and {r.world_size for r in ranks} == {2}
    assert ranks[0].run_id == ranks[1].run_id
    merged = load(FIXTURES / "kv-cache-merged-1.json")
    assert merged.kind == "merged" and merged.world_size == 2 and merged.run_id == ranks[0].run_id
    assert len(merged.per_rank) == 2 and merged.window["kind"] == "common (barrier-aligned)"
    assert set(merged.storage) == {"0", "1"}
    sessions = load(FIXTURES / "kv-cache-sessions-1.json")
    assert sessions.kind == "sessions" and sessions.rungs and sessions.window["seconds"] == 2.0


def test_the_kept_rank_files_merge_into_the_kept_merge():
    ranks = sorted(str(p) for p in (FIXTURES / "ranks").glob("*.json"))
    merged = merge_documents(ranks)
    kept = json.loads((FIXTURES / "kv-cache-merged-1.json").read_text())
    assert merged["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"] == pytest.approx(
        kept["summary"]["cache_stats"]["tier_storage_read_bandwidth_gbps"])
    assert merged["latency_ms"]["end_to_end"] == kept["latency_ms"]["end_to_end"]


@pytest.mark.parametrize("content, words", [
    ('{"summary": {}}', "not a kv-cache results file (no schema_version)"),
    ('{"schema_version": "kv-cache-results/9"}', "unknown schema_version 'kv-cache-results/9'"),
    ("[1]", "a JSON list, not an object"),
    ("{oops", "is not a JSON results file"),
])
def test_load_refuses_what_is_not_a_known_document_in_one_line(tmp_path, content, words):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(DocumentError, match=words.replace("(", r"\(").replace(")", r"\)")) as exc:
        load(path)
    assert isinstance(exc.value, UsageError) and "\n" not in str(exc.value)


@pytest.mark.parametrize("name", ["kv-cache-results-1.json", "kv-cache-sessions-1.json", "kv-cache-merged-1.json"])
def test_report_reads_every_kind(name, capsys):
    assert main(["report", str(FIXTURES / name)]) == 0
    out = capsys.readouterr()
    assert out.out and not out.err


def test_report_of_a_file_without_schema_version_is_exit_2(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text('{"summary": {"total_requests": 1}}')
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no schema_version" in err and err.count("\n") == 1


class _Rank0:
    """A RankGroup of two ranks seen from rank 0: gather hands back both documents."""

    rank, size = 0, 2

    def __init__(self, docs):
        self.docs = docs

    def gather(self, obj):
        return self.docs


def test_mpi_rank0_keeps_an_earlier_merged_document(tmp_path):
    ranks = [json.loads(p.read_text()) for p in sorted((FIXTURES / "ranks").glob("*.json"))]
    target = tmp_path / "kvcache_merged.json"
    target.write_text('{"older": 1}')
    settings = SimpleNamespace(outputs=SimpleNamespace(output=str(tmp_path / "r_rank0.json")), merged_output=str(target))
    out = io.StringIO()
    write_merged(settings, _Rank0(ranks), ranks[0], out)
    assert json.loads((tmp_path / "kvcache_merged.json.1").read_text()) == {"older": 1}
    assert load(target).kind == "merged" and "kept as" in out.getvalue()


def test_a_failed_merged_write_goes_to_a_named_fallback(tmp_path, monkeypatch):
    from kv_cache.results import write as write_mod

    ranks = [json.loads(p.read_text()) for p in sorted((FIXTURES / "ranks").glob("*.json"))]
    target = tmp_path / "ro" / "m.json"
    real = write_mod.write_json_atomic

    def fail(path, data):
        if str(path) == str(target):
            raise OSError(30, "Read-only file system")
        return real(path, data)
    monkeypatch.setattr(write_mod, "write_json_atomic", fail)
    monkeypatch.setattr(write_mod.tempfile, "gettempdir", lambda: str(tmp_path))
    out = io.StringIO()
    settings = SimpleNamespace(outputs=SimpleNamespace(output=str(tmp_path / "r_rank0.json")), merged_output=str(target))
    write_merged(settings, _Rank0(ranks), ranks[0], out)
    fallback = out.getvalue().rsplit("written to ", 1)[1].strip()
    assert fallback.startswith(str(tmp_path / "kv-cache-fallback-")) and load(fallback).kind == "merged"


def test_kv_cache_merge_keeps_an_existing_output(tmp_path):
    for p in (FIXTURES / "ranks").glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "out.json").write_text('{"older": 1}')
    assert main(["merge", str(tmp_path), "--output", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json.1").read_text()) == {"older": 1}
    assert load(tmp_path / "out.json").kind == "merged"
