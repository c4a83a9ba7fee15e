"""The tier sizes in force after the memory budget, beside those asked for: banner and run_parameters; a
storage tier on tmpfs counts against the same budget as the CPU tier."""

import os
import tempfile

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli.exits import exit_status
from kv_cache.host.blockdev import fs_type
from kv_cache.host.capacity import auto_capacity
from kv_cache.host.memlimit import MemoryLimit
from kv_cache.render.banner import size_lines
from kv_cache.serving import tiers as tiers_mod
from kv_cache.serving.tiers import RESERVE_BYTES, TierSet, open_tiers
from kv_cache.settings.run import StorageSettings, TierSettings

GIB = 1 << 30
MIB = 1 << 20


def _budget(monkeypatch, available):
    seen = []

    def limit(host_ranks=1):
        seen.append(host_ranks)
        return MemoryLimit(available // host_ranks, "test limit")

    monkeypatch.setattr(tiers_mod, "process_memory_limit", limit)
    return seen


def test_a_clamped_size_is_shown_beside_the_one_asked_for():
    sizes = {"cpu_mem_gb": {"asked": 1000.0, "effective": 20.38, "clamped": "90% of 22.9 GiB (MemAvailable)"},
             "storage_capacity_gb": {"asked": 0.0, "effective": 5.0, "clamped": None}}
    assert size_lines(sizes) == ["CPU tier: 20.38 GiB (asked 1000.00, clamped: 90% of 22.9 GiB (MemAvailable))"]


def test_auto_capacity_in_ram_stays_inside_the_memory_room():
    assert auto_capacity(10 * GIB, GIB, 1, ram_room=3 * GIB) == pytest.approx(2 * GIB)
    assert auto_capacity(10 * GIB, GIB, 1, ram_room=20 * GIB) == pytest.approx(8 * GIB)  # the free space binds
    assert auto_capacity(10 * GIB, GIB, 1, ram_room=0) == 0.0


@pytest.mark.slow  # a real run
def test_banner_and_json_show_the_cpu_tier_in_force(quick_settings, sink, monkeypatch):
    seen = _budget(monkeypatch, 600 * MIB)
    results, outcome = execute(quick_settings("--cpu-mem-gb", "1000", "--duration", "1"), sink)
    code = exit_status(outcome)
    assert code == 0 and seen == [1]
    params = results["run_parameters"]
    effective = params["cpu_mem_gb_effective"]
    assert params["cpu_mem_gb"] == 1000 and 0 < effective < 0.6  # the flag as given, and what was in force
    assert params["tier_sizes"]["cpu_mem_gb"]["clamped"].startswith("90% of 0.59 GiB (test limit)")
    assert results["measurement"]["cpu_tier_bytes"] == pytest.approx(effective * GIB, abs=1)
    banner = sink.getvalue()
    assert f"CPU Memory: {effective:.2f} GiB (asked 1000, clamped)" in banner
    assert f"CPU tier: {effective:.2f} GiB (asked 1000.00, clamped: 90% of 0.59 GiB (test limit)" in banner
    assert params["storage_capacity_gb_effective"] > 0 and params["gpu_mem_gb_effective"] is None


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or fs_type("/dev/shm") != "tmpfs", reason="needs a tmpfs")
def test_a_tmpfs_storage_tier_takes_only_what_the_budget_leaves(monkeypatch):
    _budget(monkeypatch, 1 * GIB)
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.1, cache_dir=cache, host_ranks=2)
        tier_set = TierSet(tiers=[])
        try:
            open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, largest_entry=MIB)
            budget = int(0.9 * (GIB // 2)) - RESERVE_BYTES  # half the host for this rank, less the reserve
            cpu = tier_set.memory_store.capacity_bytes
            assert cpu == int(0.1 * GIB) < budget  # fits: not clamped
            assert tier_set.tiers[-1].limit == pytest.approx(budget - cpu - MIB)  # not 90 % of the tmpfs
            assert tier_set.tiers[-1].limit < 0.9 * os.statvfs(cache).f_bavail * os.statvfs(cache).f_frsize
            size = tier_set.sizes["storage_capacity_gb"]
            assert size["asked"] == 0.0 and "tmpfs is RAM" in size["clamped"]
            assert any("bounded by the memory budget" in n for n in tier_set.notes)
        finally:
            tier_set.close()
