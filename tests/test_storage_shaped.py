"""--tier-bandwidth / --tier-latency: the storage tier's real I/O held to a token bucket per direction."""

import pytest

from kv_cache.serving.build import shape_tiers
from kv_cache.serving.cache import Tier
from kv_cache.serving.tiers import TierSet
from kv_cache.storage import BLOCK, FileStore, MemoryStore, WorkerBuffers
from kv_cache.storage.shaped import ShapedStore, Shaping, TokenBucket

CHUNK = 4 * BLOCK


def test_bucket_paces_reservations_at_the_rate():
    b = TokenBucket(1e9)  # 1 GB/s
    assert b.reserve(10**9, now=0.0) == pytest.approx(1.0)
    assert b.reserve(5 * 10**8, now=0.2) == pytest.approx(1.5)  # queued behind the first
    assert b.reserve(10**8, now=3.0) == pytest.approx(3.1)  # idle bucket: no credit beyond one request
    assert b.bytes == 16 * 10**8
    assert TokenBucket(0).reserve(10**9) == 0.0  # unlimited


def test_shaped_store_moves_real_bytes_and_counts_them(tmp_path):
    inner = FileStore(tmp_path, CHUNK, io_mode="buffered")
    s = ShapedStore(inner, Shaping(bandwidth_gbps=1000.0, latency_ms=2.0))
    bufs = WorkerBuffers(CHUNK, 1, 0)
    w = s.write("k", 3 * CHUNK + 5, bufs)
    assert "k" in inner and "k" in s and s.fs_type == inner.fs_type  # delegated to the real store
    r = s.read("k", bufs, verify=True)  # the stamps went through the wrapper to the file and back
    assert r.nbytes == w.nbytes == 3 * CHUNK + 5
    assert s.write_bucket.bytes == w.device_bytes and s.read_bucket.bytes == r.device_bytes
    # the added latency is device time (lower bounds only: a sleep never returns early)
    assert w.device_ns >= 2_000_000 and r.device_ns >= 2_000_000
    assert s.stats()["latency_ms"] == 2.0 and s.stats()["unit"].startswith("GB/s = 10^9")
    s.delete("k")
    assert "k" not in inner
    s.close()


def test_moves_through_a_shaped_store_both_ways(tmp_path):
    m = MemoryStore(1 << 20, slab_bytes=2 * BLOCK)
    f = ShapedStore(FileStore(tmp_path, CHUNK, io_mode="buffered"), Shaping(bandwidth_gbps=1000.0))
    bufs = WorkerBuffers(CHUNK, 1, 0)
    m.write("k", 2 * CHUNK, bufs)
    m.move_to("k", f, bufs)  # demotion into the shaped tier: its writes are paced
    assert "k" in f and "k" not in m and f.write_bucket.bytes > 0
    f.move_to("k", m, bufs)  # and back: its reads are paced
    assert "k" in m and f.read_bucket.bytes > 0
    f.close()
    m.close()


def test_builder_shapes_only_the_storage_tier(tmp_path):
    m = MemoryStore(1 << 20, slab_bytes=2 * BLOCK)
    f = FileStore(tmp_path, CHUNK, io_mode="buffered")
    stores = TierSet([Tier("cpu", m, 1 << 20), Tier("nvme", f, 1 << 30)], file_store=f, memory_store=m)
    shape_tiers(stores, Shaping())  # inactive: nothing wrapped
    assert stores.tiers[1].store is f and not stores.notes
    shape_tiers(stores, Shaping(bandwidth_gbps=5.0, latency_ms=0.5))
    assert stores.tiers[0].store is m  # DRAM stays host memory
    assert isinstance(stores.tiers[1].store, ShapedStore) and stores.file_store is f
    assert stores.shaped["storage"] is stores.tiers[1].store
    assert "5 GB/s" in stores.notes[0]
    stores.close()


def test_both_commands_take_the_shaping_flags():
    from kv_cache.cli import parse_sessions_settings, parse_settings
    from kv_cache.errors import UsageError

    ls = parse_sessions_settings(["--tier-bandwidth", "6.5", "--tier-latency", "0.2"]).ladder_settings
    assert (ls.storage.tier_bandwidth_gbps, ls.storage.tier_latency_ms) == (6.5, 0.2)
    assert parse_sessions_settings([]).ladder_settings.storage.tier_bandwidth_gbps == 0.0  # unshaped by default
    with pytest.raises(UsageError, match="--tier-bandwidth cannot be negative"):
        parse_sessions_settings(["--tier-bandwidth", "-1"])
    run = parse_settings(["--model", "llama3.1-8b", "--tier-bandwidth", "3", "--tier-latency", "1"])
    assert (run.storage.tier_bandwidth_gbps, run.storage.tier_latency_ms) == (3.0, 1.0)


