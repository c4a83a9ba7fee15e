"""Real `mpirun -n 2` and `-n 4` runs (the `mpi` extra: mpi4py and Open MPI from pip): one common window,
one merged document at X.json, the rank files beside it, and no file or directory shared by two ranks."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from mpi_grace import wait_for
from test_merge import _ranks

from kv_cache.benchmarks.standard.outputs import write_merged
from kv_cache.cli import main
from kv_cache.core.group import GroupBroken, filesystem_id, shared_filesystem_count
from kv_cache.errors import RanksLost
from kv_cache.host.rundir import RUN_DIR_NAME
from kv_cache.results.write import dumps

ROOT = Path(__file__).resolve().parent.parent
MICRO = ("model_configs:\n  micro:\n    name: Micro\n    num_layers: 1\n    hidden_dim: 512\n    num_heads: 4\n"
         "    kv_heads: 1\n    dtype: float16\n")
TINY = ["--model", "micro", "--num-users", "4", "--duration", "1", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
        "--generation-mode", "none", "--io-chunk-mb", "1"]


def _mpirun() -> str:
    found = shutil.which("mpirun") or shutil.which("mpirun", path=os.path.dirname(sys.executable))
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        found = None
    if not found:
        pytest.skip("no mpirun + mpi4py (system Open MPI + pip install -e '.[mpi]', or '.[mpi-bundled]')")
    return found


def _launch(tmp_path, n, script, args):
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), "-x", "PYTHONPATH",
           sys.executable, str(ROOT / script), "--config", str(cfg), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def merged_split(tmp_path):
    return json.loads((tmp_path / "X.json").read_text())["settings_split"]


def _assert_ranks_apart(docs, cache_root, n):
    """Each rank wrote its own results and used its own cache directory; no path is shared."""
    run_dirs = [d["measurement"]["run_dir"] for d in docs]
    assert len(set(run_dirs)) == n
    for rank, run_dir in enumerate(run_dirs):
        owner = Path(run_dir).parent
        assert owner.parent == cache_root and owner.name.endswith(str(rank))
    assert len({Path(r).parent for r in run_dirs}) == n  # not even the parent directory is shared
    assert [d["run_parameters"]["mpi_rank"] for d in docs] == list(range(n))


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_mpirun_writes_one_merged_document_and_the_rank_files(tmp_path, n):
    proc = _launch(tmp_path, n, "kv-cache.py", [*TINY, "--seed", "7", "--cache-dir", str(tmp_path / "cache"),
                                                "--output", str(tmp_path / "X.json")])
    names = sorted(p.name for p in tmp_path.glob("X*.json"))
    assert names == ["X.json", *[f"X_rank{r}.json" for r in range(n)]]
    assert proc.stdout.count(f"Merged results of {n} ranks written to") == 1  # rank 0 only
    docs = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(n)]
    _assert_ranks_apart(docs, tmp_path / "cache", n)
    assert [d["seed"] for d in docs] == [7 + r for r in range(n)]  # plain mpirun: seed + rank, as --processes
    # the flags are totals: the ranks' users sum to --num-users (the wrapper's are per rank)
    assert sum(d["run_parameters"]["num_users"] for d in docs) == 4
    assert all(d["run_parameters"]["settings_split"]["flags_given_as"] == "totals" for d in docs)
    assert merged_split(tmp_path)["totals"]["num_users"] == 4
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["schema_version"] == "kv-cache-merged/1" and merged["ranks"] == n
    assert merged["window"]["kind"] == "common (barrier-aligned)"
    starts = [d["measurement"]["window_wallclock"]["start_unix"] for d in docs]
    assert max(starts) - min(starts) < merged["window"]["seconds"]  # overlapping windows, one common span
    assert merged["totals"]["requests_completed"] == sum(d["requests_completed"] for d in docs)
    assert merged["latency_ms"]["end_to_end"]["count"] == sum(len(d["end_to_end_latencies"]) for d in docs)
    assert [r["rank"] for r in merged["per_rank"]] == list(range(n))
    # ranks on one filesystem split its free space
    assert all(any(f"/ {n} run(s) or rank(s)" in note for note in d["measurement"]["notes"]) for d in docs)
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))  # every rank removed its own run dir


@pytest.mark.slow
def test_ranks_on_one_host_are_counted_without_the_launchers_local_variables(tmp_path):
    """A launcher that sets no local-size / local-rank variable: MPI's node-local split counts the ranks
    sharing this host, so the host's memory budget is still divided between them."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    unset = [a for v in ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK") for a in ("-u", v)]
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", "env", *unset,
           sys.executable, str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY,
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    docs = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["run_parameters"]["settings_split"]["host_ranks"] for d in docs] == [2, 2]


