"""--start-delay / --end-delay: the Rules' settle time, declared once in the settings tree; 90 s under
mlperf_wrapper.py, 0 for the plain tool, 0 a flag away; interruptible, and said in the banner."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from kv_cache.cli import build_parser, main, parse_settings, settle
from kv_cache.cli.resolve import resolve_run
from kv_cache.cli.wrapper import plan_rank
from kv_cache.render.banner import banner_lines
from kv_cache.settings.run import MLPERF_SETTLE_S

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 5, 4, 3, 2, 1)


def _wrapper_settings(tmp_path, *extra):
    argv = ["--rank-output-base", str(tmp_path / "o"), "--rank-cache-base", str(tmp_path / "c"), "--seed-base", "1",
            "--model", "llama3.1-8b", *extra]
    kv = list(plan_rank(argv, {}, NOW).argv)
    return resolve_run(build_parser().parse_args(kv), kv, rank_paths=False, flags_per_rank=True)


def test_the_wrapper_waits_the_mlperf_tools_90_s_and_the_plain_tool_none(tmp_path):
    under_wrapper = _wrapper_settings(tmp_path).driver
    assert under_wrapper.start_delay == under_wrapper.end_delay == MLPERF_SETTLE_S == 90.0
    plain = parse_settings(["--model", "llama3.1-8b"]).driver
    assert plain.start_delay == plain.end_delay == 0.0


def test_zero_is_a_flag_away_under_the_wrapper(tmp_path):
    d = _wrapper_settings(tmp_path, "--start-delay", "0", "--end-delay", "0").driver
    assert d.start_delay == d.end_delay == 0.0


def test_a_negative_delay_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--start-delay", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--start-delay cannot be negative" in err


def test_the_waits_come_before_and_after_the_run():
    events, out = [], io.StringIO()
    code = settle.around(lambda: events.append("run") or 3, 1.5, 2.0, out=out, err=io.StringIO(), sleep=events.append)
    assert code == 3 and events == [1.5, "run", 2.0]
    assert "Waiting 1.5 s before the run (--start-delay" in out.getvalue()
    assert "Waiting 2 s after the run (--end-delay" in out.getvalue()


def _interrupt(_seconds):
    raise KeyboardInterrupt


def test_ctrl_c_in_the_start_delay_runs_nothing_and_exits_130():
    ran, err = [], io.StringIO()
    code = settle.around(lambda: ran.append(1) or 0, 90, 90, out=io.StringIO(), err=err, sleep=_interrupt)
    assert code == 130 and ran == [] and "nothing was run" in err.getvalue() and err.getvalue().count("\n") == 1


def test_ctrl_c_in_the_end_delay_keeps_the_runs_exit_status():
    err = io.StringIO()
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    assert settle.around(lambda: 0, 90, 90, out=io.StringIO(), err=err, sleep=sleep) == 0
    assert "results are written and stand" in err.getvalue()


def test_the_banner_says_the_settle_time(tmp_path):
    lines = banner_lines(_wrapper_settings(tmp_path), [], 4, None)
    assert "Settle time: waited 90 s before the run (--start-delay), 90 s after its results are written " \
           "(--end-delay)" in lines
    plain = banner_lines(parse_settings(["--model", "llama3.1-8b"]), [], 4, None)
    assert not any(line.startswith("Settle time") for line in plain)  # the plain tool's banner unchanged


@pytest.mark.slow  # a child process waiting for its signal
def test_sigint_during_a_real_start_delay_is_a_clean_exit(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--model", "llama3.1-8b", "--num-users", "2", "--duration", "5",
           "--start-delay", "600", "--cache-dir", str(tmp_path / "cache"), "--output", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()  # the wait is said before it starts
    assert line.startswith("Waiting 600 s before the run"), line
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().endswith("interrupted during the start delay; nothing was run")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no results, no cache dir: nothing ran


def test_a_delay_past_the_duration_limit_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--end-delay", "1e12"]) == 2  # (time.sleep would raise OverflowError on it)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--end-delay exceeds" in err and "got 1e+12" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_end_delay_ends_on_a_signal_although_the_run_ignores_them_to_its_exit(sig):
    """After its results a CLI run ignores stop signals to the process's exit (host/signals.py ignore_to_exit),
    and the end delay that follows said 'Ctrl-C ends the wait' but waited its 20 s out (90 s under
    mlperf_wrapper.py). The wait now ends on SIGINT or SIGTERM, and the signals are ignored again after it."""
    import time

    from kv_cache.host.signals import ignore_to_exit

    saved = {s: signal.getsignal(s) for s in settle.WAIT_SIGNALS}
    ignore_to_exit(settle.WAIT_SIGNALS)
    try:
        def sleep(_seconds):
            os.kill(os.getpid(), sig)
            for _ in range(1000):  # the handler runs in the main thread at its next check: within these 10 s
                time.sleep(0.01)

        out, err = io.StringIO(), io.StringIO()
        assert settle.around(lambda: 0, 0, 20, out=out, err=err, sleep=sleep) == 0
        assert "end delay cut short" in err.getvalue()
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in settle.WAIT_SIGNALS)
    finally:
        for s, old in saved.items():
            signal.signal(s, old)
