"""Which storage a results document measured, for every reader that must say it (plots, HTML, compare).

Reads any kind of document: a standard run (`measurement.storage_location`; older documents: the
`measurement` keys run_dir, filesystem, block_device.name, io_mode), a merged one (`rank_storage`, one per
rank) and a sessions run (`parameters.storage_location`). What a document does not say reads "unknown".
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

GIB = float(1 << 30)
UNKNOWN = "unknown"


def kind_of(doc: dict[str, Any]) -> str:
    """'sessions', 'merged' or 'standard' (from schema_version; older files by their keys)."""
    schema = str(doc.get("schema_version") or "")
    if schema.startswith("kv-cache-sessions") or "rungs" in doc:
        return "sessions"
    if schema.startswith("kv-cache-merged") or "per_rank" in doc:
        return "merged"
    return "standard"


def _location_of_measurement(m: dict[str, Any]) -> dict[str, Any]:
    if m.get("storage_location"):
        return dict(m["storage_location"])
    return {"cache_dir": m.get("run_dir"), "filesystem": m.get("filesystem"),
            "filesystem_kind": m.get("filesystem_kind"), "block_device": (m.get("block_device") or {}).get("name"),
            "io_mode": m.get("io_mode")}


def _common(locations: list[dict[str, Any]]) -> dict[str, Any]:
    """One location for several ranks: a fact the ranks share, else their distinct values joined; the cache
    directories by their common parent when they differ (rank0/, rank1/ ...)."""
    if not locations:
        return {}
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for loc in locations for k in loc):
        values = list(dict.fromkeys(str(loc.get(key)) for loc in locations if loc.get(key) is not None))
        if key == "cache_dir" and len(values) > 1:
            out[key] = os.path.commonpath(values) + f" ({len(values)} rank dirs)"
        else:
            out[key] = values[0] if len(values) == 1 else (", ".join(values) if values else None)
    return out


def _tiers(doc: dict[str, Any], kind: str) -> str:
    if kind == "sessions":
        p = doc.get("parameters") or {}
        tiers = ", ".join(p.get("tiers") or []) or UNKNOWN
        return f"{tiers}; HBM {p.get('hbm_gb', UNKNOWN)} GiB x {p.get('num_gpus', '?')} GPU, DRAM {_gib(p.get('dram_gib'))}"
    if kind == "merged":
        ranks = doc.get("rank_parameters") or []
        p = ranks[0] if ranks else {}
        each = f"per rank ({len(ranks)} ranks)" if ranks else f"per rank ({doc.get('ranks', '?')} ranks)"
        return (f"GPU {_gib(p.get('gpu_mem_gb'))}, CPU {_gib(p.get('cpu_mem_gb'))}, storage "
                f"{_capacity(p.get('storage_capacity_gb'))} {each}")
    m, p = doc.get("measurement") or {}, doc.get("run_parameters") or {}
    gpu = m.get("gpu_tier")
    gpu_text = "absent" if gpu in (None, "absent") else _gib(p.get("gpu_mem_gb"))
    cpu = m.get("cpu_tier_bytes")
    cap = m.get("storage_capacity_bytes")
    return (f"GPU {gpu_text}, CPU {_gib(cpu / GIB) if isinstance(cpu, (int, float)) else _gib(p.get('cpu_mem_gb'))}, "
            f"storage {_gib(cap / GIB) if isinstance(cap, (int, float)) else _capacity(p.get('storage_capacity_gb'))}")


def _gib(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return UNKNOWN
    return "none" if v == 0 else f"{v:.3g} GiB"


def _capacity(v: Any) -> str:
    return "auto" if v == 0 else _gib(v)


def storage_facts(doc: dict[str, Any]) -> dict[str, Any]:
    """cache_dir, mount_point, filesystem, filesystem_kind, block_device, io_mode (None when not said), and
    `tiers`, the tier configuration as text, of any kind of results document."""
    kind = kind_of(doc)
    if kind == "sessions":
        loc = dict((doc.get("parameters") or {}).get("storage_location") or {})
    elif kind == "merged":
        loc = _common([dict(s) for s in doc.get("rank_storage") or []])
    else:
        loc = _location_of_measurement(doc.get("measurement") or {})
    keys = ("cache_dir", "mount_point", "filesystem", "filesystem_kind", "block_device", "io_mode")
    out: dict[str, Any] = {k: loc.get(k) for k in keys}
    out["tiers"] = _tiers(doc, kind)
    out["kind"] = kind
    return out


def storage_label(doc: dict[str, Any]) -> str:
    """One line naming the storage: 'ext4 (block device vda) at /mnt/nvme/kv, direct I/O; tiers: ...'."""
    f = storage_facts(doc)
    if f["io_mode"] and str(f["io_mode"]).startswith("trace"):
        return f"no storage I/O (trace mode); tiers: {f['tiers']}"
    fs = f["filesystem"] or "filesystem unknown"
    where = f["block_device"] and f"block device {f['block_device']}" or f["filesystem_kind"] or "no block device"
    if f["block_device"] and f["filesystem_kind"] and f["filesystem_kind"] != "block device":
        where = f"{f['filesystem_kind']}, {where}"
    io = f"{f['io_mode']} I/O" if f["io_mode"] else "I/O mode unknown"
    return f"{fs} ({where}) at {f['cache_dir'] or 'cache dir unknown'}, {io}; tiers: {f['tiers']}"


def wrapped(text: str, width: int = 110) -> str:
    """`text` broken into lines of at most `width` characters, each of its own lines apart (figure titles)."""
    return "\n".join(part for line in text.split("\n") for part in (textwrap.wrap(line, width) or [""]))
