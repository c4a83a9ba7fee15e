"""Device limits: the rated bandwidth of a storage device and of its PCIe link.

From three places, in order: `--device-limit-gbs` (a figure given), a small YAML of a host's drives and links
(`load_devices`), or the drive's own sysfs entry (`sysfs_limit`: its model, and the PCIe link it trained at,
which bounds any drive behind it). The YAML:

    hosts:
      node1:                      # a host name as the results record it (run_parameters.host, .fs_probe)
        drives:
          - name: nvme0n1
            model: Micron 9550
            read_gbs: 14.0          # rated, decimal GB/s
            write_gbs: 10.0
            pcie: {gen: 5, width: 4}
    drives: [...]                 # the drives of any host not named above

A host's limit is the sum over its drives of min(rated, link) for each direction (one drive: its own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kv_cache.errors import UsageError

# usable GB/s per lane after encoding (PCIe 1-2: 8b/10b; 3-5: 128b/130b; 6: FLIT)
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
_GTS_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


@dataclass(frozen=True)
class Drive:
    name: str
    model: str | None = None
    read_gbs: float | None = None
    write_gbs: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None

    @property
    def link_gbs(self) -> float | None:
        if self.pcie_gen in PCIE_LANE_GBS and self.pcie_width:
            return PCIE_LANE_GBS[self.pcie_gen] * self.pcie_width
        return None

    def limit(self, op: str = "read") -> float | None:
        rated = self.read_gbs if op == "read" else self.write_gbs
        figures = [x for x in (rated, self.link_gbs) if x]
        return min(figures) if figures else None

    def describe(self) -> str:
        link = f", PCIe Gen{self.pcie_gen} x{self.pcie_width} ({self.link_gbs:.1f} GB/s)" if self.link_gbs else ""
        rated = ", rated " + " / ".join(f"{v:g} GB/s {op}" for op, v in (("read", self.read_gbs),
                                                                          ("write", self.write_gbs)) if v) \
            if self.read_gbs or self.write_gbs else ""
        return f"{self.name}" + (f" ({self.model})" if self.model else "") + rated + link


def _drive(d: Any, where: str) -> Drive:
    if not isinstance(d, dict) or not d.get("name"):
        raise UsageError(f"{where}: each drive needs a name (and read_gbs / write_gbs / pcie)")
    pcie = d.get("pcie") or {}
    try:
        return Drive(str(d["name"]), d.get("model"), float(d["read_gbs"]) if d.get("read_gbs") else None,
                     float(d["write_gbs"]) if d.get("write_gbs") else None,
                     int(pcie["gen"]) if pcie.get("gen") else None, int(pcie["width"]) if pcie.get("width") else None)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: drive {d.get('name')}: {exc}") from None


def load_devices(path: str | os.PathLike[str]) -> dict[str, list[Drive]]:
    """host -> drives ("*": the drives of any other host); a one-line UsageError for a bad file."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--devices {path}: cannot read it ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--devices {path}: expected a mapping with hosts: and/or drives:")
    table = {str(h): [_drive(d, f"{path} host {h}") for d in (v or {}).get("drives") or []]
             for h, v in (data.get("hosts") or {}).items()}
    if data.get("drives"):
        table["*"] = [_drive(d, str(path)) for d in data["drives"]]
    return table


def limit_of_host(table: dict[str, list[Drive]], host: str | None, op: str = "read") -> tuple[float, str] | None:
    """(GB/s, what it is) for `host`: the sum of its drives' limits; the only host's when the table names one
    and the result records no host."""
    drives = table.get(host or "") or table.get("*")
    if drives is None and len(table) == 1:
        drives = next(iter(table.values()))
    if not drives:
        return None
    limits = [d.limit(op) for d in drives]
    if any(x is None for x in limits):
        return None
    return sum(limits), "; ".join(d.describe() for d in drives)  # type: ignore[arg-type]


def sysfs_drive(name: str | None, sys_block: str = "/sys/block") -> Drive | None:
    """The drive `name` (e.g. nvme0n1) from sysfs: its model and the PCIe link it trained at (no rated
    figures: sysfs has none). None where sysfs has no such device."""
    if not name:
        return None
    dev = Path(sys_block) / name / "device"
    if not dev.exists():
        return None

    def read(p: Path) -> str | None:
        try:
            return p.read_text().strip()
        except OSError:
            return None

    model = read(dev / "model")
    gen = width = None
    node = Path(os.path.realpath(dev))
    for _ in range(6):  # nvme0n1/device -> nvme0 -> the PCI function with the link attributes
        speed, lanes = read(node / "current_link_speed"), read(node / "current_link_width")
        if speed and lanes:
            gen = _GTS_GEN.get(speed.split()[0])
            width = int(lanes) if lanes.isdigit() else None
            break
        node = node.parent
    return Drive(name, model, None, None, gen, width)


def sysfs_limit(name: str | None) -> dict[str, Any]:
    """measurement.device_limit from sysfs: the link's GB/s where known, else why not."""
    drive = sysfs_drive(name)
    if drive is None:
        return {"gb_per_s": None, "source": None, "note": f"no sysfs entry for block device {name}: no limit known"}
    if drive.link_gbs:
        return {"gb_per_s": drive.link_gbs, "source": f"sysfs: {drive.describe()} (the link; no rated figure in "
                "sysfs)", "model": drive.model}
    return {"gb_per_s": None, "source": None, "model": drive.model,
            "note": f"block device {name} ({drive.model or 'model unknown'}): no PCIe link in sysfs, no limit known "
                    "(give --device-limit-gbs)"}
