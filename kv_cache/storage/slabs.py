"""Entries held in fixed-size slabs of an arena (host RAM or GPU memory): the bookkeeping both arenas share.

A writer takes its slabs up front (a subclass's `_begin_write`), copies into them chunk by chunk and
commits; a reader pins the entry while it copies out, so a delete or an overwrite during the read only
marks it dead and the last reader gives the slabs back. Subclasses say how slabs are handed out
(`_begin_write`), given back (`_give`) and copied (`_copy`); the lock guards `_entries` and the free lists.
"""

from __future__ import annotations

import threading
from typing import Any

from kv_cache.storage.base import StoreBase

__all__ = ["SlabEntry", "SlabPending", "SlabStore", "direction_figures"]


class SlabEntry:
    __slots__ = ("slabs", "nbytes", "pins", "dead")

    def __init__(self, slabs: list[Any], nbytes: int):
        self.slabs = slabs  # the arena's slab ids, in payload order
        self.nbytes = nbytes
        self.pins = 0  # readers currently copying out of the slabs
        self.dead = False  # deleted/replaced while pinned: the last reader frees the slabs


class SlabPending:
    __slots__ = ("key", "slabs", "nbytes")

    def __init__(self, key: str, slabs: list[Any], nbytes: int):
        self.key, self.slabs, self.nbytes = key, slabs, nbytes


class SlabStore(StoreBase):
    """Commit, abort, pinned reads and deletes over slab lists; the arena is the subclass's."""

    name: str
    _lock: threading.Lock
    _entries: dict[str, SlabEntry]
    _closed: bool

    def _give(self, slabs: list[Any]) -> None:  # lock held
        raise NotImplementedError

    def _copy(self, slabs: list[Any], offset: int, view: Any, to_arena: bool) -> int:
        raise NotImplementedError

    def _copyable(self, view: memoryview) -> Any:
        """What `_copy` takes for a worker buffer's view (the view itself unless a subclass says)."""
        return view

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def _release(self, e: SlabEntry) -> None:  # lock held
        if e.pins:
            e.dead = True
        else:
            self._give(e.slabs)
            e.slabs = []

    def _put(self, h: SlabPending, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        if not len(view):
            return 0, 0
        return len(view), self._copy(h.slabs, offset, self._copyable(view), True)

    def _commit(self, h: SlabPending) -> int:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store closed during write")
            old = self._entries.get(h.key)
            self._entries[h.key] = SlabEntry(h.slabs, h.nbytes)
            if old is not None:
                self._release(old)
        h.slabs = []
        return 0

    def _abort(self, h: SlabPending) -> None:
        with self._lock:
            self._give(h.slabs)
        h.slabs = []

    def _begin_read(self, key: str) -> tuple[SlabEntry, int, int]:
        with self._lock:
            e = self._entries[key]  # KeyError if missing
            e.pins += 1
        return e, e.nbytes, 0

    def _get(self, h: SlabEntry, offset: int, view: memoryview) -> tuple[int, int]:
        return len(view), self._copy(h.slabs, offset, self._copyable(view), False)

    def _end_read(self, h: SlabEntry) -> int:
        with self._lock:
            h.pins -= 1
            if h.dead and h.pins == 0:
                self._give(h.slabs)
                h.slabs = []
        return 0

    def _forget_free(self) -> None:  # lock held, at close
        raise NotImplementedError

    def _drop_arena(self) -> None:  # at close, after the lock
        raise NotImplementedError

    def close(self) -> None:
        """Drop every entry, then the arena (a second close does nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._entries.clear()
            self._forget_free()
        self._drop_arena()

    def delete(self, key: str) -> None:
        with self._lock:
            e = self._entries.pop(key, None)
            if e is not None:
                self._release(e)


def direction_figures(count: str, ops: int, nbytes: int, shards: int, **times_ns: int) -> dict[str, Any]:
    """One copy direction in a GPU tier's stats: its `count` of operations, its entry bytes (per GPU) and
    bytes per replica (x `shards`), then ``<name>_seconds`` and ``<name>_gbs`` of each of `times_ns`, in
    order (0 GB/s for no time)."""
    out: dict[str, Any] = {count: ops, "bytes": nbytes, "bytes_per_replica": nbytes * shards}
    for name, ns in times_ns.items():
        out[f"{name}_seconds"] = ns / 1e9
        out[f"{name}_gbs"] = nbytes / ns if ns else 0.0
    return out
