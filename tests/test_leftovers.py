"""Leftovers: stale run directories are removed at start and reported, live ones are kept with a
warning, a cache dir the run created is removed at the end, a second interrupt does not cut clean-up."""

import json
import os
import socket
import subprocess
import sys

import pytest

from kv_cache.benchmarks.standard.run import Interrupts
from kv_cache.host.leftovers import ORPHAN_AGE_S, markerless_run_dirs, sweep
from kv_cache.host.rundir import MARKER, RunDir, boot_id, process_start, stale_run_dirs


def _fake_run_dir(parent, name, pid, proc_start=None, files=("a.npy", "b.npy")):
    d = parent / f"kv-cache-run-{name}"
    d.mkdir(parents=True)
    (d / MARKER).write_text(json.dumps({"tool": "kv-cache", "host": socket.gethostname(), "pid": pid,
                                        "proc_start": proc_start, "boot_id": boot_id()}))
    for f in files:
        (d / f).write_bytes(b"x" * 4096)
    return d


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_owners_run_dir_is_removed_and_reported(tmp_path):
    d = _fake_run_dir(tmp_path, "dead", _dead_pid())
    found = sweep(tmp_path)
    assert not d.exists()
    assert [p for p, _ in found.removed] == [d] and found.removed[0][1] >= 8192  # entries + marker
    assert "removed the run directory" in found.messages()[0] and str(d) in found.messages()[0]


def test_a_recycled_pid_is_not_the_owner(tmp_path):
    me = os.getpid()
    d = _fake_run_dir(tmp_path, "recycled", me, proc_start=(process_start(me) or 0) + 12345)
    assert stale_run_dirs(tmp_path) == [d]


def test_a_live_runs_dir_is_left_alone_with_a_warning(tmp_path):
    me = os.getpid()
    d = _fake_run_dir(tmp_path, "live", me, proc_start=process_start(me))
    found = sweep(tmp_path)
    assert d.exists() and (d / "a.npy").exists()
    assert found.live == [(d, me)]
    assert "another kv-cache run" in found.messages()[0] and "shares the device" in found.messages()[0]


def test_a_foreign_file_keeps_a_stale_dir_and_survives(tmp_path):
    d = _fake_run_dir(tmp_path, "foreign", _dead_pid())
    (d / "notes.txt").write_text("mine")
    found = sweep(tmp_path)
    assert (d / "notes.txt").read_text() == "mine"
    assert not (d / "a.npy").exists()
    assert found.kept and found.kept[0][0] == d


def test_a_cache_dir_the_run_created_is_removed_at_the_end(tmp_path):
    made = tmp_path / "new" / "deeper"
    rd = RunDir(made)
    assert made.is_dir() and rd.owns_cache_dir
    rd.remove()
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "existing"
    kept.mkdir()
    RunDir(kept).remove()
    assert kept.is_dir()


def test_only_the_first_interrupt_raises(capsys):
    handler = Interrupts()
    with pytest.raises(KeyboardInterrupt):
        handler(2, None)
    handler(2, None)  # the second one is only reported
    assert "writing the results" in capsys.readouterr().err


def test_no_signal_raises_once_the_window_has_closed(capsys):
    handler = Interrupts()
    handler.close_window()
    handler(2, None)  # a late Ctrl-C: noted, the results and clean-up go on
    handler(15, None)
    assert "window is over" in capsys.readouterr().err


def test_the_marker_stays_while_an_entry_file_does(tmp_path):
    run = RunDir(tmp_path)
    (run.path / "left.npy").write_bytes(b"x")  # an unlink that failed, a clean-up cut short
    assert run.remove() is False
    assert (run.path / MARKER).exists()  # so the next run's sweep knows the directory is a dead run's
    (run.path / "left.npy").unlink()
    assert run.remove() is True and not run.path.exists()


def _markerless(parent, pid, age_s, files=("a.npy",)):
    d = parent / f"kv-cache-run-20260101-000000-{pid}-ab12"
    d.mkdir(parents=True)
    for f in files:
        (d / f).write_bytes(b"x" * 4096)
    old = 1_000_000.0
    for p in [*(d / f for f in files), d]:
        os.utime(p, (old, old))
    return d, old + age_s


def test_a_dead_runs_markerless_dir_of_entry_files_is_swept(tmp_path):
    d, now = _markerless(tmp_path, _dead_pid(), ORPHAN_AGE_S + 1)
    assert markerless_run_dirs(tmp_path, now) == [d]
    found = sweep(tmp_path)  # the real clock: the files are decades old
    assert not d.exists() and [p for p, _ in found.removed] == [d]


@pytest.mark.parametrize("case", ["live pid", "recent", "foreign file", "empty", "other name"])
def test_a_markerless_dir_is_kept_unless_provably_a_dead_runs(tmp_path, case):
    pid = os.getpid() if case == "live pid" else _dead_pid()
    files = {"foreign file": ("a.npy", "notes.txt"), "empty": ()}.get(case, ("a.npy",))
    d, now = _markerless(tmp_path, pid, 1.0 if case == "recent" else ORPHAN_AGE_S + 1, files)
    if case == "other name":
        d = d.rename(tmp_path / "kv-cache-run-mine")
    assert markerless_run_dirs(tmp_path, now) == []
    if case != "recent":
        sweep(tmp_path)
        assert d.exists() and sorted(os.listdir(d)) == sorted(files)


def test_a_killed_run_not_yet_reaped_by_its_parent_is_gone():
    """kill -9 of a run under a parent that has not reaped it (a zombie; a container's init may take a
    while) left its run directory or remote namespace to look alive, so the next run did not sweep it."""
    import time

    from kv_cache.host.rundir import _state, pid_alive

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _state(proc.pid) != "Z" and time.monotonic() < deadline:  # exited, not reaped: we do not wait
            time.sleep(0.01)
        assert _state(proc.pid) == "Z"
        assert not pid_alive(proc.pid)
    finally:
        proc.wait()
    assert pid_alive(os.getpid())
