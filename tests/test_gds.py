"""GPUDirect Storage reads (kv_cache/storage/gds.py) through a fake kvikio and a fake device.

The fake CuFile reads the file with os.pread into the numpy "device" buffer, so the test can check that
the bytes that land in "GPU memory" are the entry's own, at the offsets a host read uses. In kvikio's
compatibility mode the store reads with its own descriptor into pinned memory and copies that to the
device (kvikio's POSIX path would read through the page cache), so no CuFile is opened at all."""

import os
import types

import numpy as np
import pytest
from gpu_fakes import FakeDevice

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
    FakeCuFile.opened = []
    return types.SimpleNamespace(CuFile=FakeCuFile, __version__="0.fake",
                                 defaults=types.SimpleNamespace(get=lambda name: value))


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 19, 0)
    yield b
    b.close()


@pytest.mark.parametrize("mode", ["CompatMode.ON", "CompatMode.OFF"])
def test_reads_land_in_device_buffers_with_the_entrys_bytes(tmp_path, bufs, mode):
    dev = FakeDevice()
    store = GDSFileStore(str(tmp_path), CHUNK, fsync=False, io_mode="buffered", kvikio=fake_kvikio(mode),
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
        assert bytes(dev.arrays[0][: len(last)]) == last
        assert dev.allocs == [CHUNK]  # allocated once, at setup
        info = store.gds_info()
        assert (info["enabled"], info["reads"], info["bytes"]) == (True, 1, 100 * KIB)
        assert info["compat_mode"] == mode and info["library"] == "kvikio 0.fake"
        if mode == "CompatMode.ON":  # own descriptor -> pinned bounce -> H2D, page cache bypassed
            assert FakeCuFile.opened == [] and "own descriptor" in info["read_path"]
            assert [d for d, _ in dev.launches] == ["h2d", "h2d"] and res.device_ns >= 2 * 100 * KIB
        else:
            assert len(FakeCuFile.opened) == 1 and info["read_path"].startswith("cuFile")
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


def test_a_cufile_handle_is_opened_once_per_file(tmp_path, bufs):
    store = GDSFileStore(str(tmp_path), CHUNK, fsync=False, io_mode="buffered", kvikio=fake_kvikio("OFF"),
                         device=FakeDevice(), slots=2)
    try:
        store.write("a", 8 * KIB, bufs)
        for _ in range(3):
            store.read("a", bufs)
        assert len(FakeCuFile.opened) == 1  # opened at the first read, kept for the next ones
        info = store.gds_info()
        assert info["handles_open"] == 1 and info["handle_open_seconds"] > 0
        first = store._handles["a"].cufile
        store.write("a", 8 * KIB, bufs)  # replaced: the old file's handle is closed, the next read reopens
        assert first.closed
        store.read("a", bufs)
        assert len(FakeCuFile.opened) == 2
        second = store._handles["a"].cufile
        store.delete("a")
        assert second.closed and store.gds_info()["handles_open"] == 0
    finally:
        store.close()


def test_compat_mode_auto_asks_kvikio():
    from kv_cache.storage.gds import uses_compat_mode

    def kv(value, preferred):
        return types.SimpleNamespace(defaults=types.SimpleNamespace(
            get=lambda name: value, is_compat_mode_preferred=lambda: preferred))

    assert uses_compat_mode(kv("CompatMode.ON", False)) and not uses_compat_mode(kv("CompatMode.OFF", True))
    assert uses_compat_mode(kv("CompatMode.AUTO", True)) and not uses_compat_mode(kv("CompatMode.AUTO", False))


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
