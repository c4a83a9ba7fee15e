"""Sessions v3 items 5-7: write-through (inclusive) DRAM offload, the (model, GPU) grid, the AIPerf
agentic-code trace replayed with the article's pace transform, and the generator's lognormal pauses."""

import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from kv_cache.cli import build_parser, main
from kv_cache.cli import parse_sessions_settings as resolve
from kv_cache.errors import UsageError
from kv_cache.results.documents import SESSIONS_SCHEMA_VERSION, SessionsDocument
from kv_cache.results.sessions_document import pace_transform
from kv_cache.serving.engine.replica import Replica, TurnRequest
from kv_cache.settings.pacing import parse_pace
from kv_cache.settings.sections import SessionsConfig
from kv_cache.workload.sessions import apply_pace, generate_session, sessions_from_trace
from kv_cache.workload.traces import open_trace

FIXTURES = Path(__file__).parent / "fixtures"
AIPERF = FIXTURES / "aiperf_agentic_code_seed42.jsonl"  # `aiperf synthesize agentic-code --num-sessions 4 --seed 42`
SMALL = ("sessions:\n  first_turn_tokens_mean: 3000\n  shared_prefix_tokens: 1024\n  new_tokens_mean: 1500\n"
         "  new_tokens_median: 1000\n  output_tokens_mean: 60\n  output_tokens_median: 40\n  turns_mean: 6\n"
         "  max_context_tokens: 20000\n"
         "model_configs:\n  micro:\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n    kv_heads: 1\n"
         "  micro2:\n    num_layers: 2\n    hidden_dim: 512\n    num_heads: 4\n    kv_heads: 1\n")


@pytest.fixture
def argv(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL)

    def make(*extra):
        return ["--config", str(cfg), "--gpu-mem-gb", "0.012", "--window", "1", "--warmup", "0",
                "--subwindows", "2", "--cpu-mem-gb", "0.05", "--pace", "fixed:0.05", "--io-workers", "2",
                "--io-chunk-mb", "1", "--no-fsync", "--output", str(tmp_path / "s.json"), *extra]

    return make


# -- write-through -------------------------------------------------------------------------------------
class _Cache:
    def __init__(self):
        self.held = set()

    def contains(self, key):
        return key in self.held


class _IO:
    """Records stores; a store lands in the cache at once unless `queue` keeps it pending."""

    def __init__(self, queue=False):
        self.cache, self.stored, self.queue, self.pending = _Cache(), [], queue, set()

    def store(self, key):
        self.stored.append(key)
        (self.pending if self.queue else self.cache.held).add(key)

    def holds_or_queued(self, key):
        return key in self.pending or self.cache.contains(key)


def _replica(capacity, io, **kw):
    stop = threading.Event()
    stop.set()
    r = Replica(0, capacity, 1, lambda *a: 0.0, io, lambda *a: None, lambda *a: None, lambda *a: None, 8, stop, **kw)
    r.thread.join()
    return r


def _turn(keys):
    return TurnRequest(slot=0, session_id="s", turn_index=0, turn_class="return", issue_ns=0,
                       input_tokens=len(keys), new_tokens=1, output_tokens=1, input_keys=list(keys),
                       final_keys=list(keys), needed_slots=len(keys))


@pytest.mark.parametrize("queue", [False, True])
def test_write_through_stores_every_computed_block_once_on_completion(queue):
    io = _IO(queue)
    r = _replica(2, io, write_through=True)
    a = _turn(["a0", "a1"])
    assert r._try_admit(a)
    r._complete(a)
    assert io.stored == ["a0", "a1"]  # written on compute, before any eviction
    b = _turn(["b0", "b1"])
    assert r._try_admit(b)  # evicts a0, a1: already stored (or queued), so nothing more is written
    r._complete(b)
    assert io.stored == ["a0", "a1", "b0", "b1"]


def test_without_write_through_only_evictions_are_stored():
    io = _IO()
    r = _replica(2, io)
    a = _turn(["a0", "a1"])
    r._try_admit(a)
    r._complete(a)
    assert io.stored == []
    b = _turn(["b0"])
    r._try_admit(b)
    assert io.stored == ["a1"]  # the tail goes first (vLLM's free-queue order)


# -- grid ----------------------------------------------------------------------------------------------
def test_grid_resolves_every_model_and_gpu_cell(argv):
    s = resolve(argv("--models", "micro,micro2", "--gpus", "l40s,h100"))
    assert [(c.model_name, c.gpu_name) for c in s.grid] == [
        ("micro", "l40s"), ("micro", "h100"), ("micro2", "l40s"), ("micro2", "h100")]
    assert s.ladder_settings == s.grid[0]
    assert resolve(argv("--model", "micro", "--gpu", "l40s")).grid == ()


