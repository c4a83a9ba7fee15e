"""The simulated GPU tier: its timing model, what it reports, and the GPU -> CPU -> storage waterfall."""

import math

import pytest

from kv_cache.errors import StorageSetupError
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.render.measurement_section import gpu_tier_lines
from kv_cache.serving import tiers as tiers_mod
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.run import StorageSettings, TierSettings
from kv_cache.settings.sections import EvictionConfig
from kv_cache.specs.models import GPU_SPECS
from kv_cache.storage import gpu_device
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_sim import SimulatedGPUStore, TransferModel
from kv_cache.storage.memory import MemoryStore

KIB = 1024
CHUNK = 64 * KIB


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 11, 0)
    yield b
    b.close()


def model(link=64.0, hbm=3350.0, shards=1):
    return TransferModel("h100", "PCIe Gen5 x16", link, hbm, shards)


def test_transfer_model_is_bytes_over_the_slower_link():
    assert model().ns(64_000) == 1000  # 64 GB/s = 64 bytes per ns
    assert model(link=64.0, hbm=32.0).ns(64_000) == 2000  # HBM slower than the link: HBM bounds it
    # the entry is already one GPU's 1/T shard (the driver's size): T GPUs moving theirs in parallel do
    # not make it faster (tensor parallelism is counted once)
    assert model(shards=2).ns(64_000) == model().ns(64_000) == 1000
    with pytest.raises(ValueError):
        model(link=0.0)
    with pytest.raises(ValueError):
        model(shards=0)


def test_builtin_gpus_have_host_links_with_sources():
    for key, spec in GPU_SPECS.items():
        assert spec.host_link_gbs > 0 and spec.host_link and spec.host_link_source, key
    assert GPU_SPECS["h100"].host_link_gbs == 64.0 and GPU_SPECS["a100"].host_link_gbs == 32.0


def test_write_and_read_report_modelled_device_time_and_measured_host_time(bufs):
    store = SimulatedGPUStore(1 << 20, model(), slab_bytes=16 * KIB)
    try:
        w = store.write("a", 100 * KIB, bufs)
        r = store.read("a", bufs, verify=True)  # the bytes really are kept: stamps check out
        for res in (w, r):
            assert res.device_bytes == 100 * KIB
            assert res.device_ns == store.model.ns(100 * KIB) == round(100 * KIB / 64)
            assert res.total_ns == res.device_ns + res.host_ns and res.host_ns >= 0
        st = store.stats()
        assert st["mode"] == "simulated" and "simulated" in st["timed"]
        assert (st["h2d"]["operations"], st["h2d"]["bytes"]) == (1, 100 * KIB)
        assert (st["d2h"]["operations"], st["d2h"]["bytes"]) == (1, 100 * KIB)
        assert st["h2d"]["modelled_seconds"] == w.device_ns / 1e9
        assert st["d2h"]["host_memcpy_seconds"] > 0  # the stand-in copy was measured, separately
        assert "SIMULATED" in gpu_tier_lines(st)[0]
    finally:
        store.close()


def test_demotion_moves_the_bytes_into_ram_with_the_d2h_side_modelled(bufs):
    gpu = SimulatedGPUStore(1 << 20, model(), slab_bytes=16 * KIB)
    cpu = MemoryStore(1 << 20, slab_bytes=16 * KIB)
    try:
        gpu.write("k", 40 * KIB, bufs)
        r, w = gpu.move_to("k", cpu, bufs)
        assert "k" not in gpu and "k" in cpu
        assert r.device_ns == gpu.model.ns(40 * KIB)  # the GPU side: modelled D2H
        assert w.total_ns == w.device_ns + w.host_ns  # the RAM side: its own measured memcpy
        cpu.read("k", bufs, verify=True)
        assert gpu.stats()["d2h"]["operations"] == 1
    finally:
        gpu.close()
        cpu.close()


