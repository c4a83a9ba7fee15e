"""Process-level behaviour: signals, exit codes, thread counts."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kv_cache.app import execute

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a real run (wall clock)
def test_sigterm_writes_results_and_cleans_up(tmp_path, quick_settings):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "foreign.npy").write_bytes(b"x")
    config = tmp_path / "micro.yaml"
    quick_settings()  # writes the micro model config
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(config), "--model", "micro",
           "--num-users", "4", "--duration", "60", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
           "--generation-mode", "none", "--cache-dir", str(cache), "--output", str(out), "--io-chunk-mb", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(p.name.startswith("kv-cache-run-") for p in cache.iterdir()):
        time.sleep(0.1)
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    results = json.loads(out.read_text())
    assert results["measurement"]["stop_reason"] == "interrupted"
    assert 0 < results["measurement"]["window_seconds"] < 30
    assert sorted(os.listdir(cache)) == ["foreign.npy"]


@pytest.mark.slow  # a real run (wall clock)
def test_usage_error_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "kv-cache.py"), "--num-users", "0", "--output", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--num-users must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.slow  # a real run (wall clock)
def test_many_users_do_not_create_threads(quick_settings, sink):
    peak = {"n": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak["n"] = max(peak["n"], threading.active_count())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results, _ = execute(quick_settings("--num-users", "1000", "--io-workers", "8"), sink)
    finally:
        stop.set()
        watcher.join()
    assert results["measurement"]["io_workers"] == 8
    assert results["requests_completed"] > 0
    assert peak["n"] <= 8 + 3  # main + watcher + workers (+ pytest's own)


@pytest.mark.slow  # a real run (wall clock)
def test_gpu_request_without_cuda_runs_a_simulated_tier_and_says_so(quick_settings, sink, monkeypatch):
    from kv_cache.storage import gpu_device

    monkeypatch.setattr(gpu_device, "cuda_status", lambda n=1: (False, "no CUDA device"))
    results, _ = execute(quick_settings("--gpu-mem-gb", "0.05"), sink)
    notes = results["measurement"]["notes"]
    assert len([n for n in notes if "GPU tier: SIMULATED" in n]) == 1
    gpu = results["measurement"]["gpu_tier"]
    assert gpu["mode"] == "simulated" and gpu["gpu"] == "h100" and gpu["h2d"]["bytes"] > 0
    assert results["summary"]["cache_stats"]["tier_gpu_kv_bytes_written_gb"] > 0
    assert "[SIMULATED GPU tier" in sink.getvalue() and "GPU tier: SIMULATED h100" in sink.getvalue()
