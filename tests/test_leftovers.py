"""Leftovers: stale run directories are removed at start and reported, live ones are kept with a
warning, a cache dir the run created is removed at the end, a second interrupt does not cut clean-up."""

import json
import os
import socket
import subprocess
import sys

import pytest

from kv_cache.app import _InterruptOnce
from kv_cache.storage.leftovers import sweep
from kv_cache.storage.rundir import MARKER, RunDir, boot_id, process_start, stale_run_dirs


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
    handler = _InterruptOnce()
    with pytest.raises(KeyboardInterrupt):
        handler(2, None)
    handler(2, None)  # the second one is only reported
    assert "writing the results" in capsys.readouterr().err