def test_waterfall_gpu_to_cpu_to_storage_moves_data(bufs):
    gpu = SimulatedGPUStore(64 * KIB, model(), slab_bytes=16 * KIB)
    cpu = MemoryStore(128 * KIB, slab_bytes=16 * KIB)
    nvme = MemoryStore(4096 * KIB, slab_bytes=16 * KIB, name="nvme")
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("gpu", gpu, 64 * KIB), Tier("cpu", cpu, 128 * KIB), Tier("nvme", nvme, math.inf)],
                           EvictionConfig(), metrics, bytes_per_token=KIB)
    try:
        for i in range(12):
            assert cache.allocate(f"k{i}", 16, 16 * KIB, bufs)[0] == "gpu"  # new entries land in HBM
        where = {t.name: set(t.lru) for t in cache.tiers}
        assert where["gpu"] and where["cpu"] and where["nvme"]  # pushed down, tier by tier
        assert set().union(*where.values()) == {f"k{i}" for i in range(12)}  # nothing dropped
        for t in cache.tiers:
            for key in t.lru:
                t.store.read(key, bufs, verify=True)  # each entry's own bytes, wherever it is now
        assert metrics.tier_op("gpu", "read").ops == len(where["cpu"]) + len(where["nvme"])
        assert metrics.io_by_cause[("cpu", "write", "demotion")][0] >= len(where["cpu"])
    finally:
        for s in (gpu, cpu, nvme):
            s.close()


def tier_settings(**kw):
    base = dict(gpu_mem_gb=0.001, cpu_mem_gb=0.0, gpu_tier="auto", gpu_type="h100", gpu_spec=GPU_SPECS["h100"])
    base.update(kw)
    return TierSettings(**base)


def test_auto_without_cuda_opens_a_simulated_tier_and_says_so(monkeypatch):
    monkeypatch.setattr(gpu_device, "cuda_status", lambda n=1: (False, "no CUDA device visible to torch"))
    ts = tiers_mod.TierSet([])
    try:
        tiers_mod.open_gpu_store(tier_settings(), StorageSettings(), ts)
        assert isinstance(ts.gpu_store, SimulatedGPUStore)
        assert any("SIMULATED" in n for n in ts.notes)
        built = tiers_mod.build_tiers(tier_settings(), None, None, ts.gpu_store)
        assert [t.name for t in built] == ["gpu", "nvme"]
    finally:
        ts.close()


def test_off_and_zero_budget_open_no_gpu_tier():
    for kw in ({"gpu_tier": "off"}, {"gpu_mem_gb": 0.0}):
        ts = tiers_mod.TierSet([])
        tiers_mod.open_gpu_store(tier_settings(**kw), StorageSettings(), ts)
        assert ts.gpu_store is None and not ts.notes
        assert tiers_mod.gpu_tier_mode(tier_settings(**kw)) == "off"


def test_real_tier_without_cuda_is_a_setup_error(monkeypatch):
    from kv_cache.storage import gpu_device

    monkeypatch.setattr(gpu_device, "cuda_status", lambda n=1: (False, "no CUDA device visible to torch"))
    with pytest.raises(StorageSetupError, match="needs CUDA"):
        tiers_mod.open_gpu_store(tier_settings(gpu_tier="real"), StorageSettings(), tiers_mod.TierSet([]))


def test_simulated_tier_needs_a_host_link_figure():
    import dataclasses

    spec = dataclasses.replace(GPU_SPECS["h100"], host_link_gbs=0.0)
    with pytest.raises(StorageSetupError, match="host link"):
        tiers_mod.open_gpu_store(tier_settings(gpu_tier="simulated", gpu_spec=spec), StorageSettings(),
                                 tiers_mod.TierSet([]))


# ------------------------------------------------------------------------------------------ flags
def test_gpu_tier_real_without_cuda_fails_in_one_line_with_exit_2(monkeypatch, capsys, tmp_path):
    from kv_cache.cli import main, resolve

    monkeypatch.setattr(resolve, "cuda_status", lambda n=1: (False, "no CUDA device visible to torch"))
    code = main(["--gpu-tier", "real", "--gpu-mem-gb", "1", "--duration", "1", "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--gpu-tier real needs CUDA: no CUDA device visible to torch" in err
    assert not list(tmp_path.iterdir())  # nothing was run


def test_unknown_gpu_type_is_a_usage_error():
    from kv_cache.cli import parse_settings
    from kv_cache.errors import UsageError

    with pytest.raises(UsageError, match="unknown --gpu-type 'z9'"):
        parse_settings(["--gpu-type", "z9"])
    s = parse_settings(["--gpu-type", "a100", "--gpu-tier", "simulated"])
    assert s.tiers.gpu_spec == GPU_SPECS["a100"] and s.tiers.gpu_tier == "simulated"
