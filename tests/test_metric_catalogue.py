"""The metric catalogue: its registry, each entry's value on a constructed recorder, and each entry reaching
the results JSON, the console report, the spreadsheet sheet and the merge of ranks."""

import io
import json

import pytest

from kv_cache.cli import main
from kv_cache.metrics import catalogue
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render import catalogue_section, xlsx
from kv_cache.render.console import print_report, report_lines
from kv_cache.results.merge import merge_documents
from kv_cache.results.samples import latency_samples
from kv_cache.results.series import latency_histograms, time_series
from kv_cache.results.summary import build_summary, harness_keys, request_lists
from kv_cache.storage.base import IOResult

MIB = 1 << 20
REAL = {"storage_read_mean_op_mib", "storage_write_mean_op_mib", "storage_read_device_bytes_ratio",
        "storage_write_device_bytes_ratio", "request_io_time_ratio"}


def _recorder(reads=((3 * MIB, 3 * MIB + 4096), (MIB, MIB + 4096)), writes=((2 * MIB, 2 * MIB + 8192),),
              requests=((100, 25), (300, 75)), window_s=10.0) -> RunMetrics:
    """A recorder of a window: storage reads / writes as (KV bytes, syscall bytes), requests as (e2e ns,
    I/O ns), all completing inside the window."""
    m = RunMetrics()
    m.open_window(0)
    end = int(window_s * 1e9) - 1
    for nbytes, device in reads:
        m.record_io("storage", "read", IOResult(nbytes, device, 2000, 1500, 500), end, "decode")
    for nbytes, device in writes:
        m.record_io("storage", "write", IOResult(nbytes, device, 4000, 3000, 1000), end, "prefill")
    for e2e, io_ns in requests:
        m.record_request("interactive", end, e2e, io_ns, 0, None, None, 10, 100)
    m.close_window(end + 1)
    return m


# -- the registry ------------------------------------------------------------------------------------------
def test_every_entry_describes_itself():
    entries = catalogue.all_metrics()
    assert REAL <= {m.key for m in entries}
    assert len({m.key for m in entries}) == len(entries)
    for m in entries:
        assert m.label and m.summary and m.merge in catalogue.MERGE_RULES
        assert format(1.5, m.spec)  # a format the console can use
        assert catalogue.get(m.key) is m


def test_registry_refuses_a_second_entry_of_one_key_and_bad_entries():
    first = catalogue.get("request_io_time_ratio")
    assert catalogue.register(first) is first  # the same entry again (a module imported twice) is harmless
    twin = catalogue.Metric(first.key, "x", "", lambda m: 0.0, "x")
    with pytest.raises(ValueError, match="registered twice"):
        catalogue.register(twin)
    with pytest.raises(ValueError, match="merge rule"):
        catalogue.Metric("a_key", "x", "", lambda m: 0.0, "x", merge="mean")
    with pytest.raises(ValueError, match="snake case"):
        catalogue.Metric("Bad Key", "x", "", lambda m: 0.0, "x")
    with pytest.raises(KeyError, match="no metric 'nope'"):
        catalogue.get("nope")


# -- each real entry's value --------------------------------------------------------------------------------
def test_real_entries_on_a_constructed_recorder():
    v = catalogue.values(_recorder())
    assert v["storage_read_mean_op_mib"] == 2.0  # (3 + 1) MiB over 2 reads
    assert v["storage_write_mean_op_mib"] == 2.0
    assert v["storage_read_device_bytes_ratio"] == (4 * MIB + 8192) / (4 * MIB)
    assert v["storage_write_device_bytes_ratio"] == (2 * MIB + 8192) / (2 * MIB)
    assert v["request_io_time_ratio"] == 100 / 400


def test_undefined_is_none_never_zero():
    assert {k: v for k, v in catalogue.values(RunMetrics()).items() if k in REAL} == dict.fromkeys(REAL)
    reads_only = catalogue.values(_recorder(writes=(), requests=()))
    assert reads_only["storage_write_mean_op_mib"] is None and reads_only["request_io_time_ratio"] is None
    traced = catalogue.values(_recorder(reads=((MIB, 0),)))  # a backend without a device (the trace log)
    assert traced["storage_read_device_bytes_ratio"] is None and traced["storage_read_mean_op_mib"] == 1.0


def test_operations_after_the_window_count_in_no_entry():
    m = _recorder(reads=((MIB, MIB),))
    m.record_io("storage", "read", IOResult(9 * MIB, 9 * MIB, 10, 5, 5), int(20e9), "decode")  # late
    assert catalogue.values(m)["storage_read_mean_op_mib"] == 1.0


# -- merge rules -----------------------------------------------------------------------------------------------
def test_sum_and_max_entries_merge_from_the_ranks_values():
    total = catalogue.Metric("toy_total", "Toy", "", lambda m: None, "x", merge=catalogue.SUM)
    peak = catalogue.Metric("toy_peak", "Peak", "", lambda m: None, "x", merge=catalogue.MAX)
    again = catalogue.Metric("toy_again", "Again", "", lambda m: 7.0, "x")
    ranks = [{"toy_total": 2.0, "toy_peak": 5.0, "toy_again": 1.0}, None, {"toy_total": 3.0, "toy_peak": 4.0}]
    merged = catalogue.merged_values({"toy_total": None, "toy_peak": None, "toy_again": 7.0}, ranks,
                                     [total, peak, again])
    assert merged == {"toy_total": 5.0, "toy_peak": 5.0, "toy_again": 7.0}  # recompute keeps the merged value
    assert catalogue.merged_values({"toy_total": None}, [None, {}], [total]) == {"toy_total": None}


