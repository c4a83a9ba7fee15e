import json
import os

import pytest

from kv_cache.host import BlockDeviceCounter, RunDir, mount_info
from kv_cache.host.rundir import MARKER, read_marker, stale_run_dirs
from kv_cache.storage import FileStore

CHUNK = 16 * 4096


def test_blockdev_for_tmp_counts_what_we_write(tmp_path, bufs):
    c = BlockDeviceCounter.for_path(tmp_path)
    if c is None:
        pytest.skip(f"{tmp_path} is not on a block device here")
    assert c.name
    r0, w0 = c.snapshot()
    s = FileStore(tmp_path, CHUNK)
    try:
        for i in range(4):
            s.write(f"k{i}", 2 * CHUNK, bufs)
        r1, w1 = c.snapshot()
        assert r1 >= r0 and w1 >= w0
        if s.io_mode == "direct":  # O_DIRECT + fdatasync: the data reached the device
            assert w1 - w0 >= 4 * 2 * CHUNK
        st = c.stats()
        assert st.write_bytes >= w1 and st.write_ios > 0
    finally:
        s.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_blockdev_none_for_tmpfs():
    assert BlockDeviceCounter.for_path("/dev/shm") is None


def test_blockdev_missing_path():
    assert BlockDeviceCounter.for_path("/nonexistent/path/x") is None


def test_diskstats_parsing(tmp_path):
    ds = tmp_path / "diskstats"
    ds.write_text(
        " 259       0 nvme0n1 10 0 80 5 20 0 160 7 2 30 40 0 0 0 0 3 1\n"
        " 259       1 nvme0n1p1 1 0 8 5 2 0 16 7 0 30 40\n"
    )
    c = BlockDeviceCounter("nvme0n1", diskstats=str(ds))
    assert c.snapshot() == (80 * 512, 160 * 512)
    st = c.stats()
    assert st.read_ios == 10 and st.write_ios == 20 and st.in_flight == 2 and st.flush_ios == 3
    p = BlockDeviceCounter("nvme0n1p1", diskstats=str(ds))
    assert p.snapshot() == (8 * 512, 16 * 512) and p.stats().flush_ios == 0
    with pytest.raises(OSError):
        BlockDeviceCounter("sdz", diskstats=str(ds)).snapshot()


def test_mountinfo_longest_prefix_and_escapes(tmp_path):
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "22 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
        "30 22 0:40 / /mnt/fast\\040disk rw shared:1 - xfs /dev/nvme1n1 rw\n"
        "31 22 0:41 / /mnt/fastx rw - tmpfs tmpfs rw\n"
    )
    m = mount_info("/mnt/fast disk/a/b", mountinfo=str(mi))
    assert m.mount_point == "/mnt/fast disk" and m.fs_type == "xfs" and m.source == "/dev/nvme1n1"
    assert mount_info("/mnt/fastxy", mountinfo=str(mi)).fs_type == "ext4"
    assert mount_info("/mnt/fastx/q", mountinfo=str(mi)).fs_type == "tmpfs"


def test_real_mountinfo_for_tmp(tmp_path):
    m = mount_info(tmp_path)
    assert m is not None and m.fs_type


def test_rundir_marker_and_stale_detection(tmp_path):
    rd = RunDir(tmp_path)
    info = read_marker(rd.path)
    assert info["pid"] == os.getpid()
    assert stale_run_dirs(tmp_path) == []  # we are alive
    # pretend it belongs to a process that is gone
    info["pid"] = 2**22 + 12345
    (rd.path / MARKER).write_text(json.dumps(info))
    assert stale_run_dirs(tmp_path) == [rd.path]
    assert rd.remove() is True
    assert not rd.path.exists()
    assert rd.remove() is True
