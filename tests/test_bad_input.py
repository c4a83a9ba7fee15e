"""The bad-input matrix: flags, config files, trace files and paths. Every case ends with exit status 2 and
one line on stderr (`kv-cache: error: ...`), never a traceback, and before any I/O: the measured run and the
sessions ladder are replaced by a tripwire, so a case that is accidentally valid fails at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kv_cache.cli import main

MOONCAKE_ROW = {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}
VALIDATION_ROW = {"timestamp": 0.0, "request_id": "r", "user_id": "u", "context_tokens": 100,
                  "generation_tokens": 10, "phase": "prefill", "cache_hit": True, "cache_tier": "cpu",
                  "read_bytes": 10, "write_bytes": 1, "read_latency_ms": 1, "write_latency_ms": 1, "model_name": "m"}


def _files(tmp: Path) -> dict[str, str]:
    """Small hand-made bad inputs, by name."""
    def put(name: str, text: str) -> str:
        p = tmp / name
        p.write_text(text)
        return str(p)

    def cfg(name: str, text: str) -> str:
        return put(name, text)

    return {
        "tmp": str(tmp),
        "file": put("plain.txt", "x"),
        "empty": put("empty.jsonl", ""),
        "garbage": put("garbage.bin", "\x00\x01 not a trace\n"),
        "absurd": put("absurd.jsonl", json.dumps({**MOONCAKE_ROW, "output_length": 1e30}) + "\n"),
        "negative": put("negative.jsonl", json.dumps({**MOONCAKE_ROW, "input_length": -4}) + "\n"),
        "sharegpt_obj": put("sg.json", json.dumps({"conversations": []})),
        "val_text": put("val_text.json", json.dumps([{**VALIDATION_ROW, "read_bytes": "lots"}])),
        "val_missing": put("val_missing.json", json.dumps([{k: v for k, v in VALIDATION_ROW.items() if k != "phase"}])),
        "val_notjson": put("val_bad.json", "[{"),
        "val_empty": put("val_empty.json", "[]"),
        "val_nan": put("val_nan.json", json.dumps([{**VALIDATION_ROW, "timestamp": "nan"}])),
        "cfg_yaml": cfg("bad_yaml.yaml", "storage:\n  io_mode: [1\n"),
        "cfg_key": cfg("bad_key.yaml", "storage:\n  chunk_size_mbb: 4\n"),
        "cfg_section": cfg("bad_section.yaml", "no_such_section:\n  a: 1\n"),
        "cfg_type": cfg("bad_type.yaml", "storage:\n  chunk_size_mb: big\n"),
        "cfg_prob": cfg("bad_prob.yaml", "performance_criteria:\n  max_error_rate: 2\n"),
        "cfg_cpt": cfg("bad_cpt.yaml", "sharegpt:\n  chars_per_token_estimate: 0\n"),
        "cfg_ctx": cfg("bad_ctx.yaml", "validation_limits:\n  max_trace_context_tokens: 0\n"),
        "cfg_choice": cfg("bad_choice.yaml", "storage:\n  io_mode: sideways\n"),
        "cfg_list": cfg("bad_list.yaml", "- just\n- a list\n"),
    }


# (case id, argv with {name} placeholders for _files, a fragment the message must hold)
CASES = [
    # flags
    ("num-users-zero", ["--num-users", "0"], "--num-users"),
    ("num-users-text", ["--num-users", "many"], "--num-users"),
    ("duration-negative", ["--duration", "-5"], "--duration"),
    ("duration-nan", ["--duration", "nan"], "--duration"),
    ("unknown-model", ["--model", "gpt-17"], "unknown model"),
    ("unknown-flag", ["--frobnicate"], "unrecognized arguments"),
    ("unknown-command", ["frobnicate"], "unknown command"),
    ("prefill-and-decode-only", ["--prefill-only", "--decode-only"], "mutually exclusive"),
    ("cpu-mem-negative", ["--cpu-mem-gb", "-1"], "--cpu-mem-gb"),
    ("tp-over-gpus", ["--tensor-parallel", "4", "--num-gpus", "2"], "--tensor-parallel"),
    ("io-chunk-zero", ["--io-chunk-mb", "0"], "--io-chunk-mb"),
    ("io-workers-negative", ["--io-workers", "-1"], "--io-workers"),
    ("io-mode-choice", ["--io-mode", "sideways"], "--io-mode"),
    ("profile-choice", ["--performance-profile", "fastest"], "--performance-profile"),
    ("generation-mode-choice", ["--generation-mode", "warp"], "--generation-mode"),
    ("kv-block-negative", ["--kv-block-tokens", "-1"], "--kv-block-tokens"),
    ("target-saturation", ["--target-saturation", "2"], "--target-saturation"),
    ("think-time", ["--think-time", "sometimes"], "think"),
    ("two-trace-sources", ["--trace", "{absurd}", "--dataset-path", "{sharegpt_obj}"], "choose one workload source"),
    ("autoscale-with-trace", ["--trace", "{absurd}", "--enable-autoscaling"], "--enable-autoscaling"),
    ("trace-format-choice", ["--trace", "{absurd}", "--trace-format", "parquet"], "--trace-format"),
    # config files
    ("config-missing", ["--config", "{tmp}/none.yaml"], "config file not found"),
    ("config-bad-yaml", ["--config", "{cfg_yaml}"], "invalid YAML"),
    ("config-unknown-key", ["--config", "{cfg_key}"], "chunk_size_mbb"),
    ("config-unknown-section", ["--config", "{cfg_section}"], "no_such_section"),
    ("config-wrong-type", ["--config", "{cfg_type}"], "chunk_size_mb"),
    ("config-probability", ["--config", "{cfg_prob}"], "max_error_rate"),
    ("config-chars-per-token", ["--config", "{cfg_cpt}"], "chars_per_token_estimate"),
    ("config-context-limit", ["--config", "{cfg_ctx}"], "max_trace_context_tokens"),
    ("config-choice", ["--config", "{cfg_choice}"], "io_mode"),
    ("config-not-a-mapping", ["--config", "{cfg_list}"], "{cfg_list}"),
    ("config-is-a-directory", ["--config", "{tmp}"], "{tmp}"),
    # trace files
    ("trace-missing", ["--trace", "{tmp}/none.jsonl"], "none.jsonl"),
    ("trace-empty", ["--trace", "{empty}"], "empty.jsonl"),
    ("trace-garbage", ["--trace", "{garbage}"], "garbage.bin"),
    ("trace-absurd-only", ["--trace", "{absurd}", "--trace-format", "mooncake"], "absurd_value:output_length"),
    ("trace-negative-only", ["--trace", "{negative}", "--trace-format", "mooncake"], "negative_value"),
    ("trace-dir-not-weka", ["--trace", "{tmp}", "--trace-format", "mooncake"], "is a directory"),
    ("dataset-not-array", ["--dataset-path", "{sharegpt_obj}"], "sg.json"),
    ("validation-missing", ["--validation-trace", "{tmp}/none.json"], "--validation-trace"),
    ("validation-non-numeric", ["--validation-trace", "{val_text}"], "read_bytes must be a number"),
    ("validation-nan", ["--validation-trace", "{val_nan}"], "timestamp must be a finite"),
    ("validation-missing-field", ["--validation-trace", "{val_missing}"], "missing ['phase']"),
    ("validation-not-json", ["--validation-trace", "{val_notjson}"], "not valid JSON"),
    ("validation-empty", ["--validation-trace", "{val_empty}"], "non-empty JSON list"),
    # paths
    ("output-proc", ["--output", "/proc/version"], "--output /proc/version"),
    ("output-directory", ["--output", "{tmp}"], "is a directory"),
    ("output-device", ["--output", "/dev/null"], "special file"),
    ("output-empty", ["--output", ""], "--output is empty"),
    ("output-under-a-file", ["--output", "{file}/r.json"], "part of its directory is a file"),
    ("xlsx-directory", ["--xlsx-output", "{tmp}"], "--xlsx-output"),
    ("io-trace-log-directory", ["--io-trace-log", "{tmp}"], "--io-trace-log"),
    ("cache-dir-tmp", ["--cache-dir", "/tmp"], "use a directory of its own"),
    ("cache-dir-system", ["--cache-dir", "/usr/kv"], "system directory"),
    ("cache-dir-file", ["--cache-dir", "{file}"], "not a directory"),
    ("cache-dir-empty", ["--cache-dir", ""], "must not be empty"),
    # the sessions command
    ("sessions-output-directory", ["sessions", "--output", "{tmp}"], "is a directory"),
    ("sessions-ladder", ["sessions", "--ladder", "0,x"], "--ladder"),
    ("sessions-gpu", ["sessions", "--gpu", "abacus"], "unknown GPU"),
    ("sessions-tiers", ["sessions", "--tiers", "floppy"], "--tiers"),
    ("sessions-unknown-flag", ["sessions", "--frobnicate"], "unrecognized arguments"),
    ("sessions-window-plan", ["sessions", "--window-plan", "elastic"], "--window-plan"),
    # plot directories, checked before the run (not after hours of measuring)
    ("plots-is-a-file", ["--plots", "{file}"], "is a file, not a directory"),
    ("plots-under-a-file", ["--plots", "{file}/plots"], "is not a writable directory"),
    ("sessions-plots-is-a-file", ["sessions", "--plots", "{file}"], "is a file, not a directory"),
]


@pytest.fixture
def tripwire(monkeypatch):
    """Anything that would start measuring fails the test at once."""
    def tripped(*a, **k):
        raise AssertionError("a run started: the input was not refused")
    monkeypatch.setattr("kv_cache.benchmarks.standard.run._measure", tripped)
    monkeypatch.setattr("kv_cache.benchmarks.sessions.run.run_ladder", tripped)


def test_the_matrix_is_big_enough():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, tripwire, argv, fragment):
    files = _files(tmp_path)
    argv = [a.format(**files) for a in argv]
    fragment = fragment.format(**files)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    extra = [] if "--output" in argv or "sessions" in argv[:1] else ["--output", str(out_dir / "r.json")]
    code = main([*argv, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(("kv-cache: error: ", "kv-cache sessions: error: ")), err
    assert "Traceback" not in err and fragment in err, err
    assert not list(out_dir.iterdir())  # nothing written


def test_plots_without_matplotlib_are_refused_before_the_run(tmp_path, capsys, tripwire, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code = main(["--plots", str(tmp_path / "plots"), "--output", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and "--plots needs matplotlib" in err and err.count("\n") == 1
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "plots").exists()