def test_a_gpu_no_published_run_supports_leads_each_cells_warnings(argv):
    from kv_cache.results.sessions_document import engine_gpu_warning

    s = resolve(argv("--models", "micro", "--gpus", "b200,h100"))
    b200, h100 = (engine_gpu_warning(c) for c in s.grid)
    assert b200 == ["engine model unvalidated on this GPU: on B200 the roofline has no published check: this "
                    "run's absolute figures are unvalidated"]
    assert h100 == []  # the H100 has 16-bit checks within 20 %


def test_report_reprints_each_cells_engine_model_line(argv):
    # `kv-cache report` printed the warnings but not the Engine model line, so a saved run's roofline error
    # and what the table holds for its GPU were only in the JSON; it reprints the line the run printed, one
    # per cell (named) for a grid, none for a document without engine_calibration
    from kv_cache.cli.report_cmd import _engine_lines
    from kv_cache.render.sessions import engine_line
    from kv_cache.results.sessions_document import engine_calibration

    s = resolve(argv("--models", "micro", "--gpus", "b200,h100"))
    cells = [{"parameters": {"model": "micro", "num_gpus": 1, "gpu": c.gpu_name,
                             "engine_calibration": engine_calibration(c)}} for c in s.grid]
    out = io.StringIO()
    _engine_lines({"grid": cells, **cells[0]}, out)
    lines = out.getvalue().splitlines()
    assert lines == [f"[micro on 1 x {g}] " + engine_line(c["parameters"]["engine_calibration"])
                     for g, c in zip(("b200", "h100"), cells, strict=True)]
    assert "this run's GPU: on B200 the roofline has no published check" in lines[0]
    one = io.StringIO()
    _engine_lines(cells[1], one)
    assert one.getvalue() == engine_line(cells[1]["parameters"]["engine_calibration"]) + "\n"
    none = io.StringIO()
    _engine_lines({"parameters": {"model": "micro"}}, none)
    _engine_lines({"parameters": {"engine_calibration": {"prefill_mfu": 0.65}}}, none)  # an older document
    assert none.getvalue() == ""


def test_grid_names_the_bad_cell_before_anything_runs(argv):
    with pytest.raises(UsageError, match="unknown model 'nope'"):
        resolve(argv("--models", "micro,nope", "--gpus", "l40s"))
    with pytest.raises(UsageError, match="--models needs"):
        resolve(argv("--models", ",", "--gpus", "l40s"))


@pytest.mark.slow  # two cells of one 1 s rung each, in real time
def test_grid_run_prints_one_table_and_answer_per_cell(argv, tmp_path, capsys):
    code = main(["sessions", *argv("--models", "micro,micro2", "--gpus", "l40s", "--ladder", "1",
                                   "--tiers", "none", "--dram-write-through")])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("SESSIONS HELD") == 2
    assert "micro on 1 x l40s:" in out and "micro2 on 1 x l40s:" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert [(c["parameters"]["model"], c["parameters"]["gpu"]) for c in data["grid"]] == [
        ("micro", "l40s"), ("micro2", "l40s")]
    assert all(len(c["rungs"]) == 1 and c["summary"] for c in data["grid"])
    assert data["rungs"] == data["grid"][0]["rungs"]  # the first cell is the document's own (readers keep working)
    cal = data["parameters"]["engine_calibration"]
    assert len(cal["entries"]) >= 3 and cal["max_abs_prefill_error"] <= 0.2 and cal["this_pair"] is None
    # the L40S's one check is an FP8 run: a 16-bit run on it says so on the Engine model line, and every
    # cell's warnings open with it
    assert cal["this_gpu"]["gpu"] == "l40s" and cal["this_gpu"]["unvalidated"]
    assert "this run's GPU: on L40S the roofline has no check at 16-bit; at other precisions: MLPerf" in out
    assert all(c["warnings"][0].startswith("engine model unvalidated on this GPU: on L40S") for c in data["grid"])
    assert data["parameters"]["dram_write_through"] is True
    # `kv-cache report` of the grid reprints every cell and the grid lines (it printed the first cell only)
    from argparse import Namespace

    from kv_cache.cli.report_cmd import report_command

    report = io.StringIO()
    assert report_command(Namespace(result=str(tmp_path / "s.json"), plots=None), [], report) == 0
    text = report.getvalue()
    assert text.count("SESSIONS HELD") == 2 and "micro2 on 1 x l40s:" in text and "Grid (one answer" in text
    assert text.count("this run's GPU: on L40S the roofline has no check at 16-bit") == 2  # each cell's line


