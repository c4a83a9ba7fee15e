"""The multi-tier KV cache: decides WHERE each entry lives (GPU -> CPU -> storage waterfall LRU).

Placement is the MLPerf kv-cache tool's (kept for comparable results): new entries go to the fastest
tier that can make room, pushing least-recently-used entries one tier down; the last tier deletes LRU
entries when it is full. Guarantees:
- placement decisions and reservations are made atomically under one lock, so a key is never
  allocated twice and every reserved byte belongs to exactly one pending write or move;
- demotions move the real bytes (read from the upper tier, write to the lower one) and are recorded
  as I/O of those tiers;
- an entry that is being written or moved is never read from a stale location: readers wait.
I/O itself always happens outside the lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from kv_cache.errors import StorageError
from kv_cache.metrics import names
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.settings.sections import EvictionConfig
from kv_cache.storage.base import DataCorruption, IOAborted, IOResult, Store, StoreFull
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.faults import StorageFault, describe, is_transient
from kv_cache.storage.tiername import TierName

log = logging.getLogger("kv_cache.cache")

_T = TypeVar("_T")

# Tier names as in the MLPerf tool ('nvme' is the storage tier); statistics use 'storage' for it. Both are
# spellings of one TierName (storage/tiername.py); this map is the MLPerf name -> statistics name.
STAT_NAMES = {t.legacy: t.value for t in TierName}


class CacheRead(NamedTuple):
    tier: str | None  # None: a miss
    ns: int
    nbytes: int
    in_window: bool  # the read completed inside the measured window (its hit was counted)


@dataclass(eq=False, slots=True)
class Entry:
    key: str
    size: int
    tokens: int
    location: str
    last_access: float
    access_count: int = 1
    readers: int = 0
    writing: bool = True
    moving: bool = False


@dataclass(eq=False)
class Tier:
    name: str  # the MLPerf name of its TierName: 'gpu' | 'cpu' | 'nvme'
    store: Store
    limit: float  # bytes; math.inf = unlimited
    used: int = 0  # reserved bytes (entries present + writes/moves in flight)
    peak: int = 0  # the most bytes ever reserved
    evictions: int = 0  # entries deleted (last tier) or moved down (upper tiers) to make room
    lru: OrderedDict = field(default_factory=OrderedDict)  # key -> Entry, oldest first
    # the largest footprint one entry may have here (a GPU tier: one GPU's share, as an entry is never split
    # over GPUs); a larger entry goes to the next tier instead of waiting for room no GPU can ever have
    max_entry: float = math.inf

    @property
    def kind(self) -> TierName:
        return TierName.of(self.name)

    @property
    def stat_name(self) -> str:
        return self.kind.value

    def cost(self, nbytes: int) -> int:
        """Bytes of this tier's capacity an entry occupies (a RAM arena allocates whole slabs)."""
        footprint = getattr(self.store, "footprint", None)
        return footprint(nbytes) if footprint is not None else nbytes


@dataclass(slots=True)
class _Step:
    kind: str  # 'move' | 'delete'
    entry: Entry
    src: Tier
    dst: Tier | None


MIB = 1 << 20
ROOM_WAIT_S = 30.0  # longest an allocation waits for entries being read or written to make room


class CapacityError(StorageError):
    """The storage tier is full and nothing in it can be evicted now (the capacity is a hard limit)."""


class EntryTooLarge(CapacityError):
    """An entry larger than the whole storage tier: it can never be stored."""


# How many mismatching reads --verify logs in full (key and offset); the rest are only counted.
VERIFY_LOG_LIMIT = 5


