import mmap
import tracemalloc
import zlib

import numpy as np
import pytest

from kv_cache.storage import BLOCK, WorkerBuffers, key_id


def test_key_id_is_stable_64_bit():
    a = key_id("conv_user_0001_123_turn_1")
    assert a == key_id("conv_user_0001_123_turn_1")
    assert 0 <= a < 2**64
    assert a != key_id("conv_user_0001_123_turn_2")


@pytest.mark.parametrize("bad", [0, -4096, 1000, 4097])
def test_chunk_bytes_must_be_block_multiple(bad):
    with pytest.raises(ValueError):
        WorkerBuffers(bad, 0, 0)


def test_buffers_are_page_aligned_and_sized():
    b = WorkerBuffers(3 * BLOCK, 7, 1)
    for arr in (b.write_buf, b.read_buf):
        assert arr.dtype == np.uint8 and arr.size == 3 * BLOCK
        assert arr.ctypes.data % mmap.PAGESIZE == 0
    assert len(b.write_mv) == len(b.read_mv) == 3 * BLOCK
    b.close()
    b.close()


def test_fill_is_deterministic_per_seed_the_same_in_every_worker_and_incompressible():
    a = WorkerBuffers(64 * BLOCK, 42, 0)
    same = WorkerBuffers(64 * BLOCK, 42, 0)
    other_worker = WorkerBuffers(64 * BLOCK, 42, 1)
    other_seed = WorkerBuffers(64 * BLOCK, 43, 0)
    assert np.array_equal(a.write_buf, same.write_buf)
    assert np.array_equal(a.write_buf, other_worker.write_buf)  # a reader knows what any worker wrote (--verify)
    assert not np.array_equal(a.write_buf, other_seed.write_buf)
    raw = a.write_buf.tobytes()
    assert len(zlib.compress(raw, 6)) > 0.99 * len(raw)
    assert WorkerBuffers(BLOCK, None, 0).seed == 0


def test_stamp_writes_key_and_block_index_little_endian():
    b = WorkerBuffers(8 * BLOCK, 1, 0)
    before = b.write_buf.copy()
    kid = key_id("k")
    b.stamp(kid, 100, 5)
    blocks = b.write_buf.reshape(8, BLOCK)
    for i in range(5):
        assert int.from_bytes(blocks[i, :8].tobytes(), "little") == kid
        assert int.from_bytes(blocks[i, 8:16].tobytes(), "little") == 100 + i
        assert np.array_equal(blocks[i, 16:], before.reshape(8, BLOCK)[i, 16:])
    # blocks past nblocks untouched
    assert np.array_equal(blocks[5:], before.reshape(8, BLOCK)[5:])
    with pytest.raises(ValueError):
        b.stamp(kid, 0, 9)


def test_stamp_handles_top_bit_key_ids():
    b = WorkerBuffers(2 * BLOCK, 1, 0)
    kid = 2**64 - 1
    b.stamp(kid, 2**40, 2)
    assert int.from_bytes(b.write_buf[:8].tobytes(), "little") == kid
    assert int.from_bytes(b.write_buf[BLOCK + 8 : BLOCK + 16].tobytes(), "little") == 2**40 + 1


def test_check_stamp_finds_first_bad_block():
    b = WorkerBuffers(4 * BLOCK, 1, 0)
    kid = key_id("x")
    b.stamp(kid, 8, 4)
    b.read_buf[:] = b.write_buf
    assert b.check_stamp(kid, 8, 4) == -1
    assert b.check_stamp(kid, 9, 4) == 0
    assert b.check_stamp(key_id("y"), 8, 4) == 0
    b.read_buf[2 * BLOCK + 9] ^= 1  # block index of block 2
    assert b.check_stamp(kid, 8, 4) == 2
    assert b.check_stamp(kid, 8, 2) == -1


def test_stamp_does_not_allocate():
    b = WorkerBuffers(256 * BLOCK, 1, 0)  # 1 MiB: a per-call copy would be obvious
    kid = key_id("alloc")
    b.stamp(kid, 0, 256)  # warm up any lazily created numpy state
    b.check_stamp(kid, 0, 256)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for i in range(2000):
            b.stamp(kid, i * 256, 256)
            b.check_stamp(kid, i * 256, 256)
        cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cur - base < 16 * 1024
    assert peak - base < 64 * 1024  # far below the 1 MiB buffer: no temporaries of buffer size


def test_large_buffers_are_aligned_and_fall_back_when_huge_pages_are_refused(monkeypatch):
    from kv_cache.storage import buffers as buffers_mod

    big = 4 << 20  # >= one huge page: advised MADV_HUGEPAGE
    b = WorkerBuffers(big, 3, 0)
    assert b.write_buf.ctypes.data % mmap.PAGESIZE == 0 and b.read_buf.size == big
    b.stamp(key_id("k"), 0, big // BLOCK)
    b.read_buf[:] = b.write_buf
    assert b.check_stamp(key_id("k"), 0, big // BLOCK) == -1
    b.close()
    # an advice the kernel rejects (EINVAL) must not fail the run: 4 KiB pages it is
    monkeypatch.setattr(buffers_mod.mmap, "MADV_HUGEPAGE", 0x7FFF, raising=False)
    c = WorkerBuffers(big, 3, 0)
    again = WorkerBuffers(big, 3, 0)
    assert np.array_equal(c.write_buf, again.write_buf)  # same seed, same payload, whatever the pages
    c.close()
    again.close()
