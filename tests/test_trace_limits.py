"""Trace rows that no model could serve are rejected and counted, and shown on the console; the config's
`sharegpt` section acts; rates are null over a window shorter than a second."""

from __future__ import annotations

import json
from pathlib import Path

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.console import SECTIONS, report_lines, trace_rows
from kv_cache.results.summary import MIN_RATE_WINDOW_S, build_summary, harness_keys
from kv_cache.workload.traces import open_trace
from kv_cache.workload.traces import tokenizer as tok_mod


def _mooncake(tmp_path: Path) -> Path:
    rows = [{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 10, "input_length": 100, "output_length": 1e30, "hash_ids": [2]},  # absurd
            {"timestamp": 20, "input_length": 5000, "output_length": 10, "hash_ids": [3]},  # beyond 4096
            {"timestamp": 30, "input_length": 100, "output_length": 5, "hash_ids": [4]}]
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_absurd_and_oversized_rows_are_rejected_and_counted(tmp_path):
    src = open_trace(_mooncake(tmp_path), max_context_tokens=4096)
    rows = list(src)
    assert [r.input_tokens for r in rows] == [700, 100]
    assert src.stats.skipped_reasons == {"absurd_value:output_length": 1, "beyond_context_window": 1}
    assert src.stats.skipped_malformed == 1 and src.stats.skipped_other == 1
    unlimited = open_trace(_mooncake(tmp_path))
    assert [r.input_tokens for r in unlimited] == [700, 5000, 100]  # the absurd row is always rejected


def test_skipped_rows_are_on_the_console(tmp_path):
    src = open_trace(_mooncake(tmp_path), max_context_tokens=4096)
    list(src)
    text = "\n".join(trace_rows({"trace_replay": {"stats": [src.stats.to_dict()]}}))
    assert "### TRACE ROWS ###" in text
    assert ("4 rows read (the whole file): 2 used, 2 skipped: absurd 1 (absurd_value:output_length 1); beyond the "
            "context window 1") in text
    assert trace_rows in SECTIONS


SHAREGPT = [{"id": "c1", "conversations": [{"from": "human", "value": "h" * 40}, {"from": "gpt", "value": "g" * 80},
                                          {"from": "human", "value": "h" * 40}, {"from": "gpt", "value": "g" * 80}]}]


def test_sharegpt_section_acts(tmp_path, monkeypatch):
    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT))

    def tokens(**kw):
        src = open_trace(p, **kw)
        return [(r.input_tokens, r.new_tokens, r.output_tokens) for r in src], src.stats.tokenizer
    assert tokens() == ([(10, 10, 20), (40, 10, 20)], "chars/4")
    assert tokens(chars_per_token=1.0) == ([(40, 40, 80), (160, 40, 80)], "chars/1")
    assert tokens(sharegpt_max_context=30, sharegpt_max_generation=15) == ([(10, 10, 15), (30, 10, 15)], "chars/4")


def test_factory_passes_the_config(tmp_path, monkeypatch, quick_settings):
    from kv_cache.workload.factory import open_trace_sources

    monkeypatch.setattr(tok_mod, "tiktoken_encoding", lambda: None)
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT))
    quick_settings()  # writes micro.yaml
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(cfg.read_text() + "sharegpt:\n  chars_per_token_estimate: 2.0\n")
    settings = quick_settings("--dataset-path", str(p))
    src = open_trace_sources(settings)[0]
    assert [r.output_tokens for r in src] == [40, 40] and src.stats.tokenizer == "chars/2"


def _short_window(seconds: float) -> RunMetrics:
    m = RunMetrics()
    m.open_window(0)
    m.record_request("batch", 10, 5_000_000, 2_000_000, 0, 2_000_000, None, 10, 100)
    m.close_window(int(seconds * 1e9))
    return m


def test_rates_are_zero_with_a_reason_under_a_second():
    """A rate key is always a number (the harness's aggregator adds them): 0.0 when the window was too
    short for a rate, and `rates_undefined_reason` beside it says why."""
    from kv_cache.settings.schema import BenchConfig

    cfg = BenchConfig()
    short = build_summary(_short_window(0.4), {}, cfg.qos_profiles, "throughput", cfg.performance_criteria)
    assert short["avg_throughput_tokens_per_sec"] == 0.0 and short["requests_per_second"] == 0.0
    cs = short["cache_stats"]
    rate_keys = [k for k in cs if k.endswith(("_bandwidth_gbps", "_ops_per_sec"))]
    assert len(rate_keys) == 14 and all(cs[k] == 0.0 and isinstance(cs[k], float) for k in rate_keys)
    reason = "window 0.4 s is under 1 s: its rates are undefined, written as 0.0"
    assert short["rates_undefined_reason"] == cs["rates_undefined_reason"] == reason
    assert harness_keys(short)["throughput_req_per_sec"] == 0.0
    assert harness_keys(short)["storage_throughput_mbps"] == 0.0
    assert all(isinstance(v, (int, float)) for k, v in harness_keys(short).items() if k != "overall_passed")
    assert short["cache_stats"]["storage_health"]["overall_status"] == "FAIL"
    text = "\n".join(report_lines({"summary": short}))
    assert "Requests/sec: n/a (window < 1 s)" in text
    long = build_summary(_short_window(MIN_RATE_WINDOW_S), {}, cfg.qos_profiles, "latency", cfg.performance_criteria)
    assert long["requests_per_second"] == 1.0 and long["rates_undefined_reason"] is None
    assert "n/a" not in "\n".join(report_lines({"summary": long}))
