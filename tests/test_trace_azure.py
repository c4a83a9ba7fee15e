"""The Azure LLM inference trace format (Azure/AzurePublicDataset 2023 and 2024 CSVs): detected by its
header, read as sessionless timed requests, replayed by a real run. The fixtures are written here."""

from pathlib import Path

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.workload.traces import BLOCK_TOKENS, FORMATS, detect_format, formats, open_trace
from kv_cache.workload.traces.azure import timestamp_ns

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROWS_2023 = [  # the first rows of AzureLLMInferenceTrace_conv.csv's form: naive, seven fractional digits
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,55",
    "2023-11-16 18:15:52.0000000,2000,12",
]
ROWS_2024 = [  # the 2024 week's form: an offset, six digits, sometimes no fraction
    "2024-05-10 00:00:00.009930+00:00,1200,300",
    "2024-05-10 00:00:01+00:00,80,20",
    "2024-05-10 00:00:02.5+00:00,4096,1",
]


def write(path: Path, rows, header: str = HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_the_descriptor():
    fmt = formats.get("azure")
    assert "azure" in FORMATS and BLOCK_TOKENS["azure"] is None
    assert not fmt.sessions and not fmt.directory and "TIMESTAMP" in fmt.summary
    assert "azure" not in formats.session_formats()


@pytest.mark.parametrize("header", [HEADER, "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens",
                                    "GeneratedTokens, TIMESTAMP, ContextTokens"])
def test_detected_by_its_header(tmp_path, header):
    assert detect_format(write(tmp_path / "AzureLLMInferenceTrace_conv.csv", ROWS_2023, header)) == "azure"


def test_a_burstgpt_csv_is_still_burstgpt(tmp_path):
    path = write(tmp_path / "b.csv", ["0,ChatGPT,100,20,120,Conversation log"],
                 "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type")
    assert detect_format(path) == "burstgpt"


def test_2023_rows_are_sessionless_requests_timed_from_the_first_row(tmp_path):
    source = open_trace(write(tmp_path / "conv.csv", ROWS_2023))
    rows = list(source)
    assert source.format == "azure"
    assert [(r.input_tokens, r.new_tokens, r.output_tokens) for r in rows] == [
        (374, 374, 44), (396, 396, 109), (879, 879, 55), (2000, 2000, 12)]
    assert all(r.session_id is None and r.turn == 1 and r.hash_ids is None and r.think_time_s is None for r in rows)
    # 18:15:46.6805900 -> 18:15:50.9951690 is 4.314579 s: the ticks survive (no float of epoch seconds)
    assert [r.arrival_s for r in rows] == [0.0, 4.314579, 4.541877, 5.31941]
    assert source.stats.duration_s == pytest.approx(5.31941) and source.stats.sessions == 0


def test_2024_rows_with_an_offset_and_without_a_fraction(tmp_path):
    rows = list(open_trace(write(tmp_path / "code_1week.csv", ROWS_2024)))
    assert [r.arrival_s for r in rows] == [0.0, 0.99007, 2.49007]
    assert [r.input_tokens for r in rows] == [1200, 80, 4096]


def test_timestamps_in_nanoseconds():
    assert timestamp_ns("2024-05-10 02:00:00+02:00") == timestamp_ns("2024-05-10 00:00:00Z") \
        == timestamp_ns("2024-05-10T00:00:00")
    assert timestamp_ns("2024-05-10 00:00:00.123456789123") - timestamp_ns("2024-05-10 00:00:00") == 123456789
    assert timestamp_ns("2024-05-10 00:00:00-01:30") - timestamp_ns("2024-05-10 00:00:00") == 5400 * 10**9
    for bad in ("1715299200", "2024-05-10", "2024-02-30 00:00:00", "2024-05-10 24:00:00", "yesterday"):
        with pytest.raises(ValueError):
            timestamp_ns(bad)


def test_bad_rows_are_skipped_and_counted(tmp_path):
    path = write(tmp_path / "bad.csv", [
        "not a time,100,10",  # no arrival: malformed, and not the trace's zero
        "2023-11-16 18:15:46.0000000,374,44",
        "",
        "2023-11-16 18:15:47.0000000,0,5",  # zero input
        "2023-11-16 18:15:45.0000000,200,5",  # before the first row
        "2023-11-16 18:15:48.0000000,-3,5",
        "2023-11-16 18:15:49.0000000,300",  # no GeneratedTokens
        "2023-11-16 18:15:50.0000000,300,7",
        ",300,7",
    ])
    source = open_trace(path)
    rows = list(source)
    assert [(r.arrival_s, r.input_tokens) for r in rows] == [(0.0, 374), (4.0, 300)]
    assert source.stats.skipped_reasons == {
        "bad_value:TIMESTAMP": 1, "zero_input": 1, "negative_value:TIMESTAMP": 1,
        "negative_value:ContextTokens": 1, "missing_field:GeneratedTokens": 1, "missing_field:TIMESTAMP": 1}
    assert source.stats.skipped_malformed == 6


def test_the_context_limit_applies(tmp_path):
    source = open_trace(write(tmp_path / "conv.csv", ROWS_2023), max_context_tokens=1000)
    assert [r.input_tokens for r in source] == [374, 396, 879]
    assert source.stats.skipped_reasons == {"beyond_context_window": 1}


def test_a_csv_without_its_columns_is_refused(tmp_path):
    path = write(tmp_path / "x.csv", ["2023-11-16 18:15:46,1"], "TIMESTAMP,ContextTokens")
    with pytest.raises(Exception, match="no GeneratedTokens column"):
        list(open_trace(path, "azure"))


@pytest.mark.slow  # a real run (wall clock)
def test_a_real_run_replays_it(quick_settings, sink, tmp_path):
    path = write(tmp_path / "AzureLLMInferenceTrace_code.csv", ROWS_2023)
    results, _ = execute(quick_settings("--trace", str(path), "--trace-speedup", "0", "--replay-cycles", "1",
                                        "--duration", "60"), sink)
    assert results["measurement"]["stop_reason"] == "trace complete"
    assert results["summary"]["total_requests"] == 4
    tr = results["trace_replay"]
    assert tr["format"] == "azure" and tr["stats"][0]["rows"] == 4
    assert "AzureLLMInferenceTrace_code.csv (azure): 4 rows read (the whole file)" in sink.getvalue()


@pytest.mark.parametrize("fmt,header,row", [
    ("azure", HEADER, ROWS_2023[0]),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
     "0,ChatGPT,100,20,120,Conversation log"),
])
def test_blank_lines_before_the_header_are_skipped_as_detection_skips_them(tmp_path, fmt, header, row):
    path = tmp_path / "t.csv"
    path.write_text(f"\ufeff\n \r\n{header}\n{row}\n")  # (a BOM, then blank lines)
    assert detect_format(path) == fmt
    assert len(list(open_trace(path))) == 1


def test_a_quoted_header_is_detected_as_the_reader_reads_it(tmp_path):
    path = write(tmp_path / "q.csv", ['"2023-11-16 18:15:46.6805900",374,44'],
                 '"TIMESTAMP","ContextTokens","GeneratedTokens"')
    assert detect_format(path) == "azure"
    assert [r.input_tokens for r in open_trace(path)] == [374]
