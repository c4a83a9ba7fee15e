"""One pool of I/O worker threads: every phase that touches the cache runs its operations through it.

Each worker owns a `WorkerBuffers` whose incompressible fill is drawn from (run seed, buffer id). Pools
of different jobs must not write identical bytes (a deduplicating or compressing device would then see
repeated data across phases), so each job kind has its own stream: a worker's buffer id is its stream's
base plus its index. The bases below are the only place these ids are chosen; they are kept as they
were so that a given seed writes the same bytes as before.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from enum import IntEnum

from kv_cache.storage.buffers import WorkerBuffers

Job = Callable[[WorkerBuffers], None]


class Stream(IntEnum):
    """Buffer-id base of each pool kind (room for 100,000 workers each)."""

    REQUESTS = 0  # the measured run's request workers
    FILL = 100_000  # preconditioning and decode-only pre-population
    RAG_INGEST = 200_000  # RAG document ingestion
    ENGINE_IO = 300_000  # the sessions engine's block loads and offloads
    PROBE = 400_000  # the I/O worker count's probe of the storage tier (core/io_workers.py)


def run_threads(target: Callable[[int], None], n: int, name: str = "kv-thread") -> None:
    """Run target(0) .. target(n - 1) on n threads of their own and wait for all of them; the first
    exception any raised is raised here, after every thread ended (the probe's steps, the benchmarks'
    fill and read phases)."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001  (raised after the join)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def buffer_id(stream: Stream, index: int) -> int:
    return int(stream) + index


DEFAULT_MAX_WORKERS = 32  # I/O workers when --io-workers is 0: one per unit of demand (user) up to this many
POOL_NAMES = {Stream.REQUESTS: "kv-io", Stream.FILL: "kv-fill", Stream.RAG_INGEST: "kv-rag",
              Stream.ENGINE_IO: "kv-sess-io", Stream.PROBE: "kv-probe"}  # thread-name prefix of each pool kind


def worker_count(io_workers: int, demand: int, limit: int = 0) -> int:
    """The I/O worker count every benchmark uses: `io_workers` (--io-workers) when set, else 0 = auto, one
    per unit of `demand` (users, sessions) up to DEFAULT_MAX_WORKERS; at most `limit` when it is > 0."""
    workers = io_workers or min(demand, DEFAULT_MAX_WORKERS)
    if limit > 0:
        workers = min(workers, limit)
    return max(1, workers)


def open_pool(stream: Stream, workers: int, chunk_bytes: int, seed: int) -> WorkerPool:
    """The one builder of an I/O worker pool (not started), for the standard run's phases and request
    workers and for every sessions rung alike: `workers` from :func:`worker_count`, `chunk_bytes` per
    buffer (0: no buffers, a run that moves no data), buffers filled from (`seed`, `stream`)."""
    return WorkerPool(stream, workers, chunk_bytes, seed, name=POOL_NAMES[stream])


class WorkerPool:
    """`workers` threads with their buffers allocated (and filled) before `start()` returns.

    Jobs are callables taking the worker's buffers; a higher `priority` runs first, equal priorities
    in submission order. `chunk_bytes` 0: no buffers at all (trace mode moves no data), jobs get None.
    """

    def __init__(self, stream: Stream, workers: int, chunk_bytes: int, seed: int, name: str = "kv-io") -> None:
        self.stream = stream
        self.size = max(1, workers)
        self.chunk_bytes = chunk_bytes
        self.seed = seed
        self.name = name
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []

    def start(self) -> WorkerPool:
        ready = threading.Barrier(self.size + 1)
        self._threads = [threading.Thread(target=self._work, args=(i, ready), name=f"{self.name}-{i}", daemon=True)
                         for i in range(self.size)]
        for t in self._threads:
            t.start()
        ready.wait()
        return self

    def submit(self, job: Job, priority: int = 0) -> None:
        self._jobs.put((-priority, next(self._seq), job))

    def qsize(self) -> int:
        return self._jobs.qsize()

    def drain(self) -> int:
        """Drop the jobs not started yet; returns how many were dropped."""
        dropped = 0
        try:
            while True:
                self._jobs.get_nowait()
                dropped += 1
        except queue.Empty:
            return dropped

    def close(self, wait: bool = True, cut: threading.Event | None = None) -> bool:
        """Let queued jobs run, then stop every worker; `wait` joins them, unless `cut` is set first (a
        worker stuck in an I/O call is then left behind: the workers are daemons). Returns True when every
        worker was joined (False: not waited for, or cut short)."""
        for _ in self._threads:
            self._jobs.put((1 << 30, next(self._seq), None))
        joined = wait
        if wait:
            for t in self._threads:
                while t.is_alive() and not (cut is not None and cut.is_set()):
                    t.join(None if cut is None else 0.05)
                joined = joined and not t.is_alive()
        self._threads = []
        return joined

    def run_on_each(self, job: Job) -> None:
        """Run `job` once on every worker, wait for all of them; the first exception is re-raised."""
        errors: list[BaseException] = []
        done = threading.Semaphore(0)

        def wrapped(bufs: WorkerBuffers) -> None:
            try:
                job(bufs)
            except BaseException as exc:  # surfaced to the caller after all workers returned
                errors.append(exc)
            finally:
                done.release()

        for _ in range(self.size):
            self.submit(wrapped)
        for _ in range(self.size):
            done.acquire()
        if errors:
            raise errors[0]

    def _work(self, index: int, ready: threading.Barrier) -> None:
        bufs = WorkerBuffers(self.chunk_bytes, self.seed, buffer_id(self.stream, index)) if self.chunk_bytes else None
        ready.wait()
        try:
            while True:
                job = self._jobs.get()[2]
                if job is None:
                    return
                job(bufs)
        finally:
            if bufs is not None:
                bufs.close()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # On an interrupt the caller sets the run's stop event only after this returns, and the jobs
        # watch that event: joining here would wait for work nobody stopped yet (workers are daemons).
        self.close(wait=exc_type is None)
