"""Storage backends, found by a registry: each backend is one module of this package that calls
:func:`register` with a :class:`Backend` entry (its name, the tier it serves, its options, capabilities and
constructor). Nothing else lists them: the tier builder asks :func:`choose` which backend the settings
select for a tier, and :func:`get` for one by name. A backend's own options (:class:`Option` with a flag)
are declared on its entry: the CLI makes their flags, checks their values and hands them to the settings
(`tiers.remote.options`) from here, and ``--storage-backend`` lists the entries that have a `choice`.
Adding a backend is adding one module here (and its test): docs/adding-a-backend.md walks through one.

Entries are loaded on the first lookup (every module of this package is imported once), never at the
import of this package, so importing a store class never drags in its siblings' optional dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kv_cache.registry import Registry
from kv_cache.settings.fields import COPY, Flag, FrozenMap
from kv_cache.settings.run import RemoteTierSettings
from kv_cache.storage.tiername import TierName

if TYPE_CHECKING:  # pragma: no cover  (the settings are read, never imported at run time)
    from kv_cache.settings.run import StorageSettings, TierSettings
    from kv_cache.storage.base import Store
    from kv_cache.storage.remote import RemoteStore

__all__ = ["Backend", "BackendRequest", "Capabilities", "Option", "all_backends", "choose", "find", "get",
           "gpu_backend", "names", "option_errors", "option_flags", "register", "remote_backend", "remote_names",
           "remote_settings", "storage_choices"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, for the builder and the reader of a result."""

    o_direct: bool = False  # can move bytes past the page cache (O_DIRECT)
    verify: bool = False  # its reads can check every block's stamp (--verify)
    device_counters: bool = False  # its I/O reaches a block device whose counters (/proc/diskstats) are read
    host_ram: bool = False  # its bytes live in host RAM: its size counts against the memory budget
    remote: bool = False  # its bytes go to a server over the network (measurement's filesystem_kind "remote")


@dataclass(frozen=True)
class Option:
    """A setting the backend reads and what it does there. Without a `flag`: one declared in the settings
    (a field of TierSettings or StorageSettings). With one: the backend's own, declared here whole: its
    command-line flag, its `default`, `check` (a value's error message, None when it is fine; run
    whichever backend is chosen), its rule across ranks (`split`: settings/fields.py's COPY, SPLIT or
    OFFSET) and, where `owned`, the refusal of a value given while another backend is chosen (a forgotten
    --storage-backend would measure the default tier instead). Its value is `tiers.remote.<name>`."""

    name: str
    help: str
    default: Any = None
    flag: Flag | None = None
    check: Callable[[Any], str | None] = lambda value: None
    split: str = COPY
    owned: bool = False


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
    # Chosen by --storage-backend NAME: `choice` is its entry in that flag's help, `order` its place there and
    # its flags' (lower first); `needs`: (option, the error without it) of those that must be given then.
    choice: str | None = None
    order: int = 100
    needs: tuple[tuple[str, str], ...] = ()
    # How it describes itself: `title`, what its I/O is in its tier's console heading; `location(remote)`,
    # the results' (cache_dir, mount_source) of a remote tier (remote: tiers.remote); `ring(remote, chunk)`,
    # the bytes of each I/O worker's slot ring beside its buffers (what the memory budget counts).
    title: str | None = None
    location: Callable[[Any], tuple[str, str | None]] | None = None
    ring: Callable[[Any, int], int] = lambda remote, chunk: 0
    probe_entries: bool = False  # the I/O-worker probe moves the run's entry sizes (an S3 object's cost is its size)
    # with probe_entries: the most chunks one probe operation takes (remote: tiers.remote; None: the probe's
    # own cap, io_workers.REMOTE_OP_CHUNKS); Redis: one pipelined round trip, the run's worker's unit
    probe_op_chunks: Callable[[Any], int] | None = None


