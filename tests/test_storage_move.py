import os
import threading

import numpy as np
import pytest

from kv_cache.storage import (
    BLOCK,
    MARKER,
    FileStore,
    IOAborted,
    MemoryStore,
    StoreFull,
    WorkerBuffers,
    key_id,
)

CHUNK = 4 * BLOCK
SLAB = 2 * BLOCK


def expected_bytes(bufs: WorkerBuffers, key: str, nbytes: int, lead: int = 0) -> np.ndarray:
    """Payload written by ``bufs``: chunks on the store's grid (a FileStore's first is chunk - header)."""
    out = []
    kid = key_id(key)
    total = -(-nbytes // BLOCK) * BLOCK
    off = 0
    n = min(bufs.chunk_bytes - lead, total)
    while off < total:
        bufs.stamp(kid, off // BLOCK, n // BLOCK)
        out.append(bufs.write_buf[:n].copy())
        off += n
        n = min(bufs.chunk_bytes, total - off)
    return np.concatenate(out)[:nbytes] if out else np.zeros(0, np.uint8)


def read_all(store, key, bufs):
    chunks = []
    store.read(key, bufs, verify=True, on_chunk=lambda c, v: chunks.append(np.frombuffer(v, np.uint8).copy()))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)


@pytest.fixture(params=["auto", "buffered"])
def stores(request, tmp_path):
    f = FileStore(tmp_path, CHUNK, io_mode=request.param)
    m = MemoryStore(1 << 20, slab_bytes=SLAB)
    yield m, f
    f.close()
    m.close()


@pytest.mark.parametrize("nbytes", [0, 1, 5000, CHUNK, 3 * CHUNK + 99])
def test_memory_to_file_and_back(stores, nbytes):
    m, f = stores
    writer = WorkerBuffers(CHUNK, 1, 0)
    mover = WorkerBuffers(CHUNK, 2, 1)  # another worker: moves must not depend on its fill
    m.write("k", nbytes, writer)
    exp = expected_bytes(writer, "k", nbytes)

    r, w = m.move_to("k", f, mover)
    assert r.nbytes == w.nbytes == nbytes
    assert w.device_bytes == BLOCK + -(-nbytes // BLOCK) * BLOCK
    assert r.total_ns == r.device_ns + r.host_ns and w.total_ns == w.device_ns + w.host_ns
    assert "k" not in m and "k" in f
    assert m.free_slabs == m.nslabs
    assert np.array_equal(read_all(f, "k", mover), exp)
    assert np.array_equal(np.load(f.path_of("k")), exp)

    r, w = f.move_to("k", m, mover)
    assert r.nbytes == w.nbytes == nbytes
    assert "k" in m and "k" not in f and not f.path_of("k").exists()
    assert np.array_equal(read_all(m, "k", writer), exp)


def test_move_to_full_memory_keeps_source(stores):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    f.write("big", 2 << 20, b)
    with pytest.raises(StoreFull):
        f.move_to("big", m, b)
    assert "big" in f and "big" not in m
    f.read("big", b, verify=True)


def test_move_stop_keeps_source_and_leaves_no_partial(stores):
    m, f = stores
    b = WorkerBuffers(CHUNK, 1, 0)
    m.write("k", 3 * CHUNK, b)

    class AfterFirst(threading.Event):
        calls = 0

        def is_set(self):
            self.calls += 1
            return self.calls > 1

    with pytest.raises(IOAborted) as ei:
        m.move_to("k", f, b, stop=AfterFirst())
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


def test_file_to_file(tmp_path):
    a = FileStore(tmp_path / "a", CHUNK)
    z = FileStore(tmp_path / "z", CHUNK, io_mode="buffered")
    b = WorkerBuffers(CHUNK, 1, 0)
    a.write("k", 2 * CHUNK + 1, b)
    exp = expected_bytes(b, "k", 2 * CHUNK + 1, lead=BLOCK)
    a.move_to("k", z, b)
    assert "k" not in a
    assert np.array_equal(read_all(z, "k", b), exp)
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
