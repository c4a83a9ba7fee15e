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

from kv_cache.benchmarks.standard.run import execute

ROOT = Path(__file__).resolve().parents[1]


def _window_open(cache: Path) -> bool:
    """The measured window is open: a request wrote its first entry into the run directory (these runs
    have no preconditioning and no worker probe, so nothing else writes one). A readiness check, not a
    sleep: on a loaded host the run directory can come well before the window (its `.kv-cache-run`
    marker is written first, the first entry ~0.3 s later on a quiet host)."""
    return any(run.is_dir() and any(run.glob("*.npy")) for run in cache.glob("kv-cache-run-*"))


def _wait_for_window(cache: Path, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s  # only a hang reaches it
    while not _window_open(cache):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never opened its window"
        time.sleep(0.05)


@pytest.mark.slow  # a real run (wall clock)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal (ssh session) went away
def test_sigterm_writes_results_and_cleans_up(tmp_path, quick_settings, sig):
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
    _wait_for_window(cache, proc)  # the signal lands inside the window (was: a 2 s sleep after the run dir)
    time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    results = json.loads(out.read_text())
    assert results["measurement"]["stop_reason"] == "interrupted"
    assert 0 < results["measurement"]["window_seconds"] < 30
    assert results["verdict"] == "INCOMPLETE" and results["overall_passed"] is False  # never PASS
    assert 0 < results["window_fraction"] < 0.5
    assert sorted(os.listdir(cache)) == ["foreign.npy"]


def _on_a_terminal_that_hangs_up(cmd: list[str], ready) -> subprocess.Popen:
    """Start `cmd` as the leader of a session whose controlling terminal is a pty (stdout and stderr on it),
    read what it writes until `ready()` holds, then close the pty's master: the kernel sends the session
    SIGHUP and every later write to the terminal fails with EIO, as when an ssh session is lost."""
    import fcntl  # noqa: PLC0415
    import pty  # noqa: PLC0415
    import termios  # noqa: PLC0415

    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: fcntl.ioctl(1, termios.TIOCSCTTY, 0))
    os.close(slave)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ready():
        time.sleep(0.1)
    stop.set()
    os.close(master)  # the hangup
    return proc


@pytest.mark.slow  # a real run (wall clock)
def test_a_terminal_that_hangs_up_ends_the_run_with_its_results_written(tmp_path, quick_settings):
    """The terminal itself going away (SIGHUP, then EIO on every write to it): the run ends as on Ctrl-C,
    exit 130, its JSON written and its run files removed, never an internal error on the first report line."""
    cache = tmp_path / "cache"
    cache.mkdir()
    quick_settings()  # writes the micro model config
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(tmp_path / "micro.yaml"), "--model", "micro",
           "--num-users", "4", "--duration", "60", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
           "--generation-mode", "none", "--cache-dir", str(cache), "--output", str(out), "--io-chunk-mb", "1",
           "--xlsx-output", str(tmp_path / "r.xlsx")]
    started = []

    def ready() -> bool:  # the window is open (was: 2 s after the run dir appeared), then 0.2 s into it
        if not started and _window_open(cache):
            started.append(time.monotonic())
        return bool(started) and time.monotonic() - started[0] > 0.2

    proc = _on_a_terminal_that_hangs_up(cmd, ready)
    assert proc.wait(timeout=60) == 130
    results = json.loads(out.read_text())
    assert results["measurement"]["stop_reason"] == "interrupted" and results["verdict"] == "INCOMPLETE"
    assert (tmp_path / "r.xlsx").stat().st_size > 0  # written after the report that met the EIO
    assert os.listdir(cache) == []


