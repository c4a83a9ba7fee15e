import errno
import hashlib
import json
import os
import threading

import numpy as np
import pytest

from kv_cache.errors import UsageError
from kv_cache.host import MARKER
from kv_cache.storage import (
    BLOCK,
    DataCorruption,
    FileStore,
    IOAborted,
    Store,
    WorkerBuffers,
    file_name,
    key_id,
    npy_header,
)
from kv_cache.storage import files as files_mod

CHUNK = 4 * BLOCK
SHM = "/dev/shm"


def direct_works(path) -> bool:
    try:
        s = FileStore(path, CHUNK, io_mode="direct")
    except UsageError:
        return False
    s.close()
    return True


@pytest.fixture(params=["direct", "buffered"])
def store(request, tmp_path):
    if request.param == "direct" and not direct_works(tmp_path):
        pytest.skip("O_DIRECT not supported on tmp_path")
    s = FileStore(tmp_path / "cache", CHUNK, fsync=True, io_mode=request.param)
    yield s
    s.close()


def test_auto_mode_is_direct_where_forced_direct_opens(tmp_path):
    s = FileStore(tmp_path, CHUNK)
    try:
        # auto must pick O_DIRECT exactly where a store forced to O_DIRECT can open (not on tmpfs, say)
        assert s.io_mode == ("direct" if direct_works(tmp_path) else "buffered"), s.io_mode_reason
        if s.fs_type in ("ext4", "xfs"):
            assert s.io_mode == "direct", s.io_mode_reason
        assert isinstance(s, Store) and s.name == "nvme"
        assert s.free_bytes() > 0
        assert s.run_dir.parent == tmp_path
    finally:
        s.close()


def test_npy_header_is_4096_and_parses():
    h = npy_header(12345)
    assert len(h) == BLOCK and h.endswith(b"\n") and h.startswith(b"\x93NUMPY\x01\x00")


