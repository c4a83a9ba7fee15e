"""The storage-error policy: transient errors retried a bounded number of times, every error counted per
tier and operation, messages with path and cause, a threshold after which the run stops (exit 3)."""

import errno
import math
import time
import types
from unittest import mock

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli.exits import exit_status
from kv_cache.core.error_policy import ErrorPolicy
from kv_cache.errors import ExitCode
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.faults import StorageFault, describe
from kv_cache.storage.files import FileStore
from kv_cache.storage.memory import MemoryStore

KIB = 1024
CHUNK = 64 * KIB


class Flaky:
    """Wraps a store: its next `fail` reads (or writes) raise OSError(code)."""

    def __init__(self, store, fail: int, code: int = errno.EIO, op: str = "read"):
        self.store, self.fail, self.code, self.op = store, fail, code, op
        self.name = store.name

    def __getattr__(self, name):
        return getattr(self.store, name)

    def __contains__(self, key):
        return key in self.store

    def _maybe_fail(self, op):
        if op == self.op and self.fail > 0:
            self.fail -= 1
            raise OSError(self.code, errno.errorcode[self.code])

    def read(self, key, bufs, stop=None, verify=False):
        self._maybe_fail("read")
        return self.store.read(key, bufs, stop, verify=verify)

    def write(self, key, nbytes, bufs, stop=None):
        self._maybe_fail("write")
        return self.store.write(key, nbytes, bufs, stop)


def _cache(store, retries, faults=None):
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("nvme", store, math.inf)], EvictionConfig(), metrics, KIB,
                           retries=retries, on_fault=faults.append if faults is not None else None)
    return cache, metrics


def test_a_transient_error_is_retried_and_counted_as_a_retry(bufs):
    store = Flaky(MemoryStore(1 << 20, slab_bytes=16 * KIB), fail=2)
    cache, metrics = _cache(store, retries=3)
    cache.allocate("k", 4, 4 * KIB, bufs)
    assert cache.read("k", bufs).tier == "nvme"
    assert metrics.storage_error_table() == {"storage": {"read": {"failed": 0, "retried": 2, "by_error": {}}}}


def test_an_error_that_persists_past_the_retries_names_tier_path_and_error(tmp_path, bufs):
    fs = FileStore(str(tmp_path), CHUNK)
    faults = []
    cache, metrics = _cache(Flaky(fs, fail=10), retries=2, faults=faults)
    cache.allocate("k", 4, 4 * KIB, bufs)
    with pytest.raises(StorageFault) as info:
        cache.read("k", bufs)
    fault = info.value
    assert fault.errno == errno.EIO and fault.tier == "storage" and fault.op == "read"
    assert str(fs.path_of("k")) in str(fault) and "EIO" in str(fault)
    assert faults == [fault]
    assert metrics.storage_error_table()["storage"]["read"] == {"failed": 1, "retried": 2, "by_error": {"EIO": 1}}
    fs.close()


def test_a_fatal_error_is_not_retried(bufs):
    store = Flaky(MemoryStore(1 << 20, slab_bytes=16 * KIB), fail=5, code=errno.EROFS, op="write")
    cache, metrics = _cache(store, retries=3)
    with pytest.raises(StorageFault):
        cache.allocate("k", 4, 4 * KIB, bufs)
    assert store.fail == 4  # tried once
    assert metrics.storage_error_table()["storage"]["write"]["by_error"] == {"EROFS": 1}
    assert not cache.contains("k")


def test_enospc_message_gives_free_space_against_entry_size(tmp_path):
    fs = FileStore(str(tmp_path), CHUNK)
    fault = describe(OSError(errno.ENOSPC, "No space left on device"), "storage", "write", fs, "k", 3 << 20)
    assert "ENOSPC" in str(fault) and str(fs.path_of("k")) in str(fault)
    assert "entry 3.00 MiB on disk" in str(fault) and "MiB free on that filesystem" in str(fault)
    fs.close()


def test_policy_stops_at_first_fatal_error_and_after_the_threshold_otherwise():
    alarms = []
    policy = ErrorPolicy(2, alarms.append)
    eio = StorageFault(errno.EIO, "storage read of /x failed: EIO", "storage", "read", "/x")
    policy(eio)
    policy(eio)
    assert alarms == []
    policy(eio)
    assert len(alarms) == 1 and "3 storage errors" in alarms[0] and "/x" in alarms[0]
    fatal = []
    ErrorPolicy(100, fatal.append)(StorageFault(errno.ENOSPC, "no space on /y", "storage", "write", "/y"))
    assert fatal == ["no space on /y"]


