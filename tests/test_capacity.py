"""The storage tier's capacity is a hard limit; the auto capacity keeps headroom; the results say whether
the tier filled up and started evicting."""

import math
import threading

import pytest

from kv_cache.host.capacity import auto_capacity
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.measurement import storage_fill
from kv_cache.serving import cache as cache_mod
from kv_cache.serving.cache import CapacityError, EntryTooLarge, MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.base import IOAborted
from kv_cache.storage.memory import MemoryStore

KIB = 1024
CHUNK = 64 * KIB


def _storage_only(limit, stop=None):
    metrics = RunMetrics()
    metrics.open_window()
    store = MemoryStore(8 * limit, slab_bytes=4 * KIB)
    return MultiTierCache([Tier("nvme", store, limit)], EvictionConfig(), metrics, KIB, stop)


def test_an_entry_larger_than_the_tier_is_refused_with_its_size_and_the_capacity(bufs):
    cache = _storage_only(100 * KIB)
    with pytest.raises(EntryTooLarge, match=r"needs 0\.3 MiB, more than the whole storage tier \(0\.1 MiB\)"):
        cache.allocate("big", 300, 300 * KIB, bufs)
    assert cache.tier("nvme").used == 0 and not cache.contains("big")


def test_usage_never_passes_the_limit_even_below_five_percent(bufs):
    cache = _storage_only(100 * KIB)
    nvme = cache.tier("nvme")
    for i in range(40):
        cache.allocate(f"k{i}", 1, (4 + 8 * (i % 12)) * KIB, bufs)  # mixed sizes up to 92 KiB
        assert nvme.used <= nvme.limit
        assert nvme.peak <= nvme.limit
    assert nvme.evictions > 0


def test_entries_being_read_are_not_evicted_and_placement_waits_then_gives_up(bufs, monkeypatch):
    stop = threading.Event()
    cache = _storage_only(100 * KIB, stop)
    cache.allocate("held", 1, 80 * KIB, bufs)
    cache.entries["held"].readers += 1  # a read in progress holds it
    monkeypatch.setattr(cache_mod, "ROOM_WAIT_S", 0.05)
    with pytest.raises(CapacityError, match="no room for entry 'new'"):
        cache.allocate("new", 1, 40 * KIB, bufs)
    assert cache.tier("nvme").used == 80 * KIB and cache.contains("held")
    stop.set()
    with pytest.raises(IOAborted):
        cache.allocate("new", 1, 40 * KIB, bufs)
    cache.entries["held"].readers -= 1
    stop.clear()
    assert cache.allocate("new", 1, 40 * KIB, bufs)[0] == "nvme"  # the reader is done: evicted now
    assert not cache.contains("held")


def test_auto_capacity_leaves_room_for_the_largest_entry_and_other_runs():
    gib = 1 << 30
    assert auto_capacity(10 * gib, gib, 1) == pytest.approx(8 * gib)
    assert auto_capacity(10 * gib, gib, 2) == pytest.approx(3.5 * gib)  # another run (or rank) there
    assert auto_capacity(gib, 2 * gib, 1) == 0.0


def test_results_say_whether_the_tier_filled_up():
    filled = storage_fill({"nvme": {"limit_bytes": 1e9, "peak_bytes": 1e9, "evictions": 3}})
    assert filled["reached_capacity"] is True and filled["warning"] is None
    empty = storage_fill({"nvme": {"limit_bytes": 1e9, "peak_bytes": 1e6, "evictions": 0}})
    assert empty["reached_capacity"] is False and "not a steady state" in empty["warning"]
    unlimited = storage_fill({"nvme": {"limit_bytes": math.inf, "peak_bytes": 1e6, "evictions": 0}})
    assert unlimited["capacity_bytes"] is None and "no capacity limit" in unlimited["warning"]
    # nothing reached the storage tier: a smaller --storage-capacity-gb would change nothing, the RAM tiers' would
    unused = storage_fill({"nvme": {"limit_bytes": math.inf, "peak_bytes": 0, "evictions": 0}})
    assert "stored nothing" in unused["warning"] and "--cpu-mem-gb" in unused["warning"]
    assert "--storage-capacity-gb" not in unused["warning"]
