"""A storage tier in RAM (tmpfs) is host memory: an explicit capacity there counts against the memory budget
like the CPU tier, a budget the CPU tier has used up is refused before anything runs, and an explicit
capacity beyond the filesystem's free space is refused with the numbers (issue 17, 'a RAM-backed storage tier
counts against the memory budget')."""

import os
import tempfile

import pytest

from kv_cache.cli import main
from kv_cache.errors import StorageSetupError
from kv_cache.host.blockdev import fs_type
from kv_cache.host.memlimit import MemoryLimit
from kv_cache.serving import tiers as tiers_mod
from kv_cache.serving.tiers import RESERVE_BYTES, TierSet, open_tiers
from kv_cache.settings.run import StorageSettings, TierSettings
from kv_cache.storage.files import FileStore

GIB = 1 << 30
MIB = 1 << 20
needs_tmpfs = pytest.mark.skipif(not os.path.isdir("/dev/shm") or fs_type("/dev/shm") != "tmpfs",
                                 reason="needs a tmpfs at /dev/shm")
MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")


def _budget(monkeypatch, available: int) -> None:
    monkeypatch.setattr(tiers_mod, "process_memory_limit", lambda host_ranks=1: MemoryLimit(available, "test limit"))


def _open(settings: TierSettings) -> TierSet:
    tier_set = TierSet(tiers=[])
    try:
        open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, largest_entry=MIB)
    except BaseException:
        tier_set.close()
        raise
    return tier_set


@needs_tmpfs
def test_an_explicit_capacity_on_tmpfs_is_clamped_to_the_budget_left(monkeypatch):
    _budget(monkeypatch, 1 * GIB)
    budget = int(0.9 * GIB) - RESERVE_BYTES
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        tier_set = _open(TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.1, cache_dir=cache, storage_capacity_gb=2.0))
        try:
            room = budget - tier_set.memory_store.capacity_bytes
            assert tier_set.tiers[-1].limit == room
            size = tier_set.sizes["storage_capacity_gb"]
            assert size["asked"] == 2.0 and size["effective"] == pytest.approx(room / GIB)
            assert "tmpfs is RAM" in size["clamped"]
            assert any("storage tier of 2.00 GiB on tmpfs (RAM)" in n and "clamped to" in n for n in tier_set.notes)
        finally:
            tier_set.close()


@needs_tmpfs
def test_an_explicit_capacity_on_tmpfs_that_fits_is_left_alone(monkeypatch):
    _budget(monkeypatch, 1 * GIB)
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        tier_set = _open(TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.1, cache_dir=cache, storage_capacity_gb=0.25))
        try:
            assert tier_set.tiers[-1].limit == 0.25 * GIB and tier_set.sizes["storage_capacity_gb"]["clamped"] is None
        finally:
            tier_set.close()


@needs_tmpfs
def test_strict_memory_refuses_an_explicit_capacity_on_tmpfs_beyond_the_budget(monkeypatch):
    _budget(monkeypatch, 1 * GIB)
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.1, cache_dir=cache, storage_capacity_gb=2.0,
                                strict_memory=True)
        with pytest.raises(StorageSetupError, match=r"storage tier of 2.00 GiB on tmpfs .*give at most") as err:
            _open(settings)
        assert err.value.setting == "storage_capacity_gb"


@needs_tmpfs
def test_a_cpu_tier_that_takes_the_whole_budget_leaves_a_tmpfs_tier_nothing_and_is_refused(monkeypatch):
    _budget(monkeypatch, 1 * GIB)
    allocated = []
    real = tiers_mod._open_memory_store
    monkeypatch.setattr(tiers_mod, "_open_memory_store", lambda *a, **k: allocated.append(1) or real(*a, **k))
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        with pytest.raises(StorageSetupError, match="has no room left for it: the CPU tier takes") as err:
            _open(TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=1000.0, cache_dir=cache))
        assert err.value.setting == "cache_dir" and allocated == []  # refused before the CPU tier was allocated
        assert os.listdir(cache) == []  # the run directory went with it


