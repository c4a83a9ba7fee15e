"""GPUDirect Storage reads for the storage tier, through kvikio (optional: ``pip install kvikio-cu12``).

:class:`GDSFileStore` is a :class:`FileStore` (same files, same writes) whose reads land in GPU memory:
each read takes a slot (a device buffer of one chunk, a pinned host buffer and a copy lane, allocated once
through the GPU tier's device interface, :mod:`kv_cache.storage.gpu_device`) and fills the device buffer
chunk by chunk, at the same file offsets a host read would use:

* **cuFile** (kvikio not in compatibility mode): ``kvikio.CuFile.pread`` DMAs from the storage device into
  GPU memory.  The CuFile handle is opened once per file (kept, up to ``HANDLE_CACHE`` files, until the
  entry is replaced or deleted), outside the timed read: its opening is host time, never device time;
* **compatibility mode** (no cuFile): kvikio would read through the page cache with its own POSIX
  descriptor, so the store does not use it: it reads with its own descriptor (O_DIRECT where the
  FileStore uses it, else buffered + ``posix_fadvise(DONTNEED)``, as every FileStore read) into the slot's
  pinned buffer, then copies that to the device buffer (H2D on the slot's own stream).

The results say which path ran.  The bytes land in GPU memory only: a verified read is refused (and
``--gds --verify`` is refused before anything runs).

Timed: device time = the ``pread(...).get()`` calls (cuFile), or the read syscalls plus the H2D copy's
event time (compatibility mode); host time = the rest.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from time import perf_counter_ns
from typing import Any

from kv_cache.storage.files import HEADER_BYTES, FileStore
from kv_cache.storage.gpu_device import optional_import

__all__ = ["GDSFileStore", "compat_mode", "import_kvikio", "uses_compat_mode"]

HANDLE_CACHE = 256  # CuFile handles kept open (one per file, least recently used closed first)


def import_kvikio() -> Any | None:
    """The kvikio module, or None when it is missing or cannot load (no CUDA runtime)."""
    return optional_import("kvikio")


def compat_mode(kvikio: Any) -> str:
    """kvikio's compatibility-mode setting, as it names it (newer: defaults.get, older: compat_mode())."""
    d = kvikio.defaults
    try:
        value = d.get("compat_mode")
    except Exception:
        value = d.compat_mode()
    return str(value)


def uses_compat_mode(kvikio: Any) -> bool:
    """Whether kvikio would read through POSIX (its compatibility mode) rather than cuFile: ON / True;
    AUTO as kvikio resolves it (``defaults.is_compat_mode_preferred``), compat when it cannot say."""
    value = compat_mode(kvikio).upper()
    if "OFF" in value or value == "FALSE":
        return False
    if "AUTO" in value:
        try:
            return bool(kvikio.defaults.is_compat_mode_preferred())
        except Exception:
            return True
    return True


class _Slot:
    __slots__ = ("dev", "buf", "handle", "host", "lane")

    def __init__(self, dev: Any, buf: Any, handle: Any, host: Any, lane: Any):
        self.dev, self.buf = dev, buf  # the device and one chunk of its memory, the reads' destination
        self.handle, self.host, self.lane = handle, host, lane  # compat only: pinned bounce + copy lane


class _Handle:
    __slots__ = ("cufile", "pins", "dead")

    def __init__(self, cufile: Any):
        self.cufile, self.pins, self.dead = cufile, 0, False


class _GRead:
    __slots__ = ("inner", "key", "handle", "slot")

    def __init__(self, inner: Any, key: str, handle: _Handle | None, slot: _Slot):
        self.inner, self.key, self.handle, self.slot = inner, key, handle, slot


