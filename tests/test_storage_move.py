import os

import numpy as np
import pytest

from kv_cache.host import MARKER
from kv_cache.storage import (
    BLOCK,
    FileStore,
    IOAborted,
    MemoryStore,
    StoreFull,
    WorkerBuffers,
)

CHUNK = 4 * BLOCK
SLAB = 2 * BLOCK


@pytest.fixture(params=["auto", "buffered"])
def stores(request, tmp_path):
    f = FileStore(tmp_path, CHUNK, io_mode=request.param)
    m = MemoryStore(1 << 20, slab_bytes=SLAB)
    yield m, f
    f.close()
    m.close()


@pytest.mark.parametrize("nbytes", [0, 1, 5000, CHUNK, 3 * CHUNK + 99])
def test_memory_to_file_and_back(stores, nbytes, expected_bytes, read_all):
    m, f = stores
    writer = WorkerBuffers(CHUNK, 1, 0)
    mover = WorkerBuffers(CHUNK, 1, 1)  # another worker of the run (its seed): moves carry the bytes written
    m.write("k", nbytes, writer)
    exp = expected_bytes(writer, "k", nbytes)

    r, w = m.move_to("k", f, mover)
    assert r.nbytes == w.nbytes == nbytes
    assert w.device_bytes == BLOCK + -(-nbytes // BLOCK) * BLOCK
    assert r.total_ns == r.device_ns + r.host_ns and w.total_ns == w.device_ns + w.host_ns
    assert "k" not in m and "k" in f
    assert m.free_slabs == m.nslabs
    assert np.array_equal(read_all(f, "k", mover)[0], exp)
    assert np.array_equal(np.load(f.path_of("k")), exp)

    r, w = f.move_to("k", m, mover)
    assert r.nbytes == w.nbytes == nbytes
    assert "k" in m and "k" not in f and not f.path_of("k").exists()
    assert np.array_equal(read_all(m, "k", writer)[0], exp)


def test_move_to_full_memory_keeps_source(stores):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    f.write("big", 2 << 20, b)
    with pytest.raises(StoreFull):
        f.move_to("big", m, b)
    assert "big" in f and "big" not in m
    f.read("big", b, verify=True)


def test_move_stop_keeps_source_and_leaves_no_partial(stores, stop_after_first):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    m.write("k", 3 * CHUNK, b)

    with pytest.raises(IOAborted) as ei:
        m.move_to("k", f, b, stop=stop_after_first)
    # one chunk of the file grid moved: CHUNK - 4 KiB read from RAM, header + that written to the file
    assert ei.value.device_bytes == (CHUNK - BLOCK) + CHUNK
    assert "k" in m and "k" not in f
    assert sorted(os.listdir(f.run_dir)) == [MARKER]
    m.read("k", b, verify=True)


def test_move_missing_key(stores):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    with pytest.raises(KeyError):
        m.move_to("nope", f, b)
    with pytest.raises(KeyError):
        f.move_to("nope", m, b)


def test_file_to_file(tmp_path, expected_bytes, read_all):
    a = FileStore(tmp_path / "a", CHUNK)
    z = FileStore(tmp_path / "z", CHUNK, io_mode="buffered")
    b = WorkerBuffers(CHUNK, 1, 0)
    a.write("k", 2 * CHUNK + 1, b)
    exp = expected_bytes(b, "k", 2 * CHUNK + 1, lead=BLOCK)
    a.move_to("k", z, b)
    assert "k" not in a
    assert np.array_equal(read_all(z, "k", b)[0], exp)
    a.close()
    z.close()


def test_move_onto_itself_is_refused(stores):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    f.write("k", 10, b)
    with pytest.raises(ValueError):
        f.move_to("k", f, b)
    assert "k" in f
    f.read("k", b, verify=True)