def test_a_negative_shaping_is_refused_by_the_standard_run():
    from kv_cache.cli import parse_settings
    from kv_cache.errors import UsageError

    with pytest.raises(UsageError, match="--tier-latency cannot be negative"):
        parse_settings(["--model", "llama3.1-8b", "--tier-latency", "-2"])


def test_the_runs_stop_ends_a_hold_instead_of_sleeping_past_the_window(tmp_path):
    # the stop comes while a chunk is held (set by the real store's put, after its bytes are written): the
    # hold ends there and the write is abandoned, instead of sleeping out the chunk's 20 s at 819 B/s
    import threading

    from kv_cache.storage.base import IOAborted

    stop = threading.Event()

    class StopsAfterItsPut(FileStore):
        def _put(self, h, offset, view, first):
            out = super()._put(h, offset, view, first)
            stop.set()
            return out

    inner = StopsAfterItsPut(tmp_path, CHUNK, io_mode="buffered")
    s = ShapedStore(inner, Shaping(bandwidth_gbps=CHUNK / 20 / 1e9), stop)
    bufs = WorkerBuffers(CHUNK, 1, 0)
    with pytest.raises(IOAborted):
        s.write("k", 2 * CHUNK, bufs)
    assert "k" not in inner  # the partial entry is dropped, as at any stop
    lat = ShapedStore(FileStore(tmp_path / "l", CHUNK, io_mode="buffered"), Shaping(latency_ms=20_000.0), stop)
    with pytest.raises(IOAborted):  # the latency hold is cut too (the stop is already set)
        lat.write("k", CHUNK, bufs)
    b = TokenBucket(1.0)
    assert b.wait_until(b.reserve(10**9), stop) is False  # cut short: the caller aborts
    assert TokenBucket(1.0).wait_until(0.0, stop) is True  # a deadline already passed is no cut
    s.close()
    lat.close()


def test_the_builder_hands_the_runs_stop_to_each_shaped_store(tmp_path):
    import threading

    m = MemoryStore(1 << 20, slab_bytes=2 * BLOCK)
    stop = threading.Event()
    stores = TierSet([Tier("cpu", m, 1 << 20)], memory_store=m)
    shape_tiers(stores, {"cpu": Shaping(bandwidth_gbps=1.0)}, stop=stop)
    assert stores.tiers[0].store.stop is stop
    stores.close()


def test_the_stats_say_what_the_held_seconds_cover():
    s = ShapedStore(MemoryStore(1 << 20, slab_bytes=2 * BLOCK), Shaping(bandwidth_gbps=1.0))
    counted = s.stats()["held_counted"]
    assert "from the tier's open" in counted and "summed over the I/O workers" in counted
    s.close()


class _OwnPath(MemoryStore):
    """A store with its own whole-entry read and write (as the S3 and Redis tiers have), counting its calls."""

    calls: list

    def write(self, key, nbytes, bufs, stop=None):
        self.calls.append("write")
        return super().write(key, nbytes, bufs, stop)

    def read(self, key, bufs, stop=None, verify=False, on_chunk=None):
        self.calls.append("read")
        return super().read(key, bufs, stop, verify=verify, on_chunk=on_chunk)


def test_a_store_with_its_own_read_and_write_keeps_them_under_shaping():
    # the wrapper must not swap an S3 / Redis tier's parallel or pipelined path for its chunk primitives
    inner = _OwnPath(1 << 22, slab_bytes=2 * CHUNK)
    inner.calls = []
    s = ShapedStore(inner, Shaping(bandwidth_gbps=1000.0, latency_ms=2.0))
    bufs = WorkerBuffers(CHUNK, 1, 0)
    w = s.write("k", 3 * CHUNK, bufs)
    r = s.read("k", bufs, verify=True)
    assert inner.calls == ["write", "read"]
    assert s.write_bucket.bytes == w.device_bytes > 0 and s.read_bucket.bytes == r.device_bytes > 0
    assert w.device_ns >= 2_000_000 and r.device_ns >= 2_000_000  # the latency is device time
    assert w.total_ns >= w.device_ns and r.total_ns >= r.device_ns
    s.close()


def test_a_write_through_its_own_path_cut_at_stop_is_not_kept():
    import threading

    from kv_cache.storage.base import IOAborted

    stop = threading.Event()

    class StopsAfterWriting(_OwnPath):
        def write(self, key, nbytes, bufs, stop_=None):
            out = super().write(key, nbytes, bufs, stop_)
            stop.set()
            return out

    inner = StopsAfterWriting(1 << 22, slab_bytes=2 * CHUNK)
    inner.calls = []
    s = ShapedStore(inner, Shaping(bandwidth_gbps=CHUNK / 20 / 1e9), stop)  # 20 s per chunk unless cut
    with pytest.raises(IOAborted):
        s.write("k", CHUNK, WorkerBuffers(CHUNK, 1, 0))
    assert "k" not in inner
    s.close()
