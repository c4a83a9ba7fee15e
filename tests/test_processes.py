"""`--processes N`: the per-process settings, the group's collectives, and a real two-process run."""

import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kv_cache.benchmarks.standard.processes import (
    GroupBroken,
    ProcessGroup,
    rank_settings,
    with_missing_ranks,
)
from kv_cache.cli import exit_code_for, main
from kv_cache.errors import ExitCode, InternalError
from kv_cache.host.rundir import RUN_DIR_NAME

MICRO = ("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
         "    kv_heads: 1\n    dtype: float16\n")


def test_each_process_gets_a_share_and_its_own_paths(quick_settings, tmp_path):
    settings = quick_settings("--num-users", "10", "--cpu-mem-gb", "0.3", "--processes", "3")
    ranks = [rank_settings(settings, r, 3) for r in range(3)]
    assert [s.workload.num_users for s in ranks] == [4, 3, 3]
    assert [s.seed for s in ranks] == [42, 43, 44]
    assert all(s.tiers.cpu_mem_gb == pytest.approx(0.1) for s in ranks)
    assert [s.outputs.output for s in ranks] == [str(tmp_path / f"r_rank{r}.json") for r in range(3)]
    assert [s.tiers.cache_dir for s in ranks] == [str(tmp_path / "cache" / f"rank{r}") for r in range(3)]
    assert all(s.driver.processes == 1 and s.mpi_world_size == 3 for s in ranks)
    assert [s.mpi_rank for s in ranks] == [0, 1, 2]


@pytest.mark.parametrize("extra,words", [
    (["--processes", "0"], "--processes must be at least 1"),
    (["--processes", "9", "--num-users", "4"], "at least as many users"),
    (["--processes", "2", "--io-trace-log", "t.csv"], "cannot be combined with a trace"),
])
def test_bad_processes_is_one_line_exit_2(extra, words, capsys):
    assert main(["--num-users", "4", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_process_group_collectives_in_rank_order():
    n = 3
    barrier, shared, results = threading.Barrier(n), {}, queue.Queue()
    got = [None] * n

    def rank(r):
        g = ProcessGroup(r, n, barrier, shared, results)
        got[r] = (g.allgather(f"fs{r % 2}"), g.allgather(r * 10), g.gather({"rank": r}))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == (["fs0", "fs1", "fs0"], [0, 10, 20], None) for g in got)
    assert sorted(results.get_nowait()[:2] for _ in range(n)) == [(0, "doc"), (1, "doc"), (2, "doc")]


def test_a_broken_barrier_is_a_clear_error():
    barrier = threading.Barrier(2)
    barrier.abort()
    with pytest.raises(GroupBroken):
        ProcessGroup(0, 2, barrier, {}, queue.Queue()).barrier()


@pytest.mark.slow
def test_two_processes_give_one_merged_document(quick_settings, tmp_path, capsys):
    pytest.importorskip("openpyxl")
    argv = ["--config", str(tmp_path / "micro.yaml"), "--model", "micro", "--num-users", "4", "--duration", "1",
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "3", "--io-chunk-mb",
            "1", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json"), "--processes", "2",
            "--xlsx-output", str(tmp_path / "X.xlsx")]
    quick_settings()  # writes micro.yaml
    (tmp_path / "X.json").write_text('{"older": "merge"}')  # an earlier merged document is kept, not replaced
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.glob("X*.json")) == ["X.json", "X_rank0.json", "X_rank1.json"]
    assert json.loads((tmp_path / "X.json.1").read_text()) == {"older": "merge"}
    docs = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["seed"] for d in docs] == [3, 4]
    assert docs[0]["run_id"] == docs[1]["run_id"] and [d["world_size"] for d in docs] == [2, 2]
    run_dirs = [d["measurement"]["run_dir"] for d in docs]
    assert [r.startswith(str(tmp_path / "cache" / f"rank{i}") + "/") for i, r in enumerate(run_dirs)] == [True, True]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["ranks"] == 2 and merged["window"]["kind"] == "common (barrier-aligned)"
    assert merged["run_id"] == docs[0]["run_id"] and merged["world_size"] == 2
    assert merged["totals"]["requests_completed"] == sum(d["requests_completed"] for d in docs)
    shown = capsys.readouterr().out
    assert "Merged results of 2 processes" in shown
    # --xlsx-output: the merged document's spreadsheet (the ranks write none of their own)
    assert sorted(p.name for p in tmp_path.glob("X*.xlsx")) == ["X.xlsx"] and f"Spreadsheet written to {tmp_path / 'X.xlsx'}" in shown