@pytest.mark.slow
def test_a_rank_without_the_local_variables_does_not_hang_the_others(tmp_path):
    """Only rank 1 lacks the launcher's local-size / local-rank variables: the node-local split is
    collective, so every rank must enter it, not only the one that needs it (else rank 0 goes on to the
    run's collectives while rank 1 waits in the split: the job hangs)."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    script = ('[ "$OMPI_COMM_WORLD_RANK" = 1 ] && unset OMPI_COMM_WORLD_LOCAL_SIZE OMPI_COMM_WORLD_LOCAL_RANK; '
              'exec "$@"')
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", "sh", "-c", script,
           "sh", sys.executable, str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY,
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    docs = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["run_parameters"]["settings_split"]["host_ranks"] for d in docs] == [2, 2]


@pytest.mark.slow
def test_mpirun_through_the_wrapper_keeps_the_harness_layout(tmp_path):
    out, cache = tmp_path / "results", tmp_path / "cache"
    _launch(tmp_path, 2, "mlperf_wrapper.py", ["--rank-output-base", str(out), "--rank-cache-base", str(cache),
                                               "--seed-base", "50", "--start-delay", "0", "--end-delay", "0",
                                               *TINY])  # (the wrapper's 90 s settle time: none here)
    files = [sorted((out / f"rank_{r}").glob("kvcache_results_*.json")) for r in range(2)]
    assert [len(f) for f in files] == [1, 1]
    docs = [json.loads(f[0].read_text()) for f in files]
    assert [d["seed"] for d in docs] == [50, 51]
    assert [d["run_parameters"]["num_users"] for d in docs] == [4, 4]  # per client, as the Rules say
    assert {d["run_parameters"]["settings_split"]["flags_given_as"] for d in docs} == {"per_rank"}
    run_dirs = [Path(d["measurement"]["run_dir"]).parent for d in docs]
    assert run_dirs == [cache / "rank_0", cache / "rank_1"]
    merged = list(out.glob("kvcache_merged_*.json"))
    assert len(merged) == 1 and json.loads(merged[0].read_text())["ranks"] == 2


def test_ranks_on_one_filesystem_are_counted():
    class Group:
        rank, size = 1, 4

        def allgather(self, obj):
            return [obj, obj, "fsid:other", obj]

    assert shared_filesystem_count(Group(), "/tmp") == 3
    assert shared_filesystem_count(None, "/tmp") == 1
    assert filesystem_id("/tmp/does/not/exist/yet") == filesystem_id("/tmp")


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_instead_of_hanging_the_others(tmp_path):
    """Rank 1 cannot open its cache dir while rank 0 waits at the window barrier: MPI_Abort ends both."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "rank1").write_text("not a directory")
    # (each rank through mpi_grace: mpirun SIGKILLs rank 0 0.25 s after its SIGTERM, too soon on a loaded host)
    grace = tmp_path / "grace"
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", sys.executable,
           str(ROOT / "tests" / "mpi_grace.py"), str(grace), sys.executable,
           str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY, "--cache-dir", str(tmp_path / "cache"),
           "--output", str(tmp_path / "X.json")]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120,
                          cwd=tmp_path)
    output = proc.stdout + proc.stderr + wait_for(grace).encode()  # the job's output, the ranks' included
    assert proc.returncode == 2, output[-3000:]
    assert b"kv-cache: error: cache dir" in output
    assert not list((tmp_path / "cache").glob("rank0/kv-cache-run-*"))  # rank 0 cleaned up as it was ended


