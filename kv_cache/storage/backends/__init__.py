"""Storage backends, found by a registry: each backend is one module of this package that calls
:func:`register` with a :class:`Backend` entry (its name, the tier it serves, its options, capabilities and
constructor). Nothing else lists them: the tier builder asks :func:`choose` which backend the settings
select for a tier, and :func:`get` for one by name. Adding a backend is adding one module here (and its
test).

Entries are loaded on the first lookup (every module of this package is imported once), never at the
import of this package, so importing a store class never drags in its siblings' optional dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kv_cache.registry import Registry
from kv_cache.storage.tiername import TierName

if TYPE_CHECKING:  # pragma: no cover  (the settings are read, never imported at run time)
    from kv_cache.settings.run import StorageSettings, TierSettings
    from kv_cache.storage.base import Store
    from kv_cache.storage.remote import RemoteStore

__all__ = ["Backend", "BackendRequest", "Capabilities", "Option", "all_backends", "choose", "get", "names",
           "gpu_backend", "register", "remote_backend"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, for the builder and the reader of a result."""

    o_direct: bool = False  # can move bytes past the page cache (O_DIRECT)
    verify: bool = False  # its reads can check every block's stamp (--verify)
    device_counters: bool = False  # its I/O reaches a block device whose counters (/proc/diskstats) are read
    host_ram: bool = False  # its bytes live in host RAM: its size counts against the memory budget


@dataclass(frozen=True)
class Option:
    """A setting the backend reads (a field of TierSettings or StorageSettings) and what it does there."""

    name: str
    help: str


@dataclass
class BackendRequest:
    """What a backend is opened with. `capacity_bytes`: the size the builder gave a sized tier (after the
    memory budget, for a host-RAM backend; 0 for the storage tier, whose capacity is read from the store);
    `upper`: the store of the tier above (GPUDirect reads land in the GPU tier's device); `notes`: where
    the backend says what it opened, for the results."""

    tier: TierName
    tiers: TierSettings
    storage: StorageSettings
    workers: int = 8
    capacity_bytes: int = 0
    prefault: bool = False
    upper: Store | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Backend:
    """One registry entry. `selects(tiers)`: whether the settings ask for this backend on its tier (the
    highest `priority` among those that do wins); `open(request)`: the opened store (raises
    StorageSetupError for settings it cannot open with)."""

    name: str
    tier: TierName | None  # None: any tier (the trace log stands in for every tier)
    summary: str
    capabilities: Capabilities
    open: Callable[[BackendRequest], Store]
    selects: Callable[[TierSettings], bool] = lambda tiers: False
    priority: int = 0
    options: tuple[Option, ...] = ()
    check: Callable[[TierSettings], object] = lambda tiers: None  # raises StorageSetupError before any sizing


def remote_backend(name: str, summary: str, store: Callable[[BackendRequest], RemoteStore],
                   options: tuple[Option, ...], capacity: str) -> Backend:
    """The entry of a storage tier on a server, chosen by ``--storage-backend NAME``: `store(request)` opens
    it, and its notes (the sweep of earlier runs' leftovers, what it says of the server, where the run's
    namespace is) go to the results. Its reads can verify, and besides its own `options` it reads what every
    remote store does: the grace after the run's stop, the failover budget and the tier's capacity
    (`capacity`: what 0 means there)."""

    def open_store(request: BackendRequest) -> RemoteStore:
        opened = store(request)
        request.notes.extend(opened.swept)
        request.notes.extend(opened.notes)
        request.notes.append(f"storage tier: {opened.run_dir} ({opened.io_mode_reason})")
        return opened

    return Backend(
        name=name, tier=TierName.STORAGE, summary=summary, capabilities=Capabilities(verify=True), open=open_store,
        selects=lambda tiers: tiers.remote.storage_backend == name, priority=20,
        options=(*options, Option("remote_grace_s", "seconds an operation may wait after the run's stop"),
                 Option("remote_failover_s", "seconds a lost server is retried"),
                 Option("storage_capacity_gb", f"the tier's capacity (0: {capacity})")))


def gpu_backend(name: str, mode: str, summary: str, open: Callable[[BackendRequest], Store],
                options: tuple[Option, ...], *, host_ram: bool = False,
                check: Callable[[TierSettings], object] = lambda tiers: None) -> Backend:
    """The entry of the GPU tier when --gpu-tier comes to `mode` ("real", "simulated"; auto: real where CUDA
    is present, gpu_device.gpu_tier_mode): its reads can verify, and besides its own `options` it reads the
    tensor parallelism (each GPU of a group holds its 1/T shard of an entry)."""

    def selects(tiers: TierSettings) -> bool:
        from kv_cache.storage.gpu_device import gpu_tier_mode  # noqa: PLC0415  (not at this package's import)

        return gpu_tier_mode(tiers) == mode

    return Backend(
        name=name, tier=TierName.GPU, summary=summary, capabilities=Capabilities(verify=True, host_ram=host_ram),
        open=open, selects=selects, check=check,
        options=(*options, Option("tensor_parallel", "GPUs per group (each holds the entry's 1/T shard)")))


_REGISTRY: Registry[Backend] = Registry("storage backend", __name__, __path__, key=lambda e: e.name, by_name=True)
_ENTRIES = _REGISTRY.entries  # (tests register a toy entry into it)
register = _REGISTRY.register
all_backends = _REGISTRY.all  # by name
get = _REGISTRY.get  # KeyError naming the known ones


def names() -> list[str]:
    return [b.name for b in all_backends()]


def choose(tier: TierName, tiers: TierSettings) -> Backend | None:
    """The backend the settings select for `tier` (None: none does, the tier is not built)."""
    chosen = [b for b in all_backends() if b.tier is tier and b.selects(tiers)]
    return max(chosen, key=lambda b: b.priority) if chosen else None
