"""GPUDirect Storage reads for the storage tier, through kvikio (optional: ``pip install kvikio-cu12``).

:class:`GDSFileStore` is a :class:`FileStore` (same files, same writes) whose reads land in GPU memory:
each read takes a device buffer of one chunk from a pool allocated once (through the GPU tier's device
interface, :mod:`kv_cache.storage.gpu_device`) and fills it with ``kvikio.CuFile.pread`` chunk by chunk,
at the same file offsets a host read would use.  With cuFile (GDS) the storage device DMAs into GPU
memory; without it kvikio runs in compatibility mode (POSIX reads through a host bounce buffer), and
the results say which.  The bytes land in GPU memory only: a verified read (``verify=True``) is refused.

Timed: device time = the ``pread(...).get()`` calls (storage I/O plus, in compat mode, the bounce copy)
and the opening of the cuFile handle; host time = the rest.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter_ns
from typing import Any

from kv_cache.storage.files import HEADER_BYTES, FileStore

__all__ = ["GDSFileStore", "compat_mode", "import_kvikio"]


def import_kvikio() -> Any | None:
    """The kvikio module, or None when it is missing or cannot load (no CUDA runtime)."""
    try:
        import kvikio  # noqa: PLC0415  (optional dependency)
    except Exception:
        return None
    return kvikio


def compat_mode(kvikio: Any) -> str:
    """kvikio's compatibility-mode setting, as it names it (newer: defaults.get, older: compat_mode())."""
    d = kvikio.defaults
    try:
        value = d.get("compat_mode")
    except Exception:
        value = d.compat_mode()
    return str(value)


class _GRead:
    __slots__ = ("inner", "cufile", "buf")

    def __init__(self, inner: Any, cufile: Any, buf: Any):
        self.inner, self.cufile, self.buf = inner, cufile, buf


class GDSFileStore(FileStore):
    """A FileStore whose reads go to GPU memory through kvikio; ``device`` allocates the read buffers."""

    def __init__(self, *args: Any, kvikio: Any, device: Any, slots: int = 8, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._kvikio = kvikio
        self._device = device
        self._bufs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(max(1, slots)):
            self._bufs.put(device.alloc(self.chunk_bytes))
        self._stats_lock = threading.Lock()
        self._reads = [0, 0, 0]  # entries read, bytes, pread ns
        self.compat_mode = compat_mode(kvikio)

    def read(self, key: str, bufs: Any, stop: threading.Event | None = None, verify: bool = False,
             on_chunk: Any = None):
        if verify or on_chunk is not None:
            raise ValueError(f"{self.name}: GPUDirect reads land in GPU memory; they cannot be verified on the host")
        return super().read(key, bufs, stop)

    def _begin_read(self, key: str) -> tuple[_GRead, int, int]:
        inner, nbytes, ns = super()._begin_read(key)
        buf = self._bufs.get()
        t = perf_counter_ns()
        try:
            cufile = self._kvikio.CuFile(inner.path, "r")
        except BaseException:
            self._bufs.put(buf)
            super()._end_read(inner)
            raise
        return _GRead(inner, cufile, buf), nbytes, ns + perf_counter_ns() - t

    def _get(self, h: _GRead, offset: int, view: memoryview) -> tuple[int, int]:
        n = len(view)
        got = ns = 0
        for base in range(0, n, self.chunk_bytes):  # a view larger than the device buffer goes in pieces
            k = min(self.chunk_bytes, n - base)
            t = perf_counter_ns()
            got += h.cufile.pread(h.buf[:k], k, HEADER_BYTES + offset + base).get()
            ns += perf_counter_ns() - t
        if got != n:
            raise OSError(f"{self.name}: short GPUDirect read of {h.inner.path} ({got} of {n} bytes)")
        with self._stats_lock:
            self._reads[1] += n
            self._reads[2] += ns
        return n, ns

    def _end_read(self, h: _GRead) -> int:
        t = perf_counter_ns()
        try:
            h.cufile.close()
        finally:
            self._bufs.put(h.buf)
        with self._stats_lock:
            self._reads[0] += 1
        return perf_counter_ns() - t + super()._end_read(h.inner)

    def gds_info(self) -> dict[str, Any]:
        """For the results' ``measurement.storage_gds``."""
        with self._stats_lock:
            entries, nbytes, ns = self._reads
        version = getattr(self._kvikio, "__version__", "?")
        return {
            "enabled": True,
            "library": f"kvikio {version}",
            "compat_mode": self.compat_mode,
            "device": f"{getattr(self._device, 'index', 0)}: {getattr(self._device, 'name', '?')}",
            "reads": entries,
            "bytes": nbytes,
            "pread_seconds": ns / 1e9,
            "note": ("storage-tier reads land in GPU memory through kvikio CuFile.pread (GPUDirect Storage "
                     "where cuFile is available; in compat mode, POSIX reads through a host bounce buffer); "
                     "writes are the FileStore's"),
        }
