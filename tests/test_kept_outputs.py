"""Every writer keeps an existing file (issue 17, 'a kept output for every writer'): the spreadsheet and its
CSV fallback, the trace log, the plots and the pages of `report --plots` / `run --plots` / `compare --plots`.
Each earlier file is renamed PATH.1 (.2, ...), the new one is written atomically, and the output names what
was kept."""

import io
import json
import os
from argparse import Namespace
from pathlib import Path

import pytest

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.render import xlsx
from kv_cache.storage.tracelog import IOTraceWriter

REPORT = Path(__file__).parent / "fixtures" / "report"
RENDER = Path(__file__).parent / "fixtures" / "render"


def full_results() -> dict:
    return json.loads((REPORT / "full.json").read_text())


def test_keep_existing_numbers_upwards_and_ignores_non_files(tmp_path):
    target = tmp_path / "r.csv"
    assert keep_existing(target) is None
    target.write_text("one")
    assert keep_existing(target) == f"{target}.1"
    target.write_text("two")
    assert keep_existing(target) == f"{target}.2"
    assert (tmp_path / "r.csv.1").read_text() == "one" and (tmp_path / "r.csv.2").read_text() == "two"
    assert keep_existing(os.devnull) is None and os.path.exists(os.devnull)


def test_atomic_target_leaves_nothing_half_written(tmp_path):
    target = tmp_path / "page.html"
    with pytest.raises(RuntimeError), atomic_target(target) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("killed mid-write")
    assert os.listdir(tmp_path) == []
    with atomic_target(target) as tmp:
        Path(tmp).write_text("whole")
    assert os.listdir(tmp_path) == ["page.html"] and target.read_text() == "whole"


def test_spreadsheet_keeps_an_existing_xlsx(tmp_path):
    openpyxl = pytest.importorskip("openpyxl")
    path = tmp_path / "r.xlsx"
    path.write_bytes(b"an earlier spreadsheet")
    written = xlsx.write_spreadsheet(full_results(), str(path))
    assert written.path == str(path) and written.kept_as == f"{path}.1"
    assert (tmp_path / "r.xlsx.1").read_bytes() == b"an earlier spreadsheet"
    assert "Summary" in openpyxl.load_workbook(path).sheetnames
    assert sorted(os.listdir(tmp_path)) == ["r.xlsx", "r.xlsx.1"]  # no temporary file left


def test_csv_spreadsheet_keeps_an_existing_csv(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("earlier\n")
    written = xlsx.write_spreadsheet(full_results(), str(path))
    assert written.kept_as == f"{path}.1" and (tmp_path / "r.csv.1").read_text() == "earlier\n"
    header = path.read_text().splitlines()[0].split(",")
    assert list(xlsx.run_parameter_columns(full_results()))[0] == header[0]


def test_run_output_names_the_kept_spreadsheet(tmp_path):
    from kv_cache.benchmarks.standard.outputs import write_outputs

    sheet = tmp_path / "r.csv"
    sheet.write_text("earlier\n")
    settings = Namespace(outputs=Namespace(output=str(tmp_path / "r.json"), xlsx_output=str(sheet)))
    out = io.StringIO()
    write_outputs(settings, full_results(), out)
    assert f"Spreadsheet written to {sheet} (an earlier file was kept as {sheet}.1)" in out.getvalue()


@pytest.mark.parametrize("name", ["t.log", "t.csv.zst"])
def test_trace_log_keeps_an_existing_log(tmp_path, name):
    if name.endswith(".zst"):
        pytest.importorskip("zstandard")
    path = tmp_path / name
    path.write_bytes(b"an earlier trace")
    writer = IOTraceWriter(str(path))
    writer.log("write", 10, "cpu", "k", "prefill")
    writer.close()
    assert writer.kept_as == f"{path}.1" and (tmp_path / f"{name}.1").read_bytes() == b"an earlier trace"
    assert path.stat().st_size > 0 and path.read_bytes() != b"an earlier trace"


def test_trace_log_to_dev_null_keeps_nothing():
    writer = IOTraceWriter(os.devnull)
    writer.close()
    assert writer.kept_as is None


def test_report_plots_keep_each_earlier_file_and_say_so(tmp_path):
    pytest.importorskip("matplotlib")
    from kv_cache.cli.report_cmd import report_command

    doc = tmp_path / "r.json"
    doc.write_text((RENDER / "ext4_direct.json").read_text())
    plots = tmp_path / "plots"
    report_command(Namespace(result=str(doc), plots=str(plots)), [], io.StringIO())
    first = {name: (plots / name).read_bytes() for name in os.listdir(plots)}
    assert "index.html" in first and any(n.endswith(".png") for n in first)
    out = io.StringIO()
    report_command(Namespace(result=str(doc), plots=str(plots)), [], out)
    names = set(os.listdir(plots))
    assert names == set(first) | {f"{n}.1" for n in first}  # every earlier file kept, nothing else
    assert all((plots / f"{n}.1").read_bytes() == data for n, data in first.items())
    line = out.getvalue().strip().splitlines()[-1]
    assert "earlier files kept: " in line and "index.html -> index.html.1" in line


def test_compare_plots_keep_the_earlier_page(tmp_path):
    pytest.importorskip("matplotlib")
    from kv_cache.render.compare_plots import write_compare_html

    docs = [json.loads((RENDER / "ext4_direct.json").read_text()), json.loads((RENDER / "shm_buffered.json").read_text())]
    first = write_compare_html(["a.json", "b.json"], docs, ["table"], [], tmp_path)
    first_text = first.read_text()
    write_compare_html(["a.json", "b.json"], docs, ["other table"], [], tmp_path)
    assert (tmp_path / "index.html.1").read_text() == first_text
    assert "other table" in (tmp_path / "index.html").read_text()


def test_a_kept_trace_log_is_named_in_the_run_notes(tmp_path):
    from kv_cache.serving.tiers import TierSet, open_tiers
    from kv_cache.settings.run import StorageSettings, TierSettings

    path = tmp_path / "t.log"
    path.write_text("earlier\n")
    tier_set = TierSet(tiers=[])
    try:
        open_tiers(TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path / "cache")),
                   StorageSettings(chunk_bytes=1 << 20), str(path), tier_set)
        assert tier_set.notes == [f"an earlier trace log at {path} was kept as {path}.1"]
        assert tier_set.backend_names() == {"storage": "tracelog"}
    finally:
        tier_set.close()
    assert (tmp_path / "t.log.1").read_text() == "earlier\n"
