"""The CPU-RAM tier: one preallocated arena of fixed-size slabs, no allocation per request.

The arena is a single anonymous private mapping (MAP_NORESERVE where known), so pages are only touched
when an entry is first stored there (or all at once with ``prefault=True``).  An entry is a list of
slabs; bookkeeping is under a lock, the copies (numpy ``copyto``, which releases the GIL for large
copies) happen outside it.  Entries are stored 4 KiB padded, exactly as the chunks arrived, so a
stamp check or a move to a file store sees the same blocks.
"""

from __future__ import annotations

import mmap
import platform
import sys
import threading
from time import perf_counter_ns

import numpy as np

from kv_cache.storage.base import BLOCK, StoreFull, padded
from kv_cache.storage.slabs import SlabEntry, SlabPending, SlabStore


def _map_noreserve() -> int:
    flag = getattr(mmap, "MAP_NORESERVE", None)
    if flag is not None:
        return int(flag)
    if sys.platform.startswith("linux") and platform.machine() in (
        "x86_64",
        "AMD64",
        "i686",
        "i386",
        "aarch64",
        "arm64",
        "riscv64",
        "s390x",
        "loongarch64",
    ):
        return 0x4000  # the asm-generic value
    return 0


class MemoryStore(SlabStore):
    """Slab arena of ``capacity_bytes`` (rounded up to slabs, plus ``spare_slabs``)."""

    def __init__(
        self,
        capacity_bytes: int,
        slab_bytes: int = 1 << 20,
        *,
        prefault: bool = False,
        spare_slabs: int = 4,
        name: str = "cpu",
    ):
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if slab_bytes <= 0 or slab_bytes % BLOCK:
            raise ValueError(f"slab_bytes must be a positive multiple of {BLOCK}, got {slab_bytes}")
        self.name = name
        self.capacity_bytes = int(capacity_bytes)
        self.slab_bytes = int(slab_bytes)
        base = -(-self.capacity_bytes // self.slab_bytes)
        self.nslabs = base + (max(0, spare_slabs) if base else 0)
        self._lock = threading.Lock()
        self._entries: dict[str, SlabEntry] = {}
        self._free: list[int] = list(range(self.nslabs - 1, -1, -1))  # pop() hands out low slabs first
        self._closed = False
        self._mm: mmap.mmap | None = None
        self._arena: np.ndarray | None = None
        if self.nslabs:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _map_noreserve()
            if prefault:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._mm = mmap.mmap(-1, self.nslabs * self.slab_bytes, flags=flags)
            self._arena = np.frombuffer(self._mm, dtype=np.uint8)
            if prefault and not hasattr(mmap, "MAP_POPULATE"):
                self._arena[::4096] = 0

    # ------------------------------------------------------------------ info
    @property
    def arena_bytes(self) -> int:
        return self.nslabs * self.slab_bytes

    def footprint(self, nbytes: int) -> int:
        """Arena bytes an entry of ``nbytes`` occupies (whole slabs)."""
        return -(-nbytes // self.slab_bytes) * self.slab_bytes

    @property
    def free_slabs(self) -> int:
        with self._lock:
            return len(self._free)

    # ------------------------------------------------------------------ bookkeeping helpers
    def _give(self, slabs: list[int]) -> None:  # lock held
        if not self._closed:
            self._free.extend(slabs)

    def _copyable(self, view: memoryview) -> np.ndarray:
        return np.frombuffer(view, dtype=np.uint8)

    def _copy(self, slabs: list[int], offset: int, buf: np.ndarray, to_arena: bool) -> int:
        """Copy ``buf`` to/from the entry's bytes at ``offset``; returns the ns spent in copyto."""
        arena = self._arena
        if arena is None:
            raise RuntimeError(f"{self.name}: store is closed")
        s = self.slab_bytes
        pos = 0
        n = buf.size
        ns = 0
        while pos < n:
            i, o = divmod(offset + pos, s)
            m = min(s - o, n - pos)
            a = slabs[i] * s + o
            t = perf_counter_ns()
            if to_arena:
                np.copyto(arena[a : a + m], buf[pos : pos + m])
            else:
                np.copyto(buf[pos : pos + m], arena[a : a + m])
            ns += perf_counter_ns() - t
            pos += m
        return ns

    # ------------------------------------------------------------------ primitives
    def _begin_write(self, key: str, nbytes: int) -> tuple[SlabPending, int]:
        need = -(-padded(nbytes) // self.slab_bytes)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            if self.nslabs == 0 or need > len(self._free):
                raise StoreFull(
                    f"{self.name}: entry {key!r} needs {need} slab(s), {len(self._free)} free "
                    f"of {self.nslabs}"
                )
            slabs = self._free[len(self._free) - need :][::-1]
            del self._free[len(self._free) - need :]
        return SlabPending(key, slabs, nbytes), 0

    # ------------------------------------------------------------------ public
    def _forget_free(self) -> None:
        self._free.clear()

    def _drop_arena(self) -> None:
        """Unmap the arena (left to the GC if a copy still holds a view)."""
        self._arena = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # an in-flight copy still references the arena
                pass

    def __repr__(self) -> str:
        return (
            f"MemoryStore(name={self.name!r}, capacity_bytes={self.capacity_bytes}, "
            f"slab_bytes={self.slab_bytes}, nslabs={self.nslabs})"
        )
