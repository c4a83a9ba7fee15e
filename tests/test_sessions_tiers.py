"""A sessions rung builds its offload tiers through the standard run's builder: the same backends,
memory budget, leftovers sweep, retries, --verify and storage-error policy."""

import errno
import json

import pytest
from test_leftovers import _dead_pid, _fake_run_dir
from test_sessions_ladder import SMALL

from kv_cache.benchmarks.sessions.ladder import RungRun
from kv_cache.cli import main
from kv_cache.cli import parse_sessions_settings as resolve
from kv_cache.core.error_policy import ErrorPolicy
from kv_cache.errors import ExitCode
from kv_cache.storage import backends
from kv_cache.storage.files import FileStore
from kv_cache.storage.tiername import TierName
from kv_cache.workload.session_supply import script_supply


@pytest.fixture
def argv(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL + "storage:\n  io_retries: 2\n  max_storage_errors: 0\n")

    def make(*extra):
        return ["--config", str(cfg), "--model", "micro", "--gpu", "l40s", "--gpu-mem-gb", "0.012",
                "--window", "2", "--warmup", "0", "--subwindows", "4", "--cpu-mem-gb", "0",
                "--cache-dir", str(tmp_path / "cache"), "--pace", "fixed:0.05", "--io-workers", "2",
                "--io-chunk-mb", "1", "--no-fsync", "--output", str(tmp_path / "s.json"), *extra]

    return make


def _rung(argv_list, tiers="dram+storage", sessions=4):
    s = resolve(argv_list)
    ls = s.ladder_settings
    return RungRun(ls, tiers, sessions, script_supply(None, s.sessions, ls.seed))


def test_a_rungs_cache_has_the_runs_retries_verify_and_error_policy(argv, tmp_path):
    stale = _fake_run_dir(tmp_path / "cache", "dead", _dead_pid())
    rung = _rung(argv("--verify", "--cpu-mem-gb", "0.05"))
    try:
        rung._build()
        cache = rung.cache
        assert cache.retries == 2 and cache.verify is True and isinstance(cache.on_fault, ErrorPolicy)
        assert [t.name for t in cache.tiers] == ["cpu", "nvme"]
        assert {b.name for b in rung.stores.backends.values()} == {"memory", "file"}
        assert not stale.exists()  # the leftovers of a dead run were swept before the free space was read
        assert any("removed the run directory" in n for n in rung.stores.notes)
    finally:
        rung._teardown()


def test_a_dram_rung_keeps_its_usable_fraction_and_has_no_storage_tier(argv):
    rung = _rung(argv("--cpu-mem-gb", "0.05"), tiers="dram")
    try:
        rung._build()
        (tier,) = rung.cache.tiers
        assert tier.name == "cpu" and rung.stores.file_store is None
        assert tier.limit == pytest.approx(tier.store.capacity_bytes * rung.ls.dram_usable_fraction)
    finally:
        rung._teardown()


def test_a_rung_without_offload_tiers_has_no_cache(argv):
    rung = _rung(argv(), tiers="none")
    try:
        rung._build()
        assert rung.cache is None and rung.io is None
    finally:
        rung._teardown()


def test_the_dram_tier_is_clamped_to_the_memory_budget(argv, monkeypatch):
    from kv_cache.host.memlimit import MemoryLimit
    from kv_cache.serving import tiers as tiers_mod

    monkeypatch.setattr(tiers_mod, "process_memory_limit", lambda host_ranks=1: MemoryLimit(400 << 20, "test budget"))
    rung = _rung(argv("--cpu-mem-gb", "1"), tiers="dram")
    try:
        rung._build()
        assert rung.stores.memory_store.capacity_bytes < 1 << 30
        assert any("clamped" in n for n in rung.stores.notes)
    finally:
        rung._teardown()


class _FailingFileStore(FileStore):
    """Every entry write fails with EIO (after the file was created, as a flaky device would)."""

    def _put(self, h, offset, view, first):
        raise OSError(errno.EIO, "injected EIO")


@pytest.fixture
def failing_storage(monkeypatch):
    """A storage backend that every setting selects over the file backend, whose writes always fail."""
    backends.all_backends()  # the registry loaded, then the entry added for this test only
    entry = backends.Backend(
        name="failing-test", tier=TierName.STORAGE, summary="injected EIO on every write",
        capabilities=backends.Capabilities(), selects=lambda tiers: True, priority=1000,
        open=lambda r: _FailingFileStore(r.tiers.cache_dir, r.storage.chunk_bytes, fsync=False,
                                         io_mode=r.storage.io_mode))
    monkeypatch.setitem(backends._ENTRIES, entry.name, entry)
    return entry


@pytest.mark.slow  # runs a rung in real time (stopped at the first storage error)
def test_a_failing_backend_is_retried_counted_and_stops_the_ladder_with_exit_3(argv, failing_storage, tmp_path):
    code = main(["sessions", *argv("--ladder", "4", "--tiers", "dram+storage")])
    assert code == ExitCode.STORAGE_ERROR
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["stop_reason"].startswith("storage error")
    (rung,) = doc["rungs"]
    write = rung["storage_errors"]["storage"]["write"]
    assert write["retried"] >= 2 and write["failed"] >= 1 and write["by_error"] == {"EIO": write["failed"]}
    assert "storage write" in rung["storage_error"]
