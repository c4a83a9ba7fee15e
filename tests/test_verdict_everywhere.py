"""The integrity verdict is printed wherever PASS is: the report's assessment line, the merged table and the
--processes verdict line, index.html's headline, the XLSX summary sheet (issue 28 item 6)."""

import copy
import json
from pathlib import Path

from kv_cache.render.console import storage_assessment
from kv_cache.render.html import headline
from kv_cache.render.merged_table import integrity_sentence, merged_table
from kv_cache.render.xlsx import write_spreadsheet
from kv_cache.results import integrity as integ

FX = Path(__file__).parent / "fixtures" / "integrity"
RUN, MERGED = json.loads((FX / "run.json").read_text()), json.loads((FX / "merged.json").read_text())


def _on_ram(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["measurement"].update(filesystem="tmpfs", filesystem_kind="memory")
    doc["integrity"] = integ.audit_facts(integ.facts_from_ours(doc))
    return doc


def test_a_ram_tier_says_why_on_the_pass_line_itself():
    lines = storage_assessment(_on_ram(RUN))
    i, line = next((i, x) for i, x in enumerate(lines) if "ASSESSMENT" in x)
    # the PASS line names the RAM tier first; the line under it, of its own, says why that is INVALID (issue 33.5)
    assert "PASS" in line and line.endswith("but integrity INVALID: the storage tier is on tmpfs, which is RAM")
    assert lines[i + 1].startswith("  INVALID because the storage tier is on tmpfs, which is RAM: no storage device "
                                   "was measured")
    clean = next(x for x in storage_assessment(RUN) if "ASSESSMENT" in x)
    assert "integrity" not in clean  # OK: the Integrity line below says so


def test_the_merged_table_names_the_verdict_the_integrity_and_each_ranks():
    text = merged_table(MERGED)
    assert "Verdict PASS; integrity OK" in text and " integrity  host / file" in text
    bad = copy.deepcopy(MERGED)
    bad["integrity"] = integ.merged_integrity({0: {"verdict": "ok"}, 1: {"verdict": "invalid", "reasons": ["x"]}},
                                              bad["integrity"])
    text = merged_table(bad)
    assert "integrity INVALID: rank 1: x" in text
    assert any(line.split()[:1] == ["1"] and "INVALID" in line for line in text.splitlines())


def test_index_html_and_the_xlsx_summary_carry_verdict_and_integrity(tmp_path):
    rows = dict(headline(_on_ram(RUN)))
    assert rows["verdict"] == "PASS" and rows["integrity"].startswith("INVALID: io_setup: INVALID because")
    written = write_spreadsheet(_on_ram(RUN), str(tmp_path / "r.xlsx"))
    import openpyxl  # noqa: PLC0415

    ws = openpyxl.load_workbook(written.path)["Summary"]
    row = dict(zip([c.value for c in ws[1]], [c.value for c in ws[2]], strict=True))
    assert row["verdict"] == "PASS" and row["integrity"] == "invalid" and "RAM" in row["integrity_reasons"]
    assert integrity_sentence({"verdict": "PASS"}) == "Verdict PASS; integrity NOT RECORDED"


def test_a_merged_verdict_line_names_a_storage_tier_on_ram_first():
    """Issue 33.5: a RAM-tier INVALID says why wherever PASS is printed, before any other check's reason."""
    doc = {"verdict": "PASS", "integrity": {"verdict": "invalid", "reasons": [
        "rank 0: window: 11 operations in flight at the window's end",
        "rank 0: io_setup: INVALID because the storage tier is on tmpfs, which is RAM, so no storage was measured"]}}
    assert integrity_sentence(doc) == ("Verdict PASS; integrity INVALID: rank 0: io_setup: INVALID because the storage "
                                       "tier is on tmpfs, which is RAM, so no storage was measured (+1 more: kv-cache "
                                       "audit)")
