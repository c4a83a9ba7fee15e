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
    assert {k: results["measurement"]["verify"][k] for k in ("enabled", "mismatches")} == {"enabled": True, "mismatches": 0}
    assert "every byte of every block" in results["measurement"]["verify"]["checked"]
    assert "--verify: 0 reads differed" in sink.getvalue()


def test_an_overwrite_away_from_every_stamp_is_a_mismatch(tmp_path, bufs):
    """The skeptic's case: bytes changed at byte 8209 of an entry (block 2, 17 bytes past its stamp) were
    invisible to a stamp-only check; every byte of each block is compared now."""
    fs = FileStore(str(tmp_path), CHUNK, io_mode="buffered")
    metrics = RunMetrics()
    metrics.open_window()
    cache = MultiTierCache([Tier("nvme", fs, math.inf)], EvictionConfig(), metrics, KIB, verify=True)
    cache.allocate("k", 32, 32 * KIB, bufs)
    cache.read("k", bufs)
    with open(fs.path_of("k"), "r+b") as f:
        f.seek(HEADER_BYTES + 8209)
        f.write(b"\x00\x01\x02")
    with pytest.raises(DataCorruption, match=r"'k' block 2 \(bytes 8208-12287\) differs from the payload"):
        cache.read("k", bufs)
    assert metrics.verify_mismatches == 1
    fs.close()


def test_an_entry_demoted_from_ram_verifies_on_the_file_tier(tmp_path):
    """A RAM tier lays an entry out without the file's header lead; the file tier still knows its bytes."""
    from kv_cache.storage.buffers import WorkerBuffers  # noqa: PLC0415
    from kv_cache.storage.memory import MemoryStore  # noqa: PLC0415

    b = WorkerBuffers(CHUNK, 7, 0)
    other = WorkerBuffers(CHUNK, 7, 3)
    m = MemoryStore(8 * CHUNK, CHUNK)
    fs = FileStore(str(tmp_path), CHUNK, io_mode="buffered")
    m.write("k", 3 * CHUNK + 99, b)
    m.move_to("k", fs, other)
    fs.read("k", other, verify=True)  # every byte compared: no mismatch
    with open(fs.path_of("k"), "r+b") as f:
        f.seek(HEADER_BYTES + 2 * CHUNK + 100)
        f.write(b"\xff")
    with pytest.raises(DataCorruption, match="differs from the payload"):
        fs.read("k", b, verify=True)
    fs.close()
    m.close()


@pytest.mark.slow  # a real run (wall clock)
def test_files_overwritten_mid_run_make_the_integrity_invalid(quick_settings, sink, tmp_path):
    import threading  # noqa: PLC0415

    done = threading.Event()

    def overwrite() -> None:  # another process's bytes, away from every stamp
        while not done.wait(0.01):
            try:  # the cache directory comes and goes with the run (a walk of it can raise ENOENT)
                found = list((tmp_path / "cache").rglob("*.npy"))
            except OSError:
                continue
            for p in found:
                try:
                    with open(p, "r+b") as f:
                        f.seek(HEADER_BYTES + 8209)
                        f.write(b"\x00" * 3)
                except OSError:
                    pass

    t = threading.Thread(target=overwrite, daemon=True)
    t.start()
    try:
        results, _ = execute(quick_settings("--verify", "--io-mode", "buffered"), sink)
    finally:
        done.set()
        t.join()
    assert results["measurement"]["verify"]["mismatches"] > 0
    assert results["integrity"]["verdict"] == "invalid"
    assert "Integrity: INVALID" in sink.getvalue() and "verify:" in sink.getvalue()
