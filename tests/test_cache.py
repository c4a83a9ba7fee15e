"""Waterfall placement, eviction and accounting of MultiTierCache (small sizes, RAM-backed tiers)."""

import math
import threading

import pytest

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore

KIB = 1024
CHUNK = 64 * KIB


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 7, 0)
    yield b
    b.close()


def make_cache(limits, metrics=None, last_store=None):
    """limits: list of (tier name, limit bytes); the last tier may be given a real store."""
    tiers = []
    for i, (name, limit) in enumerate(limits):
        if i == len(limits) - 1 and last_store is not None:
            store = last_store
        else:
            store = MemoryStore(int(limit * 2) if not math.isinf(limit) else 64 * 1024 * KIB, slab_bytes=16 * KIB)
        tiers.append(Tier(name, store, limit))
    metrics = metrics or RunMetrics()
    metrics.open_window()
    return MultiTierCache(tiers, EvictionConfig(), metrics, bytes_per_token=KIB)


def check_accounting(cache):
    """Invariant: a tier's reservation equals the bytes of the entries it holds (when idle)."""
    for t in cache.tiers:
        assert t.used == sum(t.cost(e.size) for e in t.lru.values()), t.name
        for key, e in t.lru.items():
            assert e.location == t.name
            assert key in t.store
    assert set(cache.entries) == {k for t in cache.tiers for k in t.lru}


def test_new_entries_go_to_fastest_tier_and_push_lru_down(bufs):
    cache = make_cache([("cpu", 100 * KIB), ("nvme", math.inf)])
    for i in range(10):
        tier, _ = cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
        assert tier == "cpu"  # new entries always land in the top tier with room
    cpu, nvme = cache.tier("cpu"), cache.tier("nvme")
    # target 80% of 100 KiB: at most 5 entries of 16 KiB stay in RAM; oldest were demoted
    assert len(cpu.lru) == 5
    assert set(nvme.lru) == {f"k{i}" for i in range(5)}
    check_accounting(cache)


@pytest.mark.slow
def test_demotion_moves_real_bytes_and_is_counted_in_destination(bufs):
    store = FileStore(None, CHUNK, fsync=False, io_mode="buffered")
    try:
        metrics = RunMetrics()
        cache = make_cache([("cpu", 64 * KIB), ("nvme", math.inf)], metrics, last_store=store)
        for i in range(6):
            cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
        w = metrics.tier_op("storage", "write")
        r = metrics.tier_op("cpu", "read")
        assert w.ops >= 3 and w.bytes == w.ops * 16 * KIB and len(w.total_ns) == w.ops
        assert r.ops == w.ops  # every demotion read the bytes from RAM...
        demoted = [k for k in cache.tier("nvme").lru]
        for k in demoted:  # ...and what landed on disk is that entry's data
            store.read(k, bufs, verify=True)
        assert metrics.io_by_cause[("storage", "write", "demotion")][0] == len(demoted)
        check_accounting(cache)
    finally:
        store.close()


def test_key_is_never_allocated_twice(bufs):
    metrics = RunMetrics()
    cache = make_cache([("cpu", 1024 * KIB), ("nvme", math.inf)], metrics)
    cache.allocate("same", 4, 4 * KIB, bufs)
    tier, ns = cache.allocate("same", 4, 4 * KIB, bufs)
    assert (tier, ns) == ("cpu", 0)
    assert metrics.tier_op("cpu", "write").ops == 1


def test_concurrent_allocations_of_one_key_write_once():
    metrics = RunMetrics()
    cache = make_cache([("cpu", 4096 * KIB), ("nvme", math.inf)], metrics)
    barrier = threading.Barrier(8)

    def work(i):
        with WorkerBuffers(CHUNK, 1, i) as b:
            barrier.wait()
            for j in range(20):
                cache.allocate(f"shared{j}", 8, 8 * KIB, b)
                cache.access(f"shared{j}", b)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert metrics.tier_op("cpu", "write").ops == 20
    check_accounting(cache)


def test_last_tier_deletes_lru_when_full_and_accounting_stays_exact(bufs):
    metrics = RunMetrics()
    cache = make_cache([("nvme", 100 * KIB)], metrics)
    for i in range(50):
        assert cache.allocate(f"k{i}", 10, 10 * KIB, bufs)[0] == "nvme"
    nvme = cache.tier("nvme")
    assert nvme.used <= 100 * KIB
    assert "k49" in cache.entries and "k0" not in cache.entries
    assert metrics.snapshot_counters()["evictions"] == 50 - len(nvme.lru)
    assert len(nvme.store) == len(nvme.lru)  # no orphans
    check_accounting(cache)


def test_large_entry_skips_tier(bufs):
    cache = make_cache([("cpu", 100 * KIB), ("nvme", math.inf)])
    # > 95% of the CPU limit: goes straight to the next tier (reference large_entry_limit_ratio)
    assert cache.allocate("big", 97, 97 * KIB, bufs)[0] == "nvme"


