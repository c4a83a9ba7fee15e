"""The storage contract: results, errors, key ids, and the chunk-streaming skeleton both stores share.

A store moves an entry as a sequence of chunks of at most ``bufs.chunk_bytes`` through the calling
worker's preallocated buffers (:class:`~kv_cache.storage.buffers.WorkerBuffers`).  The chunk at payload
offset ``off`` is ``bufs.write_buf[:n]`` after ``bufs.stamp(key_id(key), off // BLOCK, n // BLOCK)``, so
every 4 KiB block that reaches a device is unique and nothing is generated or copied per request.

Chunks follow the store's grid: the first chunk is ``chunk - lead_bytes`` long (``lead_bytes`` = what the
store puts before the payload: FileStore's 4 KiB header), the others ``chunk`` long, so that every data
syscall of a file covers exactly ``[k * chunk, (k + 1) * chunk)`` of the file - the offsets and sizes of
fio with ``bs=chunk`` - and never straddles the extent and device-request boundaries of that grid.

Subclasses implement five primitives (begin/put/commit/abort for writes, begin/get/end for reads);
:class:`StoreBase` builds ``write``, ``read`` and ``move_to`` on top of them and does the timing split:
``device_ns`` is what the primitive reports as spent in the data path (syscalls or memcpy), ``host_ns``
is everything else inside the operation.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, NamedTuple, Protocol, runtime_checkable

from kv_cache.hashing import stable_id
from kv_cache.storage.buffers import BLOCK, WorkerBuffers  # BLOCK re-exported: the unit the stores align to


class IOResult(NamedTuple):
    """What one store operation moved and how long it took (all times from ``time.perf_counter_ns``)."""

    nbytes: int  # logical entry bytes moved
    device_bytes: int  # bytes handed to the data syscalls / memcpy (incl. header and padding)
    total_ns: int  # the whole operation
    device_ns: int  # inside the data path: syscalls (FileStore) or the memcpy (MemoryStore)
    host_ns: int  # total_ns - device_ns: stamping, bookkeeping, Python


class IOAborted(Exception):
    """The operation saw its stop event between chunks and gave up (the partial entry is gone)."""

    def __init__(self, message: str = "I/O aborted", device_bytes: int = 0, device_ns: int = 0):
        super().__init__(message)
        self.device_bytes = device_bytes  # bytes that did reach the device before the abort
        self.device_ns = device_ns  # time spent in the data syscalls before the abort (device busy time)
        # A move (StoreBase.move_to) sets both: the bytes read from the source tier and those written to the
        # destination (device_bytes is their sum), which the recorder counts per tier and direction.
        self.read_bytes: int | None = None
        self.write_bytes: int | None = None


class DataCorruption(Exception):
    """A verified read found a block whose stamp is not (key id, block index), or a short file."""


class StoreFull(Exception):
    """A MemoryStore has no free slabs for the entry (nothing was kept)."""


key_id = stable_id  # the 64-bit id of a cache key, stamped into every 4 KiB block it writes


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole number of 4 KiB blocks."""
    return -(-nbytes // BLOCK) * BLOCK


ChunkSink = Callable[[int, memoryview], None]


def _lead(store: StoreBase, chunk: int) -> int:
    """The store's lead bytes if a first chunk can hold them and payload, else 0 (tiny chunks)."""
    lead = store.lead_bytes
    return lead if 0 < lead < chunk else 0


@runtime_checkable
class Store(Protocol):
    """What the cache layer calls. Both MemoryStore and FileStore implement it."""

    name: str

    def write(
        self, key: str, nbytes: int, bufs: WorkerBuffers, stop: threading.Event | None = None
    ) -> IOResult: ...

    def read(
        self, key: str, bufs: WorkerBuffers, stop: threading.Event | None = None, verify: bool = False
    ) -> IOResult: ...

    def move_to(
        self, key: str, dst: Store, bufs: WorkerBuffers, stop: threading.Event | None = None
    ) -> tuple[IOResult, IOResult]: ...

    def delete(self, key: str) -> None: ...

    def __contains__(self, key: object) -> bool: ...

    def close(self) -> None: ...


class StoreBase:
    """Chunk streaming, stop handling, verification and timing on top of five primitives.

    Primitive contract (every primitive returns the nanoseconds it spent in the data path):

    * ``_begin_write(key, nbytes) -> (handle, device_ns)``; may raise StoreFull / OSError.
    * ``_put(handle, offset, view, first) -> (device_bytes, device_ns)``: store ``view``
      (a whole number of 4 KiB blocks) at payload ``offset``.
    * ``_commit(handle) -> device_ns``: make the entry visible (file: fdatasync + close).
    * ``_abort(handle) -> None``: drop the partial entry, release everything it held.
    * ``_begin_read(key) -> (handle, nbytes, device_ns)``; KeyError if the key is not stored.
    * ``_get(handle, offset, view) -> (device_bytes, device_ns)``: fill ``view`` from payload ``offset``.
    * ``_end_read(handle) -> device_ns``: release the read (never raises for a valid handle).
    """

    name: str = "store"
    # Bytes the store writes before the payload in the same first data call (see the module docstring).
    lead_bytes: int = 0

    # ----------------------------------------------------------------- primitives (subclasses)
    def _begin_write(self, key: str, nbytes: int) -> tuple[Any, int]:  # pragma: no cover
        raise NotImplementedError

    def _put(self, h: Any, offset: int, view: memoryview, first: bool) -> tuple[int, int]:  # pragma: no cover
        raise NotImplementedError

    def _commit(self, h: Any) -> int:  # pragma: no cover
        raise NotImplementedError

    def _abort(self, h: Any) -> int | None:  # pragma: no cover
        """Drop a write begun with _begin_write; a store that holds back what `_put` was given (S3's
        parts) returns the bytes it never sent, so they are not counted as moved."""
        raise NotImplementedError

    def _begin_read(self, key: str) -> tuple[Any, int, int]:  # pragma: no cover
        raise NotImplementedError

    def _get(self, h: Any, offset: int, view: memoryview) -> tuple[int, int]:  # pragma: no cover
        raise NotImplementedError

    def _end_read(self, h: Any) -> int:  # pragma: no cover
        raise NotImplementedError

    def delete(self, key: str) -> None:  # pragma: no cover
        raise NotImplementedError

    def __contains__(self, key: object) -> bool:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError

    # Whether this store lays an entry out as write() does from the worker's fill (so a reader can compare
    # every payload byte); a remote tier writes from its own slots (storage/remote.py SlotRing): False there,
    # and an entry moved out of it is checked by its stamps only (`_stamps_only`).
    keeps_fill_layout = True

    def _account(self, res: IOResult, op: str) -> IOResult:
        """The result of one finished ``op`` ("read" or "write") on this store, as reported.  The
        identity here; a store whose data path is modelled (the simulated GPU tier) swaps its measured
        stand-in copy time for the modelled device time."""
        return res

    # ----------------------------------------------------------------- operations
    def write(
        self, key: str, nbytes: int, bufs: WorkerBuffers, stop: threading.Event | None = None
    ) -> IOResult:
        """Store ``nbytes`` of stamped data under ``key`` (replacing any previous entry)."""
        t0 = perf_counter_ns()
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        kid = key_id(key)
        chunk = bufs.chunk_bytes
        total = padded(nbytes)
        foreign = self.__dict__.get("_stamps_only")
        if foreign:
            foreign.discard(key)  # written afresh from the fill
        marks = getattr(bufs, "marks", None)  # chunk completion times: the window's edge (metrics/recorder.py)
        if marks is not None:
            marks.begin()
        h, dev_ns = self._begin_write(key, nbytes)
        dev_bytes = 0
        try:
            off = 0
            n = min(chunk - _lead(self, chunk), total)
            mv = bufs.write_mv
            while off < total:
                if stop is not None and stop.is_set():
                    raise IOAborted(f"write of {key!r} aborted after {off} bytes", dev_bytes)
                bufs.stamp(kid, off // BLOCK, n // BLOCK)
                b, ns = self._put(h, off, mv if n == chunk else mv[:n], off == 0)
                dev_bytes += b
                dev_ns += ns
                if marks is not None:
                    marks.add(dev_bytes)
                off += n
                n = min(chunk, total - off)
            if total == 0:  # an empty entry still gets its header (file) / its slot (memory)
                b, ns = self._put(h, 0, mv[:0], True)
                dev_bytes += b
                dev_ns += ns
            dev_ns += self._commit(h)
        except IOAborted as e:  # a store whose _abort returns the bytes it never sent counts only the rest
            e.device_bytes = dev_bytes - (self._abort(h) or 0)
            e.device_ns = dev_ns
            raise
        except BaseException:
            self._abort(h)
            raise
        t1 = perf_counter_ns()
        return self._account(IOResult(nbytes, dev_bytes, t1 - t0, dev_ns, t1 - t0 - dev_ns), "write")

    def read(
        self,
        key: str,
        bufs: WorkerBuffers,
        stop: threading.Event | None = None,
        verify: bool = False,
        on_chunk: ChunkSink | None = None,
    ) -> IOResult:
        """Stream the entry through ``bufs.read_buf`` chunk by chunk.

        ``verify`` checks every block's stamp (DataCorruption on mismatch).  ``on_chunk(c, view)`` (an
        extension for tests and consumers) sees each chunk while it is in ``read_buf``.
        """
        t0 = perf_counter_ns()
        marks = getattr(bufs, "marks", None)
        if marks is not None:
            marks.begin()
        h, nbytes, dev_ns = self._begin_read(key)
        dev_bytes = 0
        try:
            kid = key_id(key) if verify else 0
            chunk = bufs.chunk_bytes
            total = padded(nbytes)
            mv = bufs.read_mv
            off = 0
            c = 0
            n = min(chunk - _lead(self, chunk), total)
            leads = (_lead(self, chunk) // BLOCK, 0) if _lead(self, chunk) else (0,)
            payload = verify and key not in self.__dict__.get("_stamps_only", ())
            while off < total:
                if stop is not None and stop.is_set():
                    raise IOAborted(f"read of {key!r} aborted after {off} bytes", dev_bytes)
                b, ns = self._get(h, off, mv if n == chunk else mv[:n])
                dev_bytes += b
                dev_ns += ns
                if marks is not None:
                    marks.add(dev_bytes)
                if verify:
                    bad = bufs.check_stamp(kid, off // BLOCK, n // BLOCK)
                    if bad >= 0:
                        raise DataCorruption(
                            f"{self.name}: entry {key!r} block {off // BLOCK + bad} "
                            f"(byte {off + bad * BLOCK}) does not carry its stamp"
                        )
                    # every other byte of each block against the payload (laid out by this store, or by a
                    # tier without lead that the entry was demoted from)
                    bad = bufs.check_payload(off // BLOCK, n // BLOCK, leads) if payload else -1
                    if bad >= 0:
                        raise DataCorruption(
                            f"{self.name}: entry {key!r} block {off // BLOCK + bad} "
                            f"(bytes {off + bad * BLOCK + 16}-{off + (bad + 1) * BLOCK - 1}) differs from the "
                            "payload written"
                        )
                if on_chunk is not None:
                    on_chunk(c, mv[: min(n, nbytes - off)])
                off += n
                c += 1
                n = min(chunk, total - off)
        except IOAborted as e:
            e.device_bytes = dev_bytes
            dev_ns += self._end_read(h)
            e.device_ns = dev_ns
            raise
        except BaseException:
            self._end_read(h)
            raise
        dev_ns += self._end_read(h)
        t1 = perf_counter_ns()
        return self._account(IOResult(nbytes, dev_bytes, t1 - t0, dev_ns, t1 - t0 - dev_ns), "read")

    def move_to(
        self, key: str, dst: Store, bufs: WorkerBuffers, stop: threading.Event | None = None
    ) -> tuple[IOResult, IOResult]:
        """Stream the stored bytes of ``key`` into ``dst`` through ``bufs.read_buf``, then delete here.

        Returns (read result here, write result at dst).  On stop or error the partial copy at ``dst``
        is removed and the entry stays here.
        """
        if not isinstance(dst, StoreBase):
            raise TypeError(f"move_to needs a StoreBase destination, got {type(dst).__name__}")
        if dst is self:
            raise ValueError(f"{self.name}: cannot move {key!r} onto the store it is in")
        r_t = 0  # time attributed to the read side / write side
        w_t = 0
        r_dev = w_dev = 0
        r_bytes = w_bytes = 0
        marks = getattr(bufs, "marks", None)
        if marks is not None:
            marks.begin()
        t = perf_counter_ns()
        h, nbytes, ns = self._begin_read(key)
        r_dev += ns
        t2 = perf_counter_ns()
        r_t += t2 - t
        wh = None
        try:
            t = t2
            wh, ns = dst._begin_write(key, nbytes)
            w_dev += ns
            t2 = perf_counter_ns()
            w_t += t2 - t
            chunk = bufs.chunk_bytes
            total = padded(nbytes)
            mv = bufs.read_mv
            off = 0
            c = 0
            # one grid for both sides: the file side's, if any (a RAM arena has no alignment to keep)
            n = min(chunk - max(_lead(self, chunk), _lead(dst, chunk)), total)
            while off < total or (total == 0 and c == 0):
                if stop is not None and stop.is_set():
                    raise IOAborted(f"move of {key!r} aborted after {off} bytes", r_bytes + w_bytes)
                view = mv if n == chunk else mv[:n]
                t = perf_counter_ns()
                b, ns = self._get(h, off, view) if n else (0, 0)
                r_bytes += b
                r_dev += ns
                t2 = perf_counter_ns()
                r_t += t2 - t
                b, ns = dst._put(wh, off, view, c == 0)
                w_bytes += b
                w_dev += ns
                t = perf_counter_ns()
                w_t += t - t2
                if marks is not None:
                    marks.add_move(r_bytes, w_bytes)
                off += n
                c += 1
                n = min(chunk, total - off)
            t = perf_counter_ns()
            w_dev += dst._commit(wh)
            t2 = perf_counter_ns()
            w_t += t2 - t
            wh = None
        except BaseException as e:
            unsent = (dst._abort(wh) or 0) if wh is not None else 0  # bytes put but never sent (S3 parts)
            if isinstance(e, IOAborted):
                e.device_bytes = r_bytes + w_bytes - unsent
                e.device_ns = r_dev + w_dev
                e.read_bytes, e.write_bytes = r_bytes, w_bytes - unsent
            self._end_read(h)
            raise
        t = perf_counter_ns()
        r_dev += self._end_read(h)
        r_t += perf_counter_ns() - t
        if not self.keeps_fill_layout or key in self.__dict__.get("_stamps_only", ()):
            dst.__dict__.setdefault("_stamps_only", set()).add(key)  # its bytes are not our fill's layout
        self.delete(key)
        return (
            self._account(IOResult(nbytes, r_bytes, r_t, r_dev, r_t - r_dev), "read"),
            dst._account(IOResult(nbytes, w_bytes, w_t, w_dev, w_t - w_dev), "write"),
        )



class SizedStore(StoreBase):
    """A StoreBase whose committed entries are a `_sizes` dict (key -> payload bytes) under `_lock`: the
    file, S3 and Redis stores. Membership and count read it."""

    _sizes: dict[str, int]
    _lock: threading.Lock
    _closed: bool

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._sizes

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    def _record(self, paths: dict[str, str], key: str, path: str, nbytes: int) -> None:
        """Count the entry just written at `path` as stored (its size in `_sizes`); RuntimeError when it was
        removed or replaced meanwhile (`paths`, key -> where it is, no longer says `path`) or the store closed."""
        with self._lock:
            if not self._closed and paths.get(key) == path:
                self._sizes[key] = nbytes
                return
        raise RuntimeError(f"{self.name}: entry {key!r} was removed or the store closed during its write")

    def _unbook(self, paths: dict[str, str], key: str, path: str | None = None) -> str | None:
        """Forget `key` (in `paths` and `_sizes`), but with `path` only while it is still there; where it was,
        or None (not stored, or elsewhere than `path`: then nothing is forgotten)."""
        with self._lock:
            had = paths.get(key)
            if path is not None and had != path:
                return None
            paths.pop(key, None)
            self._sizes.pop(key, None)
            return had


def close_at_exit(store: Any) -> None:
    """Close `store` when the interpreter exits, unless it was closed before (forget_at_exit): a run that
    ends by an unhandled path still removes its run directory / objects / keys. Holds only a weak
    reference, so the registration never keeps a store alive."""
    ref = weakref.ref(store)

    def _at_exit() -> None:
        s = ref()
        if s is not None:
            s.close()

    store._atexit = _at_exit
    atexit.register(_at_exit)


def forget_at_exit(store: Any) -> None:
    """Undo close_at_exit (called by the store's own close)."""
    cb = store.__dict__.pop("_atexit", None)
    if cb is not None:
        atexit.unregister(cb)
