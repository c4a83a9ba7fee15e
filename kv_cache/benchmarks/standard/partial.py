"""The run's periodic INCOMPLETE document, rewritten during the window so that a SIGKILL loses at most an
interval (results/partial.py says what the document holds).

`PartialDocuments` is an observer of the driver. At a 1-second tick that is due (every `interval_s` of the
window), on the scheduler thread, it takes what the document is built from: a snapshot of the recorder
(`RunMetrics.snapshot`: one consistent state, copied under the recorder's lock as memcpys, so no operation
is half in it), the driver's counts (`Driver.outcome_so_far`) and the cache's usage (its tiers' counters,
as every tick reads them). Then it hands them to its own thread, which builds the document as the final
one is built (`build`: the run's build_results on the snapshot), marks it periodic and INCOMPLETE, and
writes it over the previous one atomically (results/write.py replace_document: temporary file in the same
directory, fsync, rename). The workers never wait for it: the scheduler thread pays the snapshot only, and a
tick that comes while the thread is still writing the previous document is skipped (counted), never queued.
What it cost is in the final document (`measurement.partial_documents`: the snapshot's time on the
scheduler thread, the build-and-write time on its own thread, the bytes, the documents written and skipped).

The file it writes is the run's own results file. The first write keeps an earlier file found there (as
PATH.1, the one write policy); the final document then replaces the periodic one (`owns`), and `close()`
is called before it, so no periodic write can land after the final one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv_cache.core.observe import Tick
from kv_cache.metrics.recorder import RunMetrics
from kv_cache.results.partial import mark_partial
from kv_cache.results.write import keep_existing, replace_document

__all__ = ["PartialDocuments", "Snapshot"]

log = logging.getLogger("kv_cache")


@dataclass
class Snapshot:
    """What one periodic document is built from, taken on the scheduler thread at a tick."""

    metrics: RunMetrics
    outcome: Any  # scheduler.DriverOutcome so far
    usage: dict[str, dict[str, float]]
    elapsed_s: float
    sequence: int
    autoscaler: Any = None  # its history as it stood (a copy)


@dataclass
class _Times:
    """Count, sum and longest of a cost's durations (not a list: one a document would grow with the run)."""

    count: int = 0
    total: float = 0.0
    longest: float = 0.0

    def append(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)


@dataclass
class _Cost:
    snapshot_s: _Times = field(default_factory=_Times)  # on the scheduler thread
    write_s: _Times = field(default_factory=_Times)  # build + serialise + write + fsync + rename, own thread
    bytes_last: int = 0
    bytes_total: int = 0
    skipped_busy: int = 0
    failed: int = 0
    last_error: str | None = None


