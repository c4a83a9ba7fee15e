"""The real GPU tier's logic (arenas, staging pool, placement, timing, waterfall) through fake devices.

The fakes (tests/gpu_fakes.py) implement the device interface of kv_cache/storage/gpu_device.py with numpy
arrays and stream timelines: a copy moves the bytes and costs a made-up, deterministic "event" time (2 ns
per byte H2D, 3 ns per byte D2H), so the tests can tell device time from wall-clock time.
"""

import math

import pytest
from gpu_fakes import FakeDevice

from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage import gpu_device
from kv_cache.storage.base import StoreFull
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.memory import MemoryStore

KIB = 1024
CHUNK = 64 * KIB
SLAB = 16 * KIB


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 13, 0)
    yield b
    b.close()


def make(ndev=1, per_device=256 * KIB, tp=1, chunk=CHUNK, slots=2):
    devs = [FakeDevice(i) for i in range(ndev)]
    return DeviceStore(devs, per_device, chunk, tensor_parallel=tp, slab_bytes=SLAB, staging_slots=slots), devs


def test_arenas_and_pinned_staging_are_allocated_once(bufs):
    store, devs = make(ndev=2, slots=3)
    assert [d.allocs for d in devs] == [[256 * KIB], [256 * KIB]]
    assert sum(d.pinned_allocs for d in devs) == 3
    for i in range(6):
        store.write(f"k{i}", 40 * KIB, bufs)
        store.read(f"k{i}", bufs, verify=True)
    assert [d.allocs for d in devs] == [[256 * KIB], [256 * KIB]]  # nothing allocated per request
    assert sum(d.pinned_allocs for d in devs) == 3


def test_round_trip_reports_event_time_as_device_time(bufs):
    store, devs = make()
    w = store.write("a", 100 * KIB, bufs)
    r = store.read("a", bufs, verify=True)  # the stamps came back from the "device"
    assert (w.device_bytes, w.device_ns) == (100 * KIB, 2 * 100 * KIB)
    assert (r.device_bytes, r.device_ns) == (100 * KIB, 3 * 100 * KIB)
    assert w.total_ns == w.device_ns + w.host_ns
    st = store.stats()
    assert st["mode"] == "real" and st["backend"] == "fake"
    assert st["h2d"]["bytes"] == st["d2h"]["bytes"] == 100 * KIB
    assert st["h2d"]["device_seconds"] == 2 * 100 * KIB / 1e9
    assert st["d2h"]["copy_wall_seconds"] > 0  # the wall clock around the copies, next to the events
    # whole chunks: the slabs of a fresh entry are adjacent, so each chunk is ONE copy and one wait
    # (100 KiB = a 64 KiB chunk + a 36 KiB one, padded: 2 launches per direction)
    assert [len(p) for _, p in devs[0].launches] == [1, 1, 1, 1]
    assert [p[0][2] for _, p in devs[0].launches] == [64 * KIB, 36 * KIB, 64 * KIB, 36 * KIB]
    assert devs[0].waits == 4


def test_entries_go_round_robin_over_gpus(bufs):
    store, _ = make(ndev=4)
    for i in range(5):
        store.write(f"k{i}", 20 * KIB, bufs)
    assert [store.placement(f"k{i}") for i in range(5)] == [[0, 0], [1, 1], [2, 2], [3, 3], [0, 0]]


def test_tensor_parallel_places_the_shard_whole_on_each_gpu_of_its_group(bufs):
    store, _ = make(ndev=4, tp=2)
    store.write("a", 64 * KIB, bufs)  # the driver's 1/T shard: 4 slabs on EACH GPU of group 0
    store.write("b", 48 * KIB, bufs)  # 3 slabs on each GPU of group 1
    assert store.placement("a") == [0] * 4 + [1] * 4
    assert store.placement("b") == [2] * 3 + [3] * 3
    store.read("a", bufs, verify=True)
    store.read("b", bufs, verify=True)


def test_a_full_group_is_skipped_and_a_full_store_refuses_without_leaking(bufs):
    store, _ = make(ndev=2, per_device=64 * KIB)  # 4 slabs per GPU
    store.write("big", 64 * KIB, bufs)  # fills GPU 0
    store.write("x", 16 * KIB, bufs)  # GPU 1 (its turn)
    store.write("y", 16 * KIB, bufs)  # GPU 0's turn, but it is full: GPU 1
    assert store.placement("y") == [1]
    free = [len(f) for f in store._free]
    with pytest.raises(StoreFull):
        store.write("z", 48 * KIB, bufs)
    assert [len(f) for f in store._free] == free and "z" not in store
    store.delete("big")
    store.write("z", 48 * KIB, bufs)
    store.read("z", bufs, verify=True)


def test_views_larger_than_a_staging_slot_go_in_pieces(bufs):
    store, _ = make(chunk=16 * KIB)  # staging slot smaller than the worker's 64 KiB chunks
    store.write("a", 200 * KIB, bufs)
    store.read("a", bufs, verify=True)


def test_demotion_to_ram_moves_the_bytes_and_frees_the_slabs(bufs):
    store, _ = make()
    cpu = MemoryStore(1 << 20, slab_bytes=SLAB)
    try:
        free = len(store._free[0])
        store.write("k", 50 * KIB, bufs)
        r, _ = store.move_to("k", cpu, bufs)
        assert r.device_ns == 3 * 52 * KIB  # 50 KiB padded to 52: D2H event time
        assert "k" not in store and len(store._free[0]) == free
        cpu.read("k", bufs, verify=True)
    finally:
        cpu.close()


def test_waterfall_through_a_device_tier(bufs):
    gpu, _ = make(ndev=2, per_device=32 * KIB)
    cpu = MemoryStore(1 << 20, slab_bytes=SLAB)
    nvme = MemoryStore(4 << 20, slab_bytes=SLAB, name="nvme")
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("gpu", gpu, 64 * KIB), Tier("cpu", cpu, 128 * KIB), Tier("nvme", nvme, math.inf)],
                           EvictionConfig(), metrics, bytes_per_token=KIB)
    try:
        for i in range(10):
            cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
        where = {t.name: set(t.lru) for t in cache.tiers}
        assert where["gpu"] and where["cpu"] and where["nvme"]
        assert set().union(*where.values()) == {f"k{i}" for i in range(10)}
        for t in cache.tiers:
            for key in t.lru:
                t.store.read(key, bufs, verify=True)
    finally:
        for s in (gpu, cpu, nvme):
            s.close()


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError):
        DeviceStore([FakeDevice(0), FakeDevice(1), FakeDevice(2)], 64 * KIB, CHUNK, tensor_parallel=2)
    with pytest.raises(ValueError):
        DeviceStore([], 64 * KIB, CHUNK)


def test_without_torch_or_cupy_cuda_is_unavailable(monkeypatch):
    monkeypatch.setattr(gpu_device, "_torch", lambda: None)
    monkeypatch.setattr(gpu_device, "_cupy", lambda: None)
    ok, reason = gpu_device.cuda_status(1)
    assert not ok and "neither torch nor cupy" in reason
    with pytest.raises(gpu_device.CudaUnavailable):
        gpu_device.open_devices(1)


def test_too_few_devices_is_unavailable(monkeypatch):
    monkeypatch.setattr(gpu_device, "_count", lambda lib: 1 if lib == "torch" else 0)
    ok, reason = gpu_device.cuda_status(2)
    assert not ok and reason == "2 GPU(s) asked for, torch sees 1"
    assert gpu_device.cuda_status(1) == (True, "torch, 1 CUDA device(s)")