@pytest.mark.parametrize("nbytes", [0, 1, 5000, BLOCK, CHUNK, CHUNK + 1, 3 * CHUNK + 777])
def test_round_trip(store, bufs, nbytes, expected_bytes, read_all):
    w = store.write("entry", nbytes, bufs)
    assert w.nbytes == nbytes
    assert w.device_bytes == BLOCK + -(-nbytes // BLOCK) * BLOCK
    assert w.total_ns == w.device_ns + w.host_ns and w.device_ns > 0 and w.host_ns >= 0
    exp = expected_bytes(bufs, "entry", nbytes, lead=BLOCK)
    got, r = read_all(store, "entry", bufs)
    assert r.nbytes == nbytes and r.device_bytes == -(-nbytes // BLOCK) * BLOCK
    assert np.array_equal(got, exp)
    path = store.path_of("entry")
    assert path.parent == store.run_dir
    assert path.stat().st_size == FileStore.file_bytes(nbytes)
    arr = np.load(path)
    assert arr.dtype == np.uint8 and arr.shape == (nbytes,)
    assert np.array_equal(arr, exp)


def test_single_chunk_read_buf_equals_stamped_write_buf(store, bufs):
    n = CHUNK - BLOCK  # one chunk of file: the header + this payload
    store.write("one", n, bufs)
    bufs.read_buf[:] = 0
    store.read("one", bufs, verify=True)
    bufs.stamp(key_id("one"), 0, n // BLOCK)
    assert np.array_equal(bufs.read_buf[:n], bufs.write_buf[:n])


@pytest.mark.parametrize("nbytes", [1, CHUNK - BLOCK, CHUNK, 3 * CHUNK + 777])
def test_data_syscalls_cover_the_chunk_grid_of_the_file(store, bufs, nbytes, monkeypatch):
    """Every pwritev/preadv covers [k*chunk, (k+1)*chunk) of the file (the last one less), like fio bs=chunk."""
    calls = []
    real_w, real_r = files_mod._tio.pwritev, files_mod._tio.preadv  # the timed syscalls (C or Python)

    def pwritev(fd, iov, off):
        calls.append(("w", off, sum(len(v) for v in iov)))
        return real_w(fd, iov, off)

    def preadv(fd, view, off):
        calls.append(("r", off, len(view)))
        return real_r(fd, view, off)

    monkeypatch.setattr(files_mod._tio, "pwritev", pwritev)
    monkeypatch.setattr(files_mod._tio, "preadv", preadv)
    store.write("grid", nbytes, bufs)
    store.read("grid", bufs, verify=True)
    file_bytes = FileStore.file_bytes(nbytes)
    for kind in ("w", "r"):
        mine = [(off, n) for k, off, n in calls if k == kind]
        start = 0 if kind == "w" else BLOCK  # reads skip the header
        assert mine[0][0] == start
        for (off, n), (nxt, _) in zip(mine, mine[1:] + [(file_bytes, 0)], strict=True):
            assert off + n == nxt  # contiguous, whole file covered
            assert off % CHUNK == 0 or off == BLOCK
            assert (off + n) % CHUNK == 0 or off + n == file_bytes


def test_every_block_is_unique(store, tmp_path):
    seen = set()
    count = 0
    for wid in range(2):
        b = WorkerBuffers(CHUNK, 11, wid)
        for i in range(5):
            key = f"u{wid}_{i}"
            store.write(key, 2 * CHUNK + 3 * BLOCK, b)
            raw = store.path_of(key).read_bytes()[BLOCK:]
            for off in range(0, len(raw), BLOCK):
                seen.add(hashlib.blake2b(raw[off : off + BLOCK], digest_size=16).digest())
                count += 1
        # the same key rewritten by another worker gives different payload but the same stamps
        b.close()
    assert count == 2 * 5 * 11
    assert len(seen) == count


def test_verify_catches_corrupted_file(store, bufs):
    store.write("k", 2 * CHUNK, bufs)
    path = store.path_of("k")
    with open(path, "r+b") as f:
        f.seek(BLOCK + 5 * BLOCK)  # payload block 5
        f.write(b"\0" * BLOCK)
    store.read("k", bufs)  # unverified: no check
    with pytest.raises(DataCorruption, match="block 5"):
        store.read("k", bufs, verify=True)


def test_truncated_file_is_corruption(store, bufs):
    store.write("k", 2 * CHUNK, bufs)
    os.truncate(store.path_of("k"), BLOCK + CHUNK)
    with pytest.raises(DataCorruption):
        store.read("k", bufs)


def test_missing_key_and_delete(store, bufs):
    with pytest.raises(KeyError):
        store.read("nope", bufs)
    store.delete("nope")
    store.write("k", 100, bufs)
    assert "k" in store and len(store) == 1 and store.keys() == ["k"]
    store.delete("k")
    assert "k" not in store and not store.path_of("k").exists()
    with pytest.raises(KeyError):
        store.read("k", bufs)


def test_overwrite(store, bufs, expected_bytes, read_all):
    store.write("k", 3 * CHUNK, bufs)
    store.write("k", 100, bufs)
    got, r = read_all(store, "k", bufs)
    assert r.nbytes == 100 and np.array_equal(got, expected_bytes(bufs, "k", 100, lead=BLOCK))
    assert np.load(store.path_of("k")).size == 100


def test_key_sanitizing(store, bufs):
    keys = ["a/b", "a_b", "../x", "sp ace", "é", "x" * 300, ""]
    for k in keys:
        store.write(k, 10, bufs)
    names = {store.path_of(k).name for k in keys}
    assert len(names) == len(keys)
    for k in keys:
        p = store.path_of(k)
        assert p.parent == store.run_dir and p.exists() and len(p.name) < 255
        store.read(k, bufs, verify=True)
    assert file_name("conv_user_0001_17_turn_2") == "conv_user_0001_17_turn_2.npy"


def test_stop_event_aborts_and_leaves_no_file(store, bufs, stop_after_first):
    ev = threading.Event()
    ev.set()
    with pytest.raises(IOAborted) as ei:
        store.write("k", 3 * CHUNK, bufs, stop=ev)
    assert ei.value.device_bytes == 0
    assert "k" not in store and not store.path_of("k").exists()

    with pytest.raises(IOAborted) as ei:
        store.write("k", 3 * CHUNK, bufs, stop=stop_after_first)
    assert ei.value.device_bytes == CHUNK  # the first chunk of the file: header + CHUNK - 4 KiB payload
    assert ei.value.device_ns > 0  # the device time it cost (for busy time / achieved queue depth)
    assert "k" not in store and not store.path_of("k").exists()
    assert sorted(os.listdir(store.run_dir)) == [MARKER]

    store.write("k", 3 * CHUNK, bufs)
    with pytest.raises(IOAborted):
        store.read("k", bufs, stop=ev)
    assert "k" in store  # an aborted read keeps the entry


def test_write_error_removes_partial_file(store, bufs, monkeypatch):
    real = files_mod._tio.pwritev
    calls = {"n": 0}

    def failing(fd, iov, off):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, iov, off)

    monkeypatch.setattr(files_mod._tio, "pwritev", failing)
    with pytest.raises(OSError) as ei:
        store.write("k", 3 * CHUNK, bufs)
    assert ei.value.errno == errno.ENOSPC
    assert "k" not in store and not store.path_of("k").exists()
    monkeypatch.setattr(files_mod._tio, "pwritev", real)
    store.write("k", 10, bufs)
    store.read("k", bufs, verify=True)


def test_short_writes_are_completed(store, bufs, monkeypatch, expected_bytes, read_all):
    real = files_mod._tio.pwritev

    def short(fd, iov, off):  # at most one block per call
        first = iov[0] if len(iov[0]) else iov[1]
        return real(fd, [first[:BLOCK]], off)

    monkeypatch.setattr(files_mod._tio, "pwritev", short)
    store.write("k", 2 * CHUNK + 5, bufs)
    monkeypatch.setattr(files_mod._tio, "pwritev", real)
    got, _ = read_all(store, "k", bufs)
    assert np.array_equal(got, expected_bytes(bufs, "k", 2 * CHUNK + 5, lead=BLOCK))


def test_short_reads_are_completed(store, bufs, monkeypatch, expected_bytes, read_all):
    store.write("k", 2 * CHUNK + 5, bufs)
    real = files_mod._tio.preadv

    def short(fd, view, off):
        return real(fd, view[:BLOCK], off)

    monkeypatch.setattr(files_mod._tio, "preadv", short)
    got, _ = read_all(store, "k", bufs)
    assert np.array_equal(got, expected_bytes(bufs, "k", 2 * CHUNK + 5, lead=BLOCK))


def test_concurrent_workers(store, run_workers):
    def work(wid, b):
        for i in range(8):
            key = f"w{wid}_{i}"
            store.write(key, CHUNK + 1000 * i, b)
            store.read(key, b, verify=True)
            if i % 2:
                store.delete(key)

    assert run_workers(work, 4, seed=1) == []
    assert len(store) == 16


# ---------------------------------------------------------------- ownership of directories


def test_run_dir_layout_and_marker(tmp_path):
    s = FileStore(tmp_path / "a" / "b", CHUNK)
    try:
        assert (tmp_path / "a" / "b").is_dir()  # created with parents
        rd = s.run_dir
        assert rd.parent == tmp_path / "a" / "b"
        assert rd.name.startswith("kv-cache-run-")
        parts = rd.name[len("kv-cache-run-") :].split("-")
        assert (
            len(parts[0]) == 8 and len(parts[1]) == 6 and parts[2] == str(os.getpid()) and len(parts[3]) == 4
        )
        info = json.loads((rd / MARKER).read_text())
        assert info["pid"] == os.getpid() and info["tool"] == "kv-cache" and "start_time" in info
    finally:
        s.close()
    assert not rd.exists()
    assert not (tmp_path / "a").exists()  # the cache dir levels this run created go with it
    (tmp_path / "c").mkdir()
    FileStore(tmp_path / "c", CHUNK).close()
    assert (tmp_path / "c").is_dir()  # a cache dir that existed stays


def test_close_removes_only_what_it_created(tmp_path, bufs):
    foreign_cache = tmp_path / "keep.npy"  # a *.npy the reference tool would have purged
    foreign_cache.write_bytes(b"user data")
    s = FileStore(tmp_path, CHUNK)
    foreign_run = s.run_dir / "mine.txt"
    foreign_run.write_bytes(b"x")
    for i in range(3):
        s.write(f"k{i}", 5000, bufs)
    s.close()
    assert foreign_cache.read_bytes() == b"user data"
    assert foreign_run.read_bytes() == b"x"
    assert sorted(os.listdir(s.run_dir)) == ["mine.txt"]  # entries and marker gone, dir kept
    s.close()  # twice is fine
    assert foreign_run.exists()


def test_temp_cache_dir_is_removed(bufs):
    s = FileStore(None, CHUNK)
    tmp = s.cache_dir
    assert tmp.name.startswith("kv_cache_") and s.run_dir.parent == tmp
    s.write("k", 10, bufs)
    s.close()
    assert not tmp.exists()
    s.close()


def test_closed_store_refuses_writes(tmp_path, bufs):
    s = FileStore(tmp_path, CHUNK)
    s.close()
    with pytest.raises(RuntimeError):
        s.write("k", 10, bufs)
    assert os.listdir(tmp_path) == []


def test_cache_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError):
        FileStore(f, CHUNK)


def test_bad_arguments(tmp_path):
    with pytest.raises(UsageError):
        FileStore(tmp_path, CHUNK, io_mode="fast")
    with pytest.raises(ValueError):
        FileStore(tmp_path, 1000)
    assert os.listdir(tmp_path) == []


def test_buffered_forced(tmp_path):
    s = FileStore(tmp_path, CHUNK, io_mode="buffered", fsync=False)
    assert s.io_mode == "buffered"
    s.close()


@pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm")
def test_forced_direct_on_tmpfs_is_a_usage_error(tmp_path):
    import tempfile

    d = tempfile.mkdtemp(dir=SHM, prefix="kvtest_")
    try:
        with pytest.raises(UsageError) as ei:
            FileStore(d, CHUNK, io_mode="direct")
        assert "\n" not in str(ei.value) and "O_DIRECT" in str(ei.value)
        assert os.listdir(d) == []  # the run dir it made was cleaned up
        s = FileStore(d, CHUNK, io_mode="auto")
        assert s.io_mode == "buffered" and s.fs_type == "tmpfs"
        b = WorkerBuffers(CHUNK, 0, 0)
        s.write("k", CHUNK + 3, b)
        s.read("k", b, verify=True)
        s.close()
        assert os.listdir(d) == []
    finally:
        os.rmdir(d)


def test_fs_type(tmp_path):
    s = FileStore(tmp_path, CHUNK)
    try:
        assert isinstance(s.fs_type, str) and s.fs_type
        assert s.mount_point and str(s.run_dir).startswith(s.mount_point)
    finally:
        s.close()


def test_full_chunks_reuse_the_worker_buffer_and_argument_list(store, bufs, monkeypatch):
    """The per-chunk path hands the kernel the preallocated buffer itself: no slice, no new iov list."""
    seen = []
    real_w, real_r = files_mod._tio.pwritev, files_mod._tio.preadv

    def pwritev(fd, iov, off):
        seen.append(("w", id(iov), [id(v) for v in iov], sum(len(v) for v in iov)))
        return real_w(fd, iov, off)

    def preadv(fd, view, off):  # reads take the view itself: no argument list at all
        seen.append(("r", 0, [id(view)], len(view)))
        return real_r(fd, view, off)

    monkeypatch.setattr(files_mod._tio, "pwritev", pwritev)
    monkeypatch.setattr(files_mod._tio, "preadv", preadv)
    store.write("k", 6 * CHUNK, bufs)
    store.read("k", bufs)
    for kind, mv in (("w", bufs.write_mv), ("r", bufs.read_mv)):
        full = [s for s in seen if s[0] == kind and s[3] == CHUNK and s[2] == [id(mv)]]
        assert len(full) >= 5
        assert len({s[1] for s in full}) == 1  # one argument list per entry, refilled per chunk


def test_streaming_memory_does_not_grow_with_entry_size(store, bufs):
    import tracemalloc

    # the one thing sized by an entry: the worker's chunk marks (16 bytes a chunk, every chunk of the
    # operation, made room for once by the largest operation so far: storage/buffers.py ChunkMarks)
    store.write("warm", 256 * CHUNK, bufs)
    store.read("warm", bufs)
    tracemalloc.start()
    try:
        peaks = []
        for n in (4 * CHUNK, 256 * CHUNK):
            base, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            store.write(f"k{n}", n, bufs)
            store.read(f"k{n}", bufs, verify=True)
            _, peak = tracemalloc.get_traced_memory()
            peaks.append(peak - base)
    finally:
        tracemalloc.stop()
    assert peaks[1] < 64 * 1024 and peaks[1] <= peaks[0] + 8 * 1024, peaks


def test_the_timer_says_what_it_is_and_both_time_the_same_syscalls(tmp_path):
    """The C helper and the Python fallback give the same bytes and a positive duration; the fallback
    names itself as one (what the run's device_timer and console line report)."""
    import importlib
    import subprocess
    import sys

    from kv_cache.storage import timedio

    info = timedio.timer_info()
    assert info["timer"] in ("c", "python") and info["description"]
    out = subprocess.run([sys.executable, "-c", "from kv_cache.storage import timedio as t; print(t.TIMER);"
                          "print(t.TIMER_DESCRIPTION)"], capture_output=True, text=True, check=True,
                         env={**os.environ, "KV_CACHE_PURE_TIMER": "1"}).stdout.splitlines()
    assert out[0] == "python" and "fallback" in out[1] and "GIL" in out[1]
    impls = [timedio]
    try:
        impls.append(importlib.import_module("kv_cache.storage._timedio"))
    except ImportError:
        pass
    for i, t in enumerate(impls):
        path = str(tmp_path / f"f{i}")
        fd, ns = t.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        assert fd >= 0 and ns >= 0
        n, ns = t.pwritev(fd, [b"abcd", memoryview(b"efgh")], 0)
        assert (n, ns > 0) == (8, True)
        buf = bytearray(8)
        n, ns = t.preadv(fd, buf, 0)
        assert (n, bytes(buf), ns > 0) == (8, b"abcdefgh", True)
        assert t.fadvise_dontneed(fd) >= 0
        assert t.fdatasync(fd) > 0 and t.close(fd) >= 0
        with pytest.raises(OSError):
            t.fadvise_dontneed(fd)  # closed
        assert t.unlink(path) >= 0 and not os.path.exists(path)
        with pytest.raises(FileNotFoundError):
            t.unlink(path)
        with pytest.raises(FileNotFoundError):
            t.open(str(tmp_path / "missing" / "x"), os.O_RDONLY)
        with pytest.raises(OSError):
            t.preadv(fd, buf, 0)  # closed


def _timer_with_fake_helper(calls: tuple[str, ...], extra: str = "") -> list[str]:
    """(TIMER, TIMER_DESCRIPTION) of storage.timedio imported in a fresh interpreter whose C helper is a fake
    module with `calls` (and `extra`, a line of code setting more of it)."""
    import subprocess
    import sys

    code = ("import sys, types\n"
            "fake = types.ModuleType('kv_cache.storage._timedio')\n"
            f"for n in {calls!r}: setattr(fake, n, print)\n" + extra +
            "sys.modules['kv_cache.storage._timedio'] = fake\n"
            "from kv_cache.storage import timedio as t\n"
            "print(t.TIMER); print(t.TIMER_DESCRIPTION)\n")
    env = {k: v for k, v in os.environ.items() if k != "KV_CACHE_PURE_TIMER"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.splitlines()


def test_a_c_helper_built_from_an_older_source_is_not_used_and_the_run_says_rebuild():
    """A _timedio built before unlink/fadvise_dontneed (a checkout updated without a rebuild) made the
    package fail at import; now the tier falls back to Python and the timer's description says why."""
    out = _timer_with_fake_helper(('pwritev', 'preadv', 'fdatasync', 'open', 'close'))
    assert out[0] == "python" and "out of date (it has no unlink): rebuild it" in out[1]


def test_a_c_helper_built_from_another_source_with_the_same_calls_is_not_used():
    """Stale in substance, not in names: a _timedio built from an older _timedio.c that has every call
    (a checkout updated without a rebuild) was used as the current one. The build records the source's
    SHA-256 (setup.py); where the source lies beside the package and differs, the tier falls back and says
    rebuild."""
    import importlib
    import subprocess
    import sys

    out = _timer_with_fake_helper(('pwritev', 'preadv', 'fdatasync', 'open', 'close', 'unlink'),
                                  "fake.SOURCE_SHA256 = '0' * 64\n")
    assert out[0] == "python" and "built from another _timedio.c" in out[1] and "rebuild" in out[1]
    env = {k: v for k, v in os.environ.items() if k != "KV_CACHE_PURE_TIMER"}
    built = subprocess.run([sys.executable, "-c", "from kv_cache.storage import timedio as t; print(t.TIMER)"],
                           capture_output=True, text=True, check=True, env=env).stdout.strip()
    try:
        importlib.import_module("kv_cache.storage._timedio")
    except ImportError:
        return
    assert built == "c"  # the helper built from this source is used
