"""`--processes N`: N worker processes on one host, for a storage array one Python process cannot drive.

Each process is a rank of a standard run: its share of every setting that divides across ranks (users,
request rate, tier sizes...: kv_cache/settings/ranks.py), seed + rank, its own
cache directory `<cache>/rank<r>` and results `X_rank<r>.json`. The same barriers as under mpirun open and
close one common window (multiprocessing.Barrier); each rank hands its document to this (parent) process,
which writes the merged document at X.json. No MPI is needed.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv_cache.benchmarks.standard.outputs import write_merged_document
from kv_cache.benchmarks.standard.run import run_benchmark
from kv_cache.core.group import GroupBroken
from kv_cache.errors import InternalError, KvCacheError, RanksLost, RunOutcome
from kv_cache.results.merge import merge_documents
from kv_cache.results.verdict import mark_missing_ranks
from kv_cache.settings.ranks import rank_share
from kv_cache.settings.run import RunSettings

__all__ = ["GroupBroken", "ProcessGroup", "rank_settings", "run_processes", "with_missing_ranks"]

log = logging.getLogger("kv_cache")


class ProcessGroup:
    """A RankGroup over multiprocessing: a shared Barrier, a shared dict for allgather, a results queue.

    The parent breaks the barrier (abort) as soon as a process ends without finishing, so no rank waits
    for a lost one: a rank at a barrier gets GroupBroken within a poll (half a second)."""

    gather_waits = False  # a rank's document goes on the queue: an interrupted rank sends its own too

    def __init__(self, rank: int, size: int, barrier: Any, shared: Any, results: Any) -> None:
        self.rank, self.size = rank, size
        self._barrier, self._shared, self._results = barrier, shared, results
        self._rounds = 0

    def barrier(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise GroupBroken("another process of this run failed or was lost") from None

    def allgather(self, obj: Any) -> list[Any]:
        self._rounds += 1
        self._shared[(self._rounds, self.rank)] = obj
        self.barrier()
        return [self._shared[(self._rounds, r)] for r in range(self.size)]

    def gather(self, obj: Any) -> None:
        """Send this rank's document to the parent, which merges; no rank writes the merged document."""
        self._results.put((self.rank, DOC, obj))
        return None

    def report(self, kind: str, payload: Any) -> None:
        """How this rank ended, for the parent: (OUTCOME, RunOutcome) or (ERROR, a KvCacheError)."""
        self._results.put((self.rank, kind, payload))

    def abort(self) -> None:
        self._barrier.abort()


DOC, OUTCOME, ERROR = "doc", "outcome", "error"  # what a rank puts on the results queue


def rank_settings(settings: RunSettings, rank: int, n: int) -> RunSettings:
    """The settings of process `rank` of `n`: its share of every SPLIT setting (users, request rate, the
    tiers' sizes, max-requests, precondition volume, RAG documents), seed + rank, the host's memory divided
    between the `n` processes on it (settings/ranks.py), and its own paths."""
    stem, dot, ext = settings.outputs.output.rpartition(".")
    output = f"{stem}_rank{rank}.{ext}" if dot and "/" not in ext else f"{settings.outputs.output}_rank{rank}"
    cache_dir = os.path.join(settings.tiers.cache_dir, f"rank{rank}") if settings.tiers.cache_dir else None
    share = rank_share(settings, rank, n, host_ranks=n)
    return dataclasses.replace(
        share, merged_output=None,
        tiers=dataclasses.replace(share.tiers, cache_dir=cache_dir),
        outputs=dataclasses.replace(share.outputs, output=output, xlsx_output=None),
        driver=dataclasses.replace(share.driver, processes=1),
    )


def _child(settings: RunSettings, group: ProcessGroup, setup_logging: Callable[[str], None] | None) -> None:
    """One rank: run, then tell the parent how it ended. A known error goes to the parent as it is (it is
    the parent's to report); anything else is a bug: its traceback is logged here and the parent reports an
    internal error (never a usage error)."""
    if setup_logging is not None:  # a spawned process starts with no logging set up
        setup_logging(settings.outputs.log_level)
    try:
        group.report(OUTCOME, run_benchmark(settings, io.StringIO(), group=group))  # the report stays in the JSON
        code = 0
    except KeyboardInterrupt:  # interrupted before its run could write anything
        group.report(OUTCOME, RunOutcome(interrupted=True))
        code = 0
    except KvCacheError as exc:
        group.abort()  # the others must not wait for this one at a barrier
        group.report(ERROR, exc)
        code = 1
    except BaseException as exc:  # noqa: BLE001  (a bug: reported as such, with its traceback)
        log.exception("process %d: internal error", group.rank)
        group.abort()
        group.report(ERROR, InternalError(f"internal error in process {group.rank}: {type(exc).__name__}: {exc} "
                                          "(a bug; the traceback is in the log)"))
        code = 1
    raise SystemExit(code)  # (not os._exit: the results queue's feeder thread must flush)


