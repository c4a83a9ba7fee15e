"""The CPU tier in host RAM: a preallocated slab arena (MemoryStore)."""

from __future__ import annotations

from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.memory import MemoryStore
from kv_cache.storage.tiername import TierName


def _open(request: BackendRequest) -> MemoryStore:
    return MemoryStore(request.capacity_bytes, prefault=request.prefault)


BACKEND = register(Backend(
    name="memory", tier=TierName.CPU, summary="host RAM, a preallocated slab arena (memcpy)",
    capabilities=Capabilities(verify=True, host_ram=True), open=_open,
    selects=lambda tiers: tiers.cpu_mem_gb > 0,
    options=(Option("cpu_mem_gb", "the arena's size (clamped to the memory budget)"),
             Option("strict_memory", "refuse, rather than clamp, an arena that does not fit")),
))
