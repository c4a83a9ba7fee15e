"""GPUDirect Storage reads (kv_cache/storage/gds.py) through a fake kvikio and a fake device.

The fake CuFile reads the file with os.pread into the numpy "device" buffer, so the test can check that
the bytes that land in "GPU memory" are the entry's own, at the offsets a host read uses."""

import os
import types

import numpy as np
import pytest

from kv_cache.storage import gds as gds_mod
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.files import FileStore
from kv_cache.storage.gds import GDSFileStore, compat_mode

KIB = 1024
CHUNK = 64 * KIB


class FakeCuFile:
    opened: list[str] = []

    def __init__(self, path, flags="r"):
        assert flags == "r"
        self.fd = os.open(path, os.O_RDONLY)
        self.closed = False
        FakeCuFile.opened.append(path)

    def pread(self, buf, size, file_offset=0):
        data = os.pread(self.fd, size, file_offset)
        buf[: len(data)] = np.frombuffer(data, np.uint8)
        return types.SimpleNamespace(get=lambda: len(data))

    def close(self):
        os.close(self.fd)
        self.closed = True


def fake_kvikio(value="CompatMode.ON"):
    return types.SimpleNamespace(CuFile=FakeCuFile, __version__="0.fake",
                                 defaults=types.SimpleNamespace(get=lambda name: value))


class FakeDevice:
    index, name = 0, "fake0"

    def __init__(self):
        self.allocs = 0
        self.buffers = []

    def alloc(self, nbytes):
        self.allocs += 1
        self.buffers.append(np.zeros(nbytes, np.uint8))
        return self.buffers[-1]

    def pinned(self, nbytes):  # (for a DeviceStore on this device)
        a = np.zeros(nbytes, np.uint8)
        return a, a

    def events(self):
        return None


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 19, 0)
    yield b
    b.close()


def test_reads_land_in_device_buffers_with_the_entrys_bytes(tmp_path, bufs):
    dev = FakeDevice()
    store = GDSFileStore(str(tmp_path), CHUNK, fsync=False, io_mode="buffered", kvikio=fake_kvikio(),
                         device=dev, slots=1)
    plain = FileStore(str(tmp_path), CHUNK, fsync=False, io_mode="buffered")
    try:
        store.write("a", 100 * KIB, bufs)
        plain.write("a", 100 * KIB, bufs)
        chunks = []
        plain.read("a", bufs, on_chunk=lambda c, view: chunks.append(bytes(view)))
        res = store.read("a", bufs)
        assert res.nbytes == 100 * KIB and res.device_ns > 0
        # one slot: the device buffer now holds the LAST chunk the read brought in, the entry's own bytes
        last = chunks[-1]
        assert bytes(dev.buffers[0][: len(last)]) == last
        assert dev.allocs == 1  # allocated once, at setup
        info = store.gds_info()
        assert (info["enabled"], info["reads"], info["bytes"]) == (True, 1, 100 * KIB)
        assert info["compat_mode"] == "CompatMode.ON" and info["library"] == "kvikio 0.fake"
    finally:
        store.close()
        plain.close()


def test_verified_reads_are_refused_and_handles_are_released(tmp_path, bufs):
    store = GDSFileStore(str(tmp_path), CHUNK, fsync=False, io_mode="buffered", kvikio=fake_kvikio(),
                         device=FakeDevice(), slots=1)
    try:
        store.write("a", 8 * KIB, bufs)
        with pytest.raises(ValueError, match="GPU memory"):
            store.read("a", bufs, verify=True)
        for _ in range(3):  # one buffer only: each read gave it back
            store.read("a", bufs)
        with pytest.raises(KeyError):
            store.read("missing", bufs)
        store.read("a", bufs)  # the failed lookup took no buffer
    finally:
        store.close()


def test_compat_mode_from_older_kvikio():
    old = types.SimpleNamespace(defaults=types.SimpleNamespace(compat_mode=lambda: True))
    assert compat_mode(old) == "True"


def test_gds_flag_needs_the_real_gpu_tier(monkeypatch):
    from kv_cache.cli import parse_settings, resolve
    from kv_cache.errors import UsageError

    with pytest.raises(UsageError, match="--gds needs the real GPU tier"):
        parse_settings(["--gds", "--gpu-tier", "simulated"])
    monkeypatch.setattr(resolve, "import_kvikio", lambda: None)
    with pytest.raises(UsageError, match="--gds needs kvikio"):
        parse_settings(["--gds", "--gpu-tier", "real"])
    monkeypatch.setattr(resolve, "import_kvikio", fake_kvikio)
    monkeypatch.setattr(resolve, "cuda_status", lambda n=1: (False, "no CUDA device visible to torch"))
    with pytest.raises(UsageError, match="--gds needs CUDA"):
        parse_settings(["--gds"])


def test_tiers_open_a_gds_store_only_behind_a_real_gpu_tier(tmp_path, monkeypatch):
    from kv_cache.errors import StorageSetupError
    from kv_cache.serving import tiers
    from kv_cache.settings.run import StorageSettings, TierSettings
    from kv_cache.storage.gpu_real import DeviceStore

    settings = TierSettings(gpu_mem_gb=0.001, cpu_mem_gb=0.0, cache_dir=str(tmp_path), gds=True)
    storage = StorageSettings(chunk_bytes=CHUNK, fsync=False, io_mode="buffered")
    monkeypatch.setattr(gds_mod, "import_kvikio", fake_kvikio)
    ts = tiers.TierSet([])
    ts.gpu_store = DeviceStore([FakeDevice()], 256 * KIB, CHUNK, slab_bytes=16 * KIB)
    try:
        fs = tiers._open_file_store(settings, storage, ts, workers=2)
        ts.file_store = fs
        assert isinstance(fs, GDSFileStore) and any("GPUDirect" in n for n in ts.notes)
    finally:
        ts.close()
    ts = tiers.TierSet([])  # a simulated (or no) GPU tier: refused
    with pytest.raises(StorageSetupError, match="GPUDirect Storage needs"):
        tiers._open_file_store(settings, storage, ts, workers=2)
