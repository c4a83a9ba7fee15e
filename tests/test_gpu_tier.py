"""The GPU tier under tensor parallelism, several GPUs and several ranks, timed per copy (issue 19),
through the fake devices of tests/gpu_fakes.py: bytes per GPU and per replica, placement on the GPU with
room, the cache's accounted capacity, per-worker event timing under concurrent copies, start-up refusals,
GPUs picked by local rank, and the simulated tier's stand-in memcpy kept out of the latencies."""

import threading
import time
import types

import pytest
from gpu_fakes import GIB, FakeDevice

from kv_cache.errors import StorageSetupError, UsageError
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving import cache as cache_mod
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.serving.tiers import gpu_tier_limit
from kv_cache.settings.run import StorageSettings, TierSettings
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage import gpu_device
from kv_cache.storage.backends import BackendRequest
from kv_cache.storage.backends import gpu_real as gpu_real_backend
from kv_cache.storage.base import StoreFull
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.gpu_real import DeviceStore
from kv_cache.storage.gpu_sim import SimulatedGPUStore, TransferModel, standin_ns
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tiername import TierName

KIB = 1024
CHUNK = 64 * KIB
SLAB = 16 * KIB


@pytest.fixture
def bufs():
    b = WorkerBuffers(CHUNK, 23, 0)
    yield b
    b.close()


