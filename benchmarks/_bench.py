"""Helpers shared by the hand-run benchmark scripts (not part of the kv_cache package, never run in CI).

Running kv-cache and fio under ``/usr/bin/time -v`` (optionally inside a cgroup v1 blkio throttle),
parsing their JSON, fio job files, statistics.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache.metrics.stats import median  # the calling script has put the checkout on sys.path

GIB = 1 << 30
MIB = 1 << 20
HEADER = 4096  # kv-cache's .npy header: every entry file is 4 KiB + the padded payload
TIME_BIN = "/usr/bin/time"
CGROUP_V1_BLKIO = Path("/sys/fs/cgroup/blkio")


# ------------------------------------------------------------------------------------------ tools
def require_tools(need_fio: bool = True) -> None:
    """Exit with a clear message when fio or GNU time is missing."""
    missing = []
    if need_fio and shutil.which("fio") is None:
        missing.append("fio is not installed; it comes from Debian: apt-get install -y fio")
    if not os.access(TIME_BIN, os.X_OK):
        missing.append(f"{TIME_BIN} (GNU time, for peak RSS and CPU) is missing: apt-get install -y time")
    if missing:
        for m in missing:
            sys.stderr.write(f"error: {m}\n")
        sys.exit(2)


def fio_version() -> str:
    try:
        return subprocess.run(["fio", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


def kv_cache_cmd() -> list[str]:
    """The real CLI: ``python -m kv_cache`` of the interpreter running this script (same as `kv-cache`)."""
    return [sys.executable, "-m", "kv_cache"]


def model_bytes_per_token(name: str) -> int:
    from kv_cache.specs.models import MODEL_CONFIGS  # noqa: PLC0415

    return MODEL_CONFIGS[name].bytes_per_token


def settle(seconds: float) -> None:
    """Let the device drain what the previous run left (writeback, discards of unlinked files)."""
    os.sync()
    if seconds > 0:
        time.sleep(seconds)


# ------------------------------------------------------------------------------------------ time -v
def parse_time_v(path: Path) -> dict:
    """user/system CPU seconds, wall seconds and max RSS (KiB) from a GNU ``time -v`` report."""
    out = {"user_s": 0.0, "sys_s": 0.0, "wall_s": 0.0, "max_rss_kib": 0, "exit": None}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("User time (seconds):"):
            out["user_s"] = float(line.split(":")[-1])
        elif line.startswith("System time (seconds):"):
            out["sys_s"] = float(line.split(":")[-1])
        elif line.startswith("Maximum resident set size (kbytes):"):
            out["max_rss_kib"] = int(line.split(":")[-1])
        elif line.startswith("Elapsed (wall clock) time"):
            v = line.split("):", 1)[-1].strip().split(":")
            secs = 0.0
            for part in v:
                secs = secs * 60 + float(part)
            out["wall_s"] = secs
        elif line.startswith("Exit status:"):
            out["exit"] = int(line.split(":")[-1])
    return out


# ------------------------------------------------------------------------------------------ cgroup v1
@dataclass
class Throttle:
    """A cgroup v1 blkio group that limits read and write bytes/s on one block device."""

    device: str  # "major:minor" of the whole disk
    read_bps: int | None  # None: that direction is not limited
    write_bps: int | None
    path: Path = field(default_factory=lambda: CGROUP_V1_BLKIO / f"kv-cache-bench-{os.getpid()}")

    def __enter__(self) -> Throttle:
        self.path.mkdir(exist_ok=True)
        for rw, bps in (("read", self.read_bps), ("write", self.write_bps)):
            if bps:
                (self.path / f"blkio.throttle.{rw}_bps_device").write_text(f"{self.device} {bps}\n")
        return self

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run as a member of the group (sh moves itself in, then execs the tool)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *cmd]

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # members may take a moment to be gone
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def throttle_problem() -> str | None:
    """Why cgroup v1 blkio throttling cannot be used here (None if it can)."""
    if os.geteuid() != 0:
        return "needs root (cgroup v1 blkio)"
    if not (CGROUP_V1_BLKIO / "blkio.throttle.read_bps_device").exists():
        return f"no cgroup v1 blkio controller at {CGROUP_V1_BLKIO}"
    return None


def whole_disk_devnum(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """("major:minor", name) of the whole disk holding ``path`` (blk-throttle wants the disk)."""
    from kv_cache.host.blockdev import BlockDeviceCounter  # noqa: PLC0415

    bd = BlockDeviceCounter.for_path(path)
    if bd is None:
        return None
    sysdir = Path("/sys/class/block") / bd.name
    if (sysdir / "partition").exists():
        sysdir = Path(os.path.realpath(sysdir)).parent
    try:
        return (sysdir / "dev").read_text().strip(), sysdir.name
    except OSError:
        return None


# ------------------------------------------------------------------------------------------ huge pages
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def thp_mode() -> str:
    """The bracketed transparent-huge-page mode ('always', 'madvise', 'never'; 'absent')."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "absent"


