#!/usr/bin/env python3
"""Drive kv-cache's storage tier directly: N threads, each with its own WorkerBuffers, one FileStore.

No cache, no users, no scheduler: exactly the engine the benchmark uses for its storage tier
(``kv_cache.storage.FileStore`` + ``WorkerBuffers``: O_DIRECT, one file per entry, stamped chunks of
``--chunk-mb``, one fdatasync per written entry), so that a pure write or a pure read can be compared
with fio on the same files and the same settings.  Used by ``vs_fio.py`` (in-process, so that fio can
read the very files this wrote); also runnable on its own:

    python benchmarks/pure_storage.py write /mnt/nvme --workers 8 --duration 20
    python benchmarks/pure_storage.py read  /mnt/nvme --workers 8 --duration 20 --files-per-worker 2

Prints one JSON object: bytes moved (device bytes: header + padded payload, as fio counts file bytes),
seconds, GiB/s, operations, process CPU seconds, achieved queue depth (summed syscall time / seconds).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import threading
import time
from pathlib import Path

try:
    from kv_cache.storage import FileStore, IOAborted, WorkerBuffers
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kv_cache.storage import FileStore, IOAborted, WorkerBuffers

from kv_cache.core.pool import run_threads
from kv_cache.storage.files import HEADER_BYTES

GIB = 1 << 30


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Tally:
    """Per-thread counters (no lock on the hot path; summed after join)."""

    __slots__ = ("bytes", "ops", "aborted", "busy_ns", "error")

    def __init__(self) -> None:
        self.bytes = 0
        self.ops = 0
        self.aborted = 0
        self.busy_ns = 0
        self.error: BaseException | None = None


def _sizes(seed: int, worker: int, lo: int, hi: int):
    rng = random.Random(seed * 1_000_003 + worker)
    while True:
        yield rng.randint(lo, hi)


def _run_timed(workers: int, chunk_bytes: int, seed: int, duration: float, body) -> dict:
    """Start ``workers`` threads (buffers allocated before the clock starts), stop them at the deadline.

    ``body(worker_id, bufs, stop, tally)`` loops until ``stop`` is set.  In-flight operations stop at
    their next chunk boundary; the bytes they moved are counted (as fio counts completed I/O units) over
    the window (start to stop): at most one chunk per worker lies beyond it (the one in flight at the
    stop; the kv-cache CLI counts only the chunks completed by the window's end, storage/buffers.py
    ChunkMarks).  The clean-up of a cut-off entry (close + unlink) is not timed, as fio does not time the
    unlink of its files either.
    """
    stop = threading.Event()
    ready = threading.Barrier(workers + 1)
    tallies = [_Tally() for _ in range(workers)]

    def thread(i: int) -> None:
        bufs = WorkerBuffers(chunk_bytes, seed, i)
        try:
            ready.wait()
            body(i, bufs, stop, tallies[i])
        except BaseException as e:  # reported by the caller
            tallies[i].error = e
        finally:
            bufs.close()

    threads = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    ready.wait()
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    stop.wait(duration)
    stop.set()
    elapsed = time.perf_counter() - t0
    for t in threads:
        t.join()
    cpu = _cpu_seconds() - cpu0
    errors = [repr(t.error) for t in tallies if t.error is not None]
    if errors:
        raise RuntimeError(f"storage worker failed: {errors[0]}")
    moved = sum(t.bytes for t in tallies)
    return {
        "bytes": moved,
        "seconds": elapsed,
        "gibps": moved / GIB / elapsed if elapsed > 0 else 0.0,
        "ops": sum(t.ops for t in tallies),
        "aborted_ops": sum(t.aborted for t in tallies),
        "cpu_seconds": cpu,
        "cpu_seconds_per_gib": cpu / (moved / GIB) if moved else 0.0,
        "achieved_queue_depth": sum(t.busy_ns for t in tallies) / 1e9 / elapsed if elapsed > 0 else 0.0,
        "workers": workers,
        "chunk_bytes": chunk_bytes,
    }


def write_phase(store: FileStore, workers: int, duration: float, lo: int, hi: int, seed: int = 0,
                delete_after: bool = True) -> dict:
    """Each worker writes new entries of uniform random size in [lo, hi] bytes until the deadline."""
    written: list[list[str]] = [[] for _ in range(workers)]

    def body(i: int, bufs: WorkerBuffers, stop: threading.Event, tally: _Tally) -> None:
        sizes = _sizes(seed, i, lo, hi)
        n = 0
        while not stop.is_set():
            key = f"w{i:03d}-{n:06d}"
            n += 1
            try:
                res = store.write(key, next(sizes), bufs, stop)
            except IOAborted as e:
                tally.bytes += e.device_bytes
                tally.aborted += 1
                break
            tally.bytes += res.device_bytes
            tally.busy_ns += res.device_ns
            tally.ops += 1
            written[i].append(key)

    out = _run_timed(workers, store.chunk_bytes, seed, duration, body)
    out["mode"] = "write"
    if delete_after:
        for keys in written:
            for k in keys:
                store.delete(k)
    return out


def populate(store: FileStore, workers: int, files_per_worker: int, lo: int, hi: int,
             seed: int = 0, whole_chunks: bool = False) -> list[list[str]]:
    """Write ``files_per_worker`` entries per worker (untimed set-up for read_phase); returns the keys.

    ``whole_chunks``: entry sizes are rounded to whole chunks minus the 4 KiB header, so each file is a
    whole number of chunks (fio skips a file's tail shorter than its block size).
    """
    chunk = store.chunk_bytes
    keys = [[f"r{i:03d}-{j:04d}" for j in range(files_per_worker)] for i in range(workers)]

    def fill(i: int) -> None:
        sizes = _sizes(seed + 7, i, lo, hi)
        with WorkerBuffers(store.chunk_bytes, seed, i) as bufs:
            for k in keys[i]:
                n = next(sizes)
                if whole_chunks:
                    n = max(1, round((n + HEADER_BYTES) / chunk)) * chunk - HEADER_BYTES
                store.write(k, n, bufs)

    run_threads(fill, workers, "fill")
    return keys


def read_phase(store: FileStore, keys: list[list[str]], duration: float, seed: int = 0) -> dict:
    """Worker i reads its own entries ``keys[i]`` round robin, whole entries, until the deadline."""

    def body(i: int, bufs: WorkerBuffers, stop: threading.Event, tally: _Tally) -> None:
        mine = keys[i]
        n = 0
        while not stop.is_set():
            try:
                res = store.read(mine[n % len(mine)], bufs, stop)
            except IOAborted as e:
                tally.bytes += e.device_bytes
                tally.aborted += 1
                break
            n += 1
            tally.bytes += res.device_bytes
            tally.busy_ns += res.device_ns
            tally.ops += 1

    out = _run_timed(len(keys), store.chunk_bytes, seed, duration, body)
    out["mode"] = "read"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("write", "read"))
    ap.add_argument("directory", help="where to create the run directory (the device under test)")
    ap.add_argument("--workers", type=int, default=8, help="I/O threads = queue depth (default 8)")
    ap.add_argument("--chunk-mb", type=int, default=16, help="bytes per pwritev/preadv, MiB (default 16)")
    ap.add_argument("--min-mib", type=float, default=234.0, help="smallest entry, MiB (default 234)")
    ap.add_argument("--max-mib", type=float, default=937.0, help="largest entry, MiB (default 937)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds (default 20)")
    ap.add_argument("--files-per-worker", type=int, default=2, help="read mode: entries per worker")
    ap.add_argument("--io-mode", default="direct", choices=("auto", "direct", "buffered"))
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    lo, hi = int(a.min_mib * 2**20), int(a.max_mib * 2**20)
    store = FileStore(a.directory, a.chunk_mb << 20, fsync=not a.no_fsync, io_mode=a.io_mode)
    try:
        if a.mode == "write":
            res = write_phase(store, a.workers, a.duration, lo, hi, a.seed)
        else:
            keys = populate(store, a.workers, a.files_per_worker, lo, hi, a.seed)
            res = read_phase(store, keys, a.duration, a.seed)
        res["io_mode"] = store.io_mode
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        store.close()
    json.dump(res, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
