"""The storage tier (the device under test): one valid .npy file per entry, O_DIRECT where possible.

File layout: a NumPy v1.0 header padded to exactly 4096 bytes (``descr '|u1'``, shape ``(nbytes,)``),
then the payload padded with whole stamped blocks up to a 4096 multiple, so ``np.load`` returns the
``nbytes`` payload bytes and every data syscall is block aligned.

Data path per entry (nothing else is in the loop):

* write: ``open(O_WRONLY|O_CREAT|O_TRUNC[|O_DIRECT])`` -> ``pwritev([header, chunk0])``, ``pwritev(chunk)``...
  -> ``fdatasync`` (if fsync) -> buffered mode only: ``posix_fadvise(DONTNEED)`` -> ``close``.
* read: ``open(O_RDONLY[|O_DIRECT])`` -> buffered mode only: ``posix_fadvise(DONTNEED)`` ->
  ``preadv`` chunk by chunk into the worker's ``read_buf`` (the header is not read: the store knows the
  size) -> ``close``.

The first payload chunk is ``chunk - 4096`` bytes (``lead_bytes``), so each data syscall covers exactly
``[k * chunk, (k + 1) * chunk)`` of the file (the last one less): the same offsets and sizes as fio with
``bs=chunk``, never straddling the chunk grid the filesystem allocated the file on.

``device_ns`` is the sum of the durations of exactly those syscalls (plus the unlink of a replaced
entry); everything else is ``host_ns``.  The data syscalls, open, fdatasync and close are timed where they
are made, in C with the GIL released (:mod:`.timedio`; a Python fallback where the helper did not build,
which the run reports).  The stamped chunk buffers are page aligned (mmap), so O_DIRECT
needs no bounce copy.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import struct
import threading
from array import array
from pathlib import Path

from kv_cache.errors import StorageSetupError
from kv_cache.host.blockdev import mount_info
from kv_cache.host.bpftrace_hist import LHIST_BINS, lhist_index
from kv_cache.host.rundir import RunDir
from kv_cache.settings.sections import IO_MODES
from kv_cache.storage import timedio as _tio
from kv_cache.storage.base import (
    BLOCK,
    DataCorruption,
    SizedStore,
    close_at_exit,
    forget_at_exit,
    key_id,
    padded,
)

HEADER_BYTES = BLOCK

# Filesystems whose files live in RAM: O_DIRECT (accepted by tmpfs since Linux 6.6) reaches no device.
MEMORY_FS = frozenset({"tmpfs", "ramfs", "hugetlbfs", "devtmpfs", "shm", "rootfs"})

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HAVE_FADVISE = hasattr(os, "posix_fadvise")  # (where it is not, buffered mode drops no page cache)
_BAD_NAME = re.compile(r"[^A-Za-z0-9._-]")
_UNSUPPORTED = {errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def npy_header(nbytes: int) -> bytes:
    """A NumPy format 1.0 header for a 1-D uint8 array of ``nbytes``, padded to exactly 4096 bytes."""
    hlen = HEADER_BYTES - 10  # magic (6) + version (2) + header length (2)
    d = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + str(int(nbytes)) + ",), }"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", hlen) + (d.ljust(hlen - 1) + "\n").encode("latin1")


def file_name(key: str) -> str:
    """``<key>.npy`` with the key limited to [A-Za-z0-9._-]; altered or long keys get a hash suffix."""
    safe = _BAD_NAME.sub("_", key)
    if safe != key or len(safe) > 200 or safe in ("", ".", ".."):
        safe = f"{safe[:200]}-{key_id(key):016x}"
    return safe + ".npy"


# Each thread's own totals of the data syscalls and their device time, for --enable-latency-tracing's
# comparison with the kernel's figures for the same syscalls: [preadv calls, ns, pwritev calls, ns,
# fdatasync calls, ns], and while a trace runs (`bin_syscalls`) each call's time in the trace's log-linear
# bins (host/bpftrace_hist.py lhist_index: LHIST_BINS a syscall, preadv's, pwritev's, fdatasync's), whose
# percentiles are read as the kernel's are (binning costs ~0.2-0.4 us a call in Python, 4 Dec: untraced runs do
# not pay it). Per thread, so the hot path takes no lock; `syscall_totals` adds them up.
_TOTALS = threading.local()
_ALL_TOTALS: list[tuple[list[int], array]] = []
_TOTALS_LOCK = threading.Lock()
_SYSCALLS = ("preadv", "pwritev", "fdatasync")
_binning = False


def bin_syscalls(on: bool) -> None:
    """Bin each data syscall's time from now on (True: --enable-latency-tracing's span) or no longer."""
    global _binning
    _binning = bool(on)


def _totals() -> list[int]:
    t = getattr(_TOTALS, "v", None)
    if t is None:
        t = _TOTALS.v = [0, 0, 0, 0, 0, 0]
        bins = _TOTALS.bins = array("q", bytes(8 * LHIST_BINS * len(_SYSCALLS)))
        with _TOTALS_LOCK:
            _ALL_TOTALS.append((t, bins))
    return t


def _count(slot: int, calls: int, ns: int) -> None:
    """Add ``calls`` and ``ns`` to this thread's totals at ``slot`` and ``slot + 1`` (0: preadv, 2: pwritev,
    4: fdatasync), and while binning the call to its bin (a short read or write's few calls: each at their mean)."""
    t = _totals()
    t[slot] += calls
    t[slot + 1] += ns
    if _binning:
        _TOTALS.bins[(slot >> 1) * LHIST_BINS + lhist_index(ns if calls == 1 else ns // calls)] += calls


def syscall_totals() -> dict[str, tuple[int, int, list[int]]]:
    """{"preadv" | "pwritev" | "fdatasync": (calls, ns, bins)} of every FileStore in this process so far, as
    timed by the tool (:mod:`.timedio`), `bins` the calls binned (`bin_syscalls`) per log-linear bin
    (host/bpftrace_hist.py lhist_buckets reads them); differences of two snapshots give a span's (`syscall_span`)."""
    with _TOTALS_LOCK:
        rows = [(list(t), bins.tolist()) for t, bins in _ALL_TOTALS]
    s = [sum(r[i] for r, _ in rows) for i in range(6)]
    out = {}
    for k, name in enumerate(_SYSCALLS):
        at = k * LHIST_BINS
        out[name] = (s[2 * k], s[2 * k + 1], [sum(b[at + i] for _, b in rows) for i in range(LHIST_BINS)])
    return out


def syscall_span(before: dict[str, tuple], after: dict[str, tuple]) -> dict[str, tuple[int, int, list[int]]]:
    """What `syscall_totals` gained between two snapshots: (calls, ns, bins) per syscall."""
    return {k: (a[0] - before[k][0], a[1] - before[k][1], [x - y for x, y in zip(a[2], before[k][2], strict=True)])
            for k, a in after.items()}


def _advance(iov: list[memoryview], n: int) -> list[memoryview]:
    out = []
    for b in iov:
        if n >= len(b):
            n -= len(b)
            continue
        out.append(b[n:] if n else b)
        n = 0
    return out


class _Write:
    # iov / iov_hdr: the argument lists of pwritev, made once per entry and refilled per chunk, so the
    # per-chunk path allocates no Python list.
    __slots__ = ("key", "path", "fd", "nbytes", "hdr", "iov", "iov_hdr")

    def __init__(self, key: str, path: str, nbytes: int, hdr: memoryview):
        self.key = key
        self.path = path
        self.fd = -1
        self.nbytes = nbytes
        self.hdr = hdr
        self.iov: list[memoryview] = [hdr]
        self.iov_hdr: list[memoryview] = [hdr, hdr]


class _Read:
    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path


class FileStore(SizedStore):
    """Entries as files in a private run directory under ``cache_dir`` (see :mod:`.rundir`)."""

    lead_bytes = HEADER_BYTES  # the header shares the first data syscall: chunk-aligned file offsets

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None,
        chunk_bytes: int,
        fsync: bool = True,
        io_mode: str = "auto",
        *,
        name: str = "nvme",
    ):
        if chunk_bytes <= 0 or chunk_bytes % BLOCK:
            raise ValueError(f"chunk_bytes must be a positive multiple of {BLOCK}, got {chunk_bytes}")
        if io_mode not in IO_MODES:
            raise StorageSetupError(f"io mode must be one of {', '.join(IO_MODES)}, got {io_mode!r}")
        self.name = name
        self.chunk_bytes = int(chunk_bytes)
        self.fsync = bool(fsync)
        self._lock = threading.Lock()
        self._files: dict[str, str] = {}  # key -> path of every file we created and did not unlink
        self._sizes: dict[str, int] = {}  # key -> nbytes of committed (readable) entries
        self._tls = threading.local()
        self._closed = False
        self._rundir = RunDir(cache_dir)
        try:
            mi = mount_info(self._rundir.path)
            self.fs_type = mi.fs_type if mi is not None else "unknown"
            self.mount_point = mi.mount_point if mi is not None else ""
            self.mount_source = mi.source if mi is not None else ""
            if io_mode == "buffered":
                self._direct = False
                self.io_mode_reason = "buffered I/O requested"
            else:
                ok, why = self._probe_direct()
                if not ok and io_mode == "direct":
                    raise StorageSetupError(
                        f"direct: O_DIRECT is not usable in {self._rundir.cache_dir} "
                        f"({self.fs_type}): {why}; use auto or buffered"
                    ).about("io_mode")
                self._direct = ok
                self.io_mode_reason = why if ok else f"{why}; falling back to buffered I/O + fadvise"
        except BaseException:
            self._rundir.remove()
            raise
        self._flags_w = (
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC | (_O_DIRECT if self._direct else 0)
        )
        self._flags_r = os.O_RDONLY | _O_CLOEXEC | (_O_DIRECT if self._direct else 0)
        close_at_exit(self)

    # ------------------------------------------------------------------ info
    @property
    def io_mode(self) -> str:
        """'direct' (O_DIRECT) or 'buffered' (page cache + fdatasync + fadvise DONTNEED)."""
        return "direct" if self._direct else "buffered"

    @property
    def run_dir(self) -> Path:
        return self._rundir.path

    @property
    def cache_dir(self) -> Path:
        return self._rundir.cache_dir

    def free_bytes(self) -> int:
        """Space available to unprivileged users on the run dir's filesystem (statvfs)."""
        st = os.statvfs(self._rundir.path)
        return st.f_bavail * st.f_frsize

    @staticmethod
    def file_bytes(nbytes: int) -> int:
        """Bytes an entry of ``nbytes`` occupies on disk (header + padded payload)."""
        return HEADER_BYTES + padded(nbytes)

    def footprint(self, nbytes: int) -> int:
        """Capacity an entry takes in the tier (the cache's accounting): its bytes on disk."""
        return HEADER_BYTES + padded(nbytes)

    def path_of(self, key: str) -> Path:
        """Where the entry ``key`` is (or would be) stored."""
        return self._rundir.path / file_name(key)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._sizes)

    # ------------------------------------------------------------------ O_DIRECT probe
    def _probe_direct(self) -> tuple[bool, str]:
        if not _O_DIRECT:
            return False, "this platform has no O_DIRECT"
        if self.fs_type in MEMORY_FS:
            return False, f"{self.fs_type} keeps files in memory, O_DIRECT would reach no device"
        path = self._rundir.path / f".kv-cache-probe-{secrets.token_hex(4)}"
        buf = mmap.mmap(-1, BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        fd = -1
        try:
            buf[:8] = b"kvprobe!"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_DIRECT, 0o600)
            if os.pwritev(fd, [buf], 0) != BLOCK:
                return False, "O_DIRECT probe: short 4 KiB write"
            if os.preadv(fd, [buf], 0) != BLOCK:
                return False, "O_DIRECT probe: short 4 KiB read"
            return True, "O_DIRECT probe (aligned 4 KiB write + read) succeeded"
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                return False, f"O_DIRECT probe failed: {os.strerror(e.errno)}"
            raise
        finally:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            buf.close()

    # ------------------------------------------------------------------ header buffer (per thread)
    def _header(self, nbytes: int) -> memoryview:
        tls = self._tls
        mv = getattr(tls, "hdr", None)
        if mv is None:
            tls.hdr_mm = mmap.mmap(-1, HEADER_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            mv = tls.hdr = memoryview(tls.hdr_mm)
            tls.hdr_n = -1
        if tls.hdr_n != nbytes:
            mv[:] = npy_header(nbytes)
            tls.hdr_n = nbytes
        return mv

    # ------------------------------------------------------------------ syscall loops
    @staticmethod
    def _pwritev_all(fd: int, iov: list[memoryview], offset: int, total: int) -> tuple[int, int]:
        """One pwritev of ``iov`` (``total`` bytes) at ``offset``; short writes are completed.  The time is
        the syscalls' own, taken where they are made (:mod:`.timedio`)."""
        n, ns = _tio.pwritev(fd, iov, offset)
        done, calls = n, 1
        while done < total:  # rare: a short write (signal, quota, fs limits)
            if n <= 0:
                raise OSError(errno.EIO, f"pwritev made no progress at offset {offset + done}")
            iov = _advance(iov, n)
            n, more = _tio.pwritev(fd, iov, offset + done)
            ns += more
            done += n
            calls += 1
        _count(2, calls, ns)
        return done, ns

    @staticmethod
    def _preadv_all(fd: int, view: memoryview, offset: int, path: str) -> tuple[int, int]:
        """One preadv into ``view`` at ``offset`` (no argument list: the helper takes the view itself);
        short reads are completed."""
        total = len(view)
        n, ns = _tio.preadv(fd, view, offset)
        done, calls = n, 1
        while done < total:  # rare: a short read (signal) or a file shorter than recorded
            if n <= 0:
                raise DataCorruption(f"{path}: file ends at {offset + done}, expected {offset + total} bytes")
            n, more = _tio.preadv(fd, view[done:], offset + done)
            ns += more
            done += n
            calls += 1
        _count(0, calls, ns)
        return done, ns

    # ------------------------------------------------------------------ primitives
    def _begin_write(self, key: str, nbytes: int) -> tuple[_Write, int]:
        path = os.fspath(self._rundir.path / file_name(key))
        h = _Write(key, path, nbytes, self._header(nbytes))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            old = self._files.get(key)
            self._sizes.pop(key, None)  # a replaced entry is unreadable from now on
            self._files[key] = path
        ns = 0
        try:
            if old is not None:
                # unlink first: a reader that has the old file open keeps its inode intact
                try:
                    ns += _tio.unlink(old)
                except FileNotFoundError:
                    pass
            h.fd, t = _tio.open(path, self._flags_w, 0o644)
            ns += t
            if self._closed:  # close() ran meanwhile: do not leave a file behind it
                raise RuntimeError(f"{self.name}: store closed during write")
        except BaseException:
            self._abort(h)
            raise
        return h, ns

    def _put(self, h: _Write, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        if first:
            iov = h.iov_hdr
            iov[1] = view
            return self._pwritev_all(h.fd, iov, 0, HEADER_BYTES + len(view))
        iov = h.iov
        iov[0] = view
        return self._pwritev_all(h.fd, iov, HEADER_BYTES + offset, len(view))

    def _commit(self, h: _Write) -> int:
        fd = h.fd
        ns = 0
        if self.fsync:
            sync_ns = _tio.fdatasync(fd)
            ns += sync_ns
            _count(4, 1, sync_ns)
        if not self._direct and _HAVE_FADVISE:
            ns += _tio.fadvise_dontneed(fd)
        h.fd = -1
        ns += _tio.close(fd)
        self._record(self._files, h.key, h.path, h.nbytes)
        return ns

    def _abort(self, h: _Write) -> None:
        if h.fd >= 0:
            try:
                os.close(h.fd)
            except OSError:
                pass
            h.fd = -1
        if self._unbook(self._files, h.key, h.path) is not None or self._closed:
            try:
                os.unlink(h.path)
            except OSError:
                pass

    def _begin_read(self, key: str) -> tuple[_Read, int, int]:
        with self._lock:
            nbytes = self._sizes[key]  # KeyError if not stored
            path = self._files[key]
        try:
            fd, ns = _tio.open(path, self._flags_r)
        except FileNotFoundError:
            raise KeyError(key) from None
        if not self._direct and _HAVE_FADVISE:
            try:
                ns += _tio.fadvise_dontneed(fd)  # make the read go to the device
            except OSError:
                os.close(fd)
                raise
        return _Read(fd, path), nbytes, ns

    def _get(self, h: _Read, offset: int, view: memoryview) -> tuple[int, int]:
        return self._preadv_all(h.fd, view, HEADER_BYTES + offset, h.path)

    def _end_read(self, h: _Read) -> int:
        if h.fd < 0:
            return 0
        fd, h.fd = h.fd, -1
        try:
            return _tio.close(fd)
        except OSError:
            return 0

    # ------------------------------------------------------------------ public
    def delete(self, key: str) -> None:
        """Remove the entry's file (missing is fine)."""
        path = self._unbook(self._files, key)
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Delete the files this store created, the marker and the run dir (and a temp cache dir).

        Never touches anything else.  Idempotent; usable from atexit or a signal handler (it does not
        wait more than a moment for the lock a interrupted caller might hold).
        """
        got = self._lock.acquire(timeout=1.0)
        try:
            self._closed = True
            paths = list(self._files.values())
            self._files.clear()
            self._sizes.clear()
        finally:
            if got:
                self._lock.release()
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        self._rundir.remove()
        forget_at_exit(self)

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"FileStore(name={self.name!r}, run_dir={str(self._rundir.path)!r}, fs={self.fs_type}, "
            f"io_mode={self.io_mode}, fsync={self.fsync})"
        )
