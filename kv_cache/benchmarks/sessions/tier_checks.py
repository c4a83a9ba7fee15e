"""What a sessions rung's offload tiers were, and the flags that say when they cannot answer the question.

`offload_tier(...)` is the rung's `offload_tier` block: which storage the storage tier was on (path,
filesystem, I/O mode, RAM or not, shaping), each shaped tier's shaping (`shaping`: tier -> its settings,
held seconds and paced bytes per direction; the DRAM tier is `cpu`), the load and store latency
percentiles of each offload tier in the window (ms; load = a read from the tier, store = a write into it,
demotions from DRAM included), each tier's capacity, peak use and evictions, and the largest session
context the rung started.

`tier_flags(...)` flags, per rung:
- a storage tier in RAM (tmpfs / ramfs) that is not shaped: it is host memory, faster than any device;
- a tier faster than the GPU's host link: shaped above `host_link_gbs` x TP (each tier at its own shaped
  rate), or not bandwidth-shaped with a measured read bandwidth (one block per move, as one worker sees
  it, times the I/O workers) above it: the link, not the tier, would bound the loads of a real deployment;
- a tier that never filled nor evicted: it held every block offered, so a larger one would change nothing;
- turns that recomputed a prefix because its blocks were evicted from HBM and still queued for a store.
"""

from __future__ import annotations

from typing import Any

from kv_cache.metrics.recorder import GIB
from kv_cache.storage.tiername import TierName

__all__ = ["offload_tier", "tier_flags"]

GB = 1e9
LATENCY_KEYS = ("p50", "p95", "p99")
FULL = 0.95  # of a tier's limit: "filled"


def _latency(metrics: Any, tier: str) -> dict[str, Any]:
    out = {}
    for kind, op in (("load", "read"), ("store", "write")):
        stats = metrics.tier_op(tier, op)
        pct = metrics.op_percentiles_ms(tier, op) if stats.ops else {}
        out[kind] = {"ops": stats.ops, **{f"{k}_ms": pct.get(k) for k in LATENCY_KEYS}}
    return out


def _storage(stores: Any) -> dict[str, Any] | None:
    fs = getattr(stores, "file_store", None)
    if fs is None:
        return None
    shaped = (stores.shaped or {}).get(TierName.STORAGE.value)
    return {"path": str(fs.cache_dir), "filesystem": fs.fs_type, "io_mode": fs.io_mode,
            "io_mode_reason": getattr(fs, "io_mode_reason", None),
            "ram_backed": fs.fs_type in ("tmpfs", "ramfs"),
            "shaping": shaped.stats() if shaped is not None else None}


def offload_tier(stores: Any, cache: Any, metrics: Any, max_context_tokens: int, bytes_per_token: int,
                 io: Any = None, io_workers: int = 1) -> dict[str, Any]:
    """The rung's `offload_tier` block (module docstring); tiers empty for `none`."""
    tiers = []
    for t in (cache.tiers if cache is not None else []):
        limit = t.limit if t.limit != float("inf") else None
        bw = io.read_bandwidth(t.stat_name) if io is not None else None
        tiers.append({"tier": t.stat_name, "limit_gib": limit / GIB if limit else None, "peak_gib": t.peak / GIB,
                      "evictions": t.evictions, "filled": bool(limit) and t.peak >= FULL * limit,
                      "read_gbps_per_move": bw / GB if bw else None,
                      "read_gbps_workers": bw * io_workers / GB if bw else None,
                      "latency_ms": _latency(metrics, t.stat_name)})
    shaped = {tier: store.stats() for tier, store in (getattr(stores, "shaped", None) or {}).items()}
    return {"storage": _storage(stores), "tiers": tiers, "shaping": shaped, "max_context_tokens": max_context_tokens,
            "max_context_gib": max_context_tokens * bytes_per_token / GIB,
            "units": "GiB = 2^30 bytes; GB/s = 10^9 bytes/s"}


def _shaped_rate(block: dict[str, Any], tier: str) -> float | None:
    """The GB/s `tier` was shaped to in this rung (None: not bandwidth-shaped); the per-tier `shaping` map,
    else (a block written before it) the storage tier's `storage.shaping`."""
    shaping = (block.get("shaping") or {}).get(tier)
    if shaping is None and tier == TierName.STORAGE.value:
        shaping = (block.get("storage") or {}).get("shaping")
    return (shaping or {}).get("bandwidth_gbps") or None


def tier_flags(block: dict[str, Any], host_link_gbs: float, tensor_parallel: int, queued_store_turns: int,
               turns: int) -> list[str]:
    """The flags of one rung's offload tiers (module docstring)."""
    flags = []
    storage = block.get("storage")
    shaping = (storage or {}).get("shaping") or {}
    if storage and storage["ram_backed"] and not shaping.get("bandwidth_gbps"):
        flags.append(f"the storage tier is on {storage['filesystem']} (RAM), unshaped: it is host memory, not a "
                     "storage device; give --tier-bandwidth (and --tier-latency) to ask about a real tier")
    link = host_link_gbs * max(1, tensor_parallel)
    for t in block["tiers"]:
        shaped = _shaped_rate(block, t["tier"])
        rate = shaped or t["read_gbps_workers"]
        if link > 0 and rate and rate > link:
            how = "shaped to" if shaped else "measured"
            flags.append(f"the {t['tier']} tier ({how} {rate:.1f} GB/s) is faster than the GPU's host link "
                         f"({link:g} GB/s per replica): a real deployment's loads would be bound by the link")
        if not t["filled"] and t["evictions"] == 0:
            size = f"{t['limit_gib']:.2f}" if t["limit_gib"] else "unlimited"
            flags.append(f"the {t['tier']} tier never filled nor evicted (peak {t['peak_gib']:.2f} of {size} GiB): "
                         "it held every block offered; a larger tier would change nothing here")
    # a tier too small for one session's context: rung_results.failure_flags says it (with what to change)
    if queued_store_turns:
        flags.append(f"{queued_store_turns} of {turns} turns recomputed a prefix whose blocks were evicted from HBM "
                     "but still queued for a store (the tier's writes lag the evictions)")
    return flags
