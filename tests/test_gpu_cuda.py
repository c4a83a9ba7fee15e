"""The real GPU tier on real hardware: skipped unless torch (or cupy) sees a CUDA device.

benchmarks/gpu_check.sh runs these on a CUDA machine; CI (no GPU) skips them and tests the same store
logic through a fake device (tests/test_gpu_real.py)."""

import pytest

from kv_cache.storage import gpu_device
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.memory import MemoryStore

MIB = 1 << 20
OK, WHY = gpu_device.cuda_status(1)
pytestmark = pytest.mark.skipif(not OK, reason=f"no CUDA: {WHY}")


@pytest.fixture
def bufs():
    b = WorkerBuffers(4 * MIB, 17, 0)
    yield b
    b.close()


def test_round_trip_and_demotion_on_the_device(bufs):
    store = DeviceStore(gpu_device.open_devices(1), 64 * MIB, 4 * MIB, staging_slots=2)
    cpu = MemoryStore(64 * MIB)
    try:
        w = store.write("a", 10 * MIB + 123, bufs)
        r = store.read("a", bufs, verify=True)  # the bytes came back from HBM intact
        assert w.device_ns > 0 and r.device_ns > 0  # CUDA events measured the copies
        store.move_to("a", cpu, bufs)
        cpu.read("a", bufs, verify=True)
        st = store.stats()
        assert st["mode"] == "real" and st["h2d"]["bytes"] > 0 and st["d2h"]["bytes"] > 0
    finally:
        store.close()
        cpu.close()


def test_tensor_parallel_over_two_gpus(bufs):
    ok, why = gpu_device.cuda_status(2)
    if not ok:
        pytest.skip(why)
    store = DeviceStore(gpu_device.open_devices(2), 64 * MIB, 4 * MIB, tensor_parallel=2)
    try:
        store.write("a", 8 * MIB, bufs)  # the driver's 1/T shard, held whole on each GPU of the group
        assert store.placement("a") == [0] * 8 + [1] * 8
        store.read("a", bufs, verify=True)
        st = store.stats()
        assert st["bytes_per_gpu"] == [16 * MIB, 16 * MIB] and st["h2d"]["bytes_per_replica"] == 16 * MIB
    finally:
        store.close()


def test_free_memory_and_a_plain_pinned_copy_are_measured(bufs):
    dev = gpu_device.open_devices(1)[0]
    free, total = dev.mem_info()
    assert 0 < free <= total
    h2d, d2h = dev.plain_copy_gbs(4 * MIB)
    assert h2d > 0 and d2h > 0
