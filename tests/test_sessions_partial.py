"""A sessions document that stopped early is reported for what it is (issue 17, 'report, compare ... accept
every document kind'): `report` says why it stopped and prints the rungs it completed; `compare` of two
sessions runs that share no rung says so instead of printing an empty table."""

import copy
import io
import json
from argparse import Namespace
from pathlib import Path

from kv_cache.cli.compare_cmd import compare_command
from kv_cache.cli.report_cmd import report_command
from kv_cache.render.sessions import print_table

SESSIONS = Path(__file__).parent / "fixtures" / "results" / "kv-cache-sessions-1.json"


def _doc() -> dict:
    return json.loads(SESSIONS.read_text())


def _report(tmp_path, doc) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = io.StringIO()
    assert report_command(Namespace(result=str(path), plots=None), [], out) == 0
    return out.getvalue()


def _rung_table(doc) -> str:
    full = io.StringIO()
    print_table(doc, full)
    return full.getvalue().split("\nEffective capacity")[0]  # the rung rows, before the ladder's summary


def test_a_ladder_stopped_by_enospc_says_so_and_prints_its_rungs(tmp_path):
    doc = _doc()
    stopped = {**doc, "summary": None, "stop_reason": "storage error: ENOSPC (No space left on device) at /x"}
    text = _report(tmp_path, stopped)
    first, rest = text.split("\n", 1)
    assert first == (f"{tmp_path / 's.json'}: a sessions run stopped by a storage error (ENOSPC (No space left on "
                     "device) at /x), with 1 completed rung(s)")
    assert rest == _rung_table(doc)  # the same rows the full report has
    assert "interrupted" not in text and "Effective capacity" not in text


def test_an_interrupted_ladder_says_interrupted_and_prints_its_rungs(tmp_path):
    doc = _doc()
    text = _report(tmp_path, {**doc, "summary": None, "interrupted": True})
    assert text.startswith(f"{tmp_path / 's.json'}: an interrupted sessions run with 1 rung(s)\n")
    assert "none                 1" in text


def test_an_interrupted_ladder_whose_rungs_never_got_the_work_control_is_reported(tmp_path):
    # a ladder interrupted (or stopped) before the end wrote its rungs without work["flagged"]: `report`
    # raised KeyError 'flagged'
    doc = _doc()
    for r in doc["rungs"]:
        r["work"].pop("flagged", None)
        r["work"].pop("flag_reasons", None)
    text = _report(tmp_path, {**doc, "summary": None, "interrupted": True})
    assert "none                 1" in text and " ok " in text


def test_an_interrupted_ladder_with_no_rung_prints_only_the_line(tmp_path):
    text = _report(tmp_path, {**_doc(), "summary": None, "rungs": [], "interrupted": True})
    assert text == f"{tmp_path / 's.json'}: an interrupted sessions run with 0 rung(s)\n"


def test_compare_of_sessions_runs_without_a_common_rung_says_why(tmp_path):
    a, b = _doc(), copy.deepcopy(_doc())
    b["rungs"][0]["sessions"] = 8
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    out, err = io.StringIO(), io.StringIO()
    args = Namespace(results=[str(pa), str(pb)], allow_different_workloads=True, plots=None, json=None)
    assert compare_command(args, [], out, err) == 0
    assert out.getvalue().strip().splitlines()[-1] == (
        "No common rung: no (configuration, sessions) rung is in every file (A has none @ 1; B has none @ 8), "
        "so nothing is compared.")


def test_compare_with_a_common_rung_has_no_such_line(tmp_path):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(SESSIONS.read_text())
    pb.write_text(SESSIONS.read_text())
    out = io.StringIO()
    args = Namespace(results=[str(pa), str(pb)], allow_different_workloads=True, plots=None, json=None)
    assert compare_command(args, [], out, io.StringIO()) == 0
    assert "No common rung" not in out.getvalue() and "none @ 1 sessions tok/s/GPU" in out.getvalue()
