"""Sessions held: closed loop, real offload I/O, ladder output (small, fast configurations)."""

import json

import pytest

from kv_cache.benchmarks.sessions.ladder import RungRun
from kv_cache.cli import main
from kv_cache.cli import parse_sessions_settings as resolve
from kv_cache.workload.session_supply import script_supply

SMALL = ("sessions:\n  first_turn_tokens_mean: 3000\n  shared_prefix_tokens: 1024\n  new_tokens_mean: 1500\n"
         "  new_tokens_median: 1000\n  output_tokens_mean: 60\n  output_tokens_median: 40\n  turns_mean: 6\n"
         "  max_context_tokens: 20000\n"
         # 512 bytes/token: a 512-token block is 256 KiB, so storage I/O stays small and fast in tests
         "model_configs:\n  micro:\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n    kv_heads: 1\n")


@pytest.fixture
def argv(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL)

    def make(*extra):
        return ["--config", str(cfg), "--model", "micro", "--gpu", "l40s", "--gpu-mem-gb", "0.012",
                "--window", "2", "--warmup", "0.5", "--subwindows", "4", "--cpu-mem-gb", "0.05",
                "--cache-dir", str(tmp_path / "cache"), "--pace", "fixed:0.05", "--io-workers", "2",
                "--io-chunk-mb", "1", "--no-fsync", "--output", str(tmp_path / "s.json"), *extra]

    return make


def ladder_inputs(argv):
    s = resolve(argv)
    return s.ladder_settings, None, s.sessions


