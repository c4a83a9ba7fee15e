"""Per-worker I/O buffers: allocated once per run, page aligned, never shared between threads.

``write_buf`` is filled once with incompressible bytes (the same in every worker); before each chunk is
stored, :meth:`stamp` writes (key id, block index) into the first 16 bytes of every 4 KiB block, which
makes every block on the device unique (no dedup or compression can flatter it) without generating or
copying payload per request.  ``read_buf`` receives data read back; :meth:`check_stamp` verifies its
stamps and :meth:`check_payload` every other byte of each block against the fill (--verify).
"""

from __future__ import annotations

import mmap
from array import array
from bisect import bisect_right
from time import perf_counter_ns

import numpy as np

BLOCK = 4096  # the unit of uniqueness, alignment and padding

_U64 = np.dtype("<u8")
_MASK64 = (1 << 64) - 1
_FILL_WORDS = 1 << 17  # random fill in 1 MiB pieces (bounded temporary memory, once per run)
_HUGE_PAGE = 2 << 20  # transparent huge page size on x86-64 / arm64 (4 KiB base pages)


def _aligned_map(nbytes: int) -> mmap.mmap:
    """An anonymous private mapping (page aligned), backed by transparent huge pages where allowed.

    Why huge pages: an O_DIRECT request is a list of physically contiguous segments and a queue accepts
    at most ``max_segments`` of them, so with 4 KiB pages a request is capped at max_segments x 4 KiB
    (virtio-blk: 254 -> 1016 KiB) whatever ``max_sectors_kb`` allows; with 2 MiB pages a 16 MiB chunk
    goes out as max_sectors-sized requests.  Measured on virtio-blk (max_sectors_kb 4096), 8 readers of
    16 MiB on the same files: 4 KiB-page buffers 0.84-0.94 MiB per request and 1.21-1.49 GiB/s,
    huge-page buffers 4 MiB per request and 1.72-1.89 GiB/s.  It also cuts the kernel's page pinning
    per call and the TLB misses of stamping a chunk that the previous write left cold in the caches
    (0.3-0.55 -> 0.12-0.35 ms per 16 MiB).  Advice only: nothing changes where THP is disabled or the
    platform lacks MADV_HUGEPAGE (the pages are then 4 KiB, as before).
    """
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and nbytes >= _HUGE_PAGE:
        try:
            mm.madvise(advice)
        except OSError:  # THP unsupported here: 4 KiB pages it is
            pass
    return mm


MARKS = 256  # chunk completions room is made for at first; it doubles when an operation has more chunks


class ChunkMarks:
    """When each chunk of the current operation completed, and the bytes moved by then: the measured
    in-window part of an operation that straddles the window's end or is aborted after it.

    (time, cumulative bytes) pairs of every chunk of the operation in two preallocated ``array('q')``;
    ``begin`` at the start of an operation, ``add`` after each chunk (one clock read and two stores; the
    arrays double only when an operation has more chunks than any before on this worker, so their size is
    bounded by the largest operation's chunk count, 16 bytes a chunk, not by the run's length).
    ``bytes_by(t)`` is the bytes moved by chunks that completed by ``t``, however many chunks came after
    ``t`` (a ring of 256 marks counted the chunks of a stop more than 256 chunks late as inside the
    window). A demotion marks its chunks with ``add_move``, which keeps the read side's cumulative bytes too,
    so that ``split_by(t)`` gives the source tier's read bytes and the destination tier's write bytes of the
    chunks completed by ``t`` apart (the first chunk's read holds no file header, its write does). Only one
    thread (the worker owning the buffers) touches it.
    """

    __slots__ = ("_t", "_b", "_r", "count", "seq", "t0", "moved")

    def __init__(self) -> None:
        self._t = array("q", bytes(8 * MARKS))
        self._b = array("q", bytes(8 * MARKS))
        self._r = array("q", bytes(8 * MARKS))  # a move's read side (add_move); stale for other operations
        self.count = 0
        self.seq = 0  # operations begun: a demotion's read and write records share one (one operation)
        self.t0 = 0  # perf_counter_ns at the current operation's begin (one clock read per operation)
        self.moved = False  # the current operation marked its chunks with add_move (split_by is its sides)

    def begin(self) -> None:
        self.count = 0
        self.seq += 1
        self.moved = False
        self.t0 = perf_counter_ns()

    def add(self, cumulative_bytes: int) -> None:
        i = self.count
        if i == len(self._t):  # more chunks than ever before on this worker: double the room
            self._grow()
        self._t[i] = perf_counter_ns()
        self._b[i] = cumulative_bytes
        self.count = i + 1

    def add_move(self, read_bytes: int, write_bytes: int) -> None:
        """A chunk of a move done: the cumulative bytes read from the source and written to the destination."""
        i = self.count
        if i == len(self._t):
            self._grow()
        self._t[i] = perf_counter_ns()
        self._b[i] = read_bytes + write_bytes
        self._r[i] = read_bytes
        self.count = i + 1
        self.moved = True

    def _grow(self) -> None:
        self._t.extend(self._t)
        self._b.extend(self._b)
        self._r.extend(self._r)

    @property
    def total(self) -> int:
        """Bytes at the last mark (0 without one)."""
        return self._b[self.count - 1] if self.count else 0

    def bytes_by(self, t_ns: int) -> int | None:
        """Bytes moved by the chunks completed at or before ``t_ns``; None without a mark (the store does
        not mark its chunks)."""
        if not self.count:
            return None
        k = bisect_right(self._t, t_ns, 0, self.count)  # the marks' times never decrease
        return self._b[k - 1] if k else 0

    def split_by(self, t_ns: int) -> tuple[int, int] | None:
        """A move's (read, write) bytes of the chunks completed at or before ``t_ns``, and (with ``t_ns`` past
        the last mark) the move's totals; None without a mark, or for an operation not marked by ``add_move``
        (a move that is not StoreBase.move_to: then the operation's combined bytes are the measure)."""
        if not self.count or not self.moved:
            return None
        k = bisect_right(self._t, t_ns, 0, self.count)
        return (self._r[k - 1], self._b[k - 1] - self._r[k - 1]) if k else (0, 0)