class MultiTierCache:
    def __init__(self, tiers: list[Tier], policy: EvictionConfig, metrics: RunMetrics, bytes_per_token: int,
                 stop: threading.Event | None = None, tracer=None, retries: int = 0, verify: bool = False,
                 on_fault: Callable[[StorageFault], None] | None = None) -> None:
        """`retries`: how many times an operation failing with a transient error (EIO, ENOTCONN, EAGAIN)
        is tried again; `verify`: every read checks the per-block stamps; `on_fault`: told of every storage
        error left after retries (the driver's error policy)."""
        if not tiers:
            raise ValueError("at least one tier is required")
        self.tiers = tiers
        self.policy = policy
        self.metrics = metrics
        self.bytes_per_token = bytes_per_token
        self.stop = stop
        self.tracer = tracer  # optional: gets every operation (the --io-trace-log mode)
        self.retries = retries
        self.verify = verify
        self.on_fault = on_fault
        self.entries: dict[str, Entry] = {}
        self._cond = threading.Condition(threading.Lock())
        self._by_name = {t.name: t for t in tiers}
        # entries that skipped a tier because they are larger than its share (one GPU's, or the whole tier):
        # the waterfall put them in the next tier that could hold them; counted over the whole run, per tier
        self.skipped: dict[str, int] = dict.fromkeys((t.name for t in tiers[:-1]), 0)

    # -- public API ---------------------------------------------------------------------------
    def tier(self, name: str) -> Tier:
        return self._by_name[name]

    def allocate(self, key: str, tokens: int, nbytes: int, bufs: WorkerBuffers, cause: str = "prefill") -> tuple[str | None, int]:
        """Store a new entry. Returns (tier name, I/O ns spent on behalf of this call incl. evictions).

        (existing tier, 0) if the key is already present or being written: nothing is written twice.
        """
        tier, ns, _ = self.allocate_sized(key, tokens, nbytes, bufs, cause)
        return tier, ns

    def allocate_sized(self, key: str, tokens: int, nbytes: int, bufs: WorkerBuffers,
                       cause: str = "prefill") -> tuple[str | None, int, bool]:
        """As allocate, plus whether this call wrote the entry (False: it already existed).

        The storage tier's capacity is a hard limit: an entry larger than it is refused (EntryTooLarge);
        while every entry that could make room is being read or written, the call waits for them (and
        gives up with CapacityError after ROOM_WAIT_S or at stop)."""
        self._refuse_too_large(key, nbytes)
        spent = 0
        give_up = None
        while True:
            with self._cond:
                existing = self.entries.get(key)
                if existing is not None:
                    return existing.location, spent, False
                plan: list[_Step] = []
                if give_up is None:
                    self._count_skips(nbytes)
                tier = self._place(nbytes, plan)
                if tier is not None:
                    entry = Entry(key=key, size=nbytes, tokens=tokens, location=tier.name,
                                  last_access=time.monotonic())
                    self.entries[key] = entry
            spent += self._execute(plan, bufs)
            if tier is not None:
                break
            give_up = give_up or time.monotonic() + ROOM_WAIT_S
            if self.stop is not None and self.stop.is_set():
                raise IOAborted(f"write of {key!r} abandoned at stop while waiting for room", 0)
            if time.monotonic() > give_up:
                raise CapacityError(f"no room for entry {key!r} ({nbytes / MIB:.1f} MiB) in the storage tier "
                                    f"for {ROOM_WAIT_S:.0f} s: every entry in it was being read or written")
            with self._cond:
                self._cond.wait(0.01)
        try:
            _begin_marks(bufs)
            res = self._write_when_room(tier, key, nbytes, bufs)
        except BaseException as exc:
            with self._cond:
                tier.used -= tier.cost(nbytes)
                self.entries.pop(key, None)
                self._cond.notify_all()
            self._note_failure(tier, "write", exc, bufs)
            raise
        end = time.perf_counter_ns()
        with self._cond:
            entry.writing = False
            tier.lru[key] = entry
            self._cond.notify_all()
        self._record(tier, "write", res, end, cause, tokens, key, bufs)
        return tier.name, spent + res.total_ns, True

    def _count_skips(self, nbytes: int) -> None:
        """Count the upper tiers this new entry can never be placed in (larger than one GPU's share or
        than the share of the tier one entry may take, `large_entry_limit_ratio` of it, as `_ensure_space`
        places them): it skips them, as in the MLPerf tool's waterfall. Called with the lock held."""
        ratio = self.policy.large_entry_limit_ratio
        for tier in self.tiers[:-1]:
            cost = tier.cost(nbytes)
            if cost > tier.max_entry or cost > tier.limit * ratio:
                self.skipped[tier.name] += 1
                self.metrics.count(names.tier_skips(tier.stat_name))

    def _refuse_too_large(self, key: str, nbytes: int) -> None:
        last = self.tiers[-1]
        cost = last.cost(nbytes)
        if cost > last.limit:
            raise EntryTooLarge(
                f"entry {key!r} needs {cost / MIB:.1f} MiB, more than the whole storage tier "
                f"({last.limit / MIB:.1f} MiB): raise the storage capacity or use a smaller model or context")

    def _write_when_room(self, tier: Tier, key: str, nbytes: int, bufs: WorkerBuffers) -> IOResult:
        # A RAM tier's slabs are freed when a concurrent demotion out of it finishes; the space is
        # already reserved for this entry, so wait for that demotion rather than failing the request.
        return self._when_room("write", tier, "write", key, nbytes,
                               lambda: tier.store.write(key, nbytes, bufs, self.stop))

    def _when_room(self, what: str, tier: Tier, op: str, key: str, nbytes: int, call: Callable[[], _T]) -> _T:
        """`_retrying(...)`, tried again every 2 ms for up to 60 s while the RAM tier is full (StoreFull),
        and abandoned (IOAborted, naming `what`) once the run stops."""
        give_up = time.monotonic() + 60.0
        while True:
            try:
                return self._retrying(tier, op, key, nbytes, call)
            except StoreFull:
                if self.stop is not None and self.stop.is_set():
                    raise IOAborted(f"{what} of {key!r} abandoned at stop while waiting for RAM", 0) from None
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.002)

    def access(self, key: str, bufs: WorkerBuffers, cause: str = "decode") -> tuple[str | None, int]:
        """Read a whole entry. Returns (tier, ns) or (None, 0) on a miss."""
        res = self.read(key, bufs, cause)
        return res.tier, res.ns

    def read(self, key: str, bufs: WorkerBuffers, cause: str = "decode") -> CacheRead:
        """Read a whole entry. What a hit means for the workload (system prompt, earlier turn...) is the
        caller's to count; `in_window` says whether this read's hit counted in the measured window."""
        with self._cond:
            entry = self.entries.get(key)
            while entry is not None and (entry.writing or entry.moving):
                if self.stop is not None and self.stop.is_set():
                    return CacheRead(None, 0, 0, False)
                self._cond.wait(0.05)
                entry = self.entries.get(key)
            if entry is None:
                self.metrics.count(names.CACHE_MISSES, end_ns=time.perf_counter_ns())
                return CacheRead(None, 0, 0, False)
            entry.readers += 1
            entry.last_access = time.monotonic()
            entry.access_count += 1
            tier = self._by_name[entry.location]
            tier.lru.move_to_end(key)
        try:
            _begin_marks(bufs)
            res = self._retrying(tier, "read", key, entry.size,
                                 lambda: tier.store.read(key, bufs, self.stop, verify=self.verify))
        except BaseException as exc:
            self._note_failure(tier, "read", exc, bufs)
            if isinstance(exc, Exception) and not isinstance(exc, IOAborted):
                self.metrics.count(names.CACHE_MISSES)  # a read that failed found nothing: a miss, never a hit
            raise
        finally:
            with self._cond:
                entry.readers -= 1
                if entry.readers == 0:
                    self._cond.notify_all()
        end = time.perf_counter_ns()
        counted = self._record(tier, "read", res, end, cause, entry.tokens, key, bufs)
        if counted:
            self.metrics.count(names.CACHE_HITS)
        return CacheRead(tier.name, res.total_ns, res.nbytes, counted)

    def delete(self, key: str) -> bool:
        """Remove an entry from whichever tier holds it (waits for a write, move or reads in progress)."""
        with self._cond:
            entry = self.entries.get(key)
            while entry is not None and (entry.writing or entry.moving or entry.readers):
                self._cond.wait(0.05)
                entry = self.entries.get(key)
            if entry is None:
                return False
            tier = self._by_name[entry.location]
            del self.entries[key]
            del tier.lru[key]
            tier.used -= tier.cost(entry.size)
            self._cond.notify_all()
        tier.store.delete(key)
        self.metrics.count(names.tier_deletions(tier.stat_name))
        return True

    def contains(self, key: str) -> bool:
        with self._cond:
            return key in self.entries

    def usage(self) -> dict[str, dict[str, float]]:
        with self._cond:
            return {
                t.name: {"used_bytes": t.used, "limit_bytes": t.limit, "entries": len(t.lru), "peak_bytes": t.peak,
                         "evictions": t.evictions, "skipped_entries": self.skipped.get(t.name, 0),
                         "max_entry_bytes": t.max_entry}
                for t in self.tiers
            }

    def entry_sizes(self) -> list[int]:
        with self._cond:
            return [e.size for e in self.entries.values() if not e.writing]

    def clear(self, bufs: WorkerBuffers | None = None) -> None:
        """Delete every entry from every tier (end of run)."""
        with self._cond:
            items = [(self._by_name[e.location], k) for k, e in self.entries.items()]
            self.entries.clear()
            for t in self.tiers:
                t.lru.clear()
                t.used = 0
        for tier, key in items:
            try:
                tier.store.delete(key)
            except OSError as exc:  # cleanup must go on
                log.warning("could not delete %s from %s: %s", key, tier.name, exc)

    # -- placement ----------------------------------------------------------------------------
    def _place(self, nbytes: int, plan: list[_Step]) -> Tier | None:
        """The tier the entry goes to (its space reserved), or None: no tier can make room now."""
        for i in range(len(self.tiers)):
            if self._ensure_space(i, nbytes, plan, 0):
                return self.tiers[i]
        return None

    def _first_evictable(self, tier: Tier) -> Entry | None:
        for entry in tier.lru.values():
            if entry.readers == 0 and not entry.moving and not entry.writing:
                return entry
        return None

    def _ensure_space(self, index: int, required: int, plan: list[_Step], depth: int) -> bool:
        """Waterfall LRU (the MLPerf tool's rules), planning only: makes room in tier `index` by moving its
        least-recently-used entries one tier down (recursively) or, in the last tier, deleting them;
        reserves space and appends the moves and deletions that must run first. Called with the lock held."""
        p = self.policy
        tier = self.tiers[index]
        required = tier.cost(required)
        is_last = index == len(self.tiers) - 1
        limit = tier.limit
        if is_last and math.isinf(limit):  # an unbounded last tier (S3, Redis without maxmemory) still has a peak
            tier.used += required
            tier.peak = max(tier.peak, tier.used)
            return True
        if depth > p.max_recursion_depth:
            log.debug("eviction recursion limit reached in %s", tier.name)
            return False
        if not is_last and (required > limit * p.large_entry_limit_ratio or required > tier.max_entry):
            return False
        effective = limit if is_last else limit * p.target_usage_ratio
        budget = min(p.max_evictions_hard_cap, max(p.max_evictions_min, len(tier.lru) + 100))
        for iteration in range(budget):
            # the MLPerf tool's "< 5 % used" shortcut, but never past the tier's capacity
            if tier.used + required <= effective or (tier.used < 0.05 * limit and tier.used + required <= limit):
                tier.used += required
                tier.peak = max(tier.peak, tier.used)
                return True
            if (not is_last and iteration == 0 and tier.used < 0.2 * limit
                    and required > 0.5 * limit * p.target_usage_ratio):
                return False
            victim = self._first_evictable(tier)
            if victim is None:  # everything left is being read, written or moved: no room now
                return False
            if is_last:
                tier.evictions += 1
                del tier.lru[victim.key]
                del self.entries[victim.key]
                tier.used -= tier.cost(victim.size)
                victim.moving = True
                plan.append(_Step("delete", victim, tier, None))
            else:
                if not self._ensure_space(index + 1, victim.size, plan, depth + 1):
                    return False
                del tier.lru[victim.key]
                tier.used -= tier.cost(victim.size)
                victim.moving = True
                plan.append(_Step("move", victim, tier, self.tiers[index + 1]))
                tier.evictions += 1
        return False

    def _execute(self, plan: list[_Step], bufs: WorkerBuffers) -> int:
        """Run planned deletions and demotions, deepest first (the plan is already in that order)."""
        spent = 0
        for step in plan:
            entry = step.entry
            if step.kind == "delete":
                t0 = time.perf_counter_ns()
                try:
                    step.src.store.delete(entry.key)
                except OSError as exc:
                    self.metrics.record_error(f"{step.src.stat_name}_delete", exc)
                spent += time.perf_counter_ns() - t0
                self.metrics.count(names.EVICTIONS)
                self.metrics.count(names.tier_deletions(step.src.stat_name))
                continue
            dst = step.dst
            try:
                _begin_marks(bufs)
                read_res, write_res = self._move_when_room(step.src, dst, entry, bufs)
            except BaseException as exc:
                # The entry is dropped (not half-kept): its reservation in dst is returned, the source
                # copy removed, and the failure counted like any other operation's (storage errors per
                # tier and operation, and the error policy, which may stop the run).
                with self._cond:
                    dst.used -= dst.cost(entry.size)
                    self.entries.pop(entry.key, None)
                    self._cond.notify_all()
                try:
                    step.src.store.delete(entry.key)
                except OSError:
                    pass
                if isinstance(exc, OSError):
                    exc = describe(exc, dst.stat_name, "demote", dst.store, entry.key, entry.size)
                self._note_failure(dst, "demote", exc, bufs, src=step.src)
                if isinstance(exc, Exception) and not isinstance(exc, (OSError, IOAborted)) and self.on_fault:
                    self.on_fault(self._lost_entry_fault(exc, dst, entry))
                if isinstance(exc, (IOAborted, StoreFull, OSError)):
                    continue
                raise
            end = time.perf_counter_ns()
            with self._cond:
                entry.location = dst.name
                entry.moving = False
                dst.lru[entry.key] = entry
                dst.lru.move_to_end(entry.key, last=False)  # it was the LRU entry above: oldest below
                self._cond.notify_all()
            self._record(step.src, "read", read_res, end, "demotion", entry.tokens, entry.key, bufs, "read")
            self._record(dst, "write", write_res, end, "demotion", entry.tokens, entry.key, bufs, "write")
            self.metrics.count(names.EVICTIONS)
            if dst.kind is TierName.CPU:
                self.metrics.count(names.OFFLOADS_CPU)
            elif dst.kind is TierName.STORAGE:
                self.metrics.count(names.OFFLOADS_STORAGE)
            spent += read_res.total_ns + write_res.total_ns
        return spent

    # -- accounting ---------------------------------------------------------------------------
    def _record(self, tier: Tier, op: str, res: IOResult, end_ns: int, cause: str, tokens: int, key: str = "",
                bufs: WorkerBuffers | None = None, side: str = "") -> bool:
        """`side`: `res` is that side ("read" / "write") of a demotion (its marks keep each side's bytes)."""
        if self.tracer is not None:
            self.tracer.log(op, res.nbytes, tier.name, key, cause)
        ok = self.metrics.record_io(tier.stat_name, op, res, end_ns, cause, getattr(bufs, "marks", None), side)
        if ok and tier.kind is TierName.STORAGE:
            self.metrics.count(names.STORAGE_TOKENS_PROCESSED, tokens)
        return ok

    def _move_when_room(self, src: Tier, dst: Tier, entry: Entry, bufs: WorkerBuffers) -> tuple[IOResult, IOResult]:
        """Demote `entry` from `src` to `dst` with the retries of every other operation; a RAM destination
        whose slabs are still held by a demotion out of it is waited for, as a write is."""
        return self._when_room("move", dst, "demote", entry.key, entry.size,
                               lambda: src.store.move_to(entry.key, dst.store, bufs, self.stop))

    @staticmethod
    def _lost_entry_fault(exc: Exception, tier: Tier, entry: Entry) -> StorageFault:
        """A demotion that failed without an OSError (no room left in a RAM tier after the wait) as the
        error policy sees it: an entry lost this way is never left out of the policy's count."""
        fault = StorageFault(None, f"{tier.stat_name} demote of {entry.key!r} failed: {type(exc).__name__} "
                             f"({exc}); the entry was dropped", tier.stat_name, "demote", None)
        fault.__cause__ = exc
        return fault

    def _retrying(self, tier: Tier, op: str, key: str, nbytes: int, call: Callable[[], _T]) -> _T:
        """`call()`, tried again up to `retries` times on a transient error; any OSError left is raised as
        a StorageFault naming the path and the error. A store undoes a failed operation, so a retry starts
        clean."""
        attempt = 0
        while True:
            try:
                return call()
            except OSError as exc:
                stopping = self.stop is not None and self.stop.is_set()
                if is_transient(exc) and attempt < self.retries and not stopping:
                    attempt += 1
                    self.metrics.record_retry(tier.stat_name, op)
                    continue
                raise describe(exc, tier.stat_name, op, tier.store, key, nbytes) from exc

    def _note_failure(self, tier: Tier, op: str, exc: BaseException, bufs: WorkerBuffers | None = None,
                      src: Tier | None = None) -> None:
        """`src`: the tier a failed demotion (`op` "demote", `tier` its destination) moved out of."""
        if isinstance(exc, IOAborted):
            marks = getattr(bufs, "marks", None)
            if src is not None:  # a demotion: the source's reads and the destination's writes, apart
                read_bytes = exc.read_bytes or 0  # (None: aborted before the move began, waiting for room)
                write_bytes = exc.write_bytes if exc.write_bytes is not None else exc.device_bytes
                self.metrics.record_aborted_move(src.stat_name, tier.stat_name, read_bytes, write_bytes, marks)
                return
            self.metrics.record_aborted(tier.stat_name, op, exc.device_bytes, marks)
            return
        if not isinstance(exc, Exception):
            return
        self.metrics.record_error(f"{tier.stat_name}_{op}", exc)
        self.metrics.record_storage_error(tier.stat_name, op, exc)
        if isinstance(exc, DataCorruption):
            if self.metrics.count_mismatch() <= VERIFY_LOG_LIMIT:
                log.error("--verify: %s", exc)
        if isinstance(exc, OSError) and self.on_fault is not None:
            fault = exc if isinstance(exc, StorageFault) else describe(exc, tier.stat_name, op, tier.store, "", None)
            self.on_fault(fault)


def _begin_marks(bufs: WorkerBuffers | None) -> None:
    """Forget the previous operation's chunk marks: a store that marks none (S3, Redis, GDS) then leaves
    none, and its operation at the window's edge is counted whole and named unmeasured (metrics/recorder.py)."""
    marks = getattr(bufs, "marks", None)
    if marks is not None:
        marks.begin()
