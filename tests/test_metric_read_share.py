"""The storage tier's read share (of operations: fio's rwmixread / 100; of bytes), a metric catalogue entry:
its values on constructed recorders, and the keys reaching a run's JSON, its console report and a
`kv-cache merge` document of two ranks, recomputed there from the ranks' summed recorders."""

import io
import json

import pytest

from kv_cache.cli import main
from kv_cache.metrics import catalogue
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render import catalogue_section
from kv_cache.render.console import print_report
from kv_cache.results.merge import merge_documents
from kv_cache.storage.base import IOResult
from tests.test_metric_catalogue import _rank_doc, _recorder

MIB = 1 << 20
OPS, BYTES = "storage_read_ops_share_ratio", "storage_read_bytes_share_ratio"


def test_the_entries():
    for key in (OPS, BYTES):
        m = catalogue.get(key)
        assert m.merge == catalogue.RECOMPUTE and m.unit == "" and m.spec == ".3f" and m.summary
    assert "rwmixread" in catalogue.get(OPS).label


def test_values_on_a_constructed_recorder():
    # reads of 3 MiB and 1 MiB, one write of 2 MiB: 2 of 3 operations, 4 of 6 MiB
    v = catalogue.values(_recorder())
    assert v[OPS] == 2 / 3 and v[BYTES] == 4 / 6
    small_reads = catalogue.values(_recorder(reads=((MIB, MIB),) * 3, writes=((9 * MIB, 9 * MIB),)))
    assert small_reads[OPS] == 0.75 and small_reads[BYTES] == 0.25  # the two shares differ with the sizes


def test_one_direction_and_none():
    assert catalogue.values(_recorder(writes=()))[OPS] == 1.0
    only_writes = catalogue.values(_recorder(reads=()))
    assert only_writes[OPS] == 0.0 and only_writes[BYTES] == 0.0  # measured: no read (not undefined)
    empty = catalogue.values(RunMetrics())
    assert empty[OPS] is None and empty[BYTES] is None


def test_other_tiers_do_not_count_and_cut_off_bytes_do():
    m = _recorder(reads=((MIB, MIB),), writes=((MIB, MIB),))
    m.record_io("cpu", "read", IOResult(50 * MIB, 50 * MIB, 10, 5, 5), int(9e9), "decode")  # RAM tier
    assert catalogue.values(m)[OPS] == 0.5 and catalogue.values(m)[BYTES] == 0.5
    m.io[("storage", "read")].partial_bytes += 2 * MIB  # moved in the window by a read cut off at its end
    assert catalogue.values(m)[OPS] == 0.5 and catalogue.values(m)[BYTES] == 3 / 4


def test_a_merge_recomputes_from_the_ranks_sums():
    a = _recorder(reads=((MIB, MIB),), writes=((MIB, MIB),) * 3)  # 1 of 4 operations
    b = _recorder(reads=((MIB, MIB),) * 4, writes=())  # 4 of 4
    merged = merge_documents([_rank_doc(a, 0), _rank_doc(b, 1)])["summary"]["metrics"]
    assert merged[OPS] == 5 / 8  # not the mean of the ranks' 0.25 and 1.0
    assert merged[BYTES] == 5 / 8


def _console(doc) -> str:
    out = io.StringIO()
    print_report(doc, out)
    return out.getvalue()


@pytest.mark.slow  # a real run of two processes (wall clock)
def test_a_real_run_reaches_json_console_and_a_merge_of_two_ranks(tmp_path, capsys):
    out = tmp_path / "X.json"
    argv = ["--model", "tiny-1b", "--num-users", "2", "--duration", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--seed", "7", "--cache-dir", str(tmp_path / "cache"), "--output", str(out), "--processes", "2"]
    assert main(argv) == 0
    ranks = [tmp_path / f"X_rank{r}.json" for r in range(2)]
    docs = [json.loads(p.read_text()) for p in ranks]
    ops = []
    for doc in docs:  # each rank's JSON
        block, io_ = doc["summary"]["metrics"], doc["recorder"]["io"]
        ops.append((io_.get("storage/read", {"ops": 0})["ops"], io_["storage/write"]["ops"]))
        assert ops[-1][1] > 0 and block[OPS] == ops[-1][0] / sum(ops[-1])
        assert 0.0 <= block[BYTES] <= 1.0
    # the console report of a rank's JSON (`kv-cache report`)
    capsys.readouterr()
    assert main(["report", str(ranks[0])]) == 0
    shown = capsys.readouterr().out
    assert catalogue_section.TITLE in shown
    assert f"  {catalogue.get(OPS).label}: {docs[0]['summary']['metrics'][OPS]:.3f}" in shown
    # `kv-cache merge` of the two rank files: recomputed from their summed operations, and in its report
    again = tmp_path / "M.json"
    assert main(["merge", *map(str, ranks), "--output", str(again)]) == 0
    capsys.readouterr()
    doc = json.loads(again.read_text())
    value = doc["summary"]["metrics"][OPS]
    assert value == pytest.approx(sum(r for r, _ in ops) / sum(r + w for r, w in ops))
    assert doc["summary"]["metrics"][BYTES] == json.loads(out.read_text())["summary"]["metrics"][BYTES]
    assert main(["report", str(again)]) == 0  # the merged document's console report
    line = f"  {catalogue.get(OPS).label}: {value:.3f}"
    assert line in capsys.readouterr().out and line in _console(doc)


@pytest.mark.slow  # a real run (wall clock)
def test_a_runs_own_console_report_prints_it(tmp_path, capsys):
    out = tmp_path / "one.json"
    assert main(["--model", "tiny-1b", "--num-users", "2", "--duration", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
                 "--seed", "7", "--cache-dir", str(tmp_path / "cache"), "--output", str(out)]) == 0
    block = json.loads(out.read_text())["summary"]["metrics"]
    printed = capsys.readouterr().out
    assert f"  {catalogue.get(OPS).label}: {block[OPS]:.3f}" in printed
    assert f"  {catalogue.get(BYTES).label}: {block[BYTES]:.3f}" in printed