def test_a_sighup_ignored_under_nohup_stays_ignored():
    """`nohup kv-cache ...` is meant to outlive the terminal: the run takes SIGINT and SIGTERM over but
    leaves a SIGHUP it was started ignoring ignored (and never restores what it did not take)."""
    from kv_cache.host.signals import catch_stop_signals  # noqa: PLC0415

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        handler = lambda signum, frame: None  # noqa: E731
        previous = catch_stop_signals(handler)
        assert sorted(previous) == sorted([signal.SIGINT, signal.SIGTERM])
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is handler
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert signal.SIGHUP in catch_stop_signals(handler)  # not ignored: taken over as the others
        assert signal.getsignal(signal.SIGHUP) is handler
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


@pytest.mark.slow  # a real run (wall clock)
def test_a_run_under_nohup_outlives_a_hangup(tmp_path, quick_settings):
    """SIGHUP to a run started with SIGHUP ignored (nohup): the window runs to its end, exit 0."""
    cache = tmp_path / "cache"
    cache.mkdir()
    quick_settings()  # writes the micro model config
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(tmp_path / "micro.yaml"), "--model", "micro",
           "--num-users", "4", "--duration", "4", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
           "--generation-mode", "none", "--cache-dir", str(cache), "--output", str(out), "--io-chunk-mb", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    _wait_for_window(cache, proc)  # the hang-up lands inside the window, after the handlers are installed
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert json.loads(out.read_text())["measurement"]["stop_reason"] != "interrupted"


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


