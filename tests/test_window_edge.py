"""The window's edge, measured: an operation that straddles the window's end adds only its chunks completed
by then, an aborted one only what moved inside the window, however late the stop (metrics/recorder.py,
storage/buffers.py ChunkMarks). Deterministic: the window is closed by the store's own stop checks."""

import math
import threading
import time

import pytest

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.base import IOAborted
from kv_cache.storage.buffers import MARKS, ChunkMarks
from kv_cache.storage.files import FileStore

KIB = 1024
CHUNK = 64 * KIB


class LateStop(threading.Event):
    """A stop event that closes the metrics' window at its `close_at`-th check (the scheduler's deadline,
    passed while the operation kept going) and is set only at its `stop_at`-th check (the late stop)."""

    def __init__(self, metrics: RunMetrics, close_at: int, stop_at: int | None):
        super().__init__()
        self.metrics, self.close_at, self.stop_at, self.calls = metrics, close_at, stop_at, 0

    def is_set(self) -> bool:
        self.calls += 1
        if self.calls == self.close_at:
            self.metrics.close_window(time.perf_counter_ns())
        return self.stop_at is not None and self.calls >= self.stop_at


def test_marks_give_the_bytes_of_chunks_completed_by_a_time():
    m = ChunkMarks()
    m.begin()
    assert m.bytes_by(10**18) is None  # no mark: the store did not mark its chunks
    m.add(100)
    t = time.perf_counter_ns()
    m.add(200)
    assert m.bytes_by(t) == 100 and m.bytes_by(10**18) == 200 and m.bytes_by(0) == 0 and m.total == 200


def test_marks_hold_every_chunk_however_many():
    m = ChunkMarks()
    m.begin()
    m.add(10)
    t = time.perf_counter_ns()
    while time.perf_counter_ns() == t:
        pass
    for i in range(2, 4 * MARKS + 11):  # more chunks after t than the room made at first
        m.add(i * 10)
    assert m.bytes_by(t) == 10 and m.bytes_by(0) == 0 and m.total == (4 * MARKS + 10) * 10
    m.begin()  # the next operation starts from nothing, in the room the last one made
    m.add(5)
    assert m.bytes_by(10**18) == 5 and m.total == 5


def test_a_moves_marks_give_each_sides_bytes_and_other_operations_none():
    m = ChunkMarks()
    m.begin()
    m.add_move(60, 64)  # the first chunk: the read holds no header, the write does
    t = time.perf_counter_ns()
    while time.perf_counter_ns() == t:
        pass
    m.add_move(124, 128)
    assert m.split_by(t) == (60, 64) and m.split_by(10**18) == (124, 128) and m.split_by(0) == (0, 0)
    assert m.bytes_by(t) == 124 and m.total == 252
    m.begin()  # a write next: its marks have no sides (the last move's are stale, not its)
    m.add(64)
    assert m.split_by(10**18) is None and m.bytes_by(10**18) == 64


def _cache(tmp_path, metrics, stop):
    fs = FileStore(str(tmp_path), CHUNK, io_mode="buffered")
    return fs, MultiTierCache([Tier("nvme", fs, math.inf)], EvictionConfig(), metrics, KIB, stop=stop)


def test_an_aborted_write_after_a_late_stop_adds_only_its_chunks_inside_the_window(tmp_path, bufs):
    metrics = RunMetrics()
    metrics.open_window()
    stop = LateStop(metrics, close_at=3, stop_at=17)  # window ends after 2 chunks; the stop comes 14 later
    fs, cache = _cache(tmp_path, metrics, stop)
    with pytest.raises(IOAborted):
        cache.allocate("k", 32, 32 * CHUNK, bufs)
    s = metrics.tier_op("storage", "write")
    edge = metrics.edge_record()
    moved = metrics.late["storage_write_aborted_device_bytes"]
    assert moved >= 15 * CHUNK  # it really moved 16 chunks (the first holds the header) before the stop
    assert s.partial_bytes == 2 * CHUNK  # two of them inside the window: the rest is left out
    assert edge["aborted_ops"] == 1 and edge["edge_ops"] == 1 and edge["counted_bytes"] == 2 * CHUNK
    assert edge["excluded_bytes"] == moved - 2 * CHUNK and edge["unmeasured_ops"] == 0
    fs.close()


def test_a_write_aborted_hundreds_of_chunks_late_adds_only_its_chunks_inside_the_window(tmp_path, bufs):
    # the stop comes 600 chunks after the window's end: with the marks a ring of 256, the chunks of the
    # stop's first 343 were counted as inside the window (2.8 MB of 131 kB at 300, 22 MB at 600)
    metrics = RunMetrics()
    metrics.open_window()
    stop = LateStop(metrics, close_at=3, stop_at=603)
    fs, cache = _cache(tmp_path, metrics, stop)
    with pytest.raises(IOAborted):
        cache.allocate("k", 800, 800 * CHUNK, bufs)
    moved = metrics.late["storage_write_aborted_device_bytes"]
    assert moved >= 600 * CHUNK
    assert metrics.tier_op("storage", "write").partial_bytes == 2 * CHUNK
    assert metrics.edge_record()["excluded_bytes"] == moved - 2 * CHUNK
    fs.close()


