"""`--processes N`: N worker processes on one host, for a storage array one Python process cannot drive.

Each process is a rank of a standard run: its share of every setting that divides across ranks (users,
request rate, tier sizes...: kv_cache/settings/ranks.py), seed + rank, its own
cache directory `<cache>/rank<r>` and results `X_rank<r>.json`. The same barriers as under mpirun open and
close one common window (multiprocessing.Barrier); each rank hands its document to this (parent) process,
which writes the merged document at X.json. No MPI is needed.

The console is the parent's: the ranks' reports stay in their documents, and what a user watches comes
from here: rank 0's banner with every rank's share and sizes in force, one progress line per second
totalled over the ranks (the ranks send their ticks on the results queue, off the I/O path), the merged
table and its verdict. Signals are the parent's too: the ranks run in a process group of their own, so a
terminal's Ctrl-C reaches the parent alone, which passes each signal on to every rank once (so a rank
counts them as one process would); its own handler stays until the merged document is written, and
whether the run was interrupted is the ranks' word (a rank whose window completed was not), so a signal
after the window never changes the status nor loses the merged document.

A parent that dies (SIGKILL, OOM kill) leaves nothing behind: each rank watches multiprocessing's parent
sentinel (a pipe whose end the parent holds: EOF means it is gone), finishes its window, writes its own
`X_rank<r>.json` with a note naming the `kv-cache merge` command that merges them, and exits; after the
parent's death no rank waits at a barrier more than PARENT_GONE_BARRIER_S (no one is left to break it for
a lost rank); the manager process (the ranks' shared dict) watches the same sentinel and exits with it.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_ready
from multiprocessing.managers import SyncManager
from typing import Any

from kv_cache.benchmarks.standard.outputs import write_merged_document
from kv_cache.benchmarks.standard.run import STOP_SIGNALS, run_benchmark
from kv_cache.core.group import GroupBroken
from kv_cache.core.observe import RankTicks, RunObserver, Tick
from kv_cache.errors import InternalError, KvCacheError, RanksLost, RunOutcome
from kv_cache.host.signals import catch_stop_signals
from kv_cache.render.banner import ranks_lines
from kv_cache.render.merged_table import integrity_sentence
from kv_cache.render.progress import QUIET_LEVELS, make_progress
from kv_cache.results.figures import Figures
from kv_cache.results.merge import merge_documents
from kv_cache.results.partial import partial_until, read_periodic
from kv_cache.results.run_document import INTERRUPTED_EARLY
from kv_cache.results.verdict import INCOMPLETE, mark_missing_ranks
from kv_cache.results.write import write_document
from kv_cache.settings.ranks import rank_share
from kv_cache.settings.run import RunSettings
from kv_cache.storage.backends.gpu_real import PROCESSES_INDEX

__all__ = ["EXIT_GRACE_S", "PARENT_GONE_BARRIER_S", "GroupBroken", "ProcessGroup", "merge_command", "rank_settings", "run_processes",
           "verdict_line", "with_missing_ranks"]

log = logging.getLogger("kv_cache")

PARENT_GONE_BARRIER_S = 30.0  # once the parent is gone, the longest a rank waits at a barrier for the others
# (counted from the later of its arrival and the parent's death): ranks that close one window arrive within
# their drains of each other; a rank lost meanwhile can no longer be seen by anyone else


EXIT_GRACE_S = 10.0  # once the parent is gone, how long a rank whose run is over may take to exit before its
# watch ends it (os._exit: its results file is written by then)
_hard_exit = os._exit  # (a test replaces it)


def merge_command(output: str, n: int) -> str:
    """The command that merges the rank files of a `--processes n` run whose parent did not."""
    stem, dot, ext = output.rpartition(".")
    pattern = f"{stem}_rank*.{ext}" if dot and "/" not in ext else f"{output}_rank*"
    return f"kv-cache merge --allow-missing-ranks --output {output} {pattern}"


class ProcessGroup:
    """A RankGroup over multiprocessing: a shared Barrier, a shared dict for allgather, a results queue.

    The parent breaks the barrier (abort) as soon as a process ends without finishing, so no rank waits
    for a lost one: a rank at a barrier gets GroupBroken within a poll (half a second)."""

    gather_waits = False  # a rank's document goes on the queue: an interrupted rank sends its own too

    def __init__(self, rank: int, size: int, barrier: Any, shared: Any, results: Any,
                 progress: bool = False, merged_output: str | None = None) -> None:
        self.rank, self.size = rank, size
        self._barrier, self._shared, self._results = barrier, shared, results
        self._rounds = 0
        self.progress = progress  # the parent shows progress: send it this rank's ticks
        self.console: io.StringIO | None = None  # this rank's console (its report stays in its document)
        self.merged_output = merged_output  # where the parent writes the merged document (X.json)
        self.parent_gone = threading.Event()  # the parent process died: nobody reads the results queue
        self._unwatched = threading.Event()  # stop_watching(): the watch thread ends at its next poll
        self.parent_gone_at: float | None = None  # time.monotonic() when this rank saw it
        self._waiting_since: float | None = None  # time.monotonic() this rank entered the barrier it is in
        self._left: tuple[int, float] | None = None  # (exit status, when) once its run is over (leave)

    def __getstate__(self) -> dict[str, Any]:  # (sent to a rank: its watch starts there, afresh)
        return {**self.__dict__, "parent_gone": None, "parent_gone_at": None, "_waiting_since": None, "_left": None,
                "_unwatched": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, parent_gone=threading.Event(), _unwatched=threading.Event())

    def stop_watching(self) -> None:
        """End the watch thread at its next poll (a rank's process ends with it anyway; a caller that lives
        on, a test, must not leave it polling the clock)."""
        self._unwatched.set()

    def watch_parent(self, sentinel: Any, grace_s: float = PARENT_GONE_BARRIER_S, poll_s: float = 0.2,
                     exit_grace_s: float = EXIT_GRACE_S) -> threading.Thread:
        """Watch the parent in a daemon thread: `sentinel` (multiprocessing's parent sentinel: readable at
        EOF, when the parent is gone) becoming ready sets `parent_gone`; from then on a barrier this rank
        waits at longer than `grace_s` (from the later of its arrival and the parent's death) is broken, so
        a rank lost after the parent cannot hold the others for ever; and a rank whose run is over (`leave`)
        but still here `exit_grace_s` later is ended."""
        thread = threading.Thread(target=self._watch, args=(sentinel, grace_s, poll_s, exit_grace_s),
                                  name="kv-cache-parent-watch", daemon=True)
        thread.start()
        return thread

    def _watch(self, sentinel: Any, grace_s: float, poll_s: float, exit_grace_s: float) -> None:
        while not wait_ready([sentinel], timeout=poll_s):
            if self._unwatched.is_set():
                return
        self.parent_gone_at = time.monotonic()
        self.parent_gone.set()
        self._drop_queued()
        log.warning("process %d: the parent process is gone; this process goes on without it (its window runs to "
                    "its end; a barrier waits at most %.0f s for the others), writes its own results file and exits "
                    "(merge the processes' files with `%s`)", self.rank, grace_s,
                    merge_command(self.merged_output or "X.json", self.size))
        broken = False
        while True:
            now = time.monotonic()
            since = self._waiting_since
            if not broken and since is not None and now - max(since, self.parent_gone_at) >= grace_s:
                log.warning("process %d: waited %.0f s at a barrier since the parent is gone; breaking it",
                            self.rank, grace_s)
                self._barrier.abort()
                broken = True
            left = self._left
            if left is not None and now - max(left[1], self.parent_gone_at) >= exit_grace_s:
                # still here after its run was over and written: its exit waits on something only the parent
                # could end (the queue's feeder thread, blocked on a pipe nobody reads any more)
                log.warning("process %d: exiting now (its results file is written)", self.rank)
                _hard_exit(left[0])
                return
            if self._unwatched.wait(poll_s):
                return

    def barrier(self) -> None:
        self._waiting_since = time.monotonic()
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            why = ("the parent process is gone and another process did not reach the barrier"
                   if self.parent_gone.is_set() else "another process of this run failed or was lost")
            raise GroupBroken(why) from None
        finally:
            self._waiting_since = None

    def allgather(self, obj: Any) -> list[Any]:
        self._rounds += 1
        try:
            self._shared[(self._rounds, self.rank)] = obj
            self.barrier()
            return [self._shared[(self._rounds, r)] for r in range(self.size)]
        except (OSError, EOFError):  # the manager process is gone: it ends with the parent
            raise GroupBroken("the parent process is gone (its shared state with it)") from None

    def gather(self, obj: Any) -> None:
        """Send this rank's document to the parent, which merges; no rank writes the merged document. When
        the parent is gone, nobody will: the rank's own file (already written) gets a note saying so and
        naming the command that merges the files."""
        if self.parent_gone.is_set():
            self._note_no_merge(obj)
            return None
        self._results.put((self.rank, DOC, obj))
        return None

    def _note_no_merge(self, doc: dict[str, Any]) -> None:
        command = merge_command(self.merged_output or "X.json", self.size)
        note = (f"the parent process of this --processes {self.size} run was gone before this process's results "
                f"could be merged: no merged document was written; merge the processes' files with `{command}`")
        path = doc.get("_source")
        data = {k: v for k, v in doc.items() if k != "_source"}
        data.setdefault("measurement", {}).setdefault("notes", []).append(note)
        if path and os.path.exists(path):  # (its own file, just written: replaced, not kept as .1)
            try:
                write_document(path, data, keep=False)
            except OSError as exc:
                log.error("process %d: could not add the note to %s (%s)", self.rank, path, exc)
        log.warning("process %d: %s", self.rank, note)

    def report(self, kind: str, payload: Any) -> None:
        """How this rank ended, for the parent: (OUTCOME, RunOutcome) or (ERROR, a KvCacheError); nothing
        once the parent is gone."""
        if not self.parent_gone.is_set():
            self._results.put((self.rank, kind, payload))

    def leave(self, code: int = 0) -> None:
        """Before the exit with status `code`: when the parent is gone, what is left on the results queue is
        dropped (its feeder thread would wait for ever for a reader to empty the pipe), and should the exit
        still hang (the parent died while it read this rank's document), the watch ends the process after
        EXIT_GRACE_S."""
        self._left = (code, time.monotonic())
        if self.parent_gone.is_set():
            self._drop_queued()

    def _drop_queued(self) -> None:
        cancel = getattr(self._results, "cancel_join_thread", None)
        if cancel is not None:
            cancel()

    def abort(self) -> None:
        self._barrier.abort()

    # RankConsole (core/observe.py): the parent shows the banner and the progress of every rank
    def observer(self) -> RunObserver | None:
        return _TickSender(self._results, self.rank, self.parent_gone) if self.progress else None

    def announce(self, sizes: Mapping[str, Mapping[str, Any]]) -> None:
        if self.parent_gone.is_set():
            return
        banner = self.console.getvalue() if self.console is not None else ""
        self._results.put((self.rank, BANNER, (banner, {k: dict(v) for k, v in sizes.items()})))


class _TickSender:
    """A rank's progress observer: each tick goes to the parent on the results queue (a put hands it to
    the queue's feeder thread; the scheduler thread does not wait), then one END when the window is over.
    Nothing once the parent is gone."""

    def __init__(self, results: Any, rank: int, parent_gone: threading.Event | None = None) -> None:
        self._results, self._rank = results, rank
        self._gone = parent_gone if parent_gone is not None else threading.Event()

    def tick(self, tick: Tick) -> None:
        if not self._gone.is_set():
            self._results.put((self._rank, TICK, tick))

    def done(self) -> None:
        if not self._gone.is_set():
            self._results.put((self._rank, TICKS_END, None))


DOC, OUTCOME, ERROR = "doc", "outcome", "error"  # what a rank puts on the results queue
BANNER, TICK, TICKS_END = "banner", "tick", "ticks-end"  # ... and for the parent's console


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
        tiers=dataclasses.replace(share.tiers, cache_dir=cache_dir, local_rank=rank,
                                  local_rank_from=PROCESSES_INDEX),
        outputs=dataclasses.replace(share.outputs, output=output, xlsx_output=None),
        driver=dataclasses.replace(share.driver, processes=1),
    )


def _child(settings: RunSettings, group: ProcessGroup, setup_logging: Callable[[str], None] | None) -> None:
    """One rank: run, then tell the parent how it ended. A known error goes to the parent as it is (it is
    the parent's to report); anything else is a bug: its traceback is logged here and the parent reports an
    internal error (never a usage error)."""
    parent = mp.parent_process()
    if parent is not None:  # signals come from the parent, once each (a terminal's Ctrl-C
        os.setpgrp()  # reaches the parent only, which passes it on)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group's log lines must not stop it
    if setup_logging is not None:  # a spawned process starts with no logging set up
        setup_logging(settings.outputs.log_level)
    if parent is not None:
        group.watch_parent(parent.sentinel)  # a parent that dies: finish the window, write, exit
    group.console = io.StringIO()
    try:
        outcome = run_benchmark(settings, group.console, group=group)  # (its report stays in its document)
        _ignore_signals()  # its run is over and written: a late signal has nothing left to stop
        group.report(OUTCOME, outcome)
        code = 0
    except KeyboardInterrupt:  # interrupted before its run could write anything
        group.report(OUTCOME, RunOutcome(interrupted=True))
        code = 0
    except KvCacheError as exc:
        group.abort()  # the others must not wait for this one at a barrier
        group.report(ERROR, exc)
        if group.parent_gone.is_set():  # (no parent to say it)
            log.error("process %d: %s", group.rank, exc)
        code = 1
    except BaseException as exc:  # noqa: BLE001  (a bug: reported as such, with its traceback)
        log.exception("process %d: internal error", group.rank)
        group.abort()
        group.report(ERROR, InternalError(f"internal error in process {group.rank}: {type(exc).__name__}: {exc} "
                                          "(a bug; the traceback is in the log)"))
        code = 1
    group.leave(code)
    raise SystemExit(code)  # (not os._exit: the results queue's feeder thread must flush)


def run_processes(settings: RunSettings, out, setup_logging: Callable[[str], None] | None = None) -> RunOutcome:
    """Start the processes, wait for them, write the merged document; returns how the run ended.

    A lost process (killed, out of memory, crashed: it ended without saying how) breaks the barrier, so
    the others finish (their window is theirs) and the merge of the others names it: RunOutcome with
    `missing_ranks`. A known error of a process (bad cache dir, storage error before the window) is
    raised here after the others have stopped; a programming error is raised as InternalError.

    SIGINT and SIGTERM are handled here from the start to the merged document's write (and after, once
    one came): each is passed on to the ranks still running and never raises, so whatever arrives, the
    ranks' documents are merged and written, and the status is what the ranks' outcomes say."""
    n = settings.driver.processes
    started_unix = time.time()  # (a lost rank's periodic document must be written after this: this run's)
    ctx = mp.get_context("spawn")
    manager = SyncManager(ctx=ctx)
    manager.start(_manager_init)  # a terminal's Ctrl-C must not end the ranks' shared dict; a dead parent does
    progress = settings.outputs.log_level.upper() not in QUIET_LEVELS
    barrier, shared, results = ctx.Barrier(n), manager.dict(), ctx.Queue()
    procs = [ctx.Process(target=_child, name=f"kv-cache-rank{r}",
                         args=(rank_settings(settings, r, n),
                               ProcessGroup(r, n, barrier, shared, results, progress=progress,
                                            merged_output=settings.outputs.output),
                               setup_logging)) for r in range(n)]
    out.write(f"Running {n} processes ({settings.workload.num_users} users split between them); results per process "
              f"beside {settings.outputs.output}\n")
    out.flush()
    ended = _Ended(console=_Console(settings, n, out))
    signals = _ParentSignals()
    signals.install()
    try:
        try:
            for p in procs:
                p.start()
                signals.ranks[p.pid] = p
            _collect(procs, results, barrier, ended, signals)
            signals.collecting = False
        finally:
            manager.shutdown()
        return _conclude(settings, procs, ended, out, signals, started_unix)
    finally:
        signals.restore()


def _manager_init() -> None:
    """The manager process ignores SIGINT: the parent decides when the run ends, and shuts it down. A parent
    that cannot (SIGKILL, OOM kill) closes its end of the parent sentinel: the manager then exits at once
    rather than live on as an orphan (the ranks need it only to set up, before the window)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), name="kv-cache-parent-watch",
                         daemon=True).start()