@pytest.mark.slow  # a real run (wall clock)
def test_persistent_eio_stops_the_run_with_exit_3_and_full_results(quick_settings, sink):
    real_get = FileStore._get

    def failing_get(self, h, offset, view):
        raise OSError(errno.EIO, "Input/output error")

    with mock.patch.object(FileStore, "_get", failing_get):
        results, outcome = execute(quick_settings("--duration", "5"), sink)
        code = exit_status(outcome)
    assert real_get is FileStore._get
    meas = results["measurement"]
    assert code == ExitCode.STORAGE_ERROR
    assert meas["stop_reason"] == "storage error"
    read = meas["storage_errors"]["storage"]["read"]
    assert read["by_error"]["EIO"] == read["failed"] > 0 and read["retried"] == 3 * read["failed"]
    assert "summary" in results or "requests_completed" in results
    assert "Storage errors, storage read" in sink.getvalue()


class FlakyMoves:
    """Wraps an upper tier's store: its next `fail` demotions out of it raise OSError(code)."""

    def __init__(self, store, fail: int, code: int = errno.EIO):
        self.store, self.fail, self.code = store, fail, code
        self.name = store.name

    def __getattr__(self, name):
        return getattr(self.store, name)

    def __contains__(self, key):
        return key in self.store

    def move_to(self, key, dst, bufs, stop=None):
        if self.fail > 0:
            self.fail -= 1
            raise OSError(self.code, errno.errorcode[self.code])
        return self.store.move_to(key, dst, bufs, stop)


def _two_tier_cache(fail: int, retries: int, faults: list):
    metrics = RunMetrics()
    metrics.open_window()
    upper = FlakyMoves(MemoryStore(1 << 20, slab_bytes=16 * KIB), fail)
    lower = MemoryStore(1 << 20, slab_bytes=16 * KIB)
    tiers = [Tier("cpu", upper, 40 * KIB), Tier("nvme", lower, math.inf)]
    return MultiTierCache(tiers, EvictionConfig(), metrics, KIB, retries=retries, on_fault=faults.append), metrics


def test_a_demotion_is_retried_like_any_other_operation(bufs):
    faults = []
    cache, metrics = _two_tier_cache(fail=1, retries=2, faults=faults)
    for i in range(3):  # the third entry pushes the first one down to the storage tier
        cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
    assert cache.entries["k0"].location == "nvme" and "k0" in cache.tier("nvme").store
    table = metrics.storage_error_table()
    assert table["storage"]["demote"] == {"failed": 0, "retried": 1, "by_error": {}}
    assert faults == []


def test_a_failed_demotion_is_a_storage_error_the_policy_sees(bufs):
    faults = []
    cache, metrics = _two_tier_cache(fail=10, retries=2, faults=faults)
    alarms = []
    cache.on_fault = ErrorPolicy(0, alarms.append)
    for i in range(3):
        cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
    assert "k0" not in cache.entries  # the entry is gone from every tier ...
    table = metrics.storage_error_table()
    assert table["storage"]["demote"] == {"failed": 1, "retried": 2, "by_error": {"EIO": 1}}  # ... and counted
    assert len(alarms) == 1 and "storage demote" in alarms[0]  # the policy saw it and stops the run
    assert cache.tier("cpu").used == sum(cache.tier("cpu").cost(e.size) for e in cache.tier("cpu").lru.values())


def test_a_demotion_that_finds_no_ram_is_a_fault_for_the_policy(bufs, monkeypatch):
    from kv_cache.serving import cache as cache_mod
    from kv_cache.storage.base import StoreFull

    faults = []
    cache, metrics = _two_tier_cache(fail=0, retries=0, faults=faults)
    clock = iter(range(0, 10_000, 100))  # each look at the clock is 100 s later: the wait gives up at once
    # cache.py's own clock only: patching the time module itself would also move every other thread's
    # clock in this worker process (a leftover watcher thread once ran the iterator dry: StopIteration)
    monkeypatch.setattr(cache_mod, "time", types.SimpleNamespace(
        monotonic=lambda: float(next(clock)), sleep=lambda s: None, perf_counter_ns=time.perf_counter_ns))

    def full(*args, **kwargs):
        raise StoreFull("no free slabs")

    cache.tiers[0].store.move_to = full
    for i in range(3):
        cache.allocate(f"k{i}", 16, 16 * KIB, bufs)
    assert "k0" not in cache.entries
    assert metrics.storage_error_table()["storage"]["demote"]["by_error"] == {"StoreFull": 1}
    assert len(faults) == 1 and isinstance(faults[0], StorageFault) and "dropped" in str(faults[0])
