"""--verify: every read checks the per-block stamps; mismatches are counted and the first ones logged with
key and offset."""

import logging
import math
import os

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.cli.exits import exit_status
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.serving.cache import MultiTierCache, Tier
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.base import DataCorruption
from kv_cache.storage.files import HEADER_BYTES, FileStore

KIB = 1024
CHUNK = 64 * KIB


def test_a_corrupted_block_is_counted_and_logged_with_key_and_offset(tmp_path, bufs, caplog):
    fs = FileStore(str(tmp_path), CHUNK, io_mode="buffered")
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("nvme", fs, math.inf)], EvictionConfig(), metrics, KIB, verify=True)
    cache.allocate("k", 32, 32 * KIB, bufs)
    assert cache.read("k", bufs).tier == "nvme"  # intact: verified silently
    with open(fs.path_of("k"), "r+b") as f:  # block 3 of the payload gets another entry's bytes
        f.seek(HEADER_BYTES + 3 * 4096)
        f.write(os.urandom(4096))
    with caplog.at_level(logging.ERROR, logger="kv_cache.cache"), pytest.raises(DataCorruption):
        cache.read("k", bufs)
    assert metrics.verify_mismatches == 1
    assert "'k' block 3 (byte 12288)" in caplog.text
    assert metrics.storage_error_table()["storage"]["read"]["by_error"] == {"DataCorruption": 1}
    fs.close()


@pytest.mark.slow  # a real run (wall clock)
def test_a_verified_run_reports_no_mismatch(quick_settings, sink):
    results, outcome = execute(quick_settings("--verify"), sink)
    code = exit_status(outcome)
    assert code == 0
    assert results["measurement"]["verify"] == {"enabled": True, "mismatches": 0}
    assert "--verify: 0 reads" in sink.getvalue()
