"""How a run's settings divide across ranks: the split / offset / copy rule of every setting, shares that
sum to the flags, --processes and mpirun ranks given totals, the wrapper's per-rank values, the host's
memory budget divided between the ranks on it, and the results recording totals and shares."""

import json
from datetime import datetime

import pytest

from kv_cache.benchmarks.standard.processes import rank_settings
from kv_cache.cli import build_parser, main
from kv_cache.cli.resolve import resolve_run
from kv_cache.errors import UsageError
from kv_cache.host.memlimit import MemoryLimit, process_memory_limit, share_of_host
from kv_cache.results.parameters import run_parameters
from kv_cache.settings.fields import COPY, OFFSET, SPLIT
from kv_cache.settings.ranks import rank_share, rules, setting_value, split_values, totals

SPLIT_SETTINGS = {"num_users", "request_rate", "storage_capacity_gb", "gpu_mem_gb", "cpu_mem_gb", "max_requests",
                  "precondition_size_gb", "rag_num_docs", "tier_bandwidth_gbps",
                  "cpu_tier_bandwidth_gbps"}  # the shaped rates: shared
TOTALS = ("--num-users", "10", "--request-rate", "2", "--storage-capacity-gb", "3", "--gpu-mem-gb", "0",
          "--cpu-mem-gb", "0.3", "--max-requests", "7", "--precondition-size-gb", "5", "--enable-rag",
          "--rag-num-docs", "11")
GIB = 1 << 30


def test_every_setting_has_its_rule():
    got = rules()
    assert {name for name, (_, rule) in got.items() if rule == SPLIT} == SPLIT_SETTINGS
    assert {name for name, (_, rule) in got.items() if rule == OFFSET} == {"seed"}
    for copied in ("duration", "cache_dir", "generation_mode", "num_gpus", "tensor_parallel", "trace_speedup",
                   "precondition_threads", "max_concurrent_allocs", "performance_profile", "model_name"):
        assert got[copied][1] == COPY, copied


@pytest.mark.parametrize("total,n,shares", [
    (10, 3, [4, 3, 3]), (7, 2, [4, 3]), (2, 2, [1, 1]), (0, 4, [0, 0, 0, 0]), (5, 1, [5]),
])
def test_integer_shares_give_the_remainder_to_the_first_ranks(total, n, shares):
    assert split_values(total, n) == shares and sum(shares) == total


@pytest.mark.parametrize("total,n", [(2.0, 2), (0.3, 3), (1000.0, 7), (0.0, 2)])
def test_float_shares_sum_to_the_total(total, n):
    shares = split_values(total, n)
    assert len(shares) == n and sum(shares) == pytest.approx(total, abs=1e-12)
    assert all(s == pytest.approx(total / n) for s in shares)


def test_processes_divide_every_total_and_offset_the_seed(quick_settings, tmp_path):
    settings = quick_settings(*TOTALS, "--processes", "3")
    ranks = [rank_settings(settings, r, 3) for r in range(3)]
    assert [s.workload.num_users for s in ranks] == [4, 3, 3]
    assert [s.driver.max_requests for s in ranks] == [3, 2, 2]
    assert [s.workload.rag_num_docs for s in ranks] == [4, 4, 3]
    for name, total in (("request_rate", 2.0), ("storage_capacity_gb", 3.0), ("cpu_mem_gb", 0.3),
                        ("precondition_size_gb", 5.0)):
        assert sum(setting_value(s, name) for s in ranks) == pytest.approx(total), name
        assert setting_value(ranks[0], name) == pytest.approx(total / 3), name
    assert [s.seed for s in ranks] == [42, 43, 44]
    assert all(s.driver.duration == settings.driver.duration and s.tiers.cache_dir.endswith(f"rank{r}") for r, s in enumerate(ranks))
    assert all(s.tiers.host_ranks == 3 and s.driver.processes == 1 and s.mpi_world_size == 3 for s in ranks)
    assert all(dict(s.rank_totals) == totals(settings) for s in ranks)
    assert ranks[1].rank_totals["num_users"] == 10 and ranks[1].rank_totals["request_rate"] == 2.0


