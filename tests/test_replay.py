"""Trace replay end to end (issue 5): block hit rates equal the trace's own reuse, sessions, formats."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli import main, parse_settings
from kv_cache.errors import UsageError


def run(quick_settings, sink, *argv):
    return execute(quick_settings("--trace-speedup", "0", "--replay-cycles", "1", "--duration", "300", *argv), sink)


def mooncake_reuse(path: Path, rows: int | None = None) -> float:
    """Block reuse of a Mooncake trace from its raw rows: the share of hash ids an earlier row had."""
    seen: set = set()
    total = hits = 0
    with open(path) as fp:
        for line in fp.readlines()[:rows]:
            ids = json.loads(line)["hash_ids"]
            total += len(ids)
            hits += sum(1 for h in ids if h in seen)
            seen.update(ids)
    return hits / total


@pytest.mark.slow
def test_block_hit_rate_equals_reuse_of_first_rows_with_real_io(quick_settings, sink, traces_dir):
    path = traces_dir / "mooncake" / "conversation_trace_300.jsonl"
    results, _ = run(quick_settings, sink, "--trace", str(path), "--kv-block-tokens", "512", "--max-requests", "100",
                     "--io-workers", "4", "--no-fsync")
    expected = mooncake_reuse(path, rows=100)  # 3.3 % reuse in the first 100 rows (5.8 % in 200): not zero
    assert expected > 0.03
    b = results["summary"]["block_stats"]
    assert results["summary"]["total_requests"] == 100
    assert b["block_hit_rate"] == pytest.approx(expected, abs=1e-9)
    assert b["loads"] + b["stores"] == b["blocks"] and b["hit_rate_by_tier"]["storage"] == b["block_hit_rate"]
    assert results["trace_replay"]["format"] == "mooncake"
    # stores really went to the device: one block entry written per store
    assert results["summary"]["cache_stats"]["write_iops"] == b["stores"]


@pytest.mark.slow
def test_whole_synthetic_trace_reuse(quick_settings, sink, traces_dir):
    path = traces_dir / "mooncake" / "synthetic_trace_300.jsonl"
    # one I/O worker, so that no two requests are in flight at once: a CI run with four gave a hit rate of
    # 0.0474 against the trace's 0.0478 once (not reproduced in 6 runs beside busy loops; concurrency suspected)
    results, _ = run(quick_settings, sink, "--trace", str(path), "--kv-block-tokens", "512", "--io-trace-log",
                     "/dev/null", "--io-workers", "1")
    assert results["measurement"]["stop_reason"] == "trace complete"
    assert results["summary"]["total_requests"] == 300
    assert results["summary"]["block_stats"]["block_hit_rate"] == pytest.approx(mooncake_reuse(path), abs=1e-9)


@pytest.mark.slow
def test_agentic_sessions_replay_with_think_times_and_growing_context(quick_settings, sink, tmp_path, traces_dir):
    src = traces_dir / "agentic-coding"
    one = tmp_path / "ac"
    one.mkdir()
    shutil.copy(sorted(src.glob("trace_*.json"))[0], one)
    results, _ = run(quick_settings, sink, "--trace", str(one), "--kv-block-tokens", "1024", "--think-time",
                     "fixed:0.01", "--io-workers", "2", "--no-fsync", "--max-requests", "30")
    tr = results["trace_replay"]
    assert tr["format"] == "weka" and tr["replay"] == "closed-loop sessions" and tr["sessions"] >= 1
    per_turn = results["summary"]["per_turn"]
    assert len(per_turn) > 5
    first, last = per_turn[0], per_turn[-1]
    assert last["mean_context_tokens"] > first["mean_context_tokens"]
    assert last["mean_bytes_read"] > per_turn[1]["mean_bytes_read"] > 0  # context growth shows in the reads
    assert first["mean_bytes_read"] == 0 and first["mean_bytes_written"] > 0


def write_burst(dirpath: Path):
    dirpath.mkdir()
    rows = [("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")]
    a = rows + [(t, "ChatGPT", 100 + t, 20, 120 + t, "Conversation log") for t in range(5)]
    b = rows + [(t, "GPT-4", 200, 30, 230, "API log") for t in range(3)]
    for name, data in (("b.csv", b), ("a.csv", a)):
        with open(dirpath / name, "w", newline="") as fh:
            csv.writer(fh).writerows(data)


@pytest.mark.slow
@pytest.mark.parametrize("cycles", [1, 2])
@pytest.mark.slow  # a real run (wall clock)
def test_burstgpt_directory_and_replay_cycles(quick_settings, sink, tmp_path, cycles):
    write_burst(tmp_path / "burst")
    results, _ = execute(quick_settings("--use-burst-trace", "--burst-trace-path", str(tmp_path / "burst"),
                                        "--trace-speedup", "0", "--replay-cycles", str(cycles), "--duration", "60"),
                         sink)
    assert results["measurement"]["stop_reason"] == "trace complete"
    assert results["summary"]["total_requests"] == 8 * cycles
    stats = results["trace_replay"]["stats"]
    assert [s["path"].endswith("a.csv") for s in stats] == [True, False]
    # each file's own rows (not the last pass's), and its passes apart
    assert [(s["rows"], s["complete"]) for s in stats] == [(5, True), (3, True)]
    assert [s["replayed"] for s in stats] == [{"rows_sent": 5 * cycles, "passes": cycles, "passes_complete": cycles},
                                              {"rows_sent": 3 * cycles, "passes": cycles, "passes_complete": cycles}]
    passes = "in 1 pass (complete)" if cycles == 1 else f"over {cycles} passes ({cycles} complete)"
    assert f"a.csv (burstgpt): 5 rows read (the whole file): 5 used, 0 skipped; {5 * cycles} rows sent to the load generator {passes}" \
        in sink.getvalue()


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_sharegpt_without_multi_turn_runs(quick_settings, sink, tmp_path):
    data = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "hello there " * 20},
                                             {"from": "gpt", "value": "hi " * 30},
                                             {"from": "human", "value": "more " * 40},
                                             {"from": "gpt", "value": "sure " * 10}]} for i in range(4)]
    data.append({"no": "conversations"})
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    results, _ = execute(quick_settings("--dataset-path", str(path), "--disable-multi-turn", "--trace-speedup", "0",
                                        "--replay-cycles", "1", "--think-time", "fixed:0"), sink)
    assert results["summary"]["total_requests"] == 8  # the reference's workers all died here
    stats = results["trace_replay"]["stats"][0]
    assert stats["skipped_malformed"] == 1 and stats["tokenizer"] in ("chars/4", "tiktoken-cl100k_base")


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_open_loop_poisson_over_a_trace(quick_settings, sink, tmp_path):
    write_burst(tmp_path / "burst")
    results, _ = execute(quick_settings("--use-burst-trace", "--burst-trace-path", str(tmp_path / "burst"),
                                        "--request-rate", "50", "--replay-cycles", "3", "--duration", "60"), sink)
    assert results["trace_replay"]["replay"] == "open loop, Poisson"
    assert results["summary"]["total_requests"] + results["measurement"]["requests_rejected"] == 24


@pytest.mark.slow
@pytest.mark.slow  # a real run (wall clock)
def test_synthetic_users_with_block_layout_reuse_history(quick_settings, sink):
    results, _ = execute(quick_settings("--kv-block-tokens", "256", "--duration", "3", "--disable-prefix-caching"),
                         sink)
    b = results["summary"]["block_stats"]
    assert b["blocks"] > 0 and b["loads"] > 0  # later turns load the conversation's earlier blocks
    assert results["summary"]["cache_stats"]["decode_reads"] == 0  # blocks are loaded once, not re-read


@pytest.mark.parametrize("argv, message", [
    (["--think-time", "sometimes"], "--think-time must be"),
    (["--think-time", "uniform:5:1"], "--think-time must be"),
    (["--kv-block-tokens", "-1"], "--kv-block-tokens cannot be negative"),
    (["--use-burst-trace", "--burst-trace-path", "/nonexistent/*.csv"], "no CSV file matched"),
])
def test_bad_trace_arguments_fail_before_the_run(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_settings(argv)


def trace_file_refused(tmp_path, capsys, trace):
    """The run opens the trace first: a bad file is exit 2 and one line, before any I/O (no run dir, no JSON)."""
    out, cache = tmp_path / "r.json", tmp_path / "cache"
    assert main(["--trace", trace, "--output", str(out), "--cache-dir", str(cache), "--gpu-mem-gb", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kv-cache: error: ") and err.count("\n") == 1
    assert not out.exists() and not cache.exists()
    return err


def test_missing_trace_is_a_usage_error(tmp_path, capsys):
    assert "no such file" in trace_file_refused(tmp_path, capsys, "/nonexistent/trace.jsonl")


def test_empty_trace_is_a_usage_error(tmp_path, capsys):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    assert str(p) in trace_file_refused(tmp_path, capsys, str(p))


def test_two_sources_are_refused(tmp_path):
    with pytest.raises(UsageError, match="choose one workload source"):
        parse_settings(["--trace", "x.jsonl", "--dataset-path", "y.json"])