class GDSFileStore(FileStore):
    """A FileStore whose reads go to GPU memory through kvikio; ``device`` allocates the read buffers."""

    def __init__(self, *args: Any, kvikio: Any, device: Any, slots: int = 8, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._kvikio = kvikio
        self._device = device
        self.compat_mode = compat_mode(kvikio)
        self.compat = uses_compat_mode(kvikio)
        self._slots: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for _ in range(max(1, slots)):
            handle, host = device.pinned(self.chunk_bytes) if self.compat else (None, None)
            lane = device.lane() if self.compat else None
            self._slots.put(_Slot(device, device.alloc(self.chunk_bytes), handle, host, lane))
        self._handles: OrderedDict[str, _Handle] = OrderedDict()  # key -> its file's CuFile (cuFile path)
        self._stats_lock = threading.Lock()
        self._reads = [0, 0, 0, 0]  # entries read, bytes, pread ns, handle-opening ns (host time)

    def read(self, key: str, bufs: Any, stop: threading.Event | None = None, verify: bool = False,
             on_chunk: Any = None):
        if verify or on_chunk is not None:
            raise ValueError(f"{self.name}: GPUDirect reads land in GPU memory; they cannot be verified on the host")
        return super().read(key, bufs, stop)

    # ------------------------------------------------------------------ CuFile handles, once per file
    def _drop_handle(self, key: str) -> None:
        """The entry's file is replaced or gone: its handle closes (now, or when its last reader ends)."""
        with self._lock:
            h = self._handles.pop(key, None)
            if h is None:
                return
            h.dead = True
            close = h.pins == 0
        if close:
            h.cufile.close()

    def _pin_handle(self, key: str, path: str) -> _Handle:
        with self._lock:
            h = self._handles.get(key)
            if h is not None:
                self._handles.move_to_end(key)
                h.pins += 1
                return h
        t = perf_counter_ns()
        cufile = self._kvikio.CuFile(path, "r")  # outside the timed read: host time
        opened = perf_counter_ns() - t
        evicted = []
        with self._lock:
            h = self._handles.get(key)
            if h is None:
                h = self._handles[key] = _Handle(cufile)
                cufile = None
                while len(self._handles) > HANDLE_CACHE:
                    old_key, old = next(iter(self._handles.items()))
                    del self._handles[old_key]
                    old.dead = True
                    if old.pins == 0:
                        evicted.append(old.cufile)
            h.pins += 1
        for c in evicted + ([cufile] if cufile is not None else []):  # a racing reader opened it first
            c.close()
        with self._stats_lock:
            self._reads[3] += opened
        return h

    def _unpin_handle(self, h: _Handle) -> None:
        with self._lock:
            h.pins -= 1
            close = h.dead and h.pins == 0
        if close:
            h.cufile.close()

    def _begin_write(self, key: str, nbytes: int):
        self._drop_handle(key)
        return super()._begin_write(key, nbytes)

    def delete(self, key: str) -> None:
        self._drop_handle(key)
        super().delete(key)

    def close(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for h in handles:
            h.dead = True
            if h.pins == 0:
                try:
                    h.cufile.close()
                except Exception:
                    pass
        super().close()

    # ------------------------------------------------------------------ primitives
    def _begin_read(self, key: str) -> tuple[_GRead, int, int]:
        inner, nbytes, ns = super()._begin_read(key)  # our own descriptor (the compat path reads with it)
        slot = self._slots.get()
        handle = None
        if not self.compat:
            try:
                handle = self._pin_handle(key, inner.path)
            except BaseException:
                self._slots.put(slot)
                super()._end_read(inner)
                raise
        return _GRead(inner, key, handle, slot), nbytes, ns

    def _get(self, h: _GRead, offset: int, view: memoryview) -> tuple[int, int]:
        n = len(view)
        got = ns = 0
        slot = h.slot
        for base in range(0, n, self.chunk_bytes):  # a view larger than the device buffer goes in pieces
            k = min(self.chunk_bytes, n - base)
            if h.handle is None:  # compat: our O_DIRECT / fadvised descriptor into pinned memory, then H2D
                done, read_ns = super()._get(h.inner, offset + base, memoryview(slot.host)[:k])
                slot.dev.h2d(slot.buf, slot.handle, [(0, 0, k)], slot.lane)
                got += done
                ns += read_ns + slot.dev.wait(slot.lane, "h2d")
                continue
            t = perf_counter_ns()
            got += h.handle.cufile.pread(slot.buf[:k], k,
                                         HEADER_BYTES + offset + base).get()
            ns += perf_counter_ns() - t
        if got != n:
            raise OSError(f"{self.name}: short GPUDirect read of {h.inner.path} ({got} of {n} bytes)")
        with self._stats_lock:
            self._reads[1] += n
            self._reads[2] += ns
        return n, ns

    def _end_read(self, h: _GRead) -> int:
        try:
            if h.handle is not None:
                self._unpin_handle(h.handle)
        finally:
            self._slots.put(h.slot)
        with self._stats_lock:
            self._reads[0] += 1
        return super()._end_read(h.inner)

    def gds_info(self) -> dict[str, Any]:
        """For the results' ``measurement.storage_gds``."""
        with self._stats_lock:
            entries, nbytes, ns, open_ns = self._reads
        version = getattr(self._kvikio, "__version__", "?")
        return {
            "enabled": True,
            "library": f"kvikio {version}",
            "compat_mode": self.compat_mode,
            "read_path": ("own descriptor (page cache bypassed) -> pinned bounce buffer -> H2D copy: kvikio is in "
                          "compatibility mode, whose POSIX reads would come from the page cache" if self.compat
                          else "cuFile: kvikio CuFile.pread, storage DMA into GPU memory"),
            "device": f"{getattr(self._device, 'index', 0)}: {getattr(self._device, 'name', '?')}",
            "reads": entries,
            "bytes": nbytes,
            "pread_seconds": ns / 1e9,
            "handle_open_seconds": open_ns / 1e9,
            "handles_open": len(self._handles),
            "note": ("storage-tier reads land in GPU memory (see read_path); a CuFile handle is opened once per "
                     "file, outside the timed read (handle_open_seconds, host time); writes are the FileStore's"),
        }