@pytest.mark.slow
def test_a_storage_error_while_preconditioning_on_one_rank_stops_both(tmp_path):
    """Rank 1 may write files of 200 kB at most (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails):
    its preconditioning fails, it writes what it has and ends the job; rank 0, at the window barrier,
    stops within seconds instead of running its 300 s window. Exit status 3 (a storage error)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    args = [str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY, "--duration", "300", "--precondition",
            "--precondition-size-gb", "0.05", "--cache-dir", str(tmp_path / "cache"),
            "--output", str(tmp_path / "X.json")]
    # (rank 0 through mpi_grace: mpirun SIGKILLs it 0.25 s after its SIGTERM, too soon on a loaded host)
    grace = tmp_path / "grace"
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-x", "PYTHONPATH", "-n", "1", sys.executable,
           str(ROOT / "tests" / "mpi_grace.py"), str(grace), sys.executable, *args,
           ":", "-n", "1", prlimit, "--fsize=200000", sys.executable, *args]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120,
                          cwd=tmp_path)
    output = proc.stdout + proc.stderr + wait_for(grace).encode()  # the job's output, rank 0's included
    assert proc.returncode == 3, output[-3000:]
    assert b"kv-cache: error: run stopped by a storage error before the measured window" in output
    rank1 = json.loads((tmp_path / "X_rank1.json").read_text())
    assert rank1["stop_reason"].startswith("storage error before the measured phase")
    assert rank1["verdict"] == "INCOMPLETE"
    assert not list((tmp_path / "cache").glob("rank*/kv-cache-run-*"))  # both ranks removed their files


@pytest.mark.slow
def test_a_rank_killed_in_the_window_under_mpirun_leaves_the_others_results(tmp_path):
    """SIGKILL of rank 1 once its window is open: mpirun ends rank 0 with SIGTERM, and rank 0 writes what
    it measured, INCOMPLETE, and removes its files."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    # (each rank through mpi_grace: mpirun SIGKILLs rank 0 0.25 s after its SIGTERM, too soon on a loaded host)
    grace = tmp_path / "grace"
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", sys.executable,
           str(ROOT / "tests" / "mpi_grace.py"), str(grace), sys.executable,
           str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY, "--duration", "30",
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        entry = None
        while entry is None and time.monotonic() < deadline:
            entry = next((tmp_path / "cache").glob("rank1/kv-cache-run-*/*.npy"), None)
            time.sleep(0.05)
        assert entry is not None, "rank 1 never opened its window"
        os.kill(int(RUN_DIR_NAME.fullmatch(entry.parent.name).group(1)), signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    output = wait_for(grace)
    assert proc.returncode != 0, output[-3000:]
    rank0 = json.loads((tmp_path / "X_rank0.json").read_text())
    assert rank0["stop_reason"] == "interrupted" and rank0["verdict"] == "INCOMPLETE"
    assert not list((tmp_path / "cache").glob("rank0/kv-cache-run-*"))
    assert not (tmp_path / "X.json").exists()  # plain mpirun ended rank 0 before any merge
    # the documented path without --with-ft ulfm: merge what is there afterwards, naming the lost rank
    merge = subprocess.run([sys.executable, str(ROOT / "kv-cache.py"), "merge", "--allow-missing-ranks",
                            "--output", str(tmp_path / "X.json"), str(tmp_path / "X_rank0.json")],
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert merge.returncode == 0, merge.stderr
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["missing_ranks"] == [1] and merged["overall_passed"] is False


@pytest.mark.slow
def test_a_rank_sigkilled_right_after_mpiruns_sigterm_leaves_its_periodic_document(tmp_path, capsys):
    """Plain mpirun: after rank 1 is SIGKILLed in its window, mpirun SIGTERMs rank 0 and SIGKILLs it about
    0.25 s later, which on a loaded host came before rank 0 had written its document (3 of 3 runs at load
    12). Here rank 0 gets no time at all: tests/sigkill_at_sigterm.py makes the SIGTERM a SIGKILL of the
    rank itself, so its final document and clean-up never happen (its run directory stays). What it
    measured survives anyway: its last periodic document (--partial-results-interval 1), whole (written
    atomically), INCOMPLETE and saying up to when it measured. Both ranks' periodic documents then merge
    without --allow-missing-ranks (no rank is missing) into a document that names both as incomplete.
    No timing race: rank 1 is killed once both documents are there."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", sys.executable,
           str(ROOT / "tests" / "sigkill_at_sigterm.py"), str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY,
           "--duration", "60", "--partial-results-interval", "1",
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    docs = [tmp_path / "X_rank0.json", tmp_path / "X_rank1.json"]
    try:
        deadline = time.monotonic() + 90
        while not all(d.exists() for d in docs) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert all(d.exists() for d in docs), "a rank never wrote its periodic document"
        stdout, stderr = _kill_rank1_at_its_first_file(tmp_path, proc)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert list((tmp_path / "cache").glob("rank0/kv-cache-run-*")), "rank 0 was not SIGKILLed before its clean-up"
    rank0 = json.loads(docs[0].read_text())  # (a torn file would not parse)
    assert rank0["verdict"] == "INCOMPLETE" and rank0["rank_status"] == "incomplete"
    assert rank0["partial_document"]["sequence"] >= 1 and rank0["partial_document"]["window_end"] is None
    measured = rank0["partial_document"]["measured_until_s"]
    assert 1 <= measured < 60 and rank0["window_fraction"] == pytest.approx(measured / 60)
    assert rank0["recorder"]["requests"]["completed"] == rank0["requests_completed"]
    assert not (tmp_path / "X.json").exists()  # no merged document claims the run
    capsys.readouterr()
    assert main(["merge", str(docs[0]), str(docs[1]), "--output", str(tmp_path / "M.json")]) == 0
    merged = json.loads((tmp_path / "M.json").read_text())
    assert merged["missing_ranks"] == [] and merged["verdict"] == "INCOMPLETE"
    assert [(x["rank"], x["sequence"] is not None) for x in merged["incomplete_ranks"]] == [(0, True), (1, True)]
    assert merged["incomplete_ranks"][0]["measured_s"] == pytest.approx(rank0["measurement"]["window_seconds"])
    assert not merged["window"]["kind"].startswith("common")
    assert "INCOMPLETE rank 0: measured" in capsys.readouterr().out


def _kill_rank1_at_its_first_file(tmp_path, proc):
    """SIGKILL rank 1 once its first entry file is there (its window is open; with --precondition, while
    it preconditions); wait for mpirun."""
    try:
        deadline = time.monotonic() + 60
        entry = None
        while entry is None and time.monotonic() < deadline and proc.poll() is None:
            entry = next((tmp_path / "cache").glob("rank1/kv-cache-run-*/*.npy"), None)
            time.sleep(0.05)
        assert entry is not None, "rank 1 never opened its window"
        os.kill(int(RUN_DIR_NAME.fullmatch(entry.parent.name).group(1)), signal.SIGKILL)
        return proc.communicate(timeout=120)
    finally:
        proc.kill()


@pytest.mark.slow
def test_a_rank_killed_under_mpirun_with_ft_leaves_a_merged_document_naming_it(tmp_path):
    """`mpirun --with-ft ulfm`: the launcher lets rank 0 live when rank 1 is SIGKILLed in its window. Rank 0
    finishes its window, its closing barrier breaks, it writes its file and the merged document naming rank
    1 (verdict INCOMPLETE), removes its files and exits 4 (ranks lost), which mpirun passes on."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "--with-ft", "ulfm", "-n", "2", "-x", "PYTHONPATH",
           sys.executable, str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY, "--duration", "6",
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    stdout, stderr = _kill_rank1_at_its_first_file(tmp_path, proc)
    assert proc.returncode == 4, (stdout + stderr)[-3000:]
    assert not (tmp_path / "X_rank1.json").exists()
    rank0 = json.loads((tmp_path / "X_rank0.json").read_text())
    assert rank0["stop_reason"] == "duration" and rank0["window_fraction"] == 1.0  # its window was whole
    assert any("closing barrier" in n for n in rank0["measurement"]["notes"])
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["missing_ranks"] == [1] and merged["ranks_expected"] == 2
    assert merged["verdict"] == "INCOMPLETE" and merged["overall_passed"] is False
    assert [r["rank"] for r in merged["lost_ranks"]] == [1]
    assert [r["rank"] for r in merged["per_rank"]] == [0]
    assert merged["totals"]["requests_completed"] == rank0["requests_completed"]
    assert "Merged results of 1 of 2 ranks written to" in stdout
    assert not list((tmp_path / "cache").glob("rank0/kv-cache-run-*"))  # rank 0 removed its run's files


class _Survivors:
    """A RankGroup of `size` MPI ranks where `lost` ones are gone: `survivors` gives the live ones."""

    gather_waits = True

    def __init__(self, size, lost, docs, rank=0, broken=False):
        self.rank, self.size, self.lost, self.docs, self.broken = rank, size, lost, docs, broken

    def survivors(self):
        live = _Survivors(self.size - len(self.lost), [], self.docs, self.rank, self.broken)
        return live, list(self.lost)

    def gather(self, obj):
        if self.broken:
            raise GroupBroken("MPI gather failed: another rank was lost")
        return self.docs if self.rank == 0 else None


def _settings(tmp_path):
    """What write_merged reads of the settings: the rank's own output and where the merged one goes."""
    return SimpleNamespace(outputs=SimpleNamespace(output=str(tmp_path / "X_rank0.json")), merged_output=str(tmp_path / "X.json"))


def test_the_lowest_live_rank_merges_the_others_and_names_the_lost_ones(tmp_path):
    docs, _ = _ranks()
    out = io.StringIO()
    lost = write_merged(_settings(tmp_path), _Survivors(3, [1], [docs[0], docs[2]]), docs[0], out)
    assert lost == [1]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["missing_ranks"] == [1] and merged["ranks_expected"] == 3
    assert merged["verdict"] == "INCOMPLETE" and merged["overall_passed"] is False
    assert merged["lost_ranks"] == [{"rank": 1, "ended": "lost (an MPI process failure: killed, out of memory "
                                                         "or crashed)"}]
    assert "Merged results of 2 of 3 ranks written to" in out.getvalue()
    # the other live ranks learn the same lost ranks and write nothing
    assert write_merged(_settings(tmp_path), _Survivors(3, [1], docs, rank=1), docs[2], io.StringIO()) == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.json"]


def test_the_lowest_live_rank_merges_a_lost_ranks_periodic_document_of_this_run(tmp_path):
    """Under --with-ft ulfm a lost rank may have left its last periodic document at its rank file: the
    lowest live rank merges it as an incomplete rank (not missing) when it is of this run's id, and names
    the rank missing when it is another run's (an earlier killed run's file at the same path)."""
    from kv_cache.results.partial import mark_partial

    docs, _ = _ranks()
    left = mark_partial(json.loads(dumps(docs[1])), 2.0, 10.0, 2000.0, 1.0, 2)
    (tmp_path / "X_rank1.json").write_text(dumps(left))
    out = io.StringIO()
    assert write_merged(_settings(tmp_path), _Survivors(3, [1], [docs[0], docs[2]]), docs[0], out) == [1]
    merged = json.loads((tmp_path / "X.json").read_text())
    assert merged["missing_ranks"] == [] and merged["verdict"] == "INCOMPLETE" and merged["ranks"] == 3
    assert [(x["rank"], x["sequence"], x["ended"].startswith("lost (an MPI process failure"))
            for x in merged["incomplete_ranks"]] == [(1, 2, True)]
    assert "Merged results of 2 of 3 ranks and the last periodic document of rank(s) 1 (incomplete)" in out.getvalue()
    (tmp_path / "X_rank1.json").write_text(json.dumps({**left, "run_id": "an-earlier-run"}))
    os.remove(tmp_path / "X.json")
    write_merged(_settings(tmp_path), _Survivors(3, [1], [docs[0], docs[2]]), docs[0], io.StringIO())
    assert json.loads((tmp_path / "X.json").read_text())["missing_ranks"] == [1]


def test_a_rank_lost_during_the_gather_is_ranks_lost_with_the_way_out(tmp_path):
    docs, _ = _ranks()
    with pytest.raises(RanksLost, match="kv-cache merge --allow-missing-ranks"):
        write_merged(_settings(tmp_path), _Survivors(3, [], docs, broken=True), docs[0], io.StringIO())
    assert not (tmp_path / "X.json").exists()


@pytest.mark.slow
def test_a_rank_killed_before_the_window_under_mpirun_with_ft_stops_the_others_with_exit_4(tmp_path):
    """`mpirun --with-ft ulfm`, rank 1 SIGKILLed while preconditioning: rank 0's window barrier breaks; it
    removes its files and exits 4 (ranks lost) without MPI_Abort, so mpirun exits 4 too. Nothing was
    measured: no results file, as under --processes."""
    cfg = tmp_path / "micro.yaml"
    cfg.write_text(MICRO)
    cmd = [_mpirun(), "--allow-run-as-root", "--oversubscribe", "--with-ft", "ulfm", "-n", "2", "-x", "PYTHONPATH",
           sys.executable, str(ROOT / "kv-cache.py"), "--config", str(cfg), *TINY, "--duration", "30",
           "--precondition", "--precondition-size-gb", "2",
           "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json")]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    stdout, stderr = _kill_rank1_at_its_first_file(tmp_path, proc)  # 1 GiB each: seconds
    assert proc.returncode == 4, (stdout + stderr)[-3000:]
    assert "kv-cache: error: MPI barrier failed: another rank was lost" in stdout + stderr
    assert not list(tmp_path.glob("X*.json"))
    assert not list((tmp_path / "cache").glob("rank0/kv-cache-run-*"))
