"""--replay-cycles: each pass replays the trace as fresh sessions (new keys), with the trace's own history."""

from __future__ import annotations

from kv_cache.settings.schema import BenchConfig
from kv_cache.workload.replay import TracePlanner
from kv_cache.workload.traces import TraceRequest


def _planner(kv_block_tokens: int = 0) -> TracePlanner:
    cfg = BenchConfig()
    return TracePlanner(kv_block_tokens, True, cfg.qos_distribution, cfg.qos_profiles, seed=7)


def _turns(n: int = 3) -> list[TraceRequest]:
    return [TraceRequest(i, "s1", i + 1, None, None, 100 * (i + 1), 100, 10, None, None) for i in range(n)]


def test_each_cycle_has_new_keys_and_its_own_history():
    planner = _planner()
    passes = [[planner.plan(req, cycle) for req in _turns()] for cycle in range(3)]
    for plans in passes:
        assert [len(p.history_keys) for p in plans] == [0, 1, 2]  # never 4 or 8: no history from earlier passes
        assert all(set(p.history_keys) <= {q.cache_key for q in plans} for p in plans)
    keys = [{p.cache_key for p in plans} for plans in passes]
    assert not keys[0] & keys[1] and not keys[1] & keys[2] and not keys[0] & keys[2]
    assert passes[0][0].cache_key == "s1_turn_1"  # the first pass keeps its keys


def test_block_keys_differ_per_cycle():
    req = TraceRequest(0, "s1", 1, None, None, 300, 300, 10, None, None)
    planner = _planner(kv_block_tokens=128)
    first, second = planner.plan(req, 0), planner.plan(req, 1)
    assert len(first.blocks) == len(second.blocks) == 3
    assert not {k for k, _ in first.blocks} & {k for k, _ in second.blocks}
    assert planner.plan(req, 0).blocks == first.blocks  # deterministic


def test_trace_mode_allocates_no_io_buffers(quick_settings, tmp_path):
    from kv_cache.benchmarks.standard.setup import driver_options, io_chunk_bytes
    from kv_cache.core.pool import Stream, WorkerPool

    trace = quick_settings("--io-trace-log", str(tmp_path / "t.csv"))
    assert io_chunk_bytes(trace) == 0 and driver_options(trace, 4, False).chunk_bytes == 0
    assert io_chunk_bytes(quick_settings()) > 0
    seen = []
    with WorkerPool(Stream.REQUESTS, 2, 0, seed=1) as pool:
        pool.run_on_each(seen.append)
    assert seen == [None, None]