@needs_tmpfs
def test_the_cli_refuses_that_in_one_line_with_exit_2(tmp_path, capsys):
    config = tmp_path / "micro.yaml"
    config.write_text(MICRO)
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="kvcache-test-") as cache:
        rc = main(["--config", str(config), "--model", "micro", "--num-users", "2", "--duration", "2",
                   "--gpu-mem-gb", "0", "--cpu-mem-gb", "1000", "--cache-dir", cache,
                   "--output", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith(f"kv-cache: error: --cache-dir the storage tier directory {cache} is on tmpfs")
    assert "lower --cpu-mem-gb" in err[-1] and not (tmp_path / "r.json").exists()


def test_an_explicit_capacity_beyond_the_free_space_is_clamped_with_a_note(tmp_path, monkeypatch):
    """The seed README's "capped" BurstGPT line gives --storage-capacity-gb 100 where less is free: the
    reference runs it, so this tool clamps it to the automatic capacity, says so, and runs."""
    monkeypatch.setattr(FileStore, "free_bytes", lambda self: 3 * GIB)
    settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path), storage_capacity_gb=100.0)
    tier_set = TierSet(tiers=[])
    try:
        open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, largest_entry=64 * MIB)
        expected = 0.9 * 3 * GIB - 64 * MIB
        assert tier_set.tiers[-1].limit == expected
        size = tier_set.sizes["storage_capacity_gb"]
        assert size["asked"] == 100.0 and size["effective"] == expected / GIB and "free space" in size["clamped"]
        note = [n for n in tier_set.notes if n.startswith("storage capacity: 100 GiB is more than the 3.000 GiB")]
        assert len(note) == 1 and "clamped to 2.638 GiB" in note[0] and "--strict-memory refuses" in note[0]
    finally:
        tier_set.close()


def test_an_explicit_capacity_beyond_the_free_space_is_refused_under_strict_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(FileStore, "free_bytes", lambda self: 40 * MIB)
    with pytest.raises(StorageSetupError) as err:
        _open(TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path), storage_capacity_gb=1.0,
                           strict_memory=True))
    assert err.value.setting == "storage_capacity_gb"
    assert str(err.value).startswith("1 GiB is more than the 0.039 GiB (40.0 MiB) free on the filesystem of")
    assert "give at most 0.039" in str(err.value)


def test_ranks_sharing_the_filesystem_count_together(tmp_path, monkeypatch):
    monkeypatch.setattr(FileStore, "free_bytes", lambda self: 3 * GIB)
    settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path), storage_capacity_gb=2.0,
                            strict_memory=True)
    tier_set = TierSet(tiers=[])
    with pytest.raises(StorageSetupError, match=r"2 GiB x 2 ranks on that filesystem = 4.000 GiB .*give at most 1.5"):
        try:
            open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, sharers=2)
        finally:
            tier_set.close()
    fits = _open(settings)  # one rank: 2 GiB of 3 GiB free
    try:
        assert fits.tiers[-1].limit == 2 * GIB
    finally:
        fits.close()


def test_a_capacity_beyond_a_free_space_smaller_than_one_entry_says_so_not_give_at_most(tmp_path, monkeypatch):
    """--storage-capacity-gb 1 on a 64 MiB tmpfs with entries of 0.57 GiB: the refusal said 'give at most
    0.062, or leave it out', and both are refused again (no entry fits). It now says no capacity there fits."""
    monkeypatch.setattr(FileStore, "free_bytes", lambda self: 64 * MIB)
    settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path), storage_capacity_gb=1.0)
    tier_set = TierSet(tiers=[])
    try:
        with pytest.raises(StorageSetupError) as err:
            open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1,
                       largest_entry=585 * MIB)
    finally:
        tier_set.close()
    assert err.value.setting == "storage_capacity_gb" and "give at most" not in str(err.value)
    assert "no capacity that fits there holds one entry of 0.571 GiB" in str(err.value)


def test_an_explicit_capacity_smaller_than_the_largest_entry_warns_before_the_run(tmp_path, monkeypatch):
    """--storage-capacity-gb 0.06 with entries up to 0.57 GiB ran, and its first large entry stopped it
    (exit 3, 'more than the whole storage tier') without a word before: a warning and a note now say so."""
    monkeypatch.setattr(FileStore, "free_bytes", lambda self: 3 * GIB)
    settings = TierSettings(gpu_mem_gb=0.0, cpu_mem_gb=0.0, cache_dir=str(tmp_path), storage_capacity_gb=0.0625)
    tier_set = TierSet(tiers=[])
    try:
        open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, largest_entry=585 * MIB)
        assert tier_set.tiers[-1].limit == 64 * MIB
        note = [n for n in tier_set.notes if "smaller than the largest entry" in n]
        assert note == [note[0]] and note[0].startswith("storage capacity: 0.062 GiB is smaller than the largest "
                                                        "entry the users may write (0.571 GiB")
    finally:
        tier_set.close()
    tier_set = TierSet(tiers=[])
    try:  # one that holds the largest entry says nothing
        open_tiers(settings, StorageSettings(chunk_bytes=MIB), None, tier_set, workers=1, largest_entry=MIB)
        assert not [n for n in tier_set.notes if "smaller than the largest entry" in n]
    finally:
        tier_set.close()
