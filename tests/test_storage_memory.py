import threading

import numpy as np
import pytest

from kv_cache.storage import (
    BLOCK,
    DataCorruption,
    IOAborted,
    MemoryStore,
    Store,
    StoreFull,
    key_id,
)

CHUNK = 4 * BLOCK
SLAB = 2 * BLOCK


def test_is_a_store():
    m = MemoryStore(1 << 20)
    assert isinstance(m, Store)
    assert m.name == "cpu"
    m.close()


@pytest.mark.parametrize("nbytes", [0, 1, 5000, BLOCK, CHUNK, 3 * CHUNK + 123])
def test_round_trip(bufs, nbytes, expected_bytes, read_all):
    m = MemoryStore(1 << 20, slab_bytes=SLAB)
    w = m.write("k", nbytes, bufs)
    assert w.nbytes == nbytes and w.device_bytes == -(-nbytes // BLOCK) * BLOCK
    assert w.total_ns == w.device_ns + w.host_ns and w.device_ns >= 0 and w.host_ns >= 0
    assert "k" in m
    exp = expected_bytes(bufs, "k", nbytes)
    got, r = read_all(m, "k", bufs)
    assert r.nbytes == nbytes
    assert np.array_equal(got, exp)
    m.close()


def test_single_chunk_read_buf_equals_stamped_write_buf(bufs):
    m = MemoryStore(1 << 20, slab_bytes=SLAB)
    m.write("one", CHUNK, bufs)
    bufs.read_buf[:] = 0
    m.read("one", bufs)
    bufs.stamp(key_id("one"), 0, CHUNK // BLOCK)
    assert np.array_equal(bufs.read_buf, bufs.write_buf)


def test_verify_catches_corruption(bufs):
    m = MemoryStore(1 << 20, slab_bytes=SLAB)
    m.write("k", 2 * CHUNK, bufs)
    slab = m._entries["k"].slabs[3]
    m._arena[slab * SLAB + 8] ^= 0xFF  # the block index of the entry's 7th block
    m.read("k", bufs)  # unverified reads do not look
    with pytest.raises(DataCorruption):
        m.read("k", bufs, verify=True)


def test_missing_key_and_delete(bufs):
    m = MemoryStore(1 << 20)
    with pytest.raises(KeyError):
        m.read("nope", bufs)
    m.delete("nope")
    m.write("k", 10, bufs)
    m.delete("k")
    assert "k" not in m
    with pytest.raises(KeyError):
        m.read("k", bufs)


def test_store_full_releases_and_slabs_are_reused(bufs, expected_bytes, read_all):
    m = MemoryStore(4 * SLAB, slab_bytes=SLAB, spare_slabs=0)
    assert m.nslabs == 4 and m.free_slabs == 4
    m.write("a", 3 * SLAB, bufs)
    assert m.free_slabs == 1
    with pytest.raises(StoreFull):
        m.write("b", 2 * SLAB, bufs)
    assert m.free_slabs == 1 and "b" not in m
    m.write("c", 1, bufs)  # one slab
    assert m.free_slabs == 0
    with pytest.raises(StoreFull):
        m.write("d", 1, bufs)
    m.delete("a")
    assert m.free_slabs == 3
    m.write("b", 2 * SLAB, bufs)
    got, _ = read_all(m, "b", bufs)
    assert np.array_equal(got, expected_bytes(bufs, "b", 2 * SLAB))
    m.close()


def test_spare_slabs_and_footprint():
    m = MemoryStore(10 * SLAB + 1, slab_bytes=SLAB)
    assert m.nslabs == 11 + 4
    assert m.footprint(1) == SLAB and m.footprint(SLAB + 1) == 2 * SLAB
    m.close()


def test_overwrite_frees_old_slabs(bufs, read_all):
    m = MemoryStore(8 * SLAB, slab_bytes=SLAB, spare_slabs=0)
    m.write("k", 6 * SLAB, bufs)
    assert m.free_slabs == 2
    m.write("k", SLAB, bufs)
    assert m.free_slabs == 7
    got, _ = read_all(m, "k", bufs)
    assert got.size == SLAB
    m.close()


def test_capacity_zero_stores_nothing(bufs):
    m = MemoryStore(0)
    assert m.nslabs == 0
    for n in (0, 1, CHUNK):
        with pytest.raises(StoreFull):
            m.write("k", n, bufs)
    assert "k" not in m
    m.close()
    m.close()


def test_stop_event_aborts_and_releases(bufs, stop_after_first):
    m = MemoryStore(1 << 20, slab_bytes=SLAB, spare_slabs=0)
    free = m.free_slabs
    ev = threading.Event()
    ev.set()
    with pytest.raises(IOAborted):
        m.write("k", 3 * CHUNK, bufs, stop=ev)
    assert "k" not in m and m.free_slabs == free

    with pytest.raises(IOAborted) as ei:
        m.write("k", 3 * CHUNK, bufs, stop=stop_after_first)
    assert ei.value.device_bytes == CHUNK
    assert "k" not in m and m.free_slabs == free

    m.write("k", 3 * CHUNK, bufs)
    with pytest.raises(IOAborted):
        m.read("k", bufs, stop=ev)
    assert "k" in m  # an aborted read leaves the entry


def test_delete_while_reading_defers_slab_release(bufs):
    m = MemoryStore(4 * SLAB, slab_bytes=SLAB, spare_slabs=0)
    m.write("k", 2 * SLAB, bufs)
    h, nbytes, _ = m._begin_read("k")
    m.delete("k")
    assert m.free_slabs == 2  # still pinned by the reader
    m._end_read(h)
    assert m.free_slabs == 4


def test_arena_pages_are_lazy():
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    before = rss()
    m = MemoryStore(4 << 30)  # 4 GiB of address space, none of it touched
    assert rss() - before < 64 << 20
    m.close()


def test_prefault_touches_pages():
    m = MemoryStore(8 << 20, prefault=True)
    assert m.arena_bytes >= 8 << 20
    m.close()


def test_concurrent_workers(run_workers):
    m = MemoryStore(64 * CHUNK, slab_bytes=SLAB)

    def work(wid, b):
        for i in range(20):
            key = f"w{wid}_{i}"
            m.write(key, CHUNK + 17 * i, b)
            m.read(key, b, verify=True)
            m.delete(key)

    assert run_workers(work, 4, seed=9) == []
    assert m.free_slabs == m.nslabs
    m.close()