def _exit_with_parent(sentinel: Any) -> None:
    wait_ready([sentinel])
    os._exit(0)


def _ignore_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


class _ParentSignals:
    """The parent's SIGINT / SIGTERM / SIGHUP handler: passes each signal on to the ranks still running (each counts
    it as a one-process run counts its own: the first ends a window still open, a later one after the
    window cuts the drain short) and never raises. Once no rank runs, a signal only says that the merged
    document is being written. The previous handlers come back at the end unless a signal came: then the
    stop signals are ignored from there to the exit, since a late one must not kill the exit either (a
    Python handler left in place would not do: the interpreter's shutdown puts SIG_DFL back under it, and a
    SIGINT in that moment ended the process with status -2 after everything was written)."""

    def __init__(self) -> None:
        self.seen = 0
        self.ranks: dict[int, Any] = {}  # pid -> process, for the ranks not yet seen to have ended
        self.collecting = True  # False once every rank has ended
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = catch_stop_signals(self)

    def restore(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.seen else old)

    def ended(self, pid: int | None) -> None:
        self.ranks.pop(pid, None)

    def __call__(self, signum, frame) -> None:
        self.seen += 1
        if not self.collecting:
            sys.stderr.write("kv-cache: the processes have ended; writing the merged results first\n")
            return
        for pid in list(self.ranks):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # ended since the last look
                self.ranks.pop(pid, None)


