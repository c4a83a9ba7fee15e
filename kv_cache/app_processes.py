"""`--processes N`: N worker processes on one host, for a storage array one Python process cannot drive.

Each process is a rank of a standard run: its share of every setting that divides across ranks (users,
request rate, tier sizes...: kv_cache/config/ranks.py), seed + rank, its own
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
import threading
from collections.abc import Callable
from typing import Any

from kv_cache.app import run_benchmark
from kv_cache.config.ranks import rank_share
from kv_cache.config.run import RunSettings
from kv_cache.errors import ExitCode
from kv_cache.report.merge import merge_documents
from kv_cache.report.run_outputs import write_merged_document

__all__ = ["ProcessGroup", "rank_settings", "run_processes"]

log = logging.getLogger("kv_cache")


class GroupBroken(RuntimeError):
    """Another process of the run failed, so the shared barrier can never be passed."""


class ProcessGroup:
    """A RankGroup over multiprocessing: a shared Barrier, a shared dict for allgather, a results queue."""

    def __init__(self, rank: int, size: int, barrier: Any, shared: Any, results: Any) -> None:
        self.rank, self.size = rank, size
        self._barrier, self._shared, self._results = barrier, shared, results
        self._rounds = 0

    def barrier(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise GroupBroken("another process of this run failed") from None

    def allgather(self, obj: Any) -> list[Any]:
        self._rounds += 1
        self._shared[(self._rounds, self.rank)] = obj
        self.barrier()
        return [self._shared[(self._rounds, r)] for r in range(self.size)]

    def gather(self, obj: Any) -> None:
        """Send this rank's document to the parent, which merges; no rank writes the merged document."""
        self._results.put((self.rank, obj))
        return None


def rank_settings(settings: RunSettings, rank: int, n: int) -> RunSettings:
    """The settings of process `rank` of `n`: its share of every SPLIT setting (users, request rate, the
    tiers' sizes, max-requests, precondition volume, RAG documents), seed + rank, the host's memory divided
    between the `n` processes on it (config/ranks.py), and its own paths."""
    stem, dot, ext = settings.output.rpartition(".")
    output = f"{stem}_rank{rank}.{ext}" if dot and "/" not in ext else f"{settings.output}_rank{rank}"
    cache_dir = os.path.join(settings.cache_dir, f"rank{rank}") if settings.cache_dir else None
    share = rank_share(settings, rank, n, host_ranks=n)
    return dataclasses.replace(
        share, merged_output=None,
        tiers=dataclasses.replace(share.tiers, cache_dir=cache_dir),
        outputs=dataclasses.replace(share.outputs, output=output, xlsx_output=None),
        driver=dataclasses.replace(share.driver, processes=1),
    )


def _child(settings: RunSettings, group: ProcessGroup, setup_logging: Callable[[str], None] | None) -> None:
    if setup_logging is not None:  # a spawned process starts with no logging set up
        setup_logging(settings.log_level)
    try:
        code = run_benchmark(settings, io.StringIO(), group=group)  # the console report stays in the JSON
    except KeyboardInterrupt:
        code = ExitCode.INTERRUPTED
    except BaseException as exc:
        log.error("process %d: %s", group.rank, exc)
        group._barrier.abort()  # the others must not wait for this one at a barrier
        code = ExitCode.STORAGE_ERROR if isinstance(exc, OSError) else ExitCode.USAGE
    raise SystemExit(int(code))  # (not os._exit: the results queue's feeder thread must flush)


def run_processes(settings: RunSettings, out, setup_logging: Callable[[str], None] | None = None) -> int:
    """Start the processes, wait for them, write the merged document; the exit status (the worst rank's)."""
    n = settings.processes
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    barrier, shared, results = ctx.Barrier(n), manager.dict(), ctx.Queue()
    procs = [ctx.Process(target=_child, name=f"kv-cache-rank{r}",
                         args=(rank_settings(settings, r, n), ProcessGroup(r, n, barrier, shared, results),
                               setup_logging)) for r in range(n)]
    out.write(f"Running {n} processes ({settings.num_users} users split between them); results per process "
              f"beside {settings.output}\n")
    out.flush()
    docs: dict[int, dict[str, Any]] = {}
    try:
        for p in procs:
            p.start()
        docs = _collect(procs, results, barrier, n)
    except KeyboardInterrupt:
        for p in procs:
            p.join()
        return int(ExitCode.INTERRUPTED)
    finally:
        manager.shutdown()
    codes = [p.exitcode for p in procs]
    if len(docs) == n:
        merged = merge_documents([{**docs[r], "_source": rank_settings(settings, r, n).output} for r in range(n)])
        write_merged_document(settings.output, merged, out, f"Merged results of {n} processes")
    else:
        out.write(f"{n - len(docs)} of {n} processes did not finish; no merged result (`kv-cache merge` the "
                  "rank files that exist)\n")
    out.flush()
    bad = [c for c in codes if c]
    return int(bad[0]) if bad else int(ExitCode.OK)


def _collect(procs: list, results: Any, barrier: Any, n: int) -> dict[int, dict[str, Any]]:
    """Every rank's document from the queue (read before joining: a large item blocks its sender)."""
    docs: dict[int, dict[str, Any]] = {}
    while len(docs) < n:
        try:
            rank, doc = results.get(timeout=0.5)
            docs[rank] = doc
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                barrier.abort()
            if all(p.exitcode is not None for p in procs):
                break
    for p in procs:
        p.join()
    return docs