def hugepage_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("Hugepagesize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 2 * MIB


class HugePages:
    """Reserve ``count`` more hugetlb pages for the duration (root), restoring the old count after.

    Why: kv-cache's chunk buffers are anonymous mappings advised MADV_HUGEPAGE, so an O_DIRECT request
    can carry physically contiguous 2 MiB pieces; with 4 KiB pages a request is capped by the queue's
    max_segments (virtio-blk: 254 x 4 KiB = 1016 KiB), which costs fio up to a third of its bandwidth
    on such a device.  fio's only huge-page buffers are hugetlb ones (iomem=shmhuge), so the reference
    gets them too: kv-cache is compared with the best fio, not with a handicapped one.
    """

    def __init__(self, count: int):
        self.count = count
        self.before: int | None = None
        self.got = 0

    def __enter__(self) -> HugePages:
        try:
            self.before = int(NR_HUGEPAGES.read_text())
            NR_HUGEPAGES.write_text(f"{self.before + self.count}\n")
            self.got = int(NR_HUGEPAGES.read_text()) - self.before
        except (OSError, ValueError):
            self.got = 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None and self.got > 0:
            try:  # give back what we added (relative: another reservation made meanwhile stays)
                now = int(NR_HUGEPAGES.read_text())
                NR_HUGEPAGES.write_text(f"{max(0, now - self.got)}\n")
            except (OSError, ValueError):
                pass


# ------------------------------------------------------------------------------------------ one at a time
LOCK_PATH = Path("/tmp/kv-cache-bench.lock")


def exclusive(label: str):
    """Hold a system-wide lock for this benchmark (two benchmarks on one device measure each other);
    exit with a message if another one holds it.  Keep the returned file object open."""
    import fcntl  # noqa: PLC0415

    fh = open(LOCK_PATH, "a+")  # noqa: SIM115
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        other = fh.read().strip() or "another benchmark"
        sys.stderr.write(f"error: {other} is running (lock {LOCK_PATH}); benchmarks on one device must "
                         "not overlap\n")
        sys.exit(2)
    fh.seek(0)
    fh.truncate()
    fh.write(f"{label} (pid {os.getpid()})\n")
    fh.flush()
    return fh


# ------------------------------------------------------------------------------------------ disk
def disk_counters(name: str | None) -> tuple[int, int, int, int] | None:
    """(read ios, read bytes, write ios, write bytes) of block device ``name`` from /proc/diskstats."""
    if not name:
        return None
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) >= 10 and p[2] == name:
                    return int(p[3]), int(p[5]) * 512, int(p[7]), int(p[9]) * 512
    except OSError:
        pass
    return None


def disk_delta(before, after) -> dict:
    """Average request size per direction (KiB) over a run: what the device was actually asked."""
    if before is None or after is None:
        return {}
    rio, rb, wio, wb = (a - b for a, b in zip(after, before, strict=True))
    return {
        "device_read_bytes": rb,
        "device_write_bytes": wb,
        "device_avg_read_request_kib": rb / rio / 1024 if rio else None,
        "device_avg_write_request_kib": wb / wio / 1024 if wio else None,
    }


# ------------------------------------------------------------------------------------------ runs
class RunFailed(RuntimeError):
    pass