@dataclass
class _Console:
    """What the parent shows of the ranks: rank 0's banner with every rank's share and sizes in force
    (once every rank has sent its own, or when the window's first tick comes), and the total progress
    (its display opens at the first tick, as a one-process run's opens with its window)."""

    settings: RunSettings
    n: int
    out: Any
    ticks: RankTicks | None = None
    banners: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    banner_shown: bool = False
    _ended: set[int] = field(default_factory=set)  # ranks whose ticks are over

    def banner(self, rank: int, payload: tuple[str, dict[str, Any]]) -> None:
        self.banners[rank] = payload
        if len(self.banners) == self.n:
            self.show_banner()

    def show_banner(self) -> None:
        if self.banner_shown or not self.banners:
            return
        self.banner_shown = True
        first = min(self.banners)
        text = self.banners[first][0].rstrip("\n").split("\n")
        closing = text.pop() if len(text) > 1 else None  # the banner's closing rule comes after the ranks
        shares = {r: rank_settings(self.settings, r, self.n) for r in range(self.n)}
        lines = [*text, *ranks_lines(self.settings, shares, {r: b[1] for r, b in self.banners.items()}),
                 *([closing] if closing else [])]
        self.out.write("".join(line + "\n" for line in lines))
        self.out.flush()

    def tick(self, rank: int, tick: Tick) -> None:
        self.show_banner()
        if self.ticks is None:
            display = make_progress(self.settings.outputs.log_level, float(self.settings.driver.duration))
            if display is None:
                return
            self.ticks = RankTicks(self.n, display)
            for r in self._ended:
                self.ticks.end(r)
        self.ticks.add(rank, tick)

    def end(self, rank: int) -> None:
        self._ended.add(rank)
        if self.ticks is not None:
            self.ticks.end(rank)


