"""mlperf_wrapper.py: rank layout, seeds and flags of both interfaces; one real tiny run through the shim."""

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from kv_cache.cli.wrapper import OPTIONS, main, plan_rank

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 5, 4, 3, 2, 1)


def _flag(argv, name):
    """The last value given to `name` (argparse: the last one wins)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


@pytest.mark.parametrize("env,rank", [({}, 0), ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, 3),
                                      ({"PMI_RANK": "2", "PMI_SIZE": "8"}, 2)])
def test_current_interface_rank_layout_and_seed(tmp_path, env, rank):
    argv = ["--rank-output-base", str(tmp_path / "out"), "--rank-cache-base", str(tmp_path / "cache"),
            "--seed-base", "1000", "--config", "cfg.yaml", "--model", "llama3.1-8b", "--num-users", "10",
            "--generation-mode", "none"]
    plan = plan_rank(argv, env, NOW)
    assert plan.rank == rank and plan.seed == 1000 + rank
    assert plan.output == str(tmp_path / "out" / f"rank_{rank}" / "kvcache_results_20260504_030201.json")
    assert plan.cache_dir == str(tmp_path / "cache" / f"rank_{rank}")
    kv = list(plan.argv)
    assert _flag(kv, "--seed") == str(1000 + rank) and _flag(kv, "--output") == plan.output
    assert _flag(kv, "--cache-dir") == plan.cache_dir and _flag(kv, "--config") == "cfg.yaml"
    assert _flag(kv, "--num-users") == "10" and _flag(kv, "--model") == "llama3.1-8b"


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_earlier_interface_options_follow_the_rules_table(tmp_path, option):
    argv = ["--option", str(option), "--seed", "7", "--base-output-dir", str(tmp_path / "o"),
            "--cache-dir", str(tmp_path / "c")]
    plan = plan_rank(argv, {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, NOW)
    kv = list(plan.argv)
    expected = {1: ("llama3.1-8b", "200", "0", "16"), 2: ("llama3.1-8b", "100", "4", "16"),
                3: ("llama3.1-70b-instruct", "70", "0", "4")}[option]
    got = tuple(_flag(kv, f) for f in ("--model", "--num-users", "--cpu-mem-gb", "--max-concurrent-allocs"))
    assert got == expected
    assert _flag(kv, "--duration") == "300" and _flag(kv, "--generation-mode") == "none"
    assert plan.seed == 8 and _flag(kv, "--seed") == "8"
    assert plan.output.startswith(str(tmp_path / "o" / "rank_1" / "kvcache_results_"))
    assert plan.cache_dir == str(tmp_path / "c" / "rank_1")


def test_earlier_interface_extra_flags_override_the_option(tmp_path):
    argv = ["--option", "1", "--seed", "0", "--base-output-dir", str(tmp_path), "--cache-dir", str(tmp_path),
            "--duration", "5"]
    assert _flag(list(plan_rank(argv, {}, NOW).argv), "--duration") == "5"


@pytest.mark.parametrize("argv,words", [
    (["--rank-output-base", "o", "--seed-base", "1"], "--rank-cache-base"),
    (["--option", "2", "--seed", "1", "--cache-dir", "c"], "--base-output-dir"),
    (["--option", "1", "--seed-base", "1"], "mix of the two interfaces"),
    (["--option", "9"], "invalid choice"),
    (["--rank-output-base", "o", "--rank-cache-base", "c", "--seed-base", "1", "--output", "x"], "per rank"),
])
def test_bad_wrapper_flags_are_one_line_exit_2(argv, words, capsys):
    ran = []
    assert main(argv, env={}, runner=ran.append) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("mlperf_wrapper.py: error:")
    assert ran == []


def test_delays_given_reach_kv_cache_after_the_wrappers_defaults(tmp_path):
    """--start-delay / --end-delay are kv-cache flags (tests/test_settle_delays.py waits on them); the
    wrapper's 90 s defaults come first, so the values given win."""
    argv = ["--rank-output-base", str(tmp_path), "--rank-cache-base", str(tmp_path), "--seed-base", "0",
            "--start-delay", "1.5", "--end-delay", "2"]
    plans = []
    assert main(argv, env={}, runner=lambda plan: plans.append(plan) or 0) == 0
    kv = list(plans[0].argv)
    assert kv[:4] == ["--start-delay", "90", "--end-delay", "90"] and kv[4:8] == argv[6:]


def test_ranks_never_share_a_path(tmp_path):
    argv = ["--rank-output-base", str(tmp_path / "o"), "--rank-cache-base", str(tmp_path / "c"), "--seed-base", "5"]
    plans = [plan_rank(argv, {"PMI_RANK": str(r), "PMI_SIZE": "4"}, NOW) for r in range(4)]
    paths = [p.output for p in plans] + [p.cache_dir for p in plans]
    assert len(set(paths)) == 8 and sorted(p.seed for p in plans) == [5, 6, 7, 8]


@pytest.mark.slow
def test_wrapper_runs_kv_cache_under_a_rank(tmp_path):
    """A real tiny run through the top-level shim, as rank 1 of 2 (without mpirun: no barrier partner)."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n    hidden_dim: 512\n"
                   "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")
    env = {**os.environ, "PMI_RANK": "1", "PMI_SIZE": "2", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "mlperf_wrapper.py"), "--rank-output-base", str(tmp_path / "out"),
           "--rank-cache-base", str(tmp_path / "cache"), "--seed-base", "40", "--config", str(cfg),
           "--model", "micro", "--num-users", "3", "--duration", "1", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
           "--generation-mode", "none", "--io-chunk-mb", "1", "--start-delay", "0", "--end-delay", "0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    files = list((tmp_path / "out" / "rank_1").glob("kvcache_results_*.json"))
    assert len(files) == 1 and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank_1"]
    doc = json.loads(files[0].read_text())
    assert doc["seed"] == 41 and doc["measurement"]["run_dir"].startswith(str(tmp_path / "cache" / "rank_1") + "/")
    assert doc["summary"]["cache_stats"]["tier_storage_write_bandwidth_gbps"] > 0
