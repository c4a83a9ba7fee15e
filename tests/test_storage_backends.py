"""Storage backends come from one registry: each entry is found by name, says what it can do, and is
opened through its own constructor; the tier builder chooses the one the settings select."""

import math

import pytest
from test_gds import FakeDevice as GDSDevice
from test_gds import fake_kvikio

from kv_cache.errors import StorageSetupError
from kv_cache.serving import tiers as tiers_mod
from kv_cache.settings.run import StorageSettings, TierSettings
from kv_cache.specs.models import GPU_SPECS
from kv_cache.storage import backends, gds, gpu_device
from kv_cache.storage.backends import BackendRequest
from kv_cache.storage.files import FileStore
from kv_cache.storage.gds import GDSFileStore
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.gpu_sim import SimulatedGPUStore
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tiername import TierName
from kv_cache.storage.tracelog import NullStore

KIB = 1024
STORAGE = StorageSettings(chunk_bytes=64 * KIB, fsync=False, io_mode="buffered")


def test_every_backend_is_registered_with_its_tier_and_capabilities():
    built_in = {"file": TierName.STORAGE, "gds": TierName.STORAGE, "gpu_real": TierName.GPU,
                "gpu_sim": TierName.GPU, "memory": TierName.CPU, "tracelog": None}
    assert set(backends.names()) >= set(built_in)  # (a new backend adds to them)
    assert {name: backends.get(name).tier for name in built_in} == built_in
    file = backends.get("file").capabilities
    assert file.o_direct and file.verify and file.device_counters and not file.host_ram
    assert backends.get("memory").capabilities.host_ram and backends.get("gpu_sim").capabilities.host_ram
    assert not backends.get("tracelog").capabilities.verify
    assert all(b.summary for b in backends.all_backends())
    with pytest.raises(KeyError, match="no storage backend 'ceph-rados'"):
        backends.get("ceph-rados")
    for name in ("s3", "redis"):  # the remote tiers: storage, --verify, no block device, not host RAM
        remote = backends.get(name)
        assert remote.tier is TierName.STORAGE and remote.capabilities.verify
        assert not remote.capabilities.device_counters and not remote.capabilities.host_ram


def test_the_settings_select_one_backend_per_tier(monkeypatch):
    monkeypatch.setattr(gpu_device, "cuda_status", lambda n=1: (False, "no CUDA"))
    assert backends.choose(TierName.STORAGE, TierSettings()).name == "file"
    assert backends.choose(TierName.STORAGE, TierSettings(gds=True)).name == "gds"
    assert backends.choose(TierName.CPU, TierSettings(cpu_mem_gb=1)).name == "memory"
    assert backends.choose(TierName.CPU, TierSettings(cpu_mem_gb=0)) is None
    assert backends.choose(TierName.GPU, TierSettings(gpu_mem_gb=1)).name == "gpu_sim"  # auto without CUDA
    assert backends.choose(TierName.GPU, TierSettings(gpu_mem_gb=1, gpu_tier="real")).name == "gpu_real"
    assert backends.choose(TierName.GPU, TierSettings(gpu_mem_gb=0)) is None


def _open(name, tier, tiers, **kw):
    request = BackendRequest(tier, tiers, STORAGE, workers=2, **kw)
    return backends.get(name).open(request), request.notes


def test_memory_file_tracelog_and_simulated_gpu_open_through_the_registry(tmp_path):
    store, _ = _open("memory", TierName.CPU, TierSettings(), capacity_bytes=1 << 20)
    assert isinstance(store, MemoryStore) and store.capacity_bytes == 1 << 20
    store.close()
    store, _ = _open("file", TierName.STORAGE, TierSettings(cache_dir=str(tmp_path)))
    assert isinstance(store, FileStore) and str(store.run_dir).startswith(str(tmp_path))
    store.close()
    store, _ = _open("tracelog", TierName.STORAGE, TierSettings())
    assert isinstance(store, NullStore) and store.name == "nvme"
    sim = TierSettings(gpu_mem_gb=0.001, gpu_tier="simulated", gpu_spec=GPU_SPECS["h100"])
    store, notes = _open("gpu_sim", TierName.GPU, sim, capacity_bytes=1 << 20)
    assert isinstance(store, SimulatedGPUStore) and any("SIMULATED" in n for n in notes)
    store.close()


def test_gds_opens_behind_a_real_gpu_store_only(tmp_path, monkeypatch):
    monkeypatch.setattr(gds, "import_kvikio", fake_kvikio)
    upper = DeviceStore([GDSDevice()], 256 * KIB, 64 * KIB, slab_bytes=16 * KIB)
    try:
        store, notes = _open("gds", TierName.STORAGE, TierSettings(cache_dir=str(tmp_path), gds=True), upper=upper)
        assert isinstance(store, GDSFileStore) and any("GPUDirect" in n for n in notes)
        store.close()
        with pytest.raises(StorageSetupError, match="GPUDirect Storage needs"):
            _open("gds", TierName.STORAGE, TierSettings(cache_dir=str(tmp_path), gds=True))
    finally:
        upper.close()


def test_the_real_gpu_backend_without_cuda_is_a_setup_error(monkeypatch):
    monkeypatch.setattr(gpu_device, "open_devices", lambda n, first=0: (_ for _ in ()).throw(gpu_device.CudaUnavailable("none")))
    with pytest.raises(StorageSetupError, match="needs CUDA"):
        _open("gpu_real", TierName.GPU, TierSettings(gpu_mem_gb=0.001, gpu_tier="real"))


class _ToyStore(MemoryStore):
    pass


def test_a_registered_backend_is_what_the_tier_builder_opens(tmp_path, monkeypatch):
    backends.all_backends()
    entry = backends.Backend(name="toy-test", tier=TierName.CPU, summary="a toy RAM tier",
                             capabilities=backends.Capabilities(verify=True, host_ram=True),
                             open=lambda r: _ToyStore(r.capacity_bytes), selects=lambda t: t.cpu_mem_gb > 0,
                             priority=5)
    monkeypatch.setitem(backends._ENTRIES, entry.name, entry)
    ts = tiers_mod.TierSet([])
    try:
        tiers_mod.open_tiers(TierSettings(cpu_mem_gb=0.001, cache_dir=str(tmp_path), gpu_mem_gb=0,
                                          storage_capacity_gb=1), STORAGE, None, ts, workers=2)
        assert isinstance(ts.memory_store, _ToyStore) and ts.backends[TierName.CPU] is entry
        assert [t.name for t in ts.tiers] == ["cpu", "nvme"] and not math.isinf(ts.tiers[-1].limit)
    finally:
        ts.close()
