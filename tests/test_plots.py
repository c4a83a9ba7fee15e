"""Plots and the HTML page from a results document, and `kv-cache report` on a saved file."""

import io
import json
from argparse import Namespace
from pathlib import Path

import pytest

from kv_cache.cli import main
from kv_cache.cli.report_cmd import load_results, report_command
from kv_cache.errors import UsageError
from kv_cache.metrics import histograms as H
from kv_cache.report.html import write_html
from kv_cache.report.plots import draw_plots

pytest.importorskip("matplotlib")
FIXTURES = Path(__file__).parent / "fixtures" / "report"
PNG = b"\x89PNG\r\n\x1a\n"
MS = 1_000_000


def standard_results() -> dict:
    rows = [{"t_s": float(t), "seconds": 1.0, "requests": t, "storage_read_bytes": t << 20,
             "storage_read_gibps": t / 1024, "storage_read_p95_ms": 2.0 + t, "occupancy_storage_bytes": t << 30,
             "queue_depth": t % 2, "in_flight": 3, "active_users": 4} for t in range(1, 6)]
    hist = H.summary(H.from_values([ms * MS for ms in range(1, 50)]))
    return {"schema_version": "kv-cache-results/1", "time_series": {"rows": rows},
            "latency_histograms": {"storage_read_total": hist, "storage_read_device": hist},
            "run_parameters": {"model": "micro", "num_users": 4}}


def sessions_results() -> dict:
    def rung(cfg, n, est):
        return {"tiers": cfg, "sessions": n,
                "throughput_tokens_per_s_per_gpu": {"estimate": est, "low": est - 5, "high": est + 5}}
    return {"schema_version": "kv-cache-sessions/1", "mode": "sessions", "parameters": {"ladder": [2, 4]},
            "rungs": [rung("none", 2, 10.0), rung("none", 4, 15.0), rung("dram", 2, 12.0), rung("dram", 4, 20.0)]}


def test_standard_results_give_cdf_throughput_and_occupancy(tmp_path):
    pngs = draw_plots(standard_results(), tmp_path / "p")
    assert [p.name for p in pngs] == ["latency_cdf.png", "throughput.png", "occupancy.png"]
    assert all(p.read_bytes().startswith(PNG) and p.stat().st_size > 5000 for p in pngs)
    page = write_html(standard_results(), pngs, tmp_path / "p").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<th>num_users</th><td>4</td>" in page


def test_sessions_results_give_the_ladder(tmp_path):
    pngs = draw_plots(sessions_results(), tmp_path)
    assert [p.name for p in pngs] == ["ladder.png"]


def test_nothing_to_plot_draws_nothing_and_the_page_says_so(tmp_path):
    assert draw_plots({"summary": {}}, tmp_path) == []
    assert "No plots" in write_html({}, [], tmp_path).read_text()


def test_report_command_reprints_a_saved_result_and_plots_it(tmp_path):
    out = io.StringIO()
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**standard_results(), **json.loads((FIXTURES / "full.json").read_text())}))
    assert report_command(Namespace(result=str(path), plots=str(tmp_path / "plots")), [], out) == 0
    text = out.getvalue()
    assert text.startswith((FIXTURES / "full.txt").read_text()) and "Plots written to" in text
    assert (tmp_path / "plots" / "index.html").exists()


def test_report_command_on_sessions_results(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sessions_results()))
    out = io.StringIO()
    report_command(Namespace(result=str(path), plots=None), [], out)
    assert "interrupted sessions run with 4 rung(s)" in out.getvalue()


def test_bad_result_files_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not a JSON results file"):
        load_results(str(bad))
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a kv-cache results file"):
        load_results(str(bad))
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.strip().startswith("kv-cache report: error: cannot read")
