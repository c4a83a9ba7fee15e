"""Host probes: what the machine under the benchmark says about itself, read beside the run and never on its
I/O path.

blockdev.py       block-device counters (/proc/diskstats) and mount facts of the device under a directory
blocktrace.py     per-I/O block-layer latency through bpftrace (--enable-latency-tracing), bpftrace_hist.py its parser
memlimit.py       memory the host and its cgroup allow, checked before anything is allocated
capacity.py       how much of a filesystem's free space a storage tier takes when no capacity is given
rundir.py         the run directory with its marker file, and the stale ones of earlier runs
leftovers.py      run directories of earlier killed runs, removed at start and reported
files.py          keep an existing output as PATH.1 and write atomically: every writer's file policy
"""

from kv_cache.host.blockdev import BlockDeviceCounter, DiskStats, MountInfo, fs_type, mount_info
from kv_cache.host.rundir import MARKER, RUN_PREFIX, RunDir, read_marker, stale_run_dirs

__all__ = [
    "MARKER",
    "RUN_PREFIX",
    "BlockDeviceCounter",
    "DiskStats",
    "MountInfo",
    "RunDir",
    "fs_type",
    "mount_info",
    "read_marker",
    "stale_run_dirs",
]
