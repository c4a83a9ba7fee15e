"""The one builder of the serving path: every benchmark (the standard run, each sessions rung) opens its
tiers and its cache here, so both get the same storage backends, memory budget, leftovers sweep,
automatic capacity, transient-error retries, --verify and the offload tiers' shaping (--tier-bandwidth,
--tier-latency: storage/shaped.py wraps each shaped tier's store, the CPU tier's and/or the storage tier's;
TierSet.file_store and TierSet.memory_store stay the bare stores, so the storage tier's filesystem, path and
I/O mode are still read there). The error policy is the caller's event loop's
(it turns the policy's alarm into its stop): pass it as `on_fault`, or set ``cache.on_fault`` later."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kv_cache.serving.cache import MultiTierCache
from kv_cache.serving.tiers import TierSet, open_tiers
from kv_cache.storage.shaped import ShapedStore, Shaping
from kv_cache.storage.tiername import TierName

if TYPE_CHECKING:  # pragma: no cover  (the settings are read, never imported at run time)
    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.settings.run import StorageSettings, TierSettings
    from kv_cache.settings.sections import EvictionConfig
    from kv_cache.storage.faults import StorageFault

__all__ = ["open_cache", "shape_tiers"]


def open_cache(tiers: TierSettings, storage: StorageSettings, eviction: EvictionConfig, metrics: RunMetrics,
               bytes_per_token: int, stop: threading.Event | None, stores: TierSet, *,
               io_trace_log: str | None = None, workers: int = 8, largest_entry: int = 0, other_bytes: int = 0,
               sharers: int = 1, storage_tier: bool = True, last_ram_fraction: float = 1.0,
               on_fault: Callable[[StorageFault], None] | None = None) -> MultiTierCache | None:
    """Open the stores into `stores` (see open_tiers for the sizing arguments) and the cache over them,
    with `storage.io_retries` retries of a transient error and `storage.verify`; None when no tier was
    built (a sessions rung without offload tiers)."""
    open_tiers(tiers, storage, io_trace_log, stores, workers, largest_entry, other_bytes, sharers=sharers,
               storage_tier=storage_tier, last_ram_fraction=last_ram_fraction)
    if not stores.tiers:
        return None
    watch = getattr(stores.file_store, "watch", None)
    if watch is not None:  # a remote tier: its operations' deadline is tied to the run's stop (storage/remote.py)
        watch(stop)
    if io_trace_log is None:  # trace mode logs operations instead of doing them: nothing to shape
        shape_tiers(stores, {tier: Shaping(gbps, ms) for tier, (gbps, ms) in storage.tier_shaping().items()},
                    stop=stop)
    return MultiTierCache(stores.tiers, eviction, metrics, bytes_per_token, stop, tracer=stores.tracer,
                          retries=storage.io_retries, verify=storage.verify, on_fault=on_fault)


def shape_tiers(stores: TierSet, shaping: Shaping | Mapping[str, Shaping],
                stop: threading.Event | None = None) -> None:
    """Wrap each shaped offload tier's store in a ShapedStore (its own read and write buckets): `shaping` is
    {tier name (cpu, storage): its Shaping}, or one Shaping for the storage tier alone. Inactive shapings
    and the GPU tier are left as they are; each wrapped tier is noted in `stores.notes` and kept in
    `stores.shaped` (tier name -> the wrapper, for its stats). `stop` (the run's) ends every hold."""
    wanted = {TierName.STORAGE: shaping} if isinstance(shaping, Shaping) else \
        {TierName.of(name): s for name, s in shaping.items()}
    for tier in stores.tiers:
        how = wanted.get(tier.kind)
        if how is None or not how.active or tier.kind is TierName.GPU or tier.store is None \
                or isinstance(tier.store, ShapedStore):
            continue
        tier.store = ShapedStore(tier.store, how, stop)
        stores.shaped[tier.stat_name] = tier.store
        what = "storage tier" if tier.kind is TierName.STORAGE else "cpu (DRAM) tier"
        stores.notes.append(f"the {what}'s real I/O is shaped: {how.describe()} "
                            "(token bucket per direction; the sleeps count as I/O time)")