def remote_backend(name: str, summary: str, store: Callable[[BackendRequest], RemoteStore],
                   options: tuple[Option, ...], capacity: str, **describe: Any) -> Backend:
    """The entry of a storage tier on a server, chosen by ``--storage-backend NAME``: `store(request)` opens
    it, and its notes (the sweep of earlier runs' leftovers, what it says of the server, where the run's
    namespace is) go to the results. Its reads can verify, and besides its own `options` it reads what every
    remote store does: the grace after the run's stop, the failover budget and the tier's capacity
    (`capacity`: what 0 means there). `describe`: the entry's choice, order, needs, title, location, ring."""

    def open_store(request: BackendRequest) -> RemoteStore:
        opened = store(request)
        request.notes.extend(opened.swept)
        request.notes.extend(opened.notes)
        request.notes.append(f"storage tier: {opened.run_dir} ({opened.io_mode_reason})")
        return opened

    return Backend(
        name=name, tier=TierName.STORAGE, summary=summary, capabilities=Capabilities(verify=True, remote=True),
        open=open_store, selects=lambda tiers: tiers.remote.storage_backend == name, priority=20, **describe,
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


def register(entry: Backend) -> Backend:
    """Add an entry; its own options' defaults and rules become those of tiers.remote (RemoteTierSettings)."""
    own = [o for o in entry.options if o.flag is not None]
    RemoteTierSettings.option_defaults.update({o.name: o.default for o in own})
    RemoteTierSettings.option_rules.update({o.name: o.split for o in own if o.split != COPY})
    return _REGISTRY.register(entry)


all_backends = _REGISTRY.all  # by name
get = _REGISTRY.get  # KeyError naming the known ones


def names() -> list[str]:
    return [b.name for b in all_backends()]


def choose(tier: TierName, tiers: TierSettings) -> Backend | None:
    """The backend the settings select for `tier` (None: none does, the tier is not built)."""
    chosen = [b for b in all_backends() if b.tier is tier and b.selects(tiers)]
    return max(chosen, key=lambda b: b.priority) if chosen else None


def find(name: str | None) -> Backend | None:
    """The entry called `name` (None: none is, a results document of another version may name one)."""
    _REGISTRY.load()
    return _ENTRIES.get(name or "")


def remote_names() -> tuple[str, ...]:
    """The backends whose tier is a server over the network (s3, redis)."""
    return tuple(b.name for b in all_backends() if b.capabilities.remote)


def storage_choices() -> list[Backend]:
    """The entries --storage-backend offers, in its help's order."""
    return sorted((b for b in all_backends() if b.choice is not None), key=lambda b: (b.order, b.name))


def _own() -> list[tuple[Backend, Option, Flag]]:
    """(backend, option, its flag) of every backend's own option, in --help order."""
    return [(b, o, o.flag) for b in storage_choices() for o in b.options if o.flag is not None]


def option_flags() -> list[tuple[Flag, Any]]:
    """(flag, default) of every backend's own option, in --help order (after --storage-backend's)."""
    return [(flag, o.default) for _, o, flag in _own()]


def _values(args: Any) -> dict[str, Any]:  # (a flag missing from a partial namespace: its default)
    return {o.name: getattr(args, flag.dest, o.default) for _, o, flag in _own()}


def remote_settings(args: Any) -> RemoteTierSettings:
    """settings.tiers.remote from the parsed flags: the backend chosen and the options given."""
    given = {name: v for name, v in _values(args).items() if v != RemoteTierSettings.option_defaults[name]}
    return RemoteTierSettings(getattr(args, "storage_backend", "file"), options=FrozenMap(given))


def option_errors(args: Any) -> list[str]:
    """The errors of the backends' options in a parsed namespace: what the chosen backend needs, the checks
    of the owned options (what is given), an owned option given to another backend, --gds with a backend
    other than files, then the checks of the others (sizes)."""
    chosen = getattr(args, "storage_backend", None) or "file"
    backend, own, value = find(chosen), _own(), _values(args)
    errors = [message for name, message in (backend.needs if backend else ()) if not value.get(name)]
    errors += [p for _, o, _ in own if o.owned for p in [o.check(value[o.name])] if p]
    given = [(b, flag) for b, o, flag in own if o.owned and value[o.name] and b.name != chosen]
    if given:  # a forgotten --storage-backend would otherwise measure the local directory instead
        errors.append(f"{', '.join(flag.name for _, flag in given)} given but --storage-backend is {chosen}: add "
                      f"--storage-backend {given[0][0].name} (or drop the flag)")
    if chosen != "file" and getattr(args, "gds", None):  # (sessions has no --gds: None)
        errors.append(f"--gds reads files into GPU memory; it cannot be combined with --storage-backend {chosen}")
    return errors + [p for _, o, _ in own if not o.owned for p in [o.check(value[o.name])] if p]