def test_a_read_straddling_the_end_adds_its_chunks_completed_by_then(tmp_path, bufs):
    metrics = RunMetrics()
    metrics.open_window()
    fs, cache = _cache(tmp_path, metrics, None)
    cache.allocate("k", 8, 8 * CHUNK, bufs)
    cache.stop = LateStop(metrics, close_at=4, stop_at=None)  # the window ends after 3 of its 9 chunks
    res = cache.read("k", bufs)
    assert not res.in_window
    s = metrics.tier_op("storage", "read")
    assert s.ops == 0 and 0 < s.partial_bytes < 8 * CHUNK
    marks = bufs.marks
    assert s.partial_bytes == int(8 * CHUNK * marks._b[2] / marks.total)  # 3 chunks' share of the entry
    assert metrics.edge_record()["straddling_ops"] == 1
    fs.close()


def test_a_store_without_marks_is_counted_whole_and_named_unmeasured():
    metrics = RunMetrics()
    metrics.open_window(0)
    metrics.close_window(1000)
    metrics.record_aborted("storage", "read", 3 * CHUNK, None)
    assert metrics.tier_op("storage", "read").partial_bytes == 3 * CHUNK
    edge = metrics.edge_record()
    assert edge["unmeasured_ops"] == 1 and edge["unmeasured_bytes"] == 3 * CHUNK


def test_a_ram_tiers_edge_bytes_are_not_taken_for_the_storage_tiers():
    """A run whose window ends during a GPU- or CPU-tier copy, with nothing on the storage tier (an
    open loop at 1e12 req/s on tiny-1b): the edge record's bytes are the storage tier's, which the audit
    compares with the storage tier's counted bytes; the RAM tier's go apart (it printed 'INVALID - window:
    the edge operations' counted bytes (0.5 GiB) exceed the storage bytes counted (0 GiB)')."""
    from kv_cache.storage.base import IOResult

    metrics = RunMetrics()
    metrics.open_window(0)
    metrics.close_window(10)
    marks = ChunkMarks()
    marks.begin()
    marks.add(1 << 20)  # (its mark lies after the window's end: nothing of it moved inside)
    metrics.record_io("gpu", "write", IOResult(1 << 20, 1 << 20, 100, 100, 0), 20, "prefill", marks)
    edge = metrics.edge_record()
    assert edge["counted_bytes"] == 0 and edge["unmeasured_bytes"] == 0 and edge["edge_ops"] == 1
    assert edge["other_tiers_counted_bytes"] == 0
    metrics.record_io("storage", "write", IOResult(1 << 20, 1 << 20, 100, 100, 0), 20, "prefill", None)
    edge = metrics.edge_record()
    assert edge["unmeasured_bytes"] == 1 << 20 and edge["edge_ops"] == 2


def test_an_operation_begun_after_the_windows_end_and_aborted_is_no_edge_operation():
    """One worker, two operations: a read that straddles the window's end (an edge operation), then a write
    begun after the end and aborted at the stop. Only the first is at the edge: counting the second too let a
    /dev/shm run show '11 operations in flight at the window's end, more than the 8 I/O workers' (INVALID)."""
    from kv_cache.storage.base import IOResult

    metrics = RunMetrics()
    metrics.open_window()
    marks = ChunkMarks()
    marks.begin()
    marks.add(CHUNK)
    metrics.close_window(time.perf_counter_ns())
    marks.add(2 * CHUNK)
    res = IOResult(2 * CHUNK, 2 * CHUNK, 10, 10, 20)
    end = time.perf_counter_ns()
    assert not metrics.record_io("storage", "read", res._replace(total_ns=end - metrics.window_start_ns), end,
                                 "test", marks)
    marks.begin()  # the next operation, after the window's end
    marks.add(CHUNK)
    metrics.record_aborted("storage", "write", CHUNK, marks)
    edge = metrics.edge_record()
    assert edge["edge_ops"] == 1 and edge["straddling_ops"] == 1 and edge["aborted_ops"] == 0
    assert metrics.late["storage_write_aborted_ops"] == 1  # still counted as aborted, outside the window
    assert metrics.tier_op("storage", "write").partial_bytes == 0