def make(ndev=4, per_device=256 * KIB, tp=1, slots=2, **fake):
    devs = [FakeDevice(i, **fake) for i in range(ndev)]
    return DeviceStore(devs, per_device, CHUNK, tensor_parallel=tp, slab_bytes=SLAB, staging_slots=slots), devs


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_bytes_per_gpu_and_per_replica(tp, bufs):
    store, _ = make(ndev=4, tp=tp)
    store.write("a", 64 * KIB, bufs)
    store.read("a", bufs, verify=True)  # every GPU's copy came back intact (the first one is the worker's)
    st = store.stats()
    assert st["replicas"] == 4 // tp and st["capacity_bytes_per_gpu"] == 256 * KIB
    assert st["capacity_bytes"] == (4 // tp) * 256 * KIB  # entry bytes: one 1/T shard per GPU of a group
    assert st["capacity_bytes_all_gpus"] == 4 * 256 * KIB
    assert st["h2d"]["bytes"] == st["d2h"]["bytes"] == 64 * KIB  # per GPU
    assert st["h2d"]["bytes_per_replica"] == tp * 64 * KIB
    per_gpu = st["bytes_per_gpu"]
    assert sorted(per_gpu, reverse=True) == [128 * KIB] * tp + [0] * (4 - tp)  # written + read
    # capacity in entries: 256 KiB / 64 KiB per GPU x groups (not T times more)
    n = 1
    while True:
        try:
            store.write(f"k{n}", 64 * KIB, bufs)
        except StoreFull:
            break
        n += 1
    assert n == 4 * (4 // tp)


def test_placement_picks_the_gpu_with_room(bufs):
    store, _ = make(ndev=2, per_device=128 * KIB)  # 8 slabs per GPU
    store.write("a", 96 * KIB, bufs)  # GPU 0: 2 slabs left
    store.write("b", 16 * KIB, bufs)  # GPU 1 (8 free)
    store.write("c", 48 * KIB, bufs)  # GPU 1 again: it has 7 free, GPU 0 only 2
    assert [store.placement(k)[0] for k in "abc"] == [0, 1, 1]
    with pytest.raises(StoreFull, match="each GPU of a group"):
        store.write("d", 160 * KIB, bufs)  # more than one GPU holds: refused, never split over two


def _cache(gpu, limit):
    policy = EvictionConfig(target_usage_ratio=1.0, large_entry_limit_ratio=1.0)
    cpu = MemoryStore(1 << 20, slab_bytes=SLAB, name="cpu")
    nvme = MemoryStore(4 << 20, slab_bytes=SLAB, name="nvme")
    metrics = RunMetrics()
    metrics.open_window()
    tiers = [Tier("gpu", gpu, limit), Tier("cpu", cpu, 1 << 20), Tier("nvme", nvme, float("inf"))]
    return MultiTierCache(tiers, policy, metrics, bytes_per_token=KIB), (cpu, nvme)


def _no_waiting(monkeypatch):
    def refuse(_s):
        raise AssertionError("the cache waited for GPU room")
    # cache.py's own sleep only: the time module itself is shared by every thread of the worker process
    monkeypatch.setattr(cache_mod, "time", types.SimpleNamespace(
        sleep=refuse, monotonic=time.monotonic, perf_counter_ns=time.perf_counter_ns))


def test_the_cache_never_waits_for_a_gpu_with_room(monkeypatch, bufs):
    """Two GPUs of 128 KiB with entries up to 96 KiB: as one 256 KiB pool, the third entry is admitted
    although no single GPU has room (StoreFull, then a wait of up to 60 s); the accounted limit keeps
    (groups - 1) x the largest entry back, so the cache demotes instead."""
    _no_waiting(monkeypatch)
    sizes = [("a", 96), ("b", 96), ("c", 48)]
    store, _ = make(ndev=2, per_device=128 * KIB)
    pooled, lower = _cache(store, store.capacity_bytes)
    with pytest.raises(AssertionError, match="waited"):
        for key, kib in sizes:
            pooled.allocate(key, 1, kib * KIB, bufs)
    for s in lower:
        s.close()
    store, _ = make(ndev=2, per_device=128 * KIB)
    limit = gpu_tier_limit(store, 96 * KIB)
    assert limit == 256 * KIB - 96 * KIB
    cache, lower = _cache(store, limit)
    try:
        for key, kib in sizes:
            cache.allocate(key, 1, kib * KIB, bufs)
        assert set(cache.tier("gpu").lru) == {"b", "c"} and set(cache.tier("cpu").lru) == {"a"}
    finally:
        for s in lower:
            s.close()


def test_an_entry_larger_than_one_gpus_share_skips_the_gpu_tier(bufs):
    """The MLPerf tool's waterfall: an entry that cannot fit one GPU's share goes to the next tier that can
    hold it (it used to be refused at start, exit 2, where the reference runs). The keep-back for several
    groups is of the largest entry that does fit a GPU; the skips are counted per tier."""
    store, _ = make(ndev=4, per_device=64 * KIB, tp=2)
    assert gpu_tier_limit(store, 64 * KIB) == 2 * 64 * KIB - 64 * KIB
    assert gpu_tier_limit(store, 64 * KIB + 1) == 2 * 64 * KIB - 64 * KIB  # larger ones never land there
    sim = SimulatedGPUStore(128 * KIB, TransferModel("h100", "PCIe", 64.0, 3350.0), slab_bytes=SLAB)
    try:
        sim.groups, sim.capacity_per_device = 2, 64 * KIB
        assert gpu_tier_limit(sim, 80 * KIB) == 128 * KIB - 64 * KIB
    finally:
        sim.close()
    store, _ = make(ndev=1, per_device=64 * KIB)
    cache, lower = _cache(store, gpu_tier_limit(store, 96 * KIB))
    cache.tiers[0].max_entry = store.capacity_per_device
    try:
        assert cache.allocate("big", 1, 96 * KIB, bufs)[0] == "cpu"  # larger than the GPU: the next tier
        assert cache.allocate("small", 1, 32 * KIB, bufs)[0] == "gpu"
        assert cache.allocate("big", 1, 96 * KIB, bufs)[0] == "cpu"  # present already: not a new skip
        usage = cache.usage()
        assert usage["gpu"]["skipped_entries"] == 1 and usage["cpu"]["skipped_entries"] == 0
        assert cache.metrics.snapshot_counters()["gpu_skipped_entries"] == 1
        from kv_cache.results.measurement import tier_skips

        counts, notes = tier_skips(usage)
        assert counts == {"gpu": 1}
        assert notes == ["the GPU tier (6.1e-05 GiB per GPU) was skipped by 1 entry larger than its share: "
                         "each went to the next tier that could hold it (the MLPerf tool's waterfall)"]
    finally:
        for s in lower:
            s.close()


def _concurrent_writes(store, n_bytes=64 * KIB):
    results, errors = {}, []

    def run(key):
        b = WorkerBuffers(CHUNK, 29, 0)
        try:
            results[key] = store.write(key, n_bytes, b).device_ns
        except Exception as exc:  # pragma: no cover  (shown by the assertion)
            errors.append(exc)
        finally:
            b.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    return results


def test_a_copys_time_is_its_own_under_concurrent_copies():
    """Two workers' copies interleave on the device (both start events recorded before either copy):
    with a stream per worker each event pair measures its own 64 KiB (2 ns per byte); on one shared
    stream (the old design) each would include the other's copy."""
    barrier = threading.Barrier(2)
    store, _ = make(ndev=1, slots=2, barrier=barrier)
    assert _concurrent_writes(store) == {"x": 2 * 64 * KIB, "y": 2 * 64 * KIB}
    shared, _ = make(ndev=1, slots=2, barrier=threading.Barrier(2), shared_streams=True)
    assert _concurrent_writes(shared) == {"x": 2 * 128 * KIB, "y": 2 * 128 * KIB}


def test_a_group_copies_in_parallel_and_reports_the_plain_pinned_copy(bufs):
    store, devs = make(ndev=2, tp=2)
    store.measure_plain_copy()
    w = store.write("a", 64 * KIB, bufs)
    assert w.device_ns == 2 * 64 * KIB  # the longest of the two GPUs' (parallel) copies, not their sum
    assert [d.waits for d in devs] == [1, 1]  # one wait per GPU per chunk
    st = store.stats()
    assert st["h2d"]["plain_pinned_copy_gbs"] == 0.5 and st["d2h"]["plain_pinned_copy_gbs"] == pytest.approx(1 / 3)
    assert st["h2d"]["device_gbs"] == 0.5  # the fake's cost: achieved = plain here


def _fake_cuda(monkeypatch, count=4, **fake):
    monkeypatch.setattr(gpu_device, "_count", lambda lib: count if lib == "torch" else 0)
    monkeypatch.setattr(gpu_device, "_torch", lambda: object())
    monkeypatch.setattr(gpu_device, "TorchDevice", lambda torch, i: FakeDevice(i, **fake))


def _request(**tiers):
    settings = TierSettings(**tiers)
    return BackendRequest(TierName.GPU, settings, StorageSettings(chunk_bytes=CHUNK), workers=2)


def test_ranks_on_one_host_take_their_gpus_by_local_rank(monkeypatch):
    _fake_cuda(monkeypatch)
    req = _request(gpu_mem_gb=0.001, num_gpus=2, local_rank=1, local_rank_from="OMPI_COMM_WORLD_LOCAL_RANK")
    store = gpu_real_backend._open(req)
    try:
        assert [d.index for d in store.devices] == [2, 3]
        assert "GPUs 2..3" in store.stats()["gpus_chosen_by"]
        assert any("GPUs 2, 3; local rank 1 (from OMPI_COMM_WORLD_LOCAL_RANK)" in n for n in req.notes)
    finally:
        store.close()
    with pytest.raises(StorageSetupError, match="GPUs 4..5"):  # a third rank of two GPUs on a 4-GPU host
        gpu_real_backend._open(_request(gpu_mem_gb=0.001, num_gpus=2, local_rank=2, local_rank_from="x"))


def test_local_rank_comes_from_the_launcher_or_the_processes_index(monkeypatch):
    from kv_cache.benchmarks.standard.processes import rank_settings
    from kv_cache.cli import parse_settings
    from kv_cache.cli.resolve import mpi_local_rank

    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    assert mpi_local_rank() == (0, "")
    monkeypatch.setenv("SLURM_LOCALID", "2")  # srun starting the ranks through PMI: no MPI variable for it
    assert mpi_local_rank() == (2, "SLURM_LOCALID")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert mpi_local_rank() == (3, "OMPI_COMM_WORLD_LOCAL_RANK")
    s = rank_settings(parse_settings(["--num-users", "4", "--gpu-mem-gb", "0"]), 1, 2)
    assert (s.tiers.local_rank, s.tiers.local_rank_from) == (1, "the --processes index")


def test_free_device_memory_clamps_or_refuses(monkeypatch):
    _fake_cuda(monkeypatch, free=1 * GIB, total=2 * GIB)
    req = _request(gpu_mem_gb=4.0, num_gpus=1)
    per_gpu, why = gpu_real_backend.device_capacity([FakeDevice(0, free=1 * GIB, total=2 * GIB)], 4 * GIB,
                                                    False, req.notes)
    assert per_gpu == 1 * GIB - int(0.05 * 2 * GIB) and "free on GPU 0" in why
    assert "clamped to" in req.notes[-1]
    with pytest.raises(StorageSetupError, match="give at most 0.90") as refused:
        gpu_real_backend.device_capacity([FakeDevice(0, free=1 * GIB, total=2 * GIB)], 4 * GIB, True, [])
    from kv_cache.cli import explain

    assert explain(refused.value).startswith("--gpu-mem-gb 4.00 GiB per GPU does not fit in GPU 0")
    with pytest.raises(StorageSetupError, match="at most 0.00"):  # nothing free: refused even unstrict
        gpu_real_backend.device_capacity([FakeDevice(0, free=0, total=2 * GIB)], GIB, False, [])
    assert gpu_real_backend.device_capacity([FakeDevice(0)], GIB, True, []) == (GIB, None)


@pytest.mark.parametrize("argv, message", [
    (["--num-gpus", "3", "--tensor-parallel", "2"], "must be a multiple of --tensor-parallel"),
    (["--gds", "--verify"], "--verify cannot check"),
])
def test_startup_refusals(argv, message):
    from kv_cache.cli import parse_settings

    with pytest.raises(UsageError, match=message):
        parse_settings(argv)


def test_startup_refusals_exit_2(capsys):
    from kv_cache.cli import main

    assert main(["--num-gpus", "3", "--tensor-parallel", "2"]) == 2
    assert "multiple of --tensor-parallel" in capsys.readouterr().err


def test_the_simulated_stand_in_memcpy_is_counted_per_thread(bufs):
    sim = SimulatedGPUStore(1 << 20, TransferModel("h100", "PCIe", 64.0, 3350.0), slab_bytes=SLAB)
    try:
        before = standin_ns()
        w = sim.write("a", 64 * KIB, bufs)
        mid = standin_ns()
        assert mid > before  # the memcpy standing in for the DMA
        assert w.total_ns == w.host_ns + w.device_ns and w.device_ns == 1024  # 64 KiB / 64 GB/s
        other = []
        t = threading.Thread(target=lambda: other.append(standin_ns()))
        t.start()
        t.join()
        assert other == [0]  # another worker's counter is its own
        # the wall clock spent the memcpy where a GPU spends the modelled copy: the difference is counted
        # (seconds x 1e9 is a float: compared to the nanosecond, not bit for bit)
        assert sim.stats()["h2d"]["host_memcpy_seconds"] * 1e9 - 1024 == pytest.approx(mid - before, abs=0.5)
    finally:
        sim.close()


def _driver_stub(done):
    from kv_cache.benchmarks.standard import scheduler

    stub = types.SimpleNamespace(
        stop=threading.Event(), _lock=threading.Lock(), _running={}, _worker=threading.local(),
        executor=types.SimpleNamespace(execute=lambda plan, bufs: "ok"),
        loop=types.SimpleNamespace(clock=lambda: 50_000, complete=done.append))
    stub._without_standin = lambda *a: scheduler.Driver._without_standin(stub, *a)
    return stub


def test_the_driver_takes_a_requests_stand_in_off_its_end_to_end_time(monkeypatch):
    from kv_cache.benchmarks.standard import scheduler

    ticks = iter([100, 100 + 7_000])  # standin_ns before and after the request: 7 us more than modelled
    monkeypatch.setattr(scheduler, "standin_ns", lambda: next(ticks))
    done = []
    plan = types.SimpleNamespace(submit_ns=40_000)
    scheduler.Driver._work(_driver_stub(done), plan, None)
    assert done == [(50_000 - 7_000, plan, "ok")]


def test_the_modelled_copy_replaces_the_stand_in_in_the_end_to_end_time(bufs):
    """A simulated write's end-to-end share is its modelled copy, not its memcpy: the wall clock less
    (memcpy - modelled) = the rest of the operation + the modelled time, i.e. the operation's own total."""
    sim = SimulatedGPUStore(1 << 20, TransferModel("h100", "PCIe", 1e-6, 3350.0), slab_bytes=SLAB)  # 1 kB/s
    try:
        import time

        before, t0 = standin_ns(), time.perf_counter_ns()
        w = sim.write("a", 64 * KIB, bufs)
        wall = time.perf_counter_ns() - t0
        net = standin_ns() - before
        # 65.5 s modelled at 1 kB/s (nothing sleeps it: the figure is accounted), so the memcpy is shorter
        # however loaded the host (at 1 MB/s, 65.5 ms, a descheduled copy could outlast it)
        assert w.device_ns == 64 * KIB * 1_000_000
        assert net < 0  # the modelled link is slower than the memcpy: the latency grows by the difference
        assert wall - net >= w.total_ns  # the request's share holds the whole modelled copy
    finally:
        sim.close()


def test_a_request_that_waited_behind_anothers_stand_in_is_not_charged_for_it():
    """Worker W runs A (submitted at 0, 10 us of stand-in beyond its model) then B, which was queued at
    1 us and started when A really ended (at 30 us): had A's copy taken its modelled time, W would have
    been free 10 us sooner, so B's end moves 10 us earlier although B itself had no stand-in."""
    from kv_cache.benchmarks.standard import scheduler

    stub = _driver_stub([])
    a, b = types.SimpleNamespace(submit_ns=0), types.SimpleNamespace(submit_ns=1_000)
    assert scheduler.Driver._without_standin(stub, a, 0, 30_000, 10_000) == 20_000
    assert scheduler.Driver._without_standin(stub, b, 30_000, 45_000, 0) == 35_000
    # C, submitted long after W went idle, waited for nobody: its end is its own
    c = types.SimpleNamespace(submit_ns=100_000)
    assert scheduler.Driver._without_standin(stub, c, 100_000, 110_000, 0) == 110_000
    # a worker that never ran a simulated copy reports real ends
    fresh = _driver_stub([])
    assert scheduler.Driver._without_standin(fresh, b, 30_000, 45_000, 0) == 45_000


def test_a_slower_modelled_link_delays_the_next_queued_request():
    """memcpy faster than the model (negative stand-in): A ends later than its wall clock, and B, queued
    behind it on the same worker, cannot start before A's modelled end."""
    from kv_cache.benchmarks.standard import scheduler

    stub = _driver_stub([])
    a, b = types.SimpleNamespace(submit_ns=0), types.SimpleNamespace(submit_ns=1_000)
    assert scheduler.Driver._without_standin(stub, a, 0, 10_000, -5_000) == 15_000
    assert scheduler.Driver._without_standin(stub, b, 10_000, 20_000, 0) == 25_000


def test_a_simulated_tier_refused_by_the_memory_budget_says_what_to_give_per_gpu():
    """--gpu-mem-gb is per GPU; a simulated tier of 2 groups holds 2 x it in RAM: the refusal's "give at
    most" is the per-GPU value (half the room), not the room itself."""
    from kv_cache.host.memlimit import MemoryLimit
    from kv_cache.serving.tiers import TierSet, open_gpu_store

    tiers = TierSettings(gpu_mem_gb=100.0, num_gpus=2, tensor_parallel=1, gpu_tier="simulated",
                         strict_memory=True, cpu_mem_gb=0.0)
    limit = MemoryLimit(available=10 * GIB, source="test")
    with pytest.raises(StorageSetupError) as refused:
        open_gpu_store(tiers, StorageSettings(), TierSet([]), 4, limit, 0)
    fits = int(0.9 * 10 * GIB) - (256 << 20)
    assert f"give at most {fits / 2 / GIB:.2f}" in str(refused.value)
    from kv_cache.cli import explain

    assert explain(refused.value).startswith("--gpu-mem-gb 100.00 GiB (simulated GPU tier (host RAM); 2 x that")


def test_a_rank_the_launcher_bound_to_its_own_gpus_takes_the_devices_it_sees(monkeypatch):
    """mpirun/srun wrappers often give each rank its GPU through CUDA_VISIBLE_DEVICES: local rank 1 then
    sees one device, index 0, and local rank x --num-gpus would point past it (refused). It takes what it
    sees and says so; a --processes child (the parent's CUDA_VISIBLE_DEVICES, shared) still takes its offset."""
    _fake_cuda(monkeypatch, count=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    req = _request(gpu_mem_gb=0.001, num_gpus=1, local_rank=1, local_rank_from="OMPI_COMM_WORLD_LOCAL_RANK")
    store = gpu_real_backend._open(req)
    try:
        assert [d.index for d in store.devices] == [0]
        assert store.stats()["gpus_chosen_by"].startswith("CUDA_VISIBLE_DEVICES=3: this rank (local rank 1")
        assert any("CUDA_VISIBLE_DEVICES=3" in n for n in req.notes)
    finally:
        store.close()
    with pytest.raises(StorageSetupError, match="GPUs 1..1"):
        gpu_real_backend._open(_request(gpu_mem_gb=0.001, num_gpus=1, local_rank=1,
                                        local_rank_from=gpu_real_backend.PROCESSES_INDEX))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(StorageSetupError, match="GPUs 1..1"):  # nothing bound it: two ranks, one GPU
        gpu_real_backend._open(req)


def test_an_entry_no_gpu_can_hold_goes_to_the_next_tier_without_waiting(monkeypatch, bufs):
    """The start-up refusal knows the synthetic users' largest entry, not a trace's: an entry larger than
    one GPU's share but within the tier's accounted limit (two GPUs of 128 KiB, a 160 KiB entry) used to be
    admitted to the GPU tier and wait up to 60 s for room no GPU can have. The GPU tier built for a run
    caps an entry at one GPU's share, so it goes to the CPU tier at once."""
    from kv_cache.serving.tiers import build_tiers

    _no_waiting(monkeypatch)
    store, _ = make(ndev=2, per_device=128 * KIB)
    cpu = MemoryStore(1 << 20, slab_bytes=SLAB, name="cpu")
    try:
        tiers = build_tiers(TierSettings(num_gpus=2), None, cpu, store, 64 * KIB, storage_tier=False)
        assert tiers[0].limit == 192 * KIB and tiers[0].max_entry == 128 * KIB
        metrics = RunMetrics()
        metrics.open_window()
        cache = MultiTierCache(tiers, EvictionConfig(target_usage_ratio=1.0, large_entry_limit_ratio=1.0),
                               metrics, bytes_per_token=KIB)
        assert cache.allocate("big", 1, 160 * KIB, bufs)[0] == "cpu"
        assert cache.allocate("small", 1, 64 * KIB, bufs)[0] == "gpu"
    finally:
        cpu.close()


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_simulated_tier_counts_tensor_parallelism_once(tp, bufs):
    """Four simulated GPUs of 256 KiB: (4 / T) x 256 KiB of entries (not 4 x), each a 1/T shard moved at
    the link's rate (not T times faster); per replica T x the bytes; the HBM stood for is 4 x 256 KiB."""
    from kv_cache.storage.backends import gpu_sim as gpu_sim_backend

    settings = TierSettings(gpu_mem_gb=256 * KIB / GIB, num_gpus=4, tensor_parallel=tp, gpu_tier="simulated")
    store = gpu_sim_backend._open(BackendRequest(TierName.GPU, settings, StorageSettings(chunk_bytes=CHUNK),
                                                 capacity_bytes=(4 // tp) * 256 * KIB))
    try:
        w = store.write("a", 64 * KIB, bufs)
        link = settings.gpu_spec.host_link_gbs
        assert w.device_ns == round(64 * KIB / link)  # one shard over one link
        st = store.stats()
        assert st["replicas"] == 4 // tp and st["capacity_bytes_per_gpu"] == 256 * KIB
        assert st["capacity_bytes"] == (4 // tp) * 256 * KIB and st["capacity_bytes_all_gpus"] == 4 * 256 * KIB
        assert st["h2d"]["bytes"] == 64 * KIB and st["h2d"]["bytes_per_replica"] == tp * 64 * KIB
    finally:
        store.close()


def test_a_gpu_tier_clamped_below_the_largest_entry_says_it_was_clamped(bufs):
    """A simulated tier the memory budget clamped below the largest entry: the run goes on (the largest
    entries skip the tier, the waterfall), and the tier's size says it was clamped."""
    from kv_cache.host.memlimit import MemoryLimit
    from kv_cache.serving.tiers import TierSet, build_tiers, open_gpu_store

    tiers = TierSettings(gpu_mem_gb=4.0, num_gpus=1, gpu_tier="simulated", cpu_mem_gb=0.0)
    stores = TierSet([])
    open_gpu_store(tiers, StorageSettings(), stores, 2, MemoryLimit(available=320 << 20,
                                                                    source="test"), 0)
    try:
        assert stores.gpu_store.clamped and stores.sizes["gpu_mem_gb"]["clamped"]
        built = build_tiers(tiers, None, None, stores.gpu_store, 64 << 20, storage_tier=False)
        assert built[0].name == "gpu" and built[0].max_entry < (64 << 20)
        assert "90% of" in stores.sizes["gpu_mem_gb"]["clamped"]
    finally:
        stores.close()


def test_a_refusal_under_several_ranks_says_the_size_was_this_ranks_share():
    """--gpu-mem-gb 1 --processes 2: each rank holds 0.5 GiB per GPU, so a refusal about it speaks of 0.5,
    which the flags given (1) do not show: the message says the flag is the total and this rank's share."""
    from kv_cache.benchmarks.standard.processes import rank_settings
    from kv_cache.benchmarks.standard.run import _with_rank_share
    from kv_cache.cli import explain, parse_settings

    share = rank_settings(parse_settings(["--num-users", "4", "--gpu-mem-gb", "1", "--processes", "2"]), 1, 2)
    exc = StorageSetupError("is too small for the largest entry").about("gpu_mem_gb")
    said = explain(_with_rank_share(exc, share))
    assert said == ("--gpu-mem-gb is too small for the largest entry (under several ranks --gpu-mem-gb 1 is the "
                    "total: this rank's share is 0.5)")
    alone = parse_settings(["--num-users", "4", "--gpu-mem-gb", "1"])
    assert _with_rank_share(exc, alone) is exc  # one process: its flags are its sizes


def test_an_allocation_that_fails_after_the_check_is_a_one_line_refusal(monkeypatch):
    """Free memory is checked first, but another process may take it before the arenas are allocated: the
    device library's out-of-memory error becomes a refusal naming --gpu-mem-gb, not a traceback."""

    class OutOfMemoryError(RuntimeError):
        pass

    def oom(self, nbytes):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")

    _fake_cuda(monkeypatch)
    monkeypatch.setattr(FakeDevice, "alloc", oom)
    with pytest.raises(StorageSetupError, match=r"could not be allocated on GPUs 0 \(OutOfMemoryError") as refused:
        gpu_real_backend._open(_request(gpu_mem_gb=0.001, num_gpus=1))
    assert refused.value.setting == "gpu_mem_gb"

    def bug(self, nbytes):
        raise TypeError("a programming error stays one")

    monkeypatch.setattr(FakeDevice, "alloc", bug)
    with pytest.raises(TypeError):
        gpu_real_backend._open(_request(gpu_mem_gb=0.001, num_gpus=1))


def test_a_gpu_tier_that_keeps_room_back_says_so():
    """--num-gpus 8 --gpu-mem-gb 0.1 with entries larger than one GPU's share: the keep-back against
    fragmentation is one GPU's share per other group, so the 0.8 GiB tier the banner shows fills 0.1 GiB;
    a note says it (it said nothing). One group keeps nothing back, and says nothing."""
    from kv_cache.serving.tiers import gpu_reserve_note

    gib = 1 << 30
    eight = types.SimpleNamespace(capacity_bytes=8 * gib // 10, capacity_per_device=gib // 10, groups=8,
                                  footprint=lambda n: n)
    limit = gpu_tier_limit(eight, gib)  # the largest entry, 1 GiB, skips the tier
    assert limit == pytest.approx(gib / 10)
    note = gpu_reserve_note(eight, limit)
    assert note.startswith("GPU tier: the cache fills 0.100 of its 0.800 GiB (13 %): 0.700 GiB (7 x 0.100 GiB")
    one = types.SimpleNamespace(capacity_bytes=gib, capacity_per_device=gib, groups=1, footprint=lambda n: n)
    assert gpu_reserve_note(one, gpu_tier_limit(one, 2 * gib)) is None


def test_an_entry_above_the_large_entry_ratio_of_a_tier_is_counted_as_a_skip(bufs):
    """The waterfall places no entry larger than large_entry_limit_ratio (0.95) of an upper tier there; one
    between 0.95 and 1.0 of the CPU tier skipped it uncounted (the count only looked at the whole tier)."""
    cpu = MemoryStore(1 << 20, slab_bytes=SLAB, name="cpu")
    nvme = MemoryStore(4 << 20, slab_bytes=SLAB, name="nvme")
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("cpu", cpu, 1 << 20), Tier("nvme", nvme, float("inf"))],
                           EvictionConfig(large_entry_limit_ratio=0.95), metrics, bytes_per_token=KIB)
    try:
        assert cache.allocate("a", 1, 1000 * KIB, bufs)[0] == "nvme"  # 0.98 of the tier
        assert cache.allocate("b", 1, 64 * KIB, bufs)[0] == "cpu"
        assert cache.usage()["cpu"]["skipped_entries"] == 1
    finally:
        cpu.close()
        nvme.close()