class CheckedRung(RungRun):
    """Records every issue and completion to check the closed-loop invariant."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.events = []

    def _issue(self, slot, now):
        super()._issue(slot, now)
        self.events.append(("issue", slot.index, now, slot.turn - 1))

    def _done(self, req, now):
        self.events.append(("done", req.slot, now, req.turn_index))
        super()._done(req, now)


@pytest.mark.slow  # runs rungs in real time
def test_closed_loop_never_two_outstanding_turns_per_session(argv):
    ls, scripts, sess = ladder_inputs(argv())
    rung = CheckedRung(ls, "dram+storage", 4, script_supply(scripts, sess, ls.seed))
    result = rung.run()
    assert result["closed_loop_violations"] == 0
    per_slot = {}
    for kind, slot, t, turn in rung.events:
        per_slot.setdefault(slot, []).append((kind, t, turn))
    assert len(per_slot) == 4
    returns = 0
    for events in per_slot.values():
        kinds = [k for k, _, _ in events]
        # strictly alternating issue, done, issue, ... (the last turn may still be running at the end)
        assert all(k == ("issue" if i % 2 == 0 else "done") for i, k in enumerate(kinds))
        for (k1, t1, _), (_k2, t2, turn) in zip(events, events[1:], strict=False):
            if k1 == "done" and turn > 0:  # a session's next turn waits for the answer plus its pause
                assert t2 - t1 >= 0.04e9
                returns += 1
    assert returns > 0


@pytest.mark.slow  # runs rungs in real time
def test_offload_tier_does_real_storage_io(argv, tmp_path):
    # no DRAM tier: every block evicted from HBM goes to files, every reload comes from them
    ls, scripts, sess = ladder_inputs(argv("--cpu-mem-gb", "0", "--window", "4", "--warmup", "0"))
    result = RungRun(ls, "dram+storage", 8, script_supply(scripts, sess, ls.seed)).run()
    o = result["offload_io"]
    assert o["storage_write_ops"] > 0 and o["storage_write_gib"] > 0  # HBM evictions went down to files
    assert o["storage_read_ops"] > 0 and o["storage_read_gib"] > 0  # returning sessions loaded them back
    assert result["kv_sources"]["loaded_share"] > 0
    assert not any((tmp_path / "cache").glob("kv-cache-run-*"))  # the rung removed its files


@pytest.mark.slow  # runs rungs in real time
def test_no_tier_recomputes_and_does_no_io(argv):
    ls, scripts, sess = ladder_inputs(argv())
    result = RungRun(ls, "none", 4, script_supply(scripts, sess, ls.seed)).run()
    assert result["offload_io"]["storage_write_ops"] == 0 and result["kv_sources"]["loaded_share"] == 0
    assert result["kv_sources"]["recomputed_share"] > 0


@pytest.mark.slow  # runs rungs in real time
def test_ladder_output_has_curve_capacity_ratios_and_cis(argv, tmp_path):
    code = sessions_main(argv("--ladder", "2,4", "--tiers", "none,dram+storage"))
    assert code == 0
    data = json.loads((tmp_path / "s.json").read_text())
    assert next(iter(data)) == "schema_version" and data["schema_version"] == "kv-cache-sessions/1"
    assert len(data["rungs"]) == 4 and data["method"]
    r = data["rungs"][0]
    for key in ("throughput_tokens_per_s_per_gpu", "prefill_tokens_per_s_per_gpu", "decode_tokens_per_s_per_gpu"):
        ci = r[key]
        assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["n"] == 4
    assert set(r["ttft"]) == {"start", "return", "agentic"} and "n" in r["ttft"]["start"]
    assert {"turns_offered", "turns_completed", "flagged"} <= r["work"].keys()
    summary = data["summary"]
    assert set(summary["configs"]) == {"none", "dram+storage"}
    none = [r for r in data["rungs"] if r["tiers"] == "none"]
    peak = max(none, key=lambda r: r["throughput_tokens_per_s_per_gpu"]["estimate"])
    assert summary["configs"]["none"]["effective_capacity_sessions"] == peak["sessions"]
    assert summary["ratios"][0]["baseline"] == "none"


@pytest.mark.parametrize("extra, message", [
    (["--ladder", "0,4"], "--ladder needs positive integers"),
    (["--tiers", "ssd"], "--tiers accepts"),
    (["--gpu", "tpu"], "unknown GPU"),
    (["--pace", "slow"], "--pace"),
    (["--subwindows", "1"], "--subwindows must be >= 2"),
    (["--model", "llama3.1-70b-instruct", "--gpu-mem-gb", "10"], "does not fit"),
    (["--replications", "0"], "--replications must be >= 1"),
    (["--slo-ttft-p90", "-1"], "--slo-ttft-p90 must be positive"),
    # inf ran the whole ladder, then ended in a JSON ValueError writing the results (exit 70)
    (["--slo-ttft-p90", "inf"], "--slo-ttft-p90 must be positive"),
    (["--tier-bandwidth", "inf"], "--tier-bandwidth must be finite"),
    (["--tier-latency", "inf"], "--tier-latency must be finite"),
    (["--window", "inf"], "--window must be finite"),
    (["--load-policy", "never"], "--load-policy"),
])
def test_bad_arguments_are_one_line_errors(argv, capsys, extra, message):
    assert sessions_main(argv(*extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def sessions_main(argv):
    return main(["sessions", *argv])


def test_sessions_subcommand_is_reachable_from_main(argv, capsys):
    assert main(["sessions", *argv("--tiers", "bogus")]) == 2
    assert "kv-cache sessions: error" in capsys.readouterr().err


@pytest.mark.slow  # runs rungs in real time
def test_interrupt_keeps_finished_rungs_and_cleans_up(argv, tmp_path):
    import signal
    import subprocess
    import sys

    # a 5 s window (warm-up 0.5 s): the second rung is still running when the SIGINT comes, even with the
    # test's read of the first rung's line late by seconds on a loaded host (the 2 s window left 2.5 s)
    cmd = [sys.executable, "-m", "kv_cache", "sessions", *argv("--ladder", "2,2", "--tiers", "dram+storage",
                                                               "--window", "5")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "tok/s" in line:  # the first rung has finished (and its line printed): interrupt the second
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=60)
    data = json.loads((tmp_path / "s.json").read_text())
    assert proc.returncode == 130 and "interrupted after 1 rung" in err
    assert len(data["rungs"]) == 1 and data["interrupted"] is True
    assert not any((tmp_path / "cache").glob("kv-cache-run-*"))


@pytest.mark.slow  # runs a rung in real time
def test_a_load_shape_moves_the_number_of_slots_at_monitor_ticks(argv):
    ls, scripts, sess = ladder_inputs(argv())

    class Grow:
        interval_s = 0.2

        def __init__(self):
            self.seen = []

        def tick(self, sample):
            self.seen.append(sample.users)
            return 4

    shape = Grow()
    rung = CheckedRung(ls, "none", 2, script_supply(scripts, sess, ls.seed), shape=shape)
    result = rung.run()
    assert shape.seen[0] == 2 and shape.seen[-1] == 4
    assert {slot for _, slot, _, _ in rung.events} == {0, 1, 2, 3}
    assert result["closed_loop_violations"] == 0


@pytest.mark.slow  # runs rungs in real time
def test_replications_slo_and_checks_reach_the_results(argv, tmp_path, capsys):
    code = sessions_main(argv("--ladder", "2,3", "--tiers", "none,dram", "--window", "1", "--replications", "2",
                              "--slo-ttft-p90", "5", "--load-policy", "cost"))
    assert code == 0
    data = json.loads((tmp_path / "s.json").read_text())
    p = data["parameters"]
    assert p["replications"] == 2 and p["slo_ttft_p90_s"] == 5 and p["load_policy"] == "cost"
    for r in data["rungs"]:
        assert r["replications"]["k"] == 2 and len(r["replications"]["seeds"]) == 2
        assert r["throughput_tokens_per_s_per_gpu"]["n"] == 2 and r["throughput_tokens_per_s_per_gpu"]["low"] >= 0
        assert {"queue_wait_s", "load_s", "prefill_s", "load_gbps"} <= r["ttft_breakdown"]["return"].keys()
        assert r["engine_clock"]["iterations"] > 0 and "flags" in r
    assert data["rungs"][-1]["offload_io_rates"]["load"]["offered_gbps"] >= 0
    c = data["summary"]["configs"]["none"]
    assert c["capacity_basis"].startswith("largest sessions") and "peak_throughput_sessions" in c
    assert isinstance(data["warnings"], list)
    out = capsys.readouterr().out
    assert "TTFT of returning turns, broken down" in out and "Offload I/O per rung" in out