def _ram_over_file(tmp_path):
    """A window opened on a RAM tier of 20 chunks over a buffered file tier: (metrics, cpu, fs, cache)."""
    from kv_cache.storage.memory import MemoryStore

    metrics = RunMetrics()
    metrics.open_window()
    cpu = MemoryStore(64 * CHUNK, slab_bytes=CHUNK, name="cpu")
    fs = FileStore(str(tmp_path), CHUNK, io_mode="buffered")
    return metrics, cpu, fs, MultiTierCache([Tier("cpu", cpu, 20 * CHUNK), Tier("nvme", fs, math.inf)],
                                            EvictionConfig(), metrics, KIB)


def test_a_demotion_aborted_after_a_late_stop_adds_each_sides_chunks_inside_the_window(tmp_path, bufs):
    """A RAM -> storage demotion aborted at a late stop: the RAM tier's read bytes and the storage tier's write
    bytes each count only the chunks completed inside the window, per tier and direction. It was recorded as one
    (storage, "demote") abort of read + write bytes: the RAM reads went into the edge's storage bytes (about
    half of them) and the in-window storage writes into a pair no bandwidth reads (lost from the write figure
    and from the block device's comparison)."""
    metrics, cpu, fs, cache = _ram_over_file(tmp_path)
    try:
        assert cache.allocate("a", 16, 16 * CHUNK, bufs)[0] == "cpu"  # inside the open window, no stop
        cache.stop = stop = LateStop(metrics, close_at=3, stop_at=11)
        with pytest.raises(IOAborted):  # "b" needs the room: "a" is demoted, and the late stop aborts it
            cache.allocate("b", 16, 16 * CHUNK, bufs)
        lead = fs.lead_bytes
        # the move's checks 1-2 let 2 chunks through in the window, 10 moved before its 11th saw the stop (the
        # 12th: the write of "b", begun after the window's end, aborted with nothing moved)
        assert stop.calls == 12 and lead == 4 * KIB
        assert metrics.late["cpu_read_aborted_device_bytes"] == 10 * CHUNK - lead
        assert metrics.late["storage_write_aborted_device_bytes"] == 10 * CHUNK
        assert metrics.tier_op("cpu", "read").partial_bytes == 2 * CHUNK - lead  # the first read chunk holds no header
        assert metrics.tier_op("storage", "write").partial_bytes == 2 * CHUNK
        assert metrics.tier_op("storage", "write").window_bytes == 2 * CHUNK  # what the write bandwidth divides
        from kv_cache.results.measurement import block_device
        assert block_device(metrics, "vdx", (0, 0), (0, 0))["tool_bytes_written"] == 10 * CHUNK  # all it wrote
        edge = metrics.edge_record()
        assert edge["aborted_ops"] == 1 and edge["edge_ops"] == 1  # one operation, its two sides
        assert edge["counted_bytes"] == 2 * CHUNK and edge["excluded_bytes"] == 8 * CHUNK  # the storage side's
        assert edge["other_tiers_counted_bytes"] == 2 * CHUNK - lead  # the RAM side's, apart
        assert metrics.tier_op("storage", "demote").partial_bytes == 0
        assert metrics.late["storage_demote_aborted_ops"] == 1 and metrics.late["cpu_write_aborted_ops"] == 1
        assert "storage_demote_aborted_device_bytes" not in metrics.late  # the bytes are the two sides'
    finally:
        cpu.close()
        fs.close()


def test_a_demotion_straddling_the_end_measures_each_side_by_its_own_chunks(tmp_path, bufs):
    """A RAM -> storage demotion that finishes after the window's end: the RAM read adds its share by the read
    side's chunks (2 chunks of 16, the first without the file's header), the storage write by the write side's
    (the header in its first chunk); both sides' bytes in one cumulative mark mixed the two."""
    metrics, cpu, fs, cache = _ram_over_file(tmp_path)
    try:
        cache.allocate("a", 16, 16 * CHUNK, bufs)
        cache.stop = LateStop(metrics, close_at=3, stop_at=None)
        cache.allocate("b", 16, 16 * CHUNK, bufs)  # "a" is demoted: the window ends after its 2nd chunk
        lead = fs.lead_bytes
        assert metrics.late["cpu_read_ops"] == 1 and metrics.late["storage_write_ops"] == 1
        assert metrics.tier_op("cpu", "read").partial_bytes == 2 * CHUNK - lead  # 16 chunks' entry: 2 read
        # the write side: 2 chunks (2 x 64 KiB, the header's 4 KiB in them) of its 16 x 64 KiB + 4 KiB
        assert metrics.tier_op("storage", "write").partial_bytes == 16 * CHUNK * 2 * CHUNK // (16 * CHUNK + lead)
        edge = metrics.edge_record()
        assert edge["straddling_ops"] == 1 and edge["edge_ops"] == 1  # the demotion's two records: one operation
        assert edge["other_tiers_counted_bytes"] == 2 * CHUNK - lead
    finally:
        cpu.close()
        fs.close()