def _signal_self_in(monkeypatch, owner, name: str, sig: int = signal.SIGINT, times: int = 1) -> dict:
    """Make the first call of `owner.name` send `sig` to this process `times` times (the test runs in the
    main thread, where the run's handler is installed), then do its work."""
    real = getattr(owner, name)
    sent = {"n": 0}

    def wrapped(*args, **kwargs):
        while sent.get("calls", 0) == 0 and sent["n"] < times:
            sent["n"] += 1
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # let the handler run before the next one
        sent["calls"] = sent.get("calls", 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return sent


@pytest.mark.slow  # a real run (wall clock)
@pytest.mark.parametrize("where", ["drain", "results", "clean-up"])
def test_a_late_ctrl_c_keeps_the_windows_results(quick_settings, sink, tmp_path, monkeypatch, where):
    """A Ctrl-C (twice) after the window closed: during the drain, while the results are built, while the
    run's files are removed. The window's results are written whole, the files are gone."""
    from kv_cache.benchmarks.standard import run as app
    from kv_cache.core.pool import WorkerPool
    from kv_cache.serving.tiers import TierSet

    owner, name = {"drain": (WorkerPool, "drain"), "results": (app, "build_results"),
                   "clean-up": (TierSet, "close")}[where]
    sent = _signal_self_in(monkeypatch, owner, name, times=2)
    outcome = app.run_benchmark(quick_settings(), sink)
    assert sent["n"] == 2
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["stop_reason"] == "duration" and results["total_requests"] > 0
    assert results["total_requests"] == len(results["end_to_end_latencies"])
    assert results["verdict"] in ("PASS", "FAIL") and results["window_fraction"] == 1.0
    assert not outcome.interrupted
    assert not (tmp_path / "cache").exists()  # entry files, marker, run dir and the cache dir it made: gone


@pytest.mark.slow  # a real run (wall clock)
def test_a_run_interrupted_in_its_window_is_incomplete_never_pass(quick_settings, sink, tmp_path, monkeypatch):
    from kv_cache.benchmarks.standard.run import run_benchmark
    from kv_cache.benchmarks.standard.scheduler import Driver
    from kv_cache.cli.exits import exit_status

    _signal_self_in(monkeypatch, Driver, "_close_bucket")  # one second into the window
    outcome = run_benchmark(quick_settings("--duration", "6"), sink)
    assert outcome.interrupted and exit_status(outcome) == 130
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["stop_reason"] == "interrupted" and results["total_requests"] > 0
    assert results["overall_passed"] is False and results["verdict"] == "INCOMPLETE"
    assert 0 < results["window_fraction"] < 1
    health = results["summary"]["cache_stats"]["storage_health"]
    assert health["overall_status"] == "INCOMPLETE"
    assert [c for c in health["criteria"] if not c["passed"]][-1]["name"] == "Measured Window Completed"
    text = sink.getvalue()
    assert "STORAGE PERFORMANCE ASSESSMENT: INCOMPLETE" in text and "Run INCOMPLETE: interrupted after" in text


@pytest.mark.slow  # a real run (wall clock)
def test_a_storage_error_while_preconditioning_stops_the_run_with_exit_3(quick_settings, tmp_path, monkeypatch,
                                                                        capsys):
    """The StorageError is raised from the preconditioning path: the phases' results are written, the
    files removed, and the CLI says it in one line with exit status 3."""
    from kv_cache.cli import main
    from kv_cache.storage import files

    real_write = files.FileStore.write
    calls = {"n": 0}

    def failing_write(self, key, nbytes, bufs, stop=None):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(28, "No space left on device")
        return real_write(self, key, nbytes, bufs, stop)

    monkeypatch.setattr(files.FileStore, "write", failing_write)
    quick_settings()  # writes micro.yaml
    argv = ["--config", str(tmp_path / "micro.yaml"), "--model", "micro", "--num-users", "2", "--duration", "60",
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--io-chunk-mb", "1",
            "--precondition", "--precondition-size-gb", "0.05",
            "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "r.json")]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "kv-cache: error: run stopped by a storage error before the measured window: " in err
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["stop_reason"].startswith("storage error before the measured phase")
    assert results["verdict"] == "INCOMPLETE" and results["window_fraction"] == 0.0
    crit = {c["name"]: c for c in results["summary"]["cache_stats"]["storage_health"]["criteria"]}
    assert not crit["Not Stopped By A Storage Error"]["passed"]
    assert "No space left" in crit["Not Stopped By A Storage Error"]["actual"]
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow  # a real run (wall clock)
def test_a_second_ctrl_c_cuts_a_hung_drain_short_and_keeps_the_results(quick_settings, sink, tmp_path,
                                                                      monkeypatch):
    """The first write of the window hangs (a store that stops answering) and is still on its worker when
    the window closes; two Ctrl-Cs during the drain: the stuck request is abandoned, the results are
    written with it counted, and the run's files are removed."""
    from kv_cache.benchmarks.standard import run as app
    from kv_cache.core.pool import WorkerPool
    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.storage import files
    from kv_cache.storage.base import IOAborted

    opened, hung, release = threading.Event(), threading.Event(), threading.Event()
    real_open, real_write = RunMetrics.open_window, files.FileStore.write

    def open_window(self, *args, **kwargs):
        opened.set()
        return real_open(self, *args, **kwargs)

    def hanging_write(self, key, nbytes, bufs, stop=None):
        if opened.is_set() and not hung.is_set():
            hung.set()
            release.wait(120)  # never set before the run ends: this request is in flight at the drain
            raise IOAborted(f"write of {key!r} released after the run", 0)
        return real_write(self, key, nbytes, bufs, stop)

    monkeypatch.setattr(RunMetrics, "open_window", open_window)
    monkeypatch.setattr(files.FileStore, "write", hanging_write)
    sent = _signal_self_in(monkeypatch, WorkerPool, "drain", times=2)  # the driver's drain, window closed
    try:
        outcome = app.run_benchmark(quick_settings("--duration", "1", "--io-workers", "2"), sink)
    finally:
        release.set()
    assert sent["n"] == 2 and hung.is_set()
    assert not outcome.interrupted  # the window ran to its end: the cut drain does not make it INCOMPLETE
    results = json.loads((tmp_path / "r.json").read_text())
    meas = results["measurement"]
    assert results["stop_reason"] == "duration" and results["window_fraction"] == 1.0
    assert meas["requests_abandoned_at_drain_cut"] >= 1
    assert meas["requests_abandoned_at_stop"] >= meas["requests_abandoned_at_drain_cut"]
    assert any("cut short by a second signal" in n for n in meas["notes"])
    assert results["verdict"] in ("PASS", "FAIL")
    assert not (tmp_path / "cache").exists()  # entry files, marker, run dir: gone, the stuck worker notwithstanding


def test_the_results_are_on_disk_before_the_runs_files_are_removed(quick_settings, sink, monkeypatch):
    """Removing a run's entry files takes time; a launcher may end the process meanwhile (mpirun after
    another rank died). So the results JSON is written first, and only then are the stores closed."""
    from kv_cache.serving.tiers import TierSet

    settings = quick_settings("--duration", "1")
    seen: list[bool] = []
    real_close = TierSet.close

    def close(self):
        seen.append(Path(settings.outputs.output).is_file())
        return real_close(self)

    monkeypatch.setattr(TierSet, "close", close)
    results, _ = execute(settings, sink)
    assert seen and seen[0] is True
    assert json.loads(Path(settings.outputs.output).read_text())["total_requests"] == results["total_requests"]


def test_the_cpu_per_gib_counts_the_windows_cpu_not_the_set_up_before_it(quick_settings, sink, monkeypatch):
    """measurement.cpu_seconds_per_gib divides by the window's bytes; its CPU was counted from before the
    stores, the I/O-worker probe and the warm-up phases, so a set-up's CPU inflated the "CPU-s per GiB
    moved" (a 5 s O_DIRECT run: 1.12 CPU-s, 0.10 per GiB). Here the phases before the window are charged
    100 CPU-s through a stand-in getrusage: none of it may be in the figure."""
    import resource

    from kv_cache.benchmarks.standard import run as run_mod

    real_getrusage, extra = resource.getrusage, {"s": 0.0}

    class Usage:
        def __init__(self, ru):
            self._ru, self.ru_utime = ru, ru.ru_utime + extra["s"]  # the charge as it stands now

        def __getattr__(self, name):
            return getattr(self._ru, name)

    real_phases = run_mod.run_phases

    def phases(*args, **kwargs):
        out = real_phases(*args, **kwargs)
        extra["s"] = 100.0  # the set-up before the window burnt 100 CPU-s
        return out

    monkeypatch.setattr(resource, "getrusage", lambda who: Usage(real_getrusage(who)))
    monkeypatch.setattr(run_mod, "run_phases", phases)
    results, _ = execute(quick_settings(), sink)
    meas = results["measurement"]
    assert extra["s"] == 100.0 and meas["process_cpu_seconds"] < 100.0


def test_the_cpu_per_gib_leaves_out_the_io_workers_buffer_set_up(quick_settings, sink, monkeypatch):
    """The I/O workers allocate and fill their buffers in WorkerPool.start, before the driver opens the
    window; that CPU (8 workers: ~0.5 CPU-s, issue 30) was in measurement.process_cpu_seconds. Here the
    pool's start is charged 100 CPU-s through a stand-in getrusage: none of it may be in the figure."""
    import resource

    from kv_cache.core import pool as pool_mod

    real_getrusage, extra = resource.getrusage, {"s": 0.0}

    class Usage:
        def __init__(self, ru):
            self._ru, self.ru_utime = ru, ru.ru_utime + extra["s"]

        def __getattr__(self, name):
            return getattr(self._ru, name)

    real_start = pool_mod.WorkerPool.start

    def start(self):
        out = real_start(self)
        extra["s"] += 100.0  # the buffers' set-up burnt 100 CPU-s
        return out

    monkeypatch.setattr(resource, "getrusage", lambda who: Usage(real_getrusage(who)))
    monkeypatch.setattr(pool_mod.WorkerPool, "start", start)
    results, _ = execute(quick_settings(), sink)
    assert extra["s"] >= 100.0 and results["measurement"]["process_cpu_seconds"] < 100.0
