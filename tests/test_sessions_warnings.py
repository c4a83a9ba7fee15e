"""The sessions console report groups a cell's per-replication warnings: with --replications K each replication
adds its own "config @ N sessions: ..." warning, the same text but for its figures, and the list printed K lines
per cell and kind (99 for one recipe run). The console prints them once, with how many of the cell's replications
said it and the figures that differ; the JSON keeps every warning."""

import copy
import io
import json
from argparse import Namespace
from pathlib import Path

from kv_cache.cli.report_cmd import report_command
from kv_cache.render.sessions import grouped_warnings, print_table

SESSIONS = Path(__file__).parent / "fixtures" / "results" / "kv-cache-sessions-1.json"
TIER = ("none @ 1 sessions: the offload tiers cannot hold even one session's context: they hold 0.20 GiB usable "
        "but one session reaches {} tokens x 16 KiB = {} GiB; raise --cpu-mem-gb")
REPEATED = [TIER.format("37,466", "0.57"), "none @ 1 sessions: the offload tier was never read in the window",
            TIER.format("39,939", "0.61"), TIER.format("38,507", "0.59")]


def _doc(warnings: list[str], k: int | None = 3) -> dict:
    doc = json.loads(SESSIONS.read_text())
    doc["warnings"] = list(warnings)
    for r in doc["rungs"]:
        if k:
            r["replications"] = {"k": k, "seeds": list(range(k))}
    return doc


def _warnings_section(text: str) -> list[str]:
    section = text.split("\nWarnings (", 1)[1].split("\n\n", 1)[0]
    return ("Warnings (" + section).splitlines()


def test_repeated_per_replication_warnings_print_once_with_their_count_and_figures():
    doc = _doc(REPEATED)
    kept = copy.deepcopy(doc)
    out = io.StringIO()
    print_table(doc, out)
    lines = _warnings_section(out.getvalue())
    assert lines[0] == "Warnings (2 lines for 4 warnings; cells marked ! above):"
    assert lines[1:] == [
        f"  - {TIER.format('37,466', '0.57')} (in 3 of the 3 replications; figures differ: "
        "37,466 / 39,939 / 38,507; 0.57 / 0.61 / 0.59)",
        "  - none @ 1 sessions: the offload tier was never read in the window",
    ]
    assert doc == kept  # the document (what the JSON holds) keeps every warning as it was


def test_a_warning_said_by_some_replications_says_how_many_and_identical_texts_list_no_figures():
    same = "none @ 1 sessions: the storage tier never filled nor evicted (peak 1.45 of 18.81 GiB)"
    lines = grouped_warnings([TIER.format("1", "0.1"), TIER.format("2", "0.2"), same, same], _doc([])["rungs"])
    assert lines == [f"{TIER.format('1', '0.1')} (in 2 of the 3 replications; figures differ: 1 / 2; 0.1 / 0.2)",
                     f"{same} (in 2 of the 3 replications)"]


def test_other_cells_and_uncelled_warnings_stay_apart():
    other = TIER.replace("none @ 1", "dram @ 1")
    warnings = [TIER.format("1", "0.1"), other.format("2", "0.2"), "a warning of no cell 1", "a warning of no cell 2"]
    assert grouped_warnings(warnings, _doc([])["rungs"]) == warnings
    # without a replication count (one run) a repeat says how many times, not "of the K replications"
    lines = grouped_warnings([TIER.format("1", "0.1"), TIER.format("2", "0.2")], _doc([], k=None)["rungs"])
    assert lines == [f"{TIER.format('1', '0.1')} (said 2 times; figures differ: 1 / 2; 0.1 / 0.2)"]


def test_warnings_not_repeated_print_exactly_as_before():
    doc = json.loads(SESSIONS.read_text())
    out = io.StringIO()
    print_table(doc, out)
    assert _warnings_section(out.getvalue()) == [f"Warnings ({len(doc['warnings'])}; cells marked ! above):",
                                                 *(f"  - {w}" for w in doc["warnings"])]


def test_kv_cache_report_on_a_sessions_document_groups_the_same_way(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_doc(REPEATED)))
    out = io.StringIO()
    assert report_command(Namespace(result=str(path), plots=None), [], out) == 0
    lines = _warnings_section(out.getvalue())
    assert lines[0] == "Warnings (2 lines for 4 warnings; cells marked ! above):"
    assert lines[1].endswith("(in 3 of the 3 replications; figures differ: 37,466 / 39,939 / 38,507; 0.57 / 0.61 / 0.59)")
    assert json.loads(path.read_text())["warnings"] == REPEATED