def test_ram_tier_accounts_whole_slabs(bufs):
    # 100 entries of 1 KiB each occupy 100 slabs of 16 KiB: capacity is the arena, not the payload
    cache = make_cache([("cpu", 160 * KIB), ("nvme", math.inf)])
    for i in range(100):
        cache.allocate(f"k{i}", 1, KIB, bufs)
    cpu = cache.tier("cpu")
    assert len(cpu.lru) == 8  # 80% of 10 slabs
    assert cpu.used == 8 * 16 * KIB
    check_accounting(cache)


def test_zero_capacity_tier_refuses_everything(bufs):
    cache = make_cache([("cpu", 0), ("nvme", math.inf)])
    assert cache.allocate("a", 1, 4 * KIB, bufs)[0] == "nvme"


def test_lru_order_follows_access(bufs):
    cache = make_cache([("cpu", 100 * KIB), ("nvme", math.inf)])
    for i in range(5):
        cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
    cache.access("k0", bufs)  # k0 becomes most recent; k1 is now the LRU
    cache.allocate("k5", 16, 16 * KIB, bufs)
    assert cache.entries["k1"].location == "nvme"
    assert cache.entries["k0"].location == "cpu"


def test_three_tier_cascade(bufs):
    metrics = RunMetrics()
    cache = make_cache([("gpu", 40 * KIB), ("cpu", 80 * KIB), ("nvme", 200 * KIB)], metrics)
    for i in range(40):
        cache.allocate(f"k{i}", 8, 8 * KIB, bufs)
    c = metrics.snapshot_counters()
    assert c["offloads_cpu"] > 0 and c["offloads_storage"] > 0 and c["storage_deletions"] > 0
    assert cache.entries["k39"].location == "gpu"
    check_accounting(cache)
    for t in cache.tiers:
        assert t.used <= t.limit


def test_miss_and_hit_counting(bufs):
    metrics = RunMetrics()
    cache = make_cache([("cpu", 1024 * KIB), ("nvme", math.inf)], metrics)
    assert cache.access("nope", bufs) == (None, 0)
    cache.allocate("a", 4, 4 * KIB, bufs)
    tier, ns = cache.access("a", bufs)
    assert tier == "cpu" and ns > 0
    c = metrics.snapshot_counters()
    assert c["cache_misses"] == 1 and c["cache_hits"] == 1
    assert "multi_turn_hits" not in c  # what a hit means for the workload is the driver's to count


def test_read_says_whether_its_hit_counted(bufs):
    metrics = RunMetrics()
    cache = make_cache([("cpu", 1024 * KIB)], metrics)
    cache.allocate("a", 4, 4 * KIB, bufs)
    assert cache.read("a", bufs).in_window
    metrics.close_window(1)  # window closed long ago: the read completes after it
    res = cache.read("a", bufs)
    assert res.tier == "cpu" and not res.in_window


def test_failed_write_releases_reservation(bufs, tmp_path):
    class FailingStore(MemoryStore):
        def write(self, key, nbytes, bufs, stop=None):
            raise OSError(28, "No space left on device")

    metrics = RunMetrics()
    metrics.open_window()
    tier = Tier("nvme", FailingStore(1024 * KIB), 1024 * KIB)
    cache = MultiTierCache([tier], EvictionConfig(), metrics, bytes_per_token=KIB)
    with pytest.raises(OSError):
        cache.allocate("x", 4, 4 * KIB, bufs)
    assert tier.used == 0 and "x" not in cache.entries
    assert metrics.errors["storage_write"] == 1


def test_concurrent_mixed_load_keeps_accounting_exact():
    metrics = RunMetrics()
    cache = make_cache([("cpu", 256 * KIB), ("nvme", 1024 * KIB)], metrics)

    def work(i):
        with WorkerBuffers(CHUNK, 3, i) as b:
            for j in range(60):
                cache.allocate(f"t{i}_{j}", 8, 8 * KIB + 512 * (j % 5), b)
                cache.access(f"t{i}_{max(0, j - 3)}", b)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_accounting(cache)
    for t in cache.tiers:
        assert t.used >= 0 and not any(e.readers or e.moving or e.writing for e in t.lru.values())


def test_one_tier_name_type_maps_the_mlperf_and_statistics_names():
    from kv_cache.serving.cache import STAT_NAMES
    from kv_cache.storage.tiername import TierName

    assert STAT_NAMES == {"gpu": "gpu", "cpu": "cpu", "nvme": "storage"}
    assert TierName.of("nvme") is TierName.of("storage") is TierName.STORAGE and TierName.STORAGE.legacy == "nvme"
    assert Tier("nvme", None, 1).kind is TierName.STORAGE and Tier("nvme", None, 1).stat_name == "storage"
    assert f"{TierName.CPU}" == "cpu" and TierName.GPU == "gpu"
    with pytest.raises(ValueError, match="unknown tier 'ssd'"):
        TierName.of("ssd")


def test_an_unbounded_last_tier_records_its_peak(bufs):
    """An unbounded last tier (a remote tier with no capacity: S3, Redis without maxmemory) kept a peak
    of 0, so `kv-cache sessions` reported "peak 0.00 GiB" and "never filled" for a tier holding blocks."""
    cache = make_cache([("cpu", 100 * KIB), ("nvme", math.inf)])
    for i in range(10):
        cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
    nvme = cache.tier("nvme")
    assert nvme.used > 0 and nvme.peak == nvme.used