def run_timed(cmd: list[str], name: str, logs: Path, throttle: Throttle | None = None,
              ok_codes: tuple[int, ...] = (0,), disk: str | None = None) -> dict:
    """Run ``cmd`` under ``time -v`` (inside ``throttle`` if given); stdout+stderr go to logs/name.log."""
    tfile = logs / f"{name}.time"
    full = [TIME_BIN, "-v", "-o", str(tfile), *(throttle.wrap(cmd) if throttle else cmd)]
    log = logs / f"{name}.log"
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(full) + "\n")
        fh.flush()
        d0 = disk_counters(disk)
        proc = subprocess.run(full, stdout=fh, stderr=subprocess.STDOUT, check=False)
        d1 = disk_counters(disk)
    if proc.returncode not in ok_codes:
        tail = log.read_text()[-2000:]
        raise RunFailed(f"{name}: exit status {proc.returncode}; log {log}:\n{tail}")
    t = parse_time_v(tfile)
    t["cmd"] = full
    t["returncode"] = proc.returncode
    t.update(disk_delta(d0, d1))
    return t


def run_kv_cache(args: list[str], name: str, logs: Path, throttle: Throttle | None = None,
                 disk: str | None = None) -> dict:
    """One real `kv-cache` CLI run; returns the storage-tier figures of its results JSON + time -v."""
    out = logs / f"{name}.json"
    t = run_timed([*kv_cache_cmd(), *args, "--output", str(out)], name, logs, throttle, ok_codes=(0, 1),
                  disk=disk)
    d = json.loads(out.read_text())
    cs = d.get("summary", {}).get("cache_stats", {})
    m = d.get("measurement", {})
    window = m.get("window_seconds") or 0.0
    bd = m.get("block_device") or {}
    if cs:
        source = "summary.cache_stats.tier_storage_{read,write}_bandwidth_gbps"
        read = float(cs.get("tier_storage_read_bandwidth_gbps", 0.0))
        write = float(cs.get("tier_storage_write_bandwidth_gbps", 0.0))
    else:
        # No request completed inside the window, so the results carry no summary; the same bytes (ops
        # completed in the window + the part of cut-off ops, device bytes) are in block_device.tool_*.
        source = "measurement.block_device.tool_bytes_{read,written} / window (no request completed)"
        read = bd.get("tool_bytes_read", 0) / GIB / window if window else 0.0
        write = bd.get("tool_bytes_written", 0) / GIB / window if window else 0.0
    return {
        "tool": "kv-cache",
        "read_gibps": read,
        "write_gibps": write,
        "gibps_source": source,
        "window_s": window,
        "io_mode": m.get("io_mode"),
        "io_workers": m.get("io_workers"),
        "chunk_bytes": m.get("chunk_bytes"),
        "achieved_queue_depth": m.get("achieved_queue_depth"),
        "cpu_seconds_per_gib": m.get("cpu_seconds_per_gib"),
        "peak_rss_mib_json": m.get("peak_rss_mib"),
        "peak_rss_mib": t["max_rss_kib"] / 1024,
        "process_cpu_s_time_v": t["user_s"] + t["sys_s"],
        "device_read_gibps": (bd.get("bytes_read", 0) / GIB / window) if window else None,
        "device_write_gibps": (bd.get("bytes_written", 0) / GIB / window) if window else None,
        "requests": d.get("total_requests"),
        "exit": t["returncode"],
        "json": str(out),
        "device_avg_read_request_kib": t.get("device_avg_read_request_kib"),
        "device_avg_write_request_kib": t.get("device_avg_write_request_kib"),
    }