# -- the AIPerf agentic-code trace and the article's pace transform ------------------------------------
def test_aiperf_agentic_code_dataset_replays_directly():
    trace = open_trace(str(AIPERF), "auto")
    assert trace.format == "aiperf"
    scripts = sessions_from_trace(trace)
    rows = [json.loads(line) for line in AIPERF.read_text().splitlines()]
    assert len(scripts) == len({r["session_id"] for r in rows}) == 4
    assert sum(len(s.turns) for s in scripts) == len(rows) == 66
    assert scripts[0].block_tokens == 512
    first = scripts[0]
    second_row = next(r for r in rows[1:] if r["session_id"] == first.session_id)
    assert first.turns[1].pause_before_s == pytest.approx(second_row["delay"] / 1000)


def test_article_pace_transform_is_a_seeded_uniform_30_60_s_draw():
    scripts = sessions_from_trace(open_trace(str(AIPERF), "auto"))
    pace = parse_pace("human:30:60")
    paced = [apply_pace(s, pace, 42) for s in scripts]
    pauses = [t.pause_before_s for s in paced for t in s.turns[1:]]
    assert all(30 <= p <= 60 for p in pauses) and len(set(pauses)) == len(pauses)
    assert all(s.turns[0] == o.turns[0] for s, o in zip(paced, scripts, strict=True))  # first turns untouched
    assert [apply_pace(s, pace, 42) for s in scripts] == paced  # seeded
    assert [apply_pace(s, pace, 43) for s in scripts] != paced
    text = pace_transform(pace, "human:30:60", 42)
    assert (text["low_s"], text["high_s"], text["seed"]) == (30, 60, 42)
    assert "uniform 30-60 s draw" in text["description"]


def test_generator_pauses_are_aiperfs_lognormal_mixture():
    cfg = SessionsConfig()
    turns = [t for i in range(400) for t in generate_session(cfg, 7, i).turns[1:]]
    for kind, mean, median in (("agentic", 5.0, 2.0), ("human", 30.0, 15.0)):
        p = np.array([t.pause_before_s for t in turns if t.pause_kind == kind])
        assert np.median(p) == pytest.approx(median, rel=0.15)
        assert np.log(p).std() == pytest.approx(np.sqrt(2 * np.log(mean / median)), rel=0.1)  # lognormal sigma
    human = sum(t.pause_kind == "human" for t in turns) / len(turns)
    assert human == pytest.approx(0.3, abs=0.03)


# -- the recipe ----------------------------------------------------------------------------------------
RECIPE = Path(__file__).parent.parent / "benchmarks" / "sessions_article.sh"


def test_recipe_asks_for_the_answer_with_three_replications_and_runs_dram():
    assert subprocess.run(["bash", "-n", str(RECIPE)], check=False).returncode == 0
    text = RECIPE.read_text()
    assert "--slo-ttft-p90 2 --replications 3" in text and "--tiers none,dram,dram+storage" in text
    assert "--tier-bandwidth" in text  # the tier shaped to the article's per-GPU share on a RAM-backed path
    command = text[text.index("python3 -m kv_cache sessions"):]
    known = {o for a in build_parser("sessions")._actions for o in a.option_strings}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command)) - known == set()


@pytest.mark.parametrize("shape", ["0.938", "0"])
def test_recipe_command_resolves_as_the_script_builds_it(tmp_path, shape):
    """A dry run of the script itself: `python3 -m kv_cache` is a shim that resolves the settings the script
    built (every flag and value, its config file included) and stops before anything runs."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real = sys.executable
    probe = ("import json, sys; from kv_cache.cli import parse_sessions_settings as p; "
             "s = p(sys.argv[1:]); st = s.ladder_settings.storage; print(json.dumps({'replications': s.replications, "
             "'slo': s.slo_ttft_p90_s, 'tiers': list(s.tiers), 'gbps': st.tier_bandwidth_gbps}))")
    (shim / "python3").write_text(
        f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = kv_cache ] && [ "$3" = sessions ]; then shift 3; '
        f'exec "{real}" -c "{probe}" "$@"; fi\nexec "{real}" "$@"\n')
    (shim / "python3").chmod(0o755)
    tier = tmp_path / "tier"
    tier.mkdir()
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "TIER_GBPS": shape,
           "PYTHONPATH": str(RECIPE.parent.parent), "OUT": str(tmp_path / "out.json")}
    done = subprocess.run(["bash", str(RECIPE), str(tier), "5"], env=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {"replications": 3, "slo": 2.0, "tiers": ["none", "dram", "dram+storage"],
                      "gbps": float(shape)}


def test_sessions_document_exposes_its_grid_cells():
    cells = [{"parameters": {"model": "a"}, "rungs": []}, {"parameters": {"model": "b"}, "rungs": []}]
    doc = SessionsDocument({"schema_version": SESSIONS_SCHEMA_VERSION, "rungs": [], "grid": cells})
    assert [c["parameters"]["model"] for c in doc.grid] == ["a", "b"]
    assert SessionsDocument({"schema_version": SESSIONS_SCHEMA_VERSION, "rungs": []}).grid == []
