"""The bytes proved per process, not per device (issue 34): /proc/<pid>/io at the window's edges is the
page-cache check's source when the run has no cgroup of its own; whole-device counters alone are at most
"unverifiable on a shared device"; S3, Redis and RAM tiers say why the check does not apply."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kv_cache.benchmarks.standard.run import execute
from kv_cache.host.procio import IOSnapshot, process_io
from kv_cache.results import integrity as integ

WRITER = """
import os, sys, time
path, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
block = os.urandom(4 << 20)
with open(path, "wb") as f:
    while time.monotonic() < until:
        f.seek(0)
        for _ in range(8):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
"""


def _page_cache(results: dict) -> dict:
    return next(c for c in results["integrity"]["checks"] if c["check"] == "page_cache")


@pytest.fixture
def background_writer(tmp_path):
    """Another process writing (and fsyncing) 32 MiB over and over to the same disk as the run."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "other.bin"), "30"])
    yield proc
    proc.kill()
    proc.wait()


def test_process_counters_count_direct_reads_not_page_cache_hits(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(os.urandom(1 << 20))
    os.sync()
    snap = IOSnapshot(None)
    with open(p, "rb") as f:  # just written: a page-cache hit
        f.read()
    assert snap.delta()["read_bytes"] < (1 << 20)
    assert process_io() is not None


@pytest.mark.slow  # two real 2 s runs beside a writer process
def test_a_buffered_run_served_from_the_page_cache_is_flagged_beside_another_writer(
        quick_settings, sink, monkeypatch, background_writer):
    # what libnofadvise does, inside the process (so the interposer check cannot see it): the page cache stays
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: None)
    from kv_cache.storage import timedio  # the store's fadvise is timedio's (in C where it built)

    monkeypatch.setattr(timedio, "fadvise_dontneed", lambda fd: 0)
    results, _ = execute(quick_settings("--io-mode", "buffered"), sink)
    c = _page_cache(results)
    assert c["status"] == integ.INVALID and c["numbers"]["source"] == "process", c
    n = c["numbers"]
    assert n["process_read_bytes"] < 0.9 * n["counted_read_bytes"]
    # (that device-wide counters moved by another writer would have passed a device-only check is held with
    # fixed figures in test_device_counters_alone_are_unverifiable_on_a_shared_device: how many bytes the
    # writer moves inside this 2 s window depends on the host's load, 91.7 MB against 122 MB read once)
    assert results["integrity"]["verdict"] == integ.INVALID


@pytest.mark.slow
def test_a_direct_run_beside_the_same_writer_is_ok(quick_settings, sink, background_writer):
    results, _ = execute(quick_settings("--io-mode", "direct"), sink)
    c = _page_cache(results)
    assert c["status"] == integ.OK and c["numbers"]["source"] == "process", c
    assert c["numbers"]["other_io_bytes"] > 0  # the writer's bytes, measured: device minus process


def _facts(**kw) -> integ.IntegrityFacts:
    return integ.IntegrityFacts(source="kv-cache", read_bytes=1e9, write_bytes=1e8, **kw)


def test_device_counters_alone_are_unverifiable_on_a_shared_device():
    alone = integ.check_page_cache(_facts(device_read_bytes=2e9, device_write_bytes=1e8))
    assert alone["status"] == integ.UNVERIFIABLE and "shared device" in alone["reason"]
    busy = integ.check_page_cache(_facts(device_read_bytes=2e9, device_write_bytes=5e9, process_read_bytes=0.95e9,
                                         process_write_bytes=1e8))
    assert busy["status"] == integ.OK and busy["numbers"]["source"] == "process"  # the narrower source decides
    own = integ.check_page_cache(_facts(device_read_bytes=2e9, process_read_bytes=2e9, cgroup_read_bytes=0.1e9))
    assert own["status"] == integ.INVALID and own["numbers"]["source"] == "cgroup"


def test_remote_and_ram_tiers_say_why_the_check_does_not_apply():
    ram = integ.check_page_cache(_facts(filesystem="tmpfs", filesystem_kind="memory"))
    assert ram["status"] == integ.NA and "RAM" in ram["reason"] and "no block device" in ram["reason"]
    remote = integ.check_page_cache(_facts(io_mode="network"))
    assert "a remote tier (S3, Redis): no block device or page cache on the client" in remote["reason"]
    counted = integ.check_page_cache(_facts(io_mode="network", net_interface="lo", net_received_bytes=2e9,
                                            net_expected_bytes=1.1e9))
    assert counted["status"] == integ.OK and "no block device or page cache on the client" in counted["reason"]


def test_a_cgroup_of_the_runs_own_counts_its_device_v1_and_v2(tmp_path):
    from kv_cache.host.procio import cgroup_io  # noqa: PLC0415

    v1 = tmp_path / "blkio" / "kv"
    v1.mkdir(parents=True)
    (v1 / "blkio.throttle.io_service_bytes").write_text("253:0 Read 4096\n253:0 Write 8192\n8:0 Read 7\nTotal 12288\n")
    (v1 / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (tmp_path / "v1.cgroup").write_text("7:blkio:/kv\n4:memory:/x\n")
    got = cgroup_io("253:0", str(tmp_path), str(tmp_path / "v1.cgroup"))
    assert got["read_bytes"] == 4096 and got["write_bytes"] == 8192 and got["own"]
    v2 = tmp_path / "run"
    v2.mkdir()
    (v2 / "io.stat").write_text("8:0 rbytes=1 wbytes=2\n253:0 rbytes=300 wbytes=400 rios=1 wios=1\n")
    (v2 / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")  # a process outside the run: not its own
    (tmp_path / "v2.cgroup").write_text("0::/run\n")
    got = cgroup_io("253:0", str(tmp_path), str(tmp_path / "v2.cgroup"))
    assert (got["read_bytes"], got["write_bytes"], got["own"]) == (300, 400, False)
