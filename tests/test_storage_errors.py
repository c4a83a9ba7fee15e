"""The storage-error policy: transient errors retried a bounded number of times, every error counted per
tier and operation, messages with path and cause, a threshold after which the run stops (exit 3)."""

import errno
import math
from unittest import mock

import pytest

from kv_cache.app import execute
from kv_cache.cache import MultiTierCache, Tier
from kv_cache.config.sections import EvictionConfig
from kv_cache.driver.error_policy import ErrorPolicy
from kv_cache.errors import ExitCode
from kv_cache.metrics.recorder import RunMetrics
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
        results, code = execute(quick_settings("--duration", "5"), sink)
    assert real_get is FileStore._get
    meas = results["measurement"]
    assert code == ExitCode.STORAGE_ERROR
    assert meas["stop_reason"] == "storage error"
    read = meas["storage_errors"]["storage"]["read"]
    assert read["by_error"]["EIO"] == read["failed"] > 0 and read["retried"] == 3 * read["failed"]
    assert "summary" in results or "requests_completed" in results
    assert "Storage errors, storage read" in sink.getvalue()