def test_two_processes_offer_the_rate_of_the_flag(quick_settings):
    settings = quick_settings("--request-rate", "2", "--processes", "2")
    assert [rank_settings(settings, r, 2).driver.request_rate for r in range(2)] == [1.0, 1.0]


@pytest.mark.parametrize("extra,words", [
    (["--processes", "2", "--max-requests", "1"], "--max-requests 1 is a total divided between 2 ranks"),
    (["--processes", "3", "--enable-rag", "--rag-num-docs", "2"], "--rag-num-docs 2 is a total"),
])
def test_a_total_too_small_to_divide_is_one_line_exit_2(extra, words, capsys, tmp_path):
    assert main(["--num-users", "4", "--cache-dir", str(tmp_path / "c"), "--output", str(tmp_path / "r.json"),
                 *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "r.json").exists()


def _mpi_env(monkeypatch, rank, size, local=None):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(rank))
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", str(size))
    if local is None:
        monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    else:
        monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(local))


def _argv(tmp_path, *extra):
    return ["--gpu-mem-gb", "0", "--seed", "42", "--cache-dir", str(tmp_path / "c"),
            "--output", str(tmp_path / "r.json"), *extra]


def test_plain_mpirun_ranks_take_their_share_of_the_totals(monkeypatch, tmp_path):
    _mpi_env(monkeypatch, 1, 2, local=2)
    argv = _argv(tmp_path, *TOTALS)
    s = resolve_run(build_parser().parse_args(argv), argv)
    assert (s.workload.num_users, s.driver.request_rate, s.driver.max_requests, s.workload.rag_num_docs) == (5, 1.0, 3, 5)
    assert s.tiers.storage_capacity_gb == pytest.approx(1.5) and s.tiers.cpu_mem_gb == pytest.approx(0.15)
    assert s.seed == 43 and s.mpi_rank == 1 and s.mpi_world_size == 2 and s.tiers.host_ranks == 2
    assert s.outputs.output == str(tmp_path / "r_rank1.json") and s.tiers.cache_dir == str(tmp_path / "c" / "rank1")
    assert s.rank_totals["num_users"] == 10 and not s.flags_per_rank


def test_the_wrapper_keeps_each_ranks_own_values(monkeypatch, tmp_path):
    _mpi_env(monkeypatch, 1, 2, local=2)
    argv = _argv(tmp_path, *TOTALS)
    s = resolve_run(build_parser().parse_args(argv), argv, rank_paths=False, flags_per_rank=True)
    assert (s.workload.num_users, s.driver.request_rate, s.driver.max_requests, s.seed) == (10, 2.0, 7, 42)  # the Rules: per client
    assert s.flags_per_rank and s.rank_totals is None and s.tiers.host_ranks == 2  # the host's memory is still shared
    split = run_parameters(s, datetime(2026, 1, 1))["settings_split"]
    assert split["flags_given_as"] == "per_rank" and split["totals"]["num_users"] == 20
    assert split["rank_share"]["num_users"] == 10


def test_a_rank_too_many_for_the_users_is_refused(monkeypatch, tmp_path):
    _mpi_env(monkeypatch, 0, 8)
    argv = _argv(tmp_path, "--num-users", "4")
    with pytest.raises(UsageError, match="--num-users 4 is a total divided between 8 ranks"):
        resolve_run(build_parser().parse_args(argv), argv)


def test_results_record_the_totals_and_the_share(quick_settings):
    settings = quick_settings(*TOTALS, "--processes", "2")
    params = run_parameters(rank_settings(settings, 1, 2), datetime(2026, 1, 1))
    assert params["num_users"] == 5 and params["request_rate"] == 1.0  # the old keys: this rank's values
    split = params["settings_split"]
    assert split["flags_given_as"] == "totals" and split["ranks"] == 2 and split["host_ranks"] == 2
    assert split["totals"]["num_users"] == 10 and split["totals"]["request_rate"] == 2.0
    assert split["rank_share"]["num_users"] == 5 and split["rank_share"]["seed"] == 43
    json.dumps(params)  # plain JSON
    single = run_parameters(settings, datetime(2026, 1, 1))["settings_split"]
    assert single["flags_given_as"] == "single" and single["totals"] == single["rank_share"] | {"seed": 42}