class WorkerBuffers:
    """One pair of aligned chunk buffers for one I/O worker thread.

    Attributes: ``chunk_bytes``; ``write_buf`` / ``read_buf`` (numpy uint8 views over anonymous
    mmaps, so page aligned, as required by O_DIRECT); ``write_mv`` / ``read_mv`` (memoryviews of the
    same memory, cheap to slice for syscalls).
    """

    def __init__(self, chunk_bytes: int, seed: int | None, worker_id: int, *, read_bytes: int | None = None,
                 fill_from: WorkerBuffers | None = None):
        if chunk_bytes <= 0 or chunk_bytes % BLOCK:
            raise ValueError(f"chunk_bytes must be a positive multiple of {BLOCK}, got {chunk_bytes}")
        self.chunk_bytes = int(chunk_bytes)
        self.seed = 0 if seed is None else int(seed)
        self.worker_id = int(worker_id)
        self.nblocks = self.chunk_bytes // BLOCK

        self._write_mm = _aligned_map(self.chunk_bytes)
        # read_bytes: a smaller read buffer (a write-only slot of a remote tier's ring: 4 KiB)
        self._read_mm = _aligned_map(self.chunk_bytes if read_bytes is None else max(BLOCK, read_bytes))
        self.write_buf = np.frombuffer(self._write_mm, dtype=np.uint8)
        self.read_buf = np.frombuffer(self._read_mm, dtype=np.uint8)
        self.write_mv = memoryview(self._write_mm)
        self.read_mv = memoryview(self._read_mm)

        # Incompressible fill, once: numpy default_rng(SeedSequence([seed])), the same in every worker's buffer,
        # so that a reader knows the payload any worker wrote (--verify compares every byte with it); every
        # block on the device is still unique by its stamp, and a worker already reuses its fill per entry.
        # `fill_from`: a fresh buffer of the same seed and size, whose fill is copied instead of drawn again
        # (a remote tier's slot ring: S3's 6 slots a worker were 6 draws of 8 MiB each, made as a worker's first
        # write came, inside the window: 16 % of a 16-worker run's samples, py-spy, 4 Dec)
        if fill_from is not None and fill_from.chunk_bytes == self.chunk_bytes and fill_from.seed == self.seed:
            self.write_buf[:] = fill_from.write_buf
        else:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed & _MASK64]))
            words = self.write_buf.view(_U64)
            for i in range(0, words.size, _FILL_WORDS):
                m = min(_FILL_WORDS, words.size - i)
                words[i : i + m] = rng.integers(
                    0, np.iinfo(np.uint64).max, size=m, dtype=np.uint64, endpoint=True
                )
        self.read_buf.fill(0)  # fault the read pages in now, not inside the first timed read
        self.marks = ChunkMarks()  # chunk completion times of the current operation (window accounting)

        # Stamp machinery, all preallocated.  The (block, 2) uint64 views cover the first 16 bytes of
        # every block; the stamps are built in a small contiguous scratch and copied in one strided
        # pass (about 3x faster than writing the two columns separately).
        w64 = self.write_buf.view(_U64).reshape(self.nblocks, BLOCK // 8)
        r64 = self.read_buf.view(_U64).reshape(-1, BLOCK // 8)
        self._w_pair = w64[:, :2]
        self._r_pair = r64[:, :2]
        self._ramp = np.arange(self.nblocks, dtype=_U64)
        self._scratch = np.empty((self.nblocks, 2), dtype=_U64)
        self._rscratch = np.empty((self.nblocks, 2), dtype=_U64)
        self._expect = np.empty(self.nblocks, dtype=_U64)
        self._ok = np.empty(self.nblocks, dtype=np.bool_)
        self._ok2 = np.empty(self.nblocks, dtype=np.bool_)
        # --verify's payload comparison: the fill itself (the write buffer less its stamps) as (block, word)
        # views, and a preallocated result array (1 byte per 8 compared): nothing is allocated per chunk.
        self._w_body = w64[:, 2:]
        self._r_body = r64[:, 2:]
        self._diff = np.empty((self.nblocks, BLOCK // 8 - 2), dtype=np.bool_)

    # ------------------------------------------------------------------ stamping
    def stamp(self, kid: int, first_block: int, nblocks: int) -> None:
        """Write (kid, first_block + i) as little-endian uint64s at the start of block i of write_buf.

        Vectorised over preallocated arrays; allocates nothing that outlives the call.
        """
        if not 0 <= nblocks <= self.nblocks:
            raise ValueError(f"nblocks {nblocks} outside 0..{self.nblocks}")
        sc = self._scratch[:nblocks]
        sc[:, 0] = kid
        np.add(self._ramp[:nblocks], np.uint64(first_block), out=sc[:, 1])
        np.copyto(self._w_pair[:nblocks], sc)

    def check_stamp(self, kid: int, first_block: int, nblocks: int) -> int:
        """Index of the first block of read_buf[:nblocks] whose stamp is not (kid, first_block + i); -1 if all match."""
        if not 0 <= nblocks <= self.nblocks:
            raise ValueError(f"nblocks {nblocks} outside 0..{self.nblocks}")
        ok = self._ok[:nblocks]
        ok2 = self._ok2[:nblocks]
        expect = self._expect[:nblocks]
        got = self._rscratch[:nblocks]
        np.copyto(got, self._r_pair[:nblocks])
        np.equal(got[:, 0], np.uint64(kid), out=ok)
        np.add(self._ramp[:nblocks], np.uint64(first_block), out=expect)
        np.equal(got[:, 1], expect, out=ok2)
        np.logical_and(ok, ok2, out=ok)
        if ok.all():
            return -1
        return int(np.argmin(ok))

    def _body_differs(self, at: int, pos: int, run: int) -> bool:
        d = self._diff[:run]
        np.not_equal(self._r_body[at:at + run], self._w_body[pos:pos + run], out=d)
        return bool(d.any())

    def _grid_differs(self, first_block: int, nblocks: int, lead_blocks: int) -> int:
        """First block of read_buf[:nblocks] whose bytes after the stamp are not the fill at the position a
        writer with `lead_blocks` of lead put entry block first_block + i (its first chunk holds
        nblocks - lead blocks, the next ones whole chunks); -1 if all match."""
        nb, b, end = self.nblocks, first_block, first_block + nblocks
        while b < end:
            if b < nb - lead_blocks:
                pos, run = b, min(end, nb - lead_blocks) - b
            else:
                pos = (b + lead_blocks) % nb
                run = min(end - b, nb - pos)
            if self._body_differs(b - first_block, pos, run):
                d = self._diff[:run]
                return b - first_block + int(np.argmax(d.any(axis=1)))
            b += run
        return -1

    def check_payload(self, first_block: int, nblocks: int, leads: tuple[int, ...] = (0,)) -> int:
        """Index of the first block of read_buf[:nblocks] (entry blocks first_block...) whose 4080 bytes after
        the stamp differ from the payload written; -1 if every byte matches. `leads`: the writers' lead
        blocks that can have laid the entry out (the reading store's first, then another tier's an entry
        can have been demoted from): a block matches when it is the fill at one of those positions."""
        if not 0 <= nblocks <= self.nblocks:
            raise ValueError(f"nblocks {nblocks} outside 0..{self.nblocks}")
        bad = -1
        for lead in leads:
            bad = self._grid_differs(first_block, nblocks, lead)
            if bad < 0:
                return -1
        return bad

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Unmap the buffers (the object is unusable afterwards). Safe to call twice."""
        for name in ("write_buf", "read_buf", "write_mv", "read_mv", "_w_pair", "_r_pair", "_w_body", "_r_body"):
            obj = self.__dict__.pop(name, None)
            if isinstance(obj, memoryview):
                obj.release()
        for name in ("_write_mm", "_read_mm"):
            mm = self.__dict__.get(name)
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # someone still holds a view; the GC will unmap it
                    pass

    def __enter__(self) -> WorkerBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WorkerBuffers(chunk_bytes={self.chunk_bytes}, seed={self.seed}, worker_id={self.worker_id})"