def _qos():
    from kv_cache.settings.sections import BenchConfig

    return dict(BenchConfig().qos_profiles)


def _rank_doc(m: RunMetrics, rank: int) -> dict:
    summary = build_summary(m, {}, _qos(), "latency", None, 0.0, None, True)
    return {
        "schema_version": "kv-cache-results/1", "run_id": "run-c", "world_size": 2, **request_lists(m),
        "seed": rank, "summary": summary, **harness_keys(summary), "stop_reason": "duration",
        "measurement": {"window_seconds": m.window_seconds, "requests_issued": m.requests.completed,
                        "requests_failed": 0, "errors": 0,
                        "window_wallclock": {"start_unix": 100.0, "end_unix": 110.0, "barrier_aligned": True}},
        "latency_samples": latency_samples(m), "recorder": m.state(), "time_series": time_series(m),
        "latency_histograms": latency_histograms(m),
        "summary_inputs": {"performance_profile": "latency", "kv_block_tokens": 0},
        "run_parameters": {"mpi_rank": rank, "mpi_world_size": 2, "host": f"node{rank}"},
    }


def test_a_merge_recomputes_from_the_merged_recorder(monkeypatch):
    a = _recorder(reads=((MIB, MIB),), requests=((100, 10),))
    b = _recorder(reads=((3 * MIB, 3 * MIB), (5 * MIB, 5 * MIB)), requests=((300, 290),))
    ops = catalogue.Metric("toy_rank_reads", "Toy", "ops", lambda m: m.tier_op("storage", "read").ops, "x",
                           merge=catalogue.MAX)
    monkeypatch.setitem(catalogue._ENTRIES, ops.key, ops)
    merged = merge_documents([_rank_doc(a, 0), _rank_doc(b, 1)])["summary"]["metrics"]
    assert merged["storage_read_mean_op_mib"] == 3.0  # 9 MiB over 3 reads, not the mean of 1 and 4
    assert merged["request_io_time_ratio"] == 300 / 400
    assert merged["toy_rank_reads"] == 2.0  # MAX: the larger rank's value, not the merged recorder's 3


# -- the console section and the sheet -------------------------------------------------------------------------
def test_console_section_and_sheet_print_only_what_the_document_carries():
    doc = {"summary": {"metrics": {"storage_read_mean_op_mib": 2.0, "request_io_time_ratio": 0.25,
                                   "storage_write_mean_op_mib": None}}}
    assert catalogue_section.report_lines(doc) == [
        "", catalogue_section.TITLE, "  Share of request time in KV cache I/O (all tiers): 0.250",
        "  Storage read size per operation (mean): 2.00 MiB"]
    sheet = catalogue_section.sheets(doc)["Metrics"]
    assert sheet[0] == ["Key", "Metric", "Value", "Unit", "Merge"]
    assert ["storage_read_mean_op_mib", "Storage read size per operation (mean)", 2.0, "MiB", "recompute"] in sheet
    for older in ({}, {"summary": {}}, {"summary": {"metrics": {"storage_write_mean_op_mib": None}}}):
        assert catalogue_section.report_lines(older) == [] and catalogue_section.sheets(older) == {}


# -- a short real run: the JSON, the console, the merge -------------------------------------------------------------
@pytest.mark.slow
def test_real_run_reaches_json_console_and_merge(tmp_path, capsys):
    out = tmp_path / "X.json"
    argv = ["--model", "tiny-1b", "--num-users", "2", "--duration", "2", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--seed", "7", "--cache-dir", str(tmp_path / "cache"), "--output", str(out), "--processes", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    ranks = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    merged = json.loads(out.read_text())
    for doc in (*ranks, merged):
        block = doc["summary"]["metrics"]
        assert block.keys() == {m.key for m in catalogue.all_metrics()}
        assert block["storage_write_mean_op_mib"] > 0 and block["storage_write_device_bytes_ratio"] >= 1.0
        text = io.StringIO()
        print_report(doc, text)
        assert catalogue_section.TITLE in text.getvalue()
        assert f"  Storage write size per operation (mean): {block['storage_write_mean_op_mib']:.2f} MiB" \
            in report_lines(doc)
    rec = [r["recorder"]["io"]["storage/write"] for r in ranks]
    assert merged["summary"]["metrics"]["storage_write_mean_op_mib"] == pytest.approx(
        sum(x["bytes"] for x in rec) / sum(x["ops"] for x in rec) / MIB)
    assert main(["report", str(out)]) == 0
    assert catalogue_section.TITLE in capsys.readouterr().out
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.load_workbook(xlsx.export(ranks[0], str(tmp_path / "X.xlsx")))
    keys = [row[0] for row in book["Metrics"].iter_rows(min_row=2, values_only=True)]
    assert "storage_write_mean_op_mib" in keys