class PartialDocuments:
    """The periodic document of a run (see the module docstring). `take(elapsed_s, sequence)` returns the
    Snapshot at a due tick (the run gives the driver's and the cache's parts); `build(snapshot)` the
    document of it, as build_results makes the final one."""

    def __init__(self, path: str, interval_s: float, duration_s: float,
                 take: Callable[[float, int], Snapshot], build: Callable[[Snapshot], dict[str, Any]],
                 after_write: Callable[[], None] | None = None) -> None:
        self.path, self.interval_s, self.duration_s = path, float(interval_s), float(duration_s)
        self._take, self._build = take, build
        self._after_write = after_write  # once a document and its snapshot are freed (the malloc trim)
        self._due = self.interval_s
        self._sequence = 0
        self._job: Snapshot | None = None
        self._ready = threading.Condition()
        self._closed = False  # no more snapshots (the window is over)
        self._stop = False  # the thread ends (close)
        self._busy = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.driver: Any = None  # the run's Driver, set before it runs (the take callback reads its counts)
        self.kept_as: str | None = None  # an earlier file at the path, kept by the first write
        self.cost = _Cost()

    # -- the driver's observer (scheduler thread) ------------------------------------------------
    def tick(self, tick: Tick) -> None:
        if self.interval_s <= 0 or self._closed or tick.elapsed_s + 1e-9 < self._due:
            return
        self._due = tick.elapsed_s + self.interval_s
        with self._ready:
            if self._busy or self._job is not None:  # the previous one is still being written: skip this tick
                self.cost.skipped_busy += 1
                return
        t0 = time.perf_counter()
        self._sequence += 1
        try:
            job = self._take(tick.elapsed_s, self._sequence)
        except Exception as exc:  # noqa: BLE001  (never the driver's loop: said once, counted)
            self._failed(exc, "the periodic results document's snapshot failed")
            return
        self.cost.snapshot_s.append(time.perf_counter() - t0)
        with self._ready:
            self._job = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kv-cache-partial-doc", daemon=True)
                self._thread.start()
            self._ready.notify()

    def done(self) -> None:
        """The window is over: no more snapshots (the thread ends at close())."""
        self._closed = True

    # -- its thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._ready:
                while self._job is None and not self._stop:
                    self._ready.wait()
                job, self._job = self._job, None
                if job is None:
                    return
                self._busy = True
            try:
                self._write(job)
            finally:
                with self._ready:
                    self._busy = False
            del job  # (the snapshot's copies: freed before the hook, which gives their memory back)
            if self._after_write is not None:
                self._after_write()

    def _write(self, job: Snapshot) -> None:
        t0 = time.perf_counter()
        try:
            doc = mark_partial(self._build(job), job.metrics.window_seconds, self.duration_s, time.time(),
                               self.interval_s, job.sequence)
            if self.written == 0:
                self.kept_as = keep_existing(self.path)
            if self.kept_as:
                doc["measurement"]["notes"].append(f"an earlier results file at {self.path} was kept as "
                                                   f"{self.kept_as}")
            self.cost.bytes_last = replace_document(self.path, doc)
            self.cost.bytes_total += self.cost.bytes_last
            self.written += 1
        except OSError as exc:  # (a full disk: the run goes on; the final document has its own fallback)
            self.cost.failed += 1
            if self.cost.last_error is None:
                log.warning("could not write the periodic results document %s (%s); the run goes on", self.path,
                            exc.strerror or exc)
            self.cost.last_error = f"{exc.strerror or exc}"
        except Exception as exc:  # noqa: BLE001  (a bug must not stop the run: said once, with its traceback)
            self._failed(exc, "the periodic results document could not be built")
        self.cost.write_s.append(time.perf_counter() - t0)

    def _failed(self, exc: Exception, what: str) -> None:
        self.cost.failed += 1
        if self.cost.last_error is None:
            log.exception(what)
        self.cost.last_error = f"{type(exc).__name__}: {exc}"

    # -- the run's end ---------------------------------------------------------------------------
    def close(self) -> None:
        """No more documents; waits for one being written (so none lands after the final document)."""
        self._closed = True
        with self._ready:
            self._stop = True
            self._job = None  # a snapshot not yet started is dropped: the final document comes next
            self._ready.notify_all()
        if self._thread is not None:
            self._thread.join()

    def owns(self) -> bool:
        """The file at the path is this run's own periodic document (the final one replaces it, unkept)."""
        return self.written > 0

    def record(self) -> dict[str, Any]:
        """`measurement.partial_documents` of the final document: what the periodic documents cost."""
        snap, write = self.cost.snapshot_s, self.cost.write_s
        return {
            "path": self.path, "interval_s": self.interval_s, "written": self.written,
            "skipped_busy": self.cost.skipped_busy, "failed": self.cost.failed, "last_error": self.cost.last_error,
            "snapshot_ms": _stats_ms(snap), "build_and_write_ms": _stats_ms(write), "bytes_last": self.cost.bytes_last,
            "bytes_total": self.cost.bytes_total,
            "note": ("the snapshot is taken on the scheduler thread (the recorder's lock held while its lists and "
                     "histograms are copied); the document is built and written on a thread of its own, whose "
                     "CPU time competes with the run's threads for the interpreter (GIL); a tick that came while "
                     "it was still writing was skipped. bytes_total went to the results file's filesystem during "
                     "the window: when that is the storage under test, its block-device counters include them "
                     "(and this process's counters, so they are not taken for other I/O)"),
        }


def _stats_ms(times: _Times) -> dict[str, float | int]:
    if not times.count:
        return {"count": 0}
    return {"count": times.count, "mean": 1e3 * times.total / times.count, "max": 1e3 * times.longest}