def run_fio(jobfile: str, name: str, logs: Path, throttle: Throttle | None = None,
            disk: str | None = None) -> dict:
    """One fio run of ``jobfile`` (text); returns read/write GiB/s summed over its jobs + time -v."""
    jf = logs / f"{name}.fio"
    jf.write_text(jobfile)
    out = logs / f"{name}.fio.json"
    t = run_timed(["fio", "--output-format=json", f"--output={out}", str(jf)], name, logs, throttle,
                  disk=disk)
    d = json.loads(out.read_text())
    res = {"tool": "fio"}
    # stonewalled phases (groups) run one after the other: the run's time is the sum of the groups'
    groups: dict[int, int] = {}
    for j in d["jobs"]:
        g = int(j.get("groupid", 0))
        groups[g] = max(groups.get(g, 0), j["read"]["runtime"], j["write"]["runtime"])
    elapsed = sum(groups.values()) / 1000.0
    res["seconds"] = elapsed
    for rw in ("read", "write"):
        io = sum(j[rw]["io_bytes"] for j in d["jobs"])
        res[f"{rw}_gibps"] = io / GIB / elapsed if elapsed > 0 else 0.0
        res[f"{rw}_bytes"] = io
    moved = (res["read_bytes"] + res["write_bytes"]) / GIB
    res["cpu_seconds_per_gib"] = (t["user_s"] + t["sys_s"]) / moved if moved else 0.0
    res["peak_rss_mib"] = t["max_rss_kib"] / 1024
    res["json"] = str(out)
    res["device_avg_read_request_kib"] = t.get("device_avg_read_request_kib")
    res["device_avg_write_request_kib"] = t.get("device_avg_write_request_kib")
    return res


def fio_jobfile(rw: str, *, qd: int, chunk: int, duration: float, directory: str | None = None,
                size_range: tuple[int, int] | None = None, nrfiles: int = 1,
                per_job_files: list[list[str]] | None = None, create_only: bool = False,
                unlink: bool = True, fsync_on_close: bool = True, hugetlb: bool = False,
                prewrite: bool = False, jobname: str | None = None) -> str:
    """A fio job file matching kv-cache's storage tier: pvsync (= preadv/pwritev) on O_DIRECT, ``chunk``
    bytes per call, ``qd`` synchronous jobs (queue depth ``qd``), one file after another per job,
    fsync when a written file is closed (kv-cache: one fdatasync per entry), new files (no preallocation).

    Either ``directory`` + ``size_range`` + ``nrfiles`` (fio names and sizes the files) or
    ``per_job_files`` (existing files, one job per list).  ``hugetlb``: I/O buffers in hugetlb pages
    (``iomem=shmhuge``; reserve them first, see :class:`HugePages`).  ``prewrite`` (reads): first every
    job writes one new file of ``size_range`` (a stonewalled phase), then the timed reads start - what a
    kv-cache read-heavy run does (each worker's first request writes its entry, then reads it back).
    """
    name = jobname or rw
    g = [
        "[global]",
        "ioengine=pvsync",
        "direct=1",
        f"bs={chunk}",
        "openfiles=1",
        "file_service_type=sequential",
        "group_reporting=1",
        "randrepeat=1",
        "allrandrepeat=1",
    ]
    if hugetlb:
        g += ["iomem=shmhuge", f"hugepage-size={hugepage_bytes()}"]
    if per_job_files is None:
        if directory is None or size_range is None:
            raise ValueError("directory and size_range are required without per_job_files")
        g += [f"directory={directory}", f"filesize={size_range[0]}-{size_range[1]}"]
    writes = ["fallocate=none", "create_on_open=1"] + (["fsync_on_close=1"] if fsync_on_close else [])
    main = [f"rw={rw}"]
    if create_only:
        main.append("create_only=1")
    else:
        main += ["time_based=1", f"runtime={max(1, math.ceil(duration))}"]
    if rw == "write":
        main += writes
    if unlink:
        main.append("unlink=1")
    sections: list[str] = []
    if prewrite and rw == "read" and per_job_files is None and not create_only:
        sections += ["[prewrite]", "rw=write", f"numjobs={qd}", "nrfiles=1", "unlink=0", *writes, ""]
        main.insert(0, "stonewall")
    if per_job_files is not None:
        for i, files in enumerate(per_job_files):
            sections += [f"[kv{i}]", "filename=" + ":".join(f.replace(":", "\\:") for f in files), *main, ""]
    else:
        sections += [f"[{name}]", f"numjobs={qd}", f"nrfiles={nrfiles}", *main, ""]
    return "\n".join(g + [""] + sections)


# ------------------------------------------------------------------------------------------ stats
def mmm(values: list[float | None]) -> dict:
    """min / median / max / n of the values present (None: a run that produced no figure)."""
    v = [x for x in values if x is not None]
    if not v:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(v), "median": median(v), "max": max(v), "n": len(v)}


def fmt(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m
