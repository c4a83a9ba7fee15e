"""Bytes this process (and a cgroup of its own) caused to move to and from storage.

`/proc/<pid>/io` `read_bytes` / `write_bytes` count what the process made the block layer fetch or send
(O_DIRECT included; page-cache hits are not in them), over all its threads. Where the run has a cgroup of its
own (no process in it outside this one and its children), its per-device counters narrow that to the storage
device: cgroup v2 `io.stat` (rbytes, wbytes) or v1 `blkio.throttle.io_service_bytes` (Read, Write). Linux only;
None elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CGROUP_ROOT = "/sys/fs/cgroup"


def process_io(pid: int | str = "self") -> tuple[int, int] | None:
    """(read_bytes, write_bytes) of /proc/<pid>/io, or None."""
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    vals = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        return int(vals["read_bytes"]), int(vals["write_bytes"])
    except (KeyError, ValueError):
        return None


def _own(procs_file: Path) -> bool:
    """Whether every process in the cgroup is this one or a descendant of it."""
    try:
        pids = [int(x) for x in procs_file.read_text().split()]
    except (OSError, ValueError):
        return False
    me = os.getpid()
    for pid in pids:
        p = pid
        for _ in range(32):
            if p == me:
                break
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
                p = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if p <= 1:
                return False
        else:
            return False
    return bool(pids)


def cgroup_io(dev: str | None, root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> dict[str, Any] | None:
    """This process's cgroup counters for device `dev` ("major:minor"): {"read_bytes", "write_bytes",
    "source", "own"}; None without a cgroup that counts I/O."""
    if not dev:
        return None
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "":  # v2
            for base in (Path(root) / path.lstrip("/"), Path(root) / "unified" / path.lstrip("/")):
                stat = base / "io.stat"
                if stat.exists():
                    for row in stat.read_text().splitlines():
                        parts = row.split()
                        if parts and parts[0] == dev:
                            kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
                            return {"read_bytes": int(kv.get("rbytes", 0)), "write_bytes": int(kv.get("wbytes", 0)),
                                    "source": f"{stat} {dev}", "own": path != "/" and _own(base / "cgroup.procs")}
        if "blkio" in ctrls.split(","):
            base = Path(root) / "blkio" / path.lstrip("/")
            svc = base / "blkio.throttle.io_service_bytes"
            if svc.exists():
                r = w = 0
                for row in svc.read_text().splitlines():
                    parts = row.split()
                    if len(parts) == 3 and parts[0] == dev:
                        r += int(parts[2]) if parts[1] == "Read" else 0
                        w += int(parts[2]) if parts[1] == "Write" else 0
                return {"read_bytes": r, "write_bytes": w, "source": f"{svc} {dev}",
                        "own": path != "/" and _own(base / "cgroup.procs")}
    return None


def device_number(name: str | None, sys_block: str = "/sys/block") -> str | None:
    """"major:minor" of block device `name`."""
    if not name:
        return None
    try:
        return (Path(sys_block) / name / "dev").read_text().strip()
    except OSError:
        return None


class IOSnapshot:
    """Process and cgroup counters at the window's start; `delta()` at its end gives measurement.process_io."""

    def __init__(self, device: str | None) -> None:
        self.dev = device_number(device)
        self.proc0 = process_io()
        self.cg0 = cgroup_io(self.dev)

    def delta(self) -> dict[str, Any] | None:
        proc1 = process_io()
        if self.proc0 is None or proc1 is None:
            return None
        out: dict[str, Any] = {"read_bytes": proc1[0] - self.proc0[0], "write_bytes": proc1[1] - self.proc0[1],
                               "processes": 1, "source": "/proc/self/io read_bytes/write_bytes (every thread of "
                               "this process; page-cache hits are not in them)"}
        cg1 = cgroup_io(self.dev)
        if self.cg0 is not None and cg1 is not None:
            out["cgroup"] = {"read_bytes": cg1["read_bytes"] - self.cg0["read_bytes"],
                             "write_bytes": cg1["write_bytes"] - self.cg0["write_bytes"],
                             "source": cg1["source"], "own": bool(cg1["own"] and self.cg0["own"])}
        return out