def run_processes(settings: RunSettings, out, setup_logging: Callable[[str], None] | None = None) -> RunOutcome:
    """Start the processes, wait for them, write the merged document; returns how the run ended.

    A lost process (killed, out of memory, crashed: it ended without saying how) breaks the barrier, so
    the others finish (their window is theirs) and the merge of the others names it: RunOutcome with
    `missing_ranks`. A known error of a process (bad cache dir, storage error before the window) is
    raised here after the others have stopped; a programming error is raised as InternalError."""
    n = settings.driver.processes
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    barrier, shared, results = ctx.Barrier(n), manager.dict(), ctx.Queue()
    procs = [ctx.Process(target=_child, name=f"kv-cache-rank{r}",
                         args=(rank_settings(settings, r, n), ProcessGroup(r, n, barrier, shared, results),
                               setup_logging)) for r in range(n)]
    out.write(f"Running {n} processes ({settings.workload.num_users} users split between them); results per process "
              f"beside {settings.outputs.output}\n")
    out.flush()
    ended = _Ended()
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops the ranks like Ctrl-C
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for p in procs:
            p.start()
        _collect(procs, results, barrier, ended)
    finally:
        manager.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return _conclude(settings, procs, ended, out)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@dataclass
class _Ended:
    """What the ranks sent: documents, outcomes, errors (by rank); and whether this process was interrupted."""

    docs: dict[int, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[int, RunOutcome] = field(default_factory=dict)
    errors: dict[int, KvCacheError] = field(default_factory=dict)
    interrupted: bool = False

    def take(self, item: tuple[int, str, Any]) -> None:
        rank, kind, payload = item
        {DOC: self.docs, OUTCOME: self.outcomes, ERROR: self.errors}[kind][rank] = payload


def _collect(procs: list, results: Any, barrier: Any, ended: _Ended) -> None:
    """Every rank's messages from the queue (read before joining: a large item blocks its sender). A
    process that ended with a non-zero status breaks the barrier, so no rank waits for it. Ctrl-C here
    (the ranks got it too) keeps collecting: the ranks write what they measured."""
    while True:
        try:
            ended.take(results.get(timeout=0.5))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                barrier.abort()
            if all(p.exitcode is not None for p in procs):
                break
        except KeyboardInterrupt:  # each rank gets it too (a terminal's Ctrl-C reaches them already: a
            ended.interrupted = True  # second one only makes them say that they are writing)
            for p in procs:
                if p.pid is not None and p.exitcode is None:
                    os.kill(p.pid, signal.SIGINT)
    while True:  # what the last ones sent just before they ended
        try:
            ended.take(results.get_nowait())
        except queue.Empty:
            break
    for p in procs:
        p.join()


def _conclude(settings: RunSettings, procs: list, ended: _Ended, out) -> RunOutcome:
    """The merged document of the ranks that sent one (naming the missing ones), then the outcome; the
    first rank's own error (not a broken barrier, which only follows another's failure) is raised."""
    n = len(procs)
    lost = {r: p.exitcode for r, p in enumerate(procs) if r not in ended.outcomes and r not in ended.errors}
    missing = [r for r in range(n) if r not in ended.docs]
    if ended.docs:
        # the merge gives the whole shape (verdict, window_fraction, missing and lost ranks); this process
        # adds only how each missing rank ended
        merged = merge_documents([{**ended.docs[r], "_source": rank_settings(settings, r, n).outputs.output}
                                  for r in sorted(ended.docs)], allow_missing=bool(missing),
                                 ended={r: _how(lost.get(r)) for r in missing})
        what = f"{len(ended.docs)} of {n} processes" if missing else f"{n} processes"
        write_merged_document(settings.outputs.output, merged, out, f"Merged results of {what}")
    for r, code in lost.items():
        out.write(f"Process {r} ended without its results ({_how(code)}); the others' results are kept\n")
    out.flush()
    causes = [e for _, e in sorted(ended.errors.items()) if not isinstance(e, GroupBroken)]
    if causes:
        raise causes[0]
    if lost and not ended.docs:
        raise RanksLost(f"process(es) {', '.join(f'{r} ({_how(c)})' for r, c in lost.items())} ended before "
                        "the window closed; no rank has results", tuple(lost))
    outcomes = list(ended.outcomes.values())
    return RunOutcome(
        interrupted=ended.interrupted or any(o.interrupted for o in outcomes),
        storage_error=next((o.storage_error for o in outcomes if o.storage_error), None),
        passed=bool(ended.docs) and not missing and all(o.passed for o in outcomes),
        missing_ranks=tuple(missing) if lost else (),
        fail_exit_code=settings.outputs.fail_exit_code)


def with_missing_ranks(merged: dict[str, Any], missing: list[int], world_size: int,
                       lost: dict[int, int | None]) -> dict[str, Any]:
    """The merged document of a partial set of ranks, naming the missing ones and how each ended
    (`missing_ranks`, `lost_ranks`, verdict INCOMPLETE: results/verdict.py mark_missing_ranks, which
    merge_documents applies itself); unchanged when none is missing."""
    if not missing:
        return merged
    return mark_missing_ranks(merged, missing, world_size, {r: _how(lost.get(r)) for r in missing})


def _how(code: int | None) -> str:
    """A process's end, in words: 'killed by SIGKILL', 'exit status 1'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
