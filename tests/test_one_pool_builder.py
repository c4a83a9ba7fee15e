"""Both benchmarks build their I/O worker pools through the one builder in core/pool.py, with the same
worker-count rule (--io-workers, else one per user up to DEFAULT_MAX_WORKERS)."""

from __future__ import annotations

import pytest
from test_sessions_tiers import _rung, argv  # noqa: F401  (argv: the sessions tests' fixture)

from kv_cache.benchmarks.standard.run import execute
from kv_cache.core import pool as pools
from kv_cache.core.pool import DEFAULT_MAX_WORKERS, Stream, worker_count


@pytest.fixture
def built(monkeypatch):
    calls: list[tuple[Stream, int, int]] = []
    real = pools.open_pool

    def spy(stream, workers, chunk_bytes, seed):
        calls.append((stream, workers, chunk_bytes))
        return real(stream, workers, chunk_bytes, seed)

    monkeypatch.setattr(pools, "open_pool", spy)
    return calls


def test_worker_count_rule():
    assert worker_count(0, 4) == 4 and worker_count(0, 1000) == DEFAULT_MAX_WORKERS
    assert worker_count(6, 1000) == 6 and worker_count(0, 10, limit=3) == 3 and worker_count(0, 0) == 1


@pytest.mark.slow  # a real run (wall clock)
def test_the_standard_run_builds_its_request_pool_through_the_builder(quick_settings, sink, built):
    execute(quick_settings("--io-workers", "3"), out=sink)
    assert (Stream.REQUESTS, 3, 1 << 20) in built  # --io-workers 3, --io-chunk-mb 1
    assert all(s in (Stream.REQUESTS, Stream.FILL, Stream.RAG_INGEST) for s, _, _ in built)


def test_a_sessions_rung_builds_its_io_pool_through_the_builder(argv, built):  # noqa: F811
    rung = _rung(argv())
    try:
        rung._build()
        assert built == [(Stream.ENGINE_IO, 2, 1 << 20)]  # --io-workers 2, --io-chunk-mb 1
        assert rung.io is not None
    finally:
        rung._teardown()