ROOT = Path(__file__).resolve().parents[1]


def _processes_cmd(tmp_path, *extra, duration="6"):
    (tmp_path / "micro.yaml").write_text(MICRO)
    return [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(tmp_path / "micro.yaml"), "--model", "micro",
            "--num-users", "4", "--duration", duration, "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--generation-mode", "none", "--io-chunk-mb", "1", "--cache-dir", str(tmp_path / "cache"),
            "--output", str(tmp_path / "X.json"), "--processes", "2", *extra]


def _wait_for(find, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_a_ctrl_c_to_one_rank_in_its_window_never_leaves_the_others_waiting(tmp_path):
    """SIGINT to rank 1 alone (not to the parent) once its window is open: rank 1 ends its window there and
    writes its INCOMPLETE results; rank 0 must not wait for it at the closing barrier (it used to, forever),
    and the parent writes the merged document and ends with the interrupted status."""
    proc = subprocess.Popen(_processes_cmd(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        entry = _wait_for(lambda: next((tmp_path / "cache" / "rank1").glob("kv-cache-run-*/*.npy"), None)
                          if (tmp_path / "cache" / "rank1").is_dir() else None)
        os.kill(int(RUN_DIR_NAME.fullmatch(entry.parent.name).group(1)), signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-3000:]
    assert json.loads((tmp_path / "X_rank1.json").read_text())["verdict"] == "INCOMPLETE"
    assert json.loads((tmp_path / "X_rank0.json").read_text())["total_requests"] > 0
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["verdict"] == "INCOMPLETE" and merged["ranks"] == 2
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))


@pytest.mark.slow
def test_a_rank_killed_in_the_window_leaves_a_merged_document_naming_it(tmp_path):
    """SIGKILL of rank 1 once its window is open (it has written an entry file): rank 0 finishes its
    window, its closing barrier is broken rather than waited on, and the merge of rank 0 names rank 1."""
    proc = subprocess.Popen(_processes_cmd(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        entry = _wait_for(lambda: next((tmp_path / "cache" / "rank1").glob("kv-cache-run-*/*.npy"), None)
                          if (tmp_path / "cache" / "rank1").is_dir() else None)
        pid = int(RUN_DIR_NAME.fullmatch(entry.parent.name).group(1))
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.RANKS_LOST == 4, stderr[-3000:]
    assert "Process 1 ended without its results (killed by SIGKILL)" in stdout
    assert "Merged results of 1 of 2 processes" in stdout
    rank0 = json.loads((tmp_path / "X_rank0.json").read_text())
    assert rank0["stop_reason"] == "duration" and rank0["total_requests"] > 0
    assert any("closing barrier" in note for note in rank0["measurement"]["notes"])
    assert not (tmp_path / "X_rank1.json").exists()
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["missing_ranks"] == [1] and merged["ranks_expected"] == 2
    assert merged["lost_ranks"] == [{"rank": 1, "ended": "killed by SIGKILL"}]
    assert merged["verdict"] == "INCOMPLETE" and merged["overall_passed"] is False
    assert merged["totals"]["requests_completed"] == rank0["requests_completed"]
    assert not list((tmp_path / "cache" / "rank0").glob("kv-cache-run-*"))  # the survivor cleaned up
    assert (entry.parent / ".kv-cache-run").exists()  # the killed rank's files keep their marker: swept later


@pytest.mark.slow
def test_a_rank_killed_after_its_periodic_document_is_merged_from_it_as_incomplete(tmp_path):
    """With --partial-results-interval 1 each rank rewrites X_rank<r>.json with its window so far. SIGKILL of
    rank 1 once its first periodic document is there (no timing race: the file is looked for, then the
    process killed): rank 1's document survives, whole and INCOMPLETE, and the parent merges it as an
    incomplete rank (measured until its last document) rather than naming rank 1 missing."""
    proc = subprocess.Popen(_processes_cmd(tmp_path, "--partial-results-interval", "1", duration="8"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    rank1 = tmp_path / "X_rank1.json"
    try:
        _wait_for(lambda: rank1.exists())
        entry = _wait_for(lambda: next((tmp_path / "cache" / "rank1").glob("kv-cache-run-*/*.npy"), None))
        os.kill(int(RUN_DIR_NAME.fullmatch(entry.parent.name).group(1)), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.RANKS_LOST, stderr[-3000:]
    assert "Process 1 ended without its final results (killed by SIGKILL); its last periodic document" in stdout
    doc1, rank0 = json.loads(rank1.read_text()), json.loads((tmp_path / "X_rank0.json").read_text())
    assert doc1["partial_document"]["sequence"] >= 1 and doc1["verdict"] == "INCOMPLETE"
    assert doc1["rank_status"] == "incomplete" and "no final document" in doc1["rank_status_reason"]
    assert "partial_document" not in rank0 and rank0["stop_reason"] == "duration"
    assert rank0["measurement"]["partial_documents"]["written"] >= 1  # what they cost, said
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["ranks"] == 2 and merged["missing_ranks"] == [] and merged["verdict"] == "INCOMPLETE"
    [cut] = merged["incomplete_ranks"]
    assert cut["rank"] == 1 and cut["ended"] == "killed by SIGKILL" and cut["sequence"] == doc1["partial_document"]["sequence"]
    assert cut["measured_s"] == pytest.approx(doc1["measurement"]["window_seconds"])
    assert not merged["window"]["kind"].startswith("common")
    assert merged["totals"]["requests_completed"] == rank0["requests_completed"] + doc1["requests_completed"]
    assert {x["rank"]: x["status"] for x in merged["ranks_not_to_average"]}[1] == "incomplete"  # (rank 0 may
    # be there too, as failed, when a loaded host's latencies fail the criteria)


@pytest.mark.slow
def test_a_rank_that_fails_before_the_window_stops_the_others(tmp_path):
    """Rank 1's cache dir is a file: it fails at once, rank 0 stops at the window barrier instead of
    waiting there (or running its 300 s window); one line, exit 2."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "rank1").write_text("not a directory")
    proc = subprocess.run(_processes_cmd(tmp_path, duration="300"), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("kv-cache: error: ") == 1 and "exists and is not a directory" in proc.stderr
    assert not list((tmp_path / "cache").glob("rank0/kv-cache-run-*"))
    assert not list(tmp_path.glob("X*.json"))  # nothing was measured


@pytest.mark.slow
def test_a_programming_error_in_a_process_is_an_internal_error_not_bad_input(tmp_path):
    """A bug (here an injected ZeroDivisionError in rank 1's driver) is reported with its traceback and
    exit status 70; the other rank stops at the barrier."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('KV_CACHE_TEST_BUG_RANK'):\n"
        "    from kv_cache.benchmarks.standard import scheduler\n"
        "    real = scheduler.Driver.run\n"
        "    def run(self):\n"
        "        if self.group is not None and self.group.rank == int(os.environ['KV_CACHE_TEST_BUG_RANK']):\n"
        "            raise ZeroDivisionError('injected bug')\n"
        "        return real(self)\n"
        "    scheduler.Driver.run = run\n")
    env = {**os.environ, "PYTHONPATH": f"{inject}{os.pathsep}{ROOT}", "KV_CACHE_TEST_BUG_RANK": "1"}
    proc = subprocess.run(_processes_cmd(tmp_path, duration="300"), capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == ExitCode.INTERNAL == 70, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr and "ZeroDivisionError: injected bug" in proc.stderr
    assert "kv-cache: error: internal error in process 1: ZeroDivisionError: injected bug" in proc.stderr
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))


def test_a_bug_in_a_process_is_sent_to_the_parent_as_an_internal_error(monkeypatch):
    from kv_cache.benchmarks.standard import processes as app_processes

    def buggy(settings, out, group):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(app_processes, "run_benchmark", buggy)
    barrier, results = threading.Barrier(2), queue.Queue()
    group = ProcessGroup(1, 2, barrier, {}, results)
    with pytest.raises(SystemExit) as ended:
        app_processes._child(None, group, None)
    assert ended.value.code != 2 and barrier.broken
    rank, kind, error = results.get_nowait()
    assert (rank, kind) == (1, "error") and isinstance(error, InternalError)
    assert exit_code_for(error) == ExitCode.INTERNAL


def test_a_partial_merge_names_the_missing_ranks():
    merged = with_missing_ranks({"ranks": 2, "overall_passed": True}, [2], 3, {2: -9})
    assert merged["missing_ranks"] == [2] and merged["ranks_expected"] == 3
    assert merged["lost_ranks"] == [{"rank": 2, "ended": "killed by SIGKILL"}]
    assert merged["verdict"] == "INCOMPLETE" and merged["overall_passed"] is False
    assert with_missing_ranks({"ranks": 3}, [], 3, {}) == {"ranks": 3}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: before, it ended the parent alone
def test_sigterm_to_the_parent_stops_the_ranks_and_merges_what_they_measured(tmp_path, sig):
    """SIGTERM to the `--processes` parent once the windows are open: it stops every rank like Ctrl-C,
    each writes its part (INCOMPLETE), the parent merges them (INCOMPLETE) and exits 130."""
    proc = subprocess.Popen(_processes_cmd(tmp_path, duration="60"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _wait_for(lambda: all(next((tmp_path / "cache").glob(f"rank{r}/kv-cache-run-*/*.npy"), None)
                              for r in range(2)))
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["verdict"] for d in ranks] == ["INCOMPLETE", "INCOMPLETE"]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["verdict"] == "INCOMPLETE" and merged["overall_passed"] is False and merged["ranks"] == 2
    assert not merged.get("missing_ranks")  # every rank sent its document
    assert 0 < merged["window_fraction"] < 1
    assert (f"Run INCOMPLETE (merged, 2 processes): interrupted after {merged['window_fraction'] * 100:.0f} % of "
            "the 60.0 s window; the verdict is not PASS") in stdout
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))



def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
def test_a_killed_parent_leaves_no_process_and_rank_files_that_merge(tmp_path):
    """SIGKILL of the `--processes 2` parent once both windows are open: the ranks finish their windows,
    write their own files (a note naming the merge command), and every process of the run (ranks, the
    manager, multiprocessing's resource tracker) is gone within a bounded time, none left orphaned; the
    command the note names merges the files (exit 0), nothing missing."""
    out, err = (tmp_path / "stdout").open("w"), (tmp_path / "stderr").open("w")  # (the ranks outlive the
    proc = subprocess.Popen(_processes_cmd(tmp_path, duration="2"), stdout=out, stderr=err,  # parent: no pipes)
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _wait_for(lambda: all(next((tmp_path / "cache").glob(f"rank{r}/kv-cache-run-*/*.npy"), None)
                              for r in range(2)))
        family = _children(proc.pid)
        assert len(family) >= 3  # two ranks and the manager
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _wait_for(lambda: not any(_running(p) for p in family), timeout_s=90)
    finally:
        proc.kill()
        for p in _children(proc.pid):
            os.kill(p, signal.SIGKILL)
    stderr = (tmp_path / "stderr").read_text()
    ranks = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["stop_reason"] for d in ranks] == ["duration", "duration"], stderr[-3000:]
    command = f"kv-cache merge --allow-missing-ranks --output {tmp_path / 'X.json'} {tmp_path / 'X_rank*.json'}"
    for d in ranks:
        assert any(command in note and "no merged document was written" in note for note in d["measurement"]["notes"])
    assert command in stderr
    assert not (tmp_path / "X.json").exists()
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))  # each rank removed its files
    merge = subprocess.run([sys.executable, str(ROOT / "kv-cache.py"), *command.split()[1:-1],
                            *map(str, sorted(tmp_path.glob("X_rank*.json")))], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert merge.returncode == 0, merge.stderr[-3000:]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["ranks"] == 2 and merged["missing_ranks"] == [] and merged["world_size"] == 2
    assert merged["totals"]["requests_completed"] == sum(d["requests_completed"] for d in ranks)


def test_after_the_parent_is_gone_a_barrier_is_not_waited_on_for_ever():
    """Rank 0 at a barrier that rank 1 (lost after the parent) never reaches: once the parent sentinel
    reads EOF, the watch breaks the barrier after the grace, and the rank gets GroupBroken saying why; its
    messages for the parent are dropped from then on."""
    barrier, results = threading.Barrier(2), queue.Queue()
    r, w = os.pipe()
    g = ProcessGroup(0, 2, barrier, {}, results, progress=True, merged_output="/x/X.json")
    watch = g.watch_parent(r, grace_s=0.3, poll_s=0.02)
    os.close(w)  # the parent is gone
    assert g.parent_gone.wait(10)
    with pytest.raises(GroupBroken, match="parent process is gone"):
        g.barrier()
    g.report("outcome", None)
    g.observer().tick(None)
    assert results.empty()
    g.stop_watching()  # no thread outlives the test, polling the clock of the next one
    watch.join(10)
    assert not watch.is_alive()
    os.close(r)


def test_before_the_parent_is_gone_a_barrier_waits_and_messages_go_to_it():
    barrier, results = threading.Barrier(2), queue.Queue()
    r, w = os.pipe()
    g = ProcessGroup(0, 2, barrier, {}, results, merged_output="/x/X.json")
    watch = g.watch_parent(r, grace_s=0.05, poll_s=0.01)
    other = threading.Thread(target=lambda: (time.sleep(0.3), barrier.wait()))
    other.start()
    g.barrier()  # no grace applies while the parent lives
    other.join()
    g.report("outcome", 1)
    assert results.get_nowait() == (0, "outcome", 1) and not g.parent_gone.is_set()
    g.stop_watching()
    watch.join(10)
    assert not watch.is_alive()
    os.close(w)
    os.close(r)


def test_a_rank_whose_exit_hangs_after_the_parent_died_is_ended(monkeypatch):
    """The parent dies while it reads this rank's document: the queue's feeder thread would block the exit
    for ever. The watch drops what is queued, and a rank still there after the grace is ended with its status."""
    from kv_cache.benchmarks.standard import processes

    class Results:
        cancelled = 0

        def cancel_join_thread(self):
            Results.cancelled += 1

    ended = []
    monkeypatch.setattr(processes, "_hard_exit", ended.append)
    r, w = os.pipe()
    g = ProcessGroup(1, 2, threading.Barrier(2), {}, Results())
    g.leave(3)  # its run is over; the parent still lives
    watch = g.watch_parent(r, grace_s=60, poll_s=0.01, exit_grace_s=0.05)
    os.close(w)
    _wait_for(lambda: ended, timeout_s=10)
    assert ended == [3] and Results.cancelled >= 1
    watch.join(10)  # it ends once it has ended the rank
    assert not watch.is_alive()
    os.close(r)


def test_the_merge_command_names_the_rank_files():
    from kv_cache.benchmarks.standard.processes import merge_command

    assert merge_command("/r/X.json", 2) == "kv-cache merge --allow-missing-ranks --output /r/X.json /r/X_rank*.json"
    assert merge_command("/r.d/X", 2) == "kv-cache merge --allow-missing-ranks --output /r.d/X /r.d/X_rank*"


# -- the parent's console: ticks totalled over the ranks, the banner, the verdict ----------------------------

class Shown:
    """A progress display that keeps what it was given."""

    def __init__(self):
        self.ticks, self.done_calls = [], 0

    def tick(self, tick):
        self.ticks.append(tick)

    def done(self):
        self.done_calls += 1


def _tick(second, completed, read_bytes, p95=1.0):
    from kv_cache.core.observe import Tick

    row = {"t_s": float(second), "seconds": 1.0, "requests": 1, "storage_read_bytes": read_bytes,
           "storage_read_gibps": read_bytes / 2**30, "storage_read_p95_ms": p95, "active_users": 2}
    return Tick(float(second), 3.0, completed + 1, completed, row)


def test_the_ranks_ticks_become_one_total_per_second():
    """Second k is shown once both ranks sent it (whatever order they come in); requests and bytes add
    up, GiB/s comes from the summed bytes, a p95 is the highest rank's; each rank's own figures ride along."""
    from kv_cache.core.observe import RankTicks

    shown = Shown()
    ticks = RankTicks(2, shown)
    ticks.add(1, _tick(1, 5, 2**30, p95=4.0))
    assert shown.ticks == []  # rank 0's second 1 is still to come
    ticks.add(1, _tick(2, 9, 2**30))
    ticks.add(0, _tick(1, 3, 2**29, p95=2.0))
    assert len(shown.ticks) == 1
    first = shown.ticks[0]
    assert (first.elapsed_s, first.completed, first.issued) == (1.0, 8, 10)
    assert first.row["storage_read_gibps"] == pytest.approx(1.5) and first.row["storage_read_p95_ms"] == 4.0
    assert first.row["requests"] == 2 and first.row["active_users"] == 4
    assert [(r, t.completed) for r, t in first.ranks] == [(0, 3), (1, 5)]
    ticks.end(0)  # rank 0's window is over: second 2 is no longer waited for, its counts stay in the totals
    assert [t.completed for t in shown.ticks] == [8, 12] and shown.done_calls == 0
    ticks.end(1)
    assert shown.done_calls == 1
    ticks.end(1)
    assert shown.done_calls == 1


def test_a_total_line_says_how_many_ranks_and_shows_each():
    from kv_cache.core.observe import RankTicks
    from kv_cache.render.progress import progress_line

    shown = Shown()
    ticks = RankTicks(2, shown)
    ticks.add(0, _tick(1, 3, 2**29, p95=2.0))
    ticks.add(1, _tick(1, 5, 2**30, p95=4.0))
    line = progress_line(shown.ticks[0])
    assert line.startswith("[0:01 elapsed, 0:02 left] 8 requests done by 2 ranks (2 in the last 1 s), 2 in progress")
    assert "storage R 1.50 W 0.00 GiB/s (p95 of the slowest rank R 4.0 ms)" in line
    assert line.endswith("per rank: rank 0 3 done (storage R 0.50 W 0.00 GiB/s), "
                         "rank 1 5 done (storage R 1.00 W 0.00 GiB/s)")
    assert "by 2 ranks" not in progress_line(_tick(1, 3, 2**29))  # one rank's own line is unchanged


def test_the_banner_shows_each_share_and_the_sizes_in_force(quick_settings):
    from kv_cache.render.banner import ranks_lines

    settings = quick_settings("--num-users", "5", "--cpu-mem-gb", "3", "--processes", "2")
    shares = {r: rank_settings(settings, r, 2) for r in range(2)}
    sizes = {0: {"cpu_mem_gb": {"asked": 1.5, "effective": 1.5, "clamped": None},
                 "storage_capacity_gb": {"asked": 0.0, "effective": 10.0, "clamped": None}},
             1: {"cpu_mem_gb": {"asked": 1.5, "effective": 1.0, "clamped": "90% of ..."},
                 "storage_capacity_gb": {"asked": 0.0, "effective": 10.0, "clamped": None}}}
    lines = ranks_lines(settings, shares, sizes)
    assert lines[0].startswith("Processes: 2 on this host, one common window")
    assert lines[1:] == [
        "  rank 0: cpu_mem_gb 1.5, num_users 3, seed 42 | CPU tier 1.50 GiB, Storage tier 10.00 GiB",
        "  rank 1: cpu_mem_gb 1.5, num_users 2, seed 43 | CPU tier 1.00 GiB (clamped), Storage tier 10.00 GiB",
        "  total: cpu_mem_gb 3, num_users 5 | CPU tier 2.50 GiB in force (asked 3.00), "
        "Storage tier 20.00 GiB in force (asked auto)"]
    partial = ranks_lines(settings, shares, {0: sizes[0]})
    assert partial[2].endswith("| tier sizes not known (the process ended before it sent them)")
    assert "CPU tier 1.50 GiB in force (asked 1.50, 1 of 2 processes)" in partial[3]


def test_the_merged_verdict_line(quick_settings):
    from kv_cache.benchmarks.standard.processes import verdict_line

    settings = quick_settings("--duration", "20", "--processes", "2")
    assert verdict_line({"verdict": "PASS"}, settings, 2, False) == \
        "STORAGE PERFORMANCE ASSESSMENT (merged, 2 processes): PASS\n  Verdict PASS; integrity NOT RECORDED"
    invalid = {"verdict": "PASS", "integrity": {"verdict": "invalid", "reasons": ["io_setup: INVALID because x"]}}
    assert verdict_line(invalid, settings, 2, False).endswith("Verdict PASS; integrity INVALID: io_setup: INVALID because x")
    failed = {"verdict": "FAIL", "summary": {"cache_stats": {"storage_health": {"criteria": [
        {"name": "Cache Hit Rate > 30%", "passed": True}, {"name": "Storage Tier Read Device P95 < 200ms",
                                                          "passed": False}]}}}}
    assert verdict_line(failed, settings, 2, False).startswith(
        "STORAGE PERFORMANCE ASSESSMENT (merged, 2 processes): FAIL (failed: Storage Tier Read Device P95 < 200ms)\n")
    assert verdict_line({"verdict": "INCOMPLETE", "window_fraction": 0.4}, settings, 2, True) == \
        "Run INCOMPLETE (merged, 2 processes): interrupted after 40 % of the 20.0 s window; the verdict is not PASS"
    assert verdict_line({"verdict": "INCOMPLETE", "window_fraction": 1.0, "missing_ranks": [1]}, settings, 2,
                        False) == "Run INCOMPLETE (merged, 2 processes): process(es) 1 of 2 missing; the verdict is not PASS"


def test_a_rank_whose_window_completed_was_not_interrupted(quick_settings):
    """A late signal may reach a rank after its run was written (its outcome then says interrupted): its
    document's stop reason, not that, decides."""
    from kv_cache.benchmarks.standard.processes import _Console, _Ended
    from kv_cache.errors import RunOutcome

    ended = _Ended(console=_Console(quick_settings(), 3, io.StringIO(), None))
    ended.take((0, "doc", {"stop_reason": "duration"}))
    ended.take((0, "outcome", RunOutcome(passed=True)))
    ended.take((0, "outcome", RunOutcome(interrupted=True)))  # a second word: the first stands
    ended.take((1, "doc", {"stop_reason": "interrupted"}))
    ended.take((2, "outcome", RunOutcome(interrupted=True)))  # no document: its outcome decides
    assert ended.outcomes[0].passed is True
    assert [ended.interrupted(r) for r in range(3)] == [False, True, True]


def test_the_parents_handler_passes_each_signal_on_and_never_raises(capsys):
    from kv_cache.benchmarks.standard.processes import _ParentSignals

    child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\nprint('ready', flush=True)\n"
                              "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        signals = _ParentSignals()
        signals.ranks[child.pid] = child
        signals(signal.SIGINT, None)
        assert child.wait(timeout=30) == 7
        signals.ended(child.pid)
        signals(signal.SIGINT, None)  # (a rank that ended: nothing to pass on)
        assert capsys.readouterr().err == ""
        signals.collecting = False
        signals(signal.SIGINT, None)  # every rank has ended: it only says what is going on
    finally:
        child.kill()
    assert signals.seen == 3
    assert capsys.readouterr().err == "kv-cache: the processes have ended; writing the merged results first\n"


def test_after_a_signal_the_parent_ignores_stop_signals_to_its_exit():
    # a Python handler left installed is put back to SIG_DFL by the interpreter's shutdown, so a late Ctrl-C
    # there killed the finished parent (status -2, CI saw it); once a signal came, restore() ignores them
    from kv_cache.benchmarks.standard.processes import _ParentSignals
    from kv_cache.host.signals import STOP_SIGNALS

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        quiet = _ParentSignals()
        quiet.install()
        quiet.restore()  # no signal came: the previous handlers are back
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
        late = _ParentSignals()
        late.install()
        late.collecting = False
        late(signal.SIGINT, None)
        late.restore()
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in late._previous)
        assert signal.SIGINT in late._previous
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


@pytest.mark.slow
@pytest.mark.parametrize("pauses", [(0.3,), (0.0, 0.3, 0.7)], ids=["one-sigint-0.3s-after", "three-sigints"])
def test_a_signal_after_the_window_changes_nothing(tmp_path, pauses):
    """SIGINT(s) to the parent once the last progress line of the window is out (the ranks are draining,
    writing, or have written): exit 0 as without the signal, each rank's window whole, the merged document
    written and its verdict printed. The console meanwhile: one banner with each rank's share and sizes in
    force, and one progress line per second that totals both ranks (never a rank's own line)."""
    cmd = _processes_cmd(tmp_path, duration="3")
    cmd[cmd.index("micro")] = "tiny-1b"  # large entries: a drain that lasts
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: any(line.startswith("[0:03 elapsed") for line in err))
        for pause in pauses:
            time.sleep(pause)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        stdout = proc.stdout.read()
        proc.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(err)[-3000:]
    ranks = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["stop_reason"] for d in ranks] == ["duration", "duration"]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["ranks"] == 2 and merged["verdict"] in ("PASS", "FAIL") and merged["window_fraction"] == 1.0
    assert f"STORAGE PERFORMANCE ASSESSMENT (merged, 2 processes): {merged['verdict']}" in stdout
    assert "Rank 0 of 2: its share of the totals given (num_users 2 of 4" in stdout
    assert "Processes: 2 on this host" in stdout and "  rank 1: num_users 2, seed 1 | Storage tier " in stdout
    progress = [line for line in err if line.startswith("[")]
    assert [line[:6] for line in progress] == ["[0:01 ", "[0:02 ", "[0:03 "]
    assert all(" by 2 ranks " in line and "| per rank: rank 0 " in line for line in progress)
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))