@dataclass
class _Ended:
    """What the ranks sent: documents, outcomes, errors (by rank); their banners and ticks go to `console`."""

    console: _Console
    docs: dict[int, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[int, RunOutcome] = field(default_factory=dict)
    errors: dict[int, KvCacheError] = field(default_factory=dict)

    def take(self, item: tuple[int, str, Any]) -> None:
        rank, kind, payload = item
        if kind == TICK:
            self.console.tick(rank, payload)
        elif kind == TICKS_END:
            self.console.end(rank)
        elif kind == BANNER:
            self.console.banner(rank, payload)
        else:  # (the first word of a rank stands)
            {DOC: self.docs, OUTCOME: self.outcomes, ERROR: self.errors}[kind].setdefault(rank, payload)

    def interrupted(self, rank: int) -> bool:
        """Whether a signal cut rank `rank`'s window short: its document says so (its stop reason); a rank
        with no document, its outcome. A rank whose window ran to its end was not interrupted, whatever
        signal came after."""
        doc = self.docs.get(rank)
        if doc is not None:
            return doc.get("stop_reason") in ("interrupted", INTERRUPTED_EARLY)
        outcome = self.outcomes.get(rank)
        return outcome is not None and outcome.interrupted


def _collect(procs: list, results: Any, barrier: Any, ended: _Ended, signals: _ParentSignals) -> None:
    """Every rank's messages from the queue (read before joining: a large item blocks its sender), until
    every process has ended. A process that ended with a non-zero status, or a rank interrupted in its
    window, breaks the barrier, so no rank waits for it. A signal meanwhile (passed on to the ranks by `signals`) changes nothing here: the ranks
    write what they measured and send it."""
    while True:
        try:
            ended.take(results.get(timeout=0.5))
            drained = False
        except queue.Empty:
            drained = True
        for r, p in enumerate(procs):
            if p.exitcode is not None and p.pid in signals.ranks:
                signals.ended(p.pid)
            if drained and p.exitcode is not None:  # (what it sent before it ended has been read)
                ended.console.end(r)  # its ticks end with it, even when it could not say so
        # A rank that failed, or was interrupted in its window (its own Ctrl-C), will not reach the next
        # barrier: break it, so the others end their windows instead of waiting for it forever.
        if any(p.exitcode not in (None, 0) for p in procs) or any(o.interrupted for o in ended.outcomes.values()):
            barrier.abort()
        if all(p.exitcode is not None for p in procs):
            break
    while True:  # what the last ones sent just before they ended
        try:
            ended.take(results.get_nowait())
        except queue.Empty:
            break
    for r, p in enumerate(procs):
        p.join()
        ended.console.end(r)
    ended.console.show_banner()  # (a run that ended before its first tick)


def _conclude(settings: RunSettings, procs: list, ended: _Ended, out, signals: _ParentSignals,
              started_unix: float = 0.0) -> RunOutcome:
    """The merged document of the ranks that sent one (naming the missing ones), its verdict, then the
    outcome; the first rank's own error (not a broken barrier, which only follows another's failure) is
    raised. Interrupted means a rank's window was cut short (`_Ended.interrupted`), never that the parent
    saw a signal: a signal after the windows closed changes nothing."""
    n = len(procs)
    lost = {r: p.exitcode for r, p in enumerate(procs) if r not in ended.outcomes and r not in ended.errors}
    periodic = _periodic_documents(settings, n, lost, ended, started_unix)  # a lost rank's last one, from disk
    missing = [r for r in range(n) if r not in ended.docs]
    outcomes = list(ended.outcomes.values())
    interrupted = any(ended.interrupted(r) for r in range(n))
    merged: dict[str, Any] | None = None
    if ended.docs:
        merged = merge_documents([{**ended.docs[r], "_source": rank_settings(settings, r, n).outputs.output}
                                  for r in sorted(ended.docs)], allow_missing=bool(missing),
                                 ended={r: _how(lost.get(r)) for r in periodic})
        merged = with_missing_ranks(merged, missing, n, lost)
        fractions = [float(d.get("window_fraction", 1.0)) for d in ended.docs.values()]
        merged.setdefault("window_fraction", min(fractions))  # the share of the window every rank measured
        if any(d.get("verdict") == INCOMPLETE for d in ended.docs.values()):
            merged.update(overall_passed=False, verdict=INCOMPLETE)  # a rank's window was cut short
        else:
            merged.setdefault("verdict", "PASS" if merged.get("overall_passed") else "FAIL")
        what = f"{len(ended.docs)} of {n} processes" if missing else f"{n} processes"
        write_merged_document(settings.outputs.output, merged, out, f"Merged results of {what}",
                              xlsx_path=settings.outputs.xlsx_output)
    for r, code in lost.items():
        if r in periodic:
            out.write(f"Process {r} ended without its final results ({_how(code)}); its last periodic document "
                      f"(the window until {periodic[r]:.1f} s) is merged as an incomplete rank\n")
        else:
            out.write(f"Process {r} ended without its results ({_how(code)}); the others' results are kept\n")
    if merged is not None:
        out.write(verdict_line(merged, settings, n, interrupted) + "\n")
    out.flush()
    causes = [e for _, e in sorted(ended.errors.items()) if not isinstance(e, GroupBroken)]
    if causes:
        raise causes[0]
    if lost and not ended.docs and not signals.seen:
        raise RanksLost(f"process(es) {', '.join(f'{r} ({_how(c)})' for r, c in lost.items())} ended before "
                        "the window closed; no rank has results", tuple(lost))
    return RunOutcome(
        interrupted=interrupted or bool(lost and not ended.docs and signals.seen),  # (a signal before any
        # rank could start its run: it ended without a word)
        storage_error=next((o.storage_error for o in outcomes if o.storage_error), None),
        passed=merged is not None and merged.get("verdict") == "PASS",  # (the verdict shown)
        missing_ranks=tuple(sorted({*missing, *periodic})) if lost else (),  # (lost, merged from a periodic one)
        fail_exit_code=settings.outputs.fail_exit_code)


def _periodic_documents(settings: RunSettings, n: int, lost: Mapping[int, int | None], ended: _Ended,
                        started_unix: float) -> dict[int, float]:
    """The lost ranks whose last periodic document is on disk (their X_rank<r>.json, written during the
    window: benchmarks/standard/partial.py) and of this run (written after `started_unix`, and of the run id
    of the ranks that reported, if any did: a periodic document left there by an earlier killed run is not
    this one's): each is added to `ended.docs`, to be merged as an incomplete rank. Returns rank -> the
    seconds it measured."""
    run_ids = {d.get("run_id") for d in ended.docs.values()} - {None}
    found: dict[int, float] = {}
    for r in sorted(lost):
        if r in ended.docs:
            continue
        doc = read_periodic(rank_settings(settings, r, n).outputs.output, run_ids, started_unix)
        if doc is not None:
            ended.docs[r] = doc
            found[r] = float(partial_until(doc).get("measured_until_s") or 0.0)
    return found


def verdict_line(merged: dict[str, Any], settings: RunSettings, n: int, interrupted: bool) -> str:
    """The merged run's verdict for the console, as a one-process run ends its report: `Run INCOMPLETE:
    interrupted after 40 % of the 20 s window ...`, the missing ranks, or PASS / FAIL."""
    verdict = merged.get("verdict")
    if verdict != INCOMPLETE:
        health = Figures.from_json(merged.get("summary")).cache.health
        failed = [c.name for c in (health.criteria if health else ()) if not c.passed]
        why = f" (failed: {'; '.join(failed)})" if verdict != "PASS" and failed else ""
        return (f"STORAGE PERFORMANCE ASSESSMENT (merged, {n} processes): {verdict}{why}\n"
                f"  {integrity_sentence(merged)}")
    why = []
    if interrupted:
        why.append(f"interrupted after {float(merged.get('window_fraction', 0.0)) * 100:.0f} % of the "
                   f"{settings.driver.duration} s window")
    if merged.get("missing_ranks"):
        why.append(f"process(es) {', '.join(map(str, merged['missing_ranks']))} of {n} missing")
    gone = [x for x in merged.get("incomplete_ranks") or [] if x.get("sequence") is not None]
    if gone:
        why.append("; ".join(f"process {x['rank']} lost ({x.get('ended') or 'ended'}), merged from its last periodic "
                             f"document ({float(x.get('measured_s') or 0.0):.1f} s of the window)" for x in gone))
    if not why:
        why.append(f"a process's window was cut short ({float(merged.get('window_fraction', 0.0)) * 100:.0f} % "
                   f"of the {settings.driver.duration} s window measured by every process)")
    return f"Run INCOMPLETE (merged, {n} processes): {'; '.join(why)}; the verdict is not PASS"


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
