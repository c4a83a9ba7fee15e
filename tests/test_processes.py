"""`--processes N`: the per-process settings, the group's collectives, and a real two-process run."""

import json
import queue
import threading

import pytest

from kv_cache.app_processes import GroupBroken, ProcessGroup, rank_settings
from kv_cache.cli import main


def test_each_process_gets_a_share_and_its_own_paths(quick_settings, tmp_path):
    settings = quick_settings("--num-users", "10", "--cpu-mem-gb", "0.3", "--processes", "3")
    ranks = [rank_settings(settings, r, 3) for r in range(3)]
    assert [s.num_users for s in ranks] == [4, 3, 3]
    assert [s.seed for s in ranks] == [42, 43, 44]
    assert all(s.cpu_mem_gb == pytest.approx(0.1) for s in ranks)
    assert [s.output for s in ranks] == [str(tmp_path / f"r_rank{r}.json") for r in range(3)]
    assert [s.cache_dir for s in ranks] == [str(tmp_path / "cache" / f"rank{r}") for r in range(3)]
    assert all(s.processes == 1 and s.mpi_world_size == 3 for s in ranks)
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
    assert sorted(results.get_nowait()[0] for _ in range(n)) == [0, 1, 2]


def test_a_broken_barrier_is_a_clear_error():
    barrier = threading.Barrier(2)
    barrier.abort()
    with pytest.raises(GroupBroken):
        ProcessGroup(0, 2, barrier, {}, queue.Queue()).barrier()


@pytest.mark.slow
def test_two_processes_give_one_merged_document(quick_settings, tmp_path, capsys):
    argv = ["--config", str(tmp_path / "micro.yaml"), "--model", "micro", "--num-users", "4", "--duration", "1",
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "3", "--io-chunk-mb",
            "1", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json"), "--processes", "2"]
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
    assert "Merged results of 2 processes" in capsys.readouterr().out
