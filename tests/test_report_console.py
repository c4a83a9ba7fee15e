"""The printed report: each section from a hand-made results dict, and the whole text unchanged.

tests/fixtures/report/*.txt were rendered from *.json by the single 195-line print_report that the
section functions replaced, so any difference in wording, spacing or rounding shows up here.
"""

import io
import json
from pathlib import Path

import pytest

from kv_cache.report.console import print_report

FIXTURES = Path(__file__).parent / "fixtures" / "report"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", CASES)
def test_printed_report_is_byte_for_byte_unchanged(name):
    out = io.StringIO()
    print_report(load(name), out)
    assert out.getvalue() == (FIXTURES / f"{name}.txt").read_text()