def test_rank_share_is_the_one_rule_set(quick_settings):
    settings = quick_settings(*TOTALS)
    shares = [rank_share(settings, r, 4, host_ranks=4) for r in range(4)]
    for name in SPLIT_SETTINGS:
        assert sum(setting_value(s, name) for s in shares) == pytest.approx(setting_value(settings, name)), name


def test_the_host_memory_is_divided_between_its_ranks(monkeypatch):
    limit = MemoryLimit(10 * GIB, "MemAvailable")
    assert share_of_host(limit, 1) is limit
    half = share_of_host(limit, 4)
    assert half.available == 10 * GIB // 4 and half.source == "MemAvailable / 4 ranks on this host"
    monkeypatch.setattr("kv_cache.host.memlimit.mem_available", lambda: 8 * GIB)
    monkeypatch.setattr("kv_cache.host.memlimit.cgroup_headroom", lambda: None)
    assert process_memory_limit(2).available == 4 * GIB
    assert process_memory_limit().available == 8 * GIB


@pytest.mark.slow  # two real processes
def test_two_real_processes_each_offer_half_the_rate(quick_settings, tmp_path):
    quick_settings()  # writes micro.yaml
    argv = ["--config", str(tmp_path / "micro.yaml"), "--model", "micro", "--num-users", "4", "--duration", "1",
            "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--seed", "3", "--io-chunk-mb",
            "1", "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "X.json"), "--processes", "2",
            "--request-rate", "2"]
    assert main(argv) == 0
    docs = [json.loads((tmp_path / f"X_rank{r}.json").read_text()) for r in range(2)]
    assert [d["measurement"]["requested_request_rate"] for d in docs] == [1.0, 1.0]
    assert sum(d["measurement"]["requested_request_rate"] for d in docs) == 2.0  # the flag, not 2 x it
    for d in docs:  # offered_request_rate: the arrivals really offered (a Poisson count) over the window
        m = d["measurement"]
        assert m["offered_request_rate"] == m["arrivals_offered"] / m["window_seconds"]
    assert json.loads((tmp_path / "X.json").read_text())["measurement"]["requested_request_rate"] == 2.0
    assert [d["run_parameters"]["settings_split"]["totals"]["request_rate"] for d in docs] == [2.0, 2.0]
    assert [d["run_parameters"]["settings_split"]["rank_share"]["num_users"] for d in docs] == [2, 2]
    merged = json.loads((tmp_path / "X.json").read_text())["settings_split"]
    assert merged["flags_given_as"] == "totals" and merged["totals"]["request_rate"] == 2.0
    assert [s["request_rate"] for s in merged["rank_shares"]] == [1.0, 1.0]


def test_the_mlperf_wrapper_runs_each_rank_with_its_own_values(tmp_path, monkeypatch):
    from kv_cache.cli import wrapper  # noqa: PLC0415

    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plan = wrapper.plan_rank(["--rank-output-base", str(tmp_path / "o"), "--rank-cache-base", str(tmp_path / "c"),
                              "--seed-base", "40", "--num-users", "100", "--request-rate", "4",
                              "--gpu-mem-gb", "0"], env, datetime(2026, 1, 1))
    seen = []
    monkeypatch.setattr("kv_cache.cli.run_resolved", lambda s: seen.append(s) or 0)
    assert wrapper.run_kv_cache(plan) == 0
    (s,) = seen
    assert (s.workload.num_users, s.driver.request_rate, s.seed) == (100, 4.0, 41)  # per client, as the Rules say
    assert s.flags_per_rank and s.tiers.host_ranks == 2 and s.mpi_rank == 1


def test_the_banner_names_the_ranks_share(quick_settings):
    from kv_cache.render.banner import rank_line  # noqa: PLC0415

    settings = quick_settings("--num-users", "10", "--request-rate", "2", "--processes", "2")
    line = rank_line(rank_settings(settings, 1, 2))
    assert line.startswith("Rank 1 of 2: its share of the totals given (")
    assert "num_users 5 of 10" in line and "request_rate 1 of 2" in line
