"""How much memory this process may still use: the smaller of the host's MemAvailable and what its
memory cgroup allows (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, minus what the cgroup already
uses), so that a run sized for the host is not OOM-killed in a container."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class MemoryLimit:
    available: int  # bytes this process may still allocate
    source: str  # what bounds it: "MemAvailable" or the cgroup file

    def describe(self) -> str:
        return f"{self.available / (1 << 30):.2f} GiB ({self.source})"


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def _cgroup_dirs(proc_cgroup: str, root: Path) -> list[tuple[str, Path]]:
    """(version, directory) of this process's memory cgroup and its ancestors, as visible here."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[str, Path]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "" and (root / "cgroup.controllers").exists():
            version, base = "v2", root
        elif "memory" in controllers.split(","):
            version, base = "v1", root / "memory"
        else:
            continue
        path = base / rel.lstrip("/")
        while True:  # the cgroup and every ancestor below the mount: each may limit it
            if path.is_dir():
                found.append((version, path))
            if path == base or base not in path.parents:
                break
            path = path.parent
    return found


def cgroup_headroom(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROUP_ROOT) -> tuple[int, str] | None:
    """(bytes the cgroup still allows, file of the tightest limit), or None: no memory limit."""
    best: tuple[int, str] | None = None
    for version, d in _cgroup_dirs(proc_cgroup, root):
        limit_file, usage_file = (("memory.max", "memory.current") if version == "v2"
                                  else ("memory.limit_in_bytes", "memory.usage_in_bytes"))
        limit = _read_int(d / limit_file)
        if limit is None:
            continue
        room = max(0, limit - (_read_int(d / usage_file) or 0))
        if best is None or room < best[0]:
            best = (room, str(d / limit_file))
    return best


def process_memory_limit(host_ranks: int = 1) -> MemoryLimit:
    """The memory this process may still use (see the module docstring), shared equally with the other
    `host_ranks - 1` ranks of the run on this host (`--processes`, or mpirun's ranks per node): the host's
    room covers all of them, not each."""
    host = mem_available()
    cg = cgroup_headroom()
    limit = MemoryLimit(cg[0], f"cgroup limit {cg[1]}") if cg is not None and cg[0] < host else MemoryLimit(
        host, "MemAvailable")
    return share_of_host(limit, host_ranks)


def share_of_host(limit: MemoryLimit, host_ranks: int) -> MemoryLimit:
    """One rank's part of `limit` when `host_ranks` ranks of the run share the host (itself for 1)."""
    if host_ranks <= 1:
        return limit
    return MemoryLimit(limit.available // host_ranks, f"{limit.source} / {host_ranks} ranks on this host")
