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
from kv_cache.render.html import write_html
from kv_cache.render.plots import draw_plots

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


def test_ladder_has_a_ttft_panel_a_log_axis_for_doubling_rungs_and_names_the_shaping(tmp_path):
    from PIL import Image

    from kv_cache.render.plots import _doubling

    assert _doubling([8, 16, 32, 64]) and _doubling([2, 4, 8]) and not _doubling([4, 6, 8]) and not _doubling([8, 16])
    from kv_cache.render.plots import _log_axis

    refined = {"parameters": {"ladder": [4, 8, 16]}, "rungs": [{"sessions": n} for n in (4, 5, 6, 8, 10, 11, 12, 16)]}
    assert _log_axis(refined)  # the bisection's extra rungs keep the doubling ladder's log axis
    assert not _log_axis({"rungs": refined["rungs"]}) and _log_axis({"rungs": [{"sessions": n} for n in (2, 4, 8)]})
    doc = sessions_results()
    doc.setdefault("parameters", {})["tier_shaping"] = {"bandwidth_gbps": 4.0, "latency_ms": None}
    doc["parameters"]["slo_ttft_p90_s"] = 2.0
    (png,) = draw_plots(doc, tmp_path)
    meta = Image.open(png).text
    assert "p90 TTFT" in meta["Title"] and "shaped to 4 GB/s (10^9 B/s)" in meta["Description"]


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


# --- which storage was measured: every PNG and the page say it (fixtures from real runs) ---------------------
RENDER = Path(__file__).parent / "fixtures" / "render"


def _doc(name: str) -> dict:
    return json.loads((RENDER / name).read_text())


def _png_text(path: Path) -> dict:
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as img:
        return dict(img.text)


def test_every_png_names_its_storage_and_two_storages_differ(tmp_path):
    descriptions = {}
    for name, expect in (("ext4_direct.json", ("ext4", "vda", "/tmp/render/cacheA", "direct I/O", "CPU 0.1 GiB")),
                         ("shm_buffered.json", ("tmpfs", "RAM-backed", "/dev/shm/kvrender", "buffered I/O"))):
        pngs = draw_plots(_doc(name), tmp_path / name)
        assert [p.name for p in pngs] == ["latency_cdf.png", "throughput.png", "occupancy.png"]
        texts = [_png_text(p) for p in pngs]
        for text in texts:
            assert text["Description"].startswith("Storage: ") and text["Software"] == "kv-cache"
            for word in expect:
                assert word in text["Description"], (name, word)
        assert texts[0]["Title"].startswith("Latency CDF")
        descriptions[name] = texts[0]["Description"]
    assert descriptions["ext4_direct.json"] != descriptions["shm_buffered.json"]


def test_merged_documents_plot_like_a_run_with_their_ranks_storage(tmp_path):
    """A merge carries the merged histograms and time series, so it gets every plot of a single run."""
    pngs = draw_plots(_doc("merged/m.json"), tmp_path)
    assert [p.name for p in pngs] == ["latency_cdf.png", "throughput.png", "occupancy.png"]
    assert "/tmp/render/cacheM (2 rank dirs)" in _png_text(pngs[0])["Description"]


def test_sessions_ladder_png_names_its_storage(tmp_path):
    pngs = draw_plots(_doc("sessions.json"), tmp_path)
    text = _png_text(pngs[0])["Description"]
    assert "/tmp/render/cacheS" in text and "auto I/O" in text and "dram+storage" in text


def test_page_headline_is_storage_bandwidth_and_latency_and_names_the_storage(tmp_path):
    doc = _doc("ext4_direct.json")
    cs = doc["summary"]["cache_stats"]
    page = write_html(doc, draw_plots(doc, tmp_path), tmp_path, title="kv-cache run results").read_text()
    head = page[page.index("<h2>Headline</h2>"):page.index("<h2>Storage measured</h2>")]
    assert f"<th>storage read</th><td>{cs['tier_storage_read_bandwidth_gbps']:.3f} GiB/s</td>" in head
    assert f"<th>storage write</th><td>{cs['tier_storage_write_bandwidth_gbps']:.3f} GiB/s</td>" in head
    assert f"<th>storage read device P95</th><td>{cs['storage_read_device_p95_ms']:.3f} ms</td>" in head
    assert f"<th>storage write device P95</th><td>{cs['storage_write_device_p95_ms']:.3f} ms</td>" in head
    assert f"<th>end-to-end P95</th><td>{doc['summary']['end_to_end_latency_ms']['p95']:.3f} ms</td>" in head
    assert head.index("storage read") < head.index("end-to-end P95")
    assert page.index("<h2>Headline</h2>") < page.index(" requests in ")  # requests and tokens come after
    facts = page[page.index("<h2>Storage measured</h2>"):page.index("<h2>Plots</h2>")]
    for row in ("<th>cache directory</th><td>/tmp/render/cacheA</td>", "<th>filesystem</th><td>ext4</td>",
                "<th>block device</th><td>vda</td>", "<th>I/O mode</th><td>direct</td>"):
        assert row in facts
    assert "<title>kv-cache run results: ext4 (block device vda) at /tmp/render/cacheA" in page
    assert page.count("Storage: ext4 (block device vda)") == 1 + 3  # the page's line, one per figure caption


def test_older_documents_without_storage_location_still_name_their_storage():
    doc = json.loads((FIXTURES / "full.json").read_text())
    from kv_cache.results.storage_info import storage_label

    assert "storage_location" not in doc["measurement"]
    assert storage_label(doc).startswith("ext4 (block device vda) at /data/cache/")


def test_page_of_a_merged_document_has_the_storage_headline_and_the_ranks_storage(tmp_path):
    doc = _doc("merged/m.json")
    page = write_html(doc, draw_plots(doc, tmp_path), tmp_path).read_text()
    cs = doc["summary"]["cache_stats"]
    assert f"<th>storage read</th><td>{cs['tier_storage_read_bandwidth_gbps']:.3f} GiB/s</td>" in page
    assert "<th>cache directory</th><td>/tmp/render/cacheM (2 rank dirs)</td>" in page
    assert "<th>num_users</th><td>1</td>" in page  # rank 0's parameters: a merged document has no run_parameters
