"""What the block device really saw: /proc/diskstats counters for the device holding a path.

Also the mount lookup (``/proc/self/mountinfo``) used to name the filesystem type of a directory.
Linux only; everything degrades to ``None`` elsewhere or for devices without a block device
(tmpfs, overlay, NFS, FUSE...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

SECTOR = 512  # /proc/diskstats always counts 512-byte sectors

_MOUNTINFO = "/proc/self/mountinfo"
_DISKSTATS = "/proc/diskstats"


class MountInfo(NamedTuple):
    mount_point: str
    fs_type: str
    source: str
    dev: str  # "major:minor" as mountinfo shows it


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in s:
        return s
    out = []
    i = 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_info(path: str | os.PathLike[str], mountinfo: str = _MOUNTINFO) -> MountInfo | None:
    """The mount holding ``path`` (longest mount-point prefix of its realpath), or None."""
    try:
        real = os.path.realpath(path)
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: MountInfo | None = None
    for line in lines:
        parts = line.split()
        try:
            sep = parts.index("-")
        except ValueError:
            continue
        if sep < 5 or len(parts) < sep + 3:
            continue
        mp = _unescape(parts[4])
        if not (real == mp or mp == "/" or real.startswith(mp.rstrip("/") + "/")):
            continue
        # later lines win on ties: a mount stacked over the same point hides the earlier one
        if best is None or len(mp) >= len(best.mount_point):
            best = MountInfo(mp, parts[sep + 1], _unescape(parts[sep + 2]), parts[2])
    return best


def fs_type(path: str | os.PathLike[str]) -> str:
    """Filesystem type of the mount holding ``path`` ('ext4', 'xfs', 'tmpfs', ...; 'unknown')."""
    mi = mount_info(path)
    return mi.fs_type if mi is not None else "unknown"


class DiskStats(NamedTuple):
    read_ios: int
    read_bytes: int
    write_ios: int
    write_bytes: int
    in_flight: int
    flush_ios: int  # 0 on kernels that do not report flushes


def _name_for_devnum(major: int, minor: int) -> str | None:
    link = Path(f"/sys/dev/block/{major}:{minor}")
    try:
        if link.exists():
            return Path(os.path.realpath(link)).name
    except OSError:
        pass
    return None


def _name_for_source(source: str) -> str | None:
    # btrfs and friends report an anonymous st_dev (0:NN): fall back to the mount source.
    if not source.startswith("/dev/"):
        return None
    try:
        name = Path(os.path.realpath(source)).name
    except OSError:
        return None
    return name if Path("/sys/class/block", name).exists() else None


class BlockDeviceCounter:
    """Read/write byte counters of one block device (a partition or dm device counts on its own)."""

    def __init__(self, name: str, diskstats: str = _DISKSTATS):
        self.name = name
        self._diskstats = diskstats

    @classmethod
    def for_path(cls, path: str | os.PathLike[str]) -> BlockDeviceCounter | None:
        """The counter for the block device holding ``path``; None if there is none (tmpfs, overlay...)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        name = _name_for_devnum(major, minor) if major else None
        if name is None:
            mi = mount_info(path)
            if mi is not None:
                name = _name_for_source(mi.source)
        if name is None:
            return None
        counter = cls(name)
        try:
            counter.stats()
        except OSError:
            return None
        return counter

    def stats(self) -> DiskStats:
        """All counters of interest, now. OSError if the device is gone from /proc/diskstats."""
        with open(self._diskstats, encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 14 and parts[2] == self.name:
                    flush = int(parts[18]) if len(parts) >= 20 else 0
                    return DiskStats(
                        read_ios=int(parts[3]),
                        read_bytes=int(parts[5]) * SECTOR,
                        write_ios=int(parts[7]),
                        write_bytes=int(parts[9]) * SECTOR,
                        in_flight=int(parts[11]),
                        flush_ios=flush,
                    )
        raise OSError(f"block device {self.name!r} not found in {self._diskstats}")

    def snapshot(self) -> tuple[int, int]:
        """(bytes read, bytes written) since boot, from /proc/diskstats sectors x 512."""
        s = self.stats()
        return s.read_bytes, s.write_bytes

    def __repr__(self) -> str:
        return f"BlockDeviceCounter({self.name!r})"