def test_the_banner_says_a_ranks_gpu_figure_is_the_hbm_of_all_its_gpus(quick_settings):
    """With --num-gpus 2 --tensor-parallel 2 a rank's 2 x 1 GiB of HBM holds 1 GiB of entries (each on
    both GPUs of the group): the per-rank figure is said to be HBM, not the tier's entry capacity."""
    from kv_cache.render.banner import ranks_lines

    settings = quick_settings("--num-users", "2", "--gpu-mem-gb", "2", "--num-gpus", "2", "--tensor-parallel", "2",
                              "--processes", "2")
    shares = {r: rank_settings(settings, r, 2) for r in range(2)}
    sizes = {r: {"gpu_mem_gb": {"asked": 1.0, "effective": 1.0, "clamped": None}} for r in range(2)}
    lines = ranks_lines(settings, shares, sizes)
    assert lines[1].endswith("| GPU tier (HBM of all GPUs) 2.00 GiB")
    assert lines[3].endswith("| GPU tier (HBM of all GPUs) 4.00 GiB in force (asked 4.00)")


def test_only_this_runs_periodic_document_of_a_lost_rank_is_merged(quick_settings, tmp_path):
    """A lost rank's X_rank<r>.json is merged from only when it is a periodic document of this run: written
    after the run started and of the run id the other ranks sent; a final document there, or a periodic
    one an earlier killed run left, is not (the rank is then missing)."""
    from kv_cache.benchmarks.standard import processes as app_processes
    from kv_cache.results.partial import mark_partial

    settings = quick_settings("--processes", "2", output=str(tmp_path / "X.json"))
    path = tmp_path / "X_rank1.json"

    def found(doc, started, others=("run-a",)):
        path.write_text(json.dumps(doc))
        ended = app_processes._Ended(console=None)
        ended.docs = {0: {"run_id": others[0]}} if others else {}
        return app_processes._periodic_documents(settings, 2, {1: -9}, ended, started), ended.docs

    def periodic(run_id, written):
        return mark_partial({"run_id": run_id, "measurement": {"notes": []}}, 3.0, 10.0, written, 1.0, 3)

    assert found(periodic("run-a", 2000.0), 1000.0)[0] == {1: 3.0}
    assert found(periodic("run-a", 2000.0), 1000.0)[1][1]["run_id"] == "run-a"
    assert found(periodic("run-a", 500.0), 1000.0)[0] == {}  # written before this run started
    assert found(periodic("run-b", 2000.0), 1000.0)[0] == {}  # another run's
    assert found(periodic("run-b", 2000.0), 1000.0, others=())[0] == {1: 3.0}  # no rank said its run id
    assert found({"run_id": "run-a", "verdict": "PASS"}, 1000.0)[0] == {}  # a final document
