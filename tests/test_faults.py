"""Fault suite: the real CLI against a read-only mount (EROFS), a tiny tmpfs (ENOSPC), SIGKILL followed by a
second run, a double Ctrl-C, a FUSE filesystem returning EIO, and a memory cgroup. Each case that cannot
run here (no root, no mount, no fusepy or /dev/fuse, no writable memory controller) is skipped with the
reason. Every case: a tiny model, runs of a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EIO_FUSE = Path(__file__).resolve().parent / "fixtures" / "eio_fuse.py"
MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")

pytestmark = pytest.mark.slow  # real processes, real mounts


def _cmd(tmp: Path, cache: Path, *extra: str, duration: int = 2) -> list[str]:
    config = tmp / "micro.yaml"
    config.write_text(MICRO)
    return [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(config), "--model", "micro",
            "--num-users", "4", "--duration", str(duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--generation-mode", "none", "--seed", "7", "--cache-dir", str(cache), "--output", str(tmp / "r.json"),
            "--io-chunk-mb", "1", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _run_dirs(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.name.startswith("kv-cache-run-")] if cache.is_dir() else []


def _wait_for_run_dir(cache: Path, proc: subprocess.Popen, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _run_dirs(cache)
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the run never created its run directory")


def _wait_for_window(run_dir: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the measured window is open: a request wrote its first entry into the run directory (no
    preconditioning, no worker probe in these runs). A readiness check where a fixed sleep after the run
    directory appeared was a guess that a loaded host can outlast."""
    deadline = time.monotonic() + timeout  # only a hang reaches it
    while not any(run_dir.glob("*.npy")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never opened its window"
        time.sleep(0.05)


def _mount(*args: str) -> str | None:
    """Runs mount; returns why it failed (None: it worked)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return "needs root and mount(8)"
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"mount {' '.join(args)}: {proc.stderr.strip()}"


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _results(tmp: Path) -> dict:
    return json.loads((tmp / "r.json").read_text())


def _last_line(proc: subprocess.CompletedProcess | tuple) -> str:
    err = proc.stderr if hasattr(proc, "stderr") else proc[1]
    return err.strip().splitlines()[-1] if err.strip() else ""


# -------------------------------------------------------------------------------------------------- EROFS
def test_read_only_mount_at_start_is_a_one_line_refusal(tmp_path):
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    why = _mount("--bind", str(src), str(ro)) or _mount("-o", "remount,bind,ro", str(ro))
    if why:
        _umount(ro)
        pytest.skip(why)
    try:
        proc = _run(_cmd(tmp_path, ro))
    finally:
        _umount(ro)
    assert proc.returncode == 2, proc.stderr
    assert "not writable" in _last_line(proc) and str(ro) in _last_line(proc) and "Traceback" not in proc.stderr
    print(f"[fault] EROFS at start: exit {proc.returncode}: {_last_line(proc)}")


def test_read_only_remount_during_the_run_stops_it_with_exit_3_and_the_next_run_cleans(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    why = _mount("--bind", str(src), str(mnt))
    if why:
        pytest.skip(why)
    try:
        proc = _start(_cmd(tmp_path, mnt, duration=30))
        _wait_for_window(_wait_for_run_dir(mnt, proc), proc)  # remounted inside the window (was: a 0.5 s sleep)
        deadline = time.monotonic() + 15  # EBUSY while a file is open for writing: try again
        while _mount("-o", "remount,bind,ro", str(mnt)) and time.monotonic() < deadline:
            time.sleep(0.01)
        out, err = proc.communicate(timeout=60)
    finally:
        _umount(mnt)
    assert proc.returncode == 3, err[-3000:]
    res = _results(tmp_path)
    assert res["measurement"]["stop_reason"] == "storage error"
    assert "EROFS" in err and str(mnt) in err and "Traceback" not in err
    line = next(line for line in err.splitlines() if "run stopped by a storage error" in line)
    print(f"[fault] EROFS during the run: exit {proc.returncode}: {line}")
    second = _run(_cmd(tmp_path, src, duration=1))
    assert second.returncode == 0, second.stderr
    assert _run_dirs(src) == []  # whatever the stopped run could not delete is gone now


# -------------------------------------------------------------------------------------------------- ENOSPC
def _tiny_tmpfs(tmp_path: Path, size: str = "4m") -> Path:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    why = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt))
    if why:
        pytest.skip(why)
    return mnt


def _fill(mnt: Path) -> int:
    """Another process's file takes every free byte of `mnt` (as a neighbour filling the disk would)."""
    written = 0
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            written += os.write(fd, b"\0" * (1 << 20))
    except OSError:  # ENOSPC: the filesystem is full
        pass
    finally:
        os.close(fd)
    return written


def test_a_capacity_beyond_the_free_space_is_refused_with_the_numbers(tmp_path):
    mnt = _tiny_tmpfs(tmp_path)
    try:
        proc = _run(_cmd(tmp_path, mnt, "--storage-capacity-gb", "1"))
        left = _run_dirs(mnt)
    finally:
        _umount(mnt)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _last_line(proc)
    assert line.startswith("kv-cache: error: --storage-capacity-gb 1 GiB is more than the 0.004 GiB (4.0 MiB) free")
    # 4 MiB free holds no entry of the micro model: no capacity there fits one, so no 'give at most' advice
    assert str(mnt) in line and "no capacity that fits there holds one entry of" in line
    assert "give at most" not in line and "Traceback" not in proc.stderr
    assert left == [] and not (tmp_path / "r.json").exists()  # refused before anything ran
    print(f"[fault] capacity beyond the free space: exit {proc.returncode}: {line}")


def test_enospc_from_a_neighbour_gives_exit_3_with_path_and_free_space(tmp_path):
    mnt = _tiny_tmpfs(tmp_path, "64m")
    try:
        proc = _start(_cmd(tmp_path, mnt, "--storage-capacity-gb", "0.05", duration=4))
        _wait_for_run_dir(mnt, proc)
        _fill(mnt)
        _, err = proc.communicate(timeout=120)
        left = _run_dirs(mnt)
    finally:
        _umount(mnt)
    assert proc.returncode == 3, err[-3000:]
    line = next(line for line in err.splitlines() if "run stopped by a storage error" in line)
    assert "ENOSPC" in line and str(mnt) in line and "MiB free on that filesystem" in line and "entry" in line
    assert _results(tmp_path)["measurement"]["stop_reason"] == "storage error"
    assert left == []
    print(f"[fault] ENOSPC: exit {proc.returncode}: {line}")


def test_tiny_tmpfs_with_auto_capacity_refuses_entries_larger_than_the_tier(tmp_path):
    """An automatic capacity too small for one entry is refused up front (exit 2, one line, nothing left),
    as an explicit one there is; it used to start, then stop with exit 3 and a FAIL document for a run that
    never ran."""
    mnt = _tiny_tmpfs(tmp_path)
    try:
        proc = _run(_cmd(tmp_path, mnt))
        left = _run_dirs(mnt)
    finally:
        _umount(mnt)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _last_line(proc)
    assert line.startswith(f"kv-cache: error: --cache-dir {mnt} has 0.004 GiB (4.0 MiB) free on tmpfs: the automatic")
    assert "too small for one entry of 0.012 GiB" in line and "Traceback" not in proc.stderr
    assert left == [] and not (tmp_path / "r.json").exists()
    print(f"[fault] auto capacity on a 4 MiB tmpfs: exit {proc.returncode}: {line}")


# -------------------------------------------------------------------------------------------------- signals
def test_sigkill_leaves_a_run_dir_that_the_next_run_removes_and_reports(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = _start(_cmd(tmp_path, cache, duration=30))
    run_dir = _wait_for_run_dir(cache, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert run_dir.exists()  # nothing could clean up after SIGKILL
    second = _run(_cmd(tmp_path, cache, duration=1))
    assert second.returncode == 0, second.stderr
    assert not run_dir.exists() and _run_dirs(cache) == []
    notes = _results(tmp_path)["measurement"]["notes"]
    assert any("removed the run directory" in n and str(run_dir) in n for n in notes)
    line = next(line for line in second.stderr.splitlines() if "removed the run directory" in line)
    print(f"[fault] SIGKILL then a second run: exit {proc.returncode} / {second.returncode}: {line}")


def test_double_sigint_still_writes_results_and_removes_files(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = _start(_cmd(tmp_path, cache, duration=30))
    _wait_for_window(_wait_for_run_dir(cache, proc), proc)  # both land inside the window (was: a 1.5 s sleep)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.005)  # the second one lands while the first is being handled: results, clean-up
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert _results(tmp_path)["measurement"]["stop_reason"] == "interrupted"
    assert os.listdir(cache) == []
    assert "Traceback" not in err
    print(f"[fault] double SIGINT: exit {proc.returncode}; results written, cache dir empty")


# -------------------------------------------------------------------------------------------------- FUSE EIO
def _fuse_missing() -> str | None:
    try:
        import fuse  # noqa: F401, PLC0415  (fusepy; needs libfuse.so.2)
    except (ImportError, OSError) as exc:
        return f"fusepy is not usable here ({exc})"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount") is None:
        return "fusermount is not installed"
    return None


def test_fuse_filesystem_returning_eio_is_retried_counted_and_stops_the_run(tmp_path):
    why = _fuse_missing()
    if why:
        pytest.skip(why)
    backing, mnt = tmp_path / "backing", tmp_path / "fuse"
    backing.mkdir()
    mnt.mkdir()
    daemon = subprocess.Popen([sys.executable, str(EIO_FUSE), str(backing), str(mnt)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"the FUSE filesystem did not mount: {daemon.communicate()[1][-500:]}")
            time.sleep(0.05)
        proc = _run(_cmd(tmp_path, mnt, duration=20))
    finally:
        subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True)
        daemon.terminate()
        daemon.wait(timeout=30)
    assert proc.returncode == 3, proc.stderr[-3000:]
    meas = _results(tmp_path)["measurement"]
    read = meas["storage_errors"]["storage"]["read"]
    assert read["by_error"]["EIO"] == read["failed"] > meas["storage_error_policy"]["max_storage_errors"]
    assert read["retried"] == meas["storage_error_policy"]["retries"] * read["failed"]
    line = next(line for line in proc.stderr.splitlines() if "run stopped by a storage error" in line)
    assert "EIO" in line and str(mnt) in line
    print(f"[fault] FUSE EIO: exit {proc.returncode}: {line}")


# -------------------------------------------------------------------------------------------------- memory
def _memory_cgroup(tmp_path: Path, limit: int) -> tuple[Path, str] | str:
    """A fresh memory cgroup limited to `limit` bytes: (its dir, the file taking a pid), or why not."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
        base, limit_file = v2, "memory.max"
    elif Path("/sys/fs/cgroup/memory").is_dir():
        base, limit_file = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
    else:
        return "no memory cgroup controller is mounted"
    group = base / f"kv-cache-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
    except OSError as exc:
        try:
            group.rmdir()
        except OSError:
            pass
        return f"the memory controller is not writable here ({exc.strerror})"
    return group, "cgroup.procs"


def test_memory_cgroup_clamps_the_ram_tier_instead_of_being_oom_killed(tmp_path):
    limit = 768 << 20
    got = _memory_cgroup(tmp_path, limit)
    if isinstance(got, str):
        pytest.skip(got)
    group, procs = got
    cmd = _cmd(tmp_path, tmp_path / "cache")
    cmd[cmd.index("--cpu-mem-gb") + 1] = "32"
    shell = f'echo $$ > {group / procs} && exec "$@"'
    try:
        proc = _run(["sh", "-c", shell, "sh", *cmd])
    finally:
        time.sleep(0.2)
        try:
            group.rmdir()
        except OSError:
            pass
    assert proc.returncode == 0, proc.stderr[-3000:]
    meas = _results(tmp_path)["measurement"]
    note = next(n for n in meas["notes"] if "clamped to" in n)
    assert "cgroup limit" in note
    assert meas["cpu_tier_bytes"] < limit and meas["peak_rss_mib"] < limit / (1 << 20)
    print(f"[fault] memory cgroup of 768 MiB, --cpu-mem-gb 32: exit {proc.returncode}: {note}; "
          f"peak RSS {meas['peak_rss_mib']:.0f} MiB")


def test_enospc_while_preconditioning_is_exit_3_with_results(tmp_path):
    mnt = _tiny_tmpfs(tmp_path, "512m")
    try:
        # preconditioning 0.45 GiB takes far longer than filling the rest of the tmpfs
        proc = _start(_cmd(tmp_path, mnt, "--storage-capacity-gb", "0.45", "--precondition"))
        _wait_for_run_dir(mnt, proc)
        _fill(mnt)
        _, err = proc.communicate(timeout=120)
        left = _run_dirs(mnt)
    finally:
        _umount(mnt)
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err and left == []
    assert "ENOSPC" in _results(tmp_path)["stop_reason"]
    line = next(line for line in err.splitlines() if "run stopped by a storage error" in line)
    print(f"[fault] ENOSPC while preconditioning: exit {proc.returncode}: {line}")
