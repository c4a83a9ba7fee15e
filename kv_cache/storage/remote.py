"""What the remote storage tiers (S3 objects, Redis/Valkey keys) share: the run's own namespace with its
marker, the sweep of a killed run's leftovers, server throttling retried with backoff and counted, lost
connections sent again with exponential backoff and jitter within a failover budget (RemoteStats.failover),
and the deadline every operation has, tied to the run's stop (RunDeadline, Watchdog).

A remote run owns one namespace, ``<prefix>kv-cache-run-<date>-<time>-<pid>-<4 hex>/`` (the run directory's
name), holding a marker (``.kv-cache-run``, the same JSON as a run directory's) and the entries. At the end
the run deletes the entries it created and then its marker, nothing else. A run killed before that leaves
them: the next run on the same bucket or server removes a namespace whose marker names a process of this
host that is gone (owner_alive, as for run directories), and reports, untouched, one of another host.
"""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kv_cache.host.rundir import (
    MARKER,
    RUN_DIR_NAME,
    RUN_PREFIX,
    TOOL,
    _tool_version,
    boot_id,
    owner_alive,
    process_start,
)
from kv_cache.host.signals import ABANDON_IO
from kv_cache.storage.base import BLOCK, DataCorruption, IOAborted, SizedStore, padded

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.storage.base import ChunkSink
    from kv_cache.storage.buffers import WorkerBuffers

__all__ = ["FAILOVER_S", "GRACE_S", "MARKER", "DaemonPool", "RemoteStats", "RemoteStore", "RunDeadline", "SharedSlots", "SlotRing", "Throttled", "Watchdog", "deliver",
           "hand_on", "lost_connection", "marker_json", "new_run_name", "stale_owner", "tls_refused",
           "tls_verification_failure"]

BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # waits before each retry of a throttled request (then EAGAIN)
GRACE_S = 10.0  # an operation still waiting on the server this long after the run's stop is abandoned
FAILOVER_S = 30.0  # a lost server is retried this long (backoff with jitter) before the run stops
FAILOVER_FIRST_S, FAILOVER_MAX_S = 0.05, 2.0  # the first retry's backoff, doubled up to this
CLOSE_AFTER_SIGNAL_S = 1.0  # after a stop signal, the store's clean-up waits this long on its server
SILENT_S = 0.5  # at a stop signal, an operation waiting this long with no answer from the server since: frozen
POLL_S = 0.2  # how often a wait on the server looks at the run's stop, its deadline and a stop signal
SETTLE_S = CLOSE_AFTER_SIGNAL_S + POLL_S  # at close: how long the writes in flight are waited for (settle_writes)


def new_run_name() -> str:
    """A fresh run namespace name (the same pattern as a run directory's)."""
    return f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(2)}"


def marker_json() -> bytes:
    """The marker of this run: who owns the namespace (pid, host, start time, boot), as a run dir's."""
    started = time.time()
    return (json.dumps({
        "tool": TOOL, "version": _tool_version(), "pid": os.getpid(), "host": socket.gethostname(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)), "start_unix": started,
        "proc_start": process_start(os.getpid()), "boot_id": boot_id(),
    }) + "\n").encode()


def stale_owner(name: str, marker: bytes | None) -> str | None:
    """Why the namespace `name` is a dead run's and may be removed (None: keep it). Only a namespace of
    this tool's name whose marker names a process of this host that no longer runs."""
    if not RUN_DIR_NAME.fullmatch(name) or marker is None:
        return None
    try:
        info = json.loads(marker)
    except ValueError:
        return None
    if not isinstance(info, dict) or info.get("host") != socket.gethostname():
        return None
    return None if owner_alive(info) else f"its process {info.get('pid')} on this host is gone"


_TLS_WORDS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "invalid peer certificate", "UnknownIssuer",
              "NotValidForName", "self-signed certificate", "self signed certificate", "certificate has expired",
              "Hostname mismatch", "BadSignature", "CaUsedAsEndEntity")


def tls_verification_failure(exc: BaseException) -> str | None:
    """The first line of a TLS certificate verification failure somewhere in `exc`'s chain (Python's
    ssl, rustls through obstore, urllib3 through botocore, redis-py), None when it is not one."""
    import ssl  # noqa: PLC0415

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if isinstance(e, ssl.SSLCertVerificationError) or any(w in text for w in _TLS_WORDS):
            lines = [ln for ln in text.splitlines() if any(w in ln for w in _TLS_WORDS)] or text.splitlines() or [""]
            return f"{type(e).__name__}: {lines[0].strip()}"
        e = e.__cause__ or e.__context__
    return None


def tls_refused(what: str, why: str) -> OSError:
    """A server whose TLS certificate failed verification: EACCES (a refusal the run stops at, named as
    what it is, not as a server that cannot be reached, nor retried as a lost connection)."""
    return OSError(errno.EACCES, f"{what}: the server's TLS certificate failed verification ({why})")


def lost_connection(what: str, exc: BaseException) -> OSError:
    """A lost or refused connection as the transient OSError (ENOTCONN) the cache retries; a TLS
    certificate that failed verification is an EACCES naming it (tls_refused)."""
    tls = tls_verification_failure(exc)
    if tls is not None:
        err = tls_refused(what, tls)
        err.__cause__ = exc
        return err
    first = (str(exc).splitlines() or [""])[0]
    err = OSError(errno.ENOTCONN, f"{what}: connection to the server lost ({type(exc).__name__}: {first})")
    err.__cause__ = exc
    return err


class Throttled(Exception):
    """The server asked the client to slow down (S3 503 SlowDown, HTTP 429)."""


class RunDeadline:
    """When a remote operation stops waiting on its server, tied to the run (not to a socket timeout).

    Until the run's stop event is set (the window's end, a storage error, a signal) an operation waits up
    to `stall_s` (the failover budget + the grace: a frozen server before the window, or early in a long
    one). From the moment the stop is seen (or the operation started, if later: the
    clean-up after the window) it has `grace_s` more; past that it is abandoned, counted as "the server
    stopped answering", and raised as ETIMEDOUT, which stops the run with its results (exit 3). A stop
    signal (Ctrl-C: host.signals.ABANDON_IO) abandons it at once, as IOAborted (the stop's doing, not the
    server's). The store's Watchdog looks every POLL_S, so the stop's time is known to that precision, and
    a thread blocked in a socket call is released by the store's reaper (its sockets shut down)."""

    def __init__(self, grace_s: float = GRACE_S, failover_s: float = FAILOVER_S):
        self.grace_s, self.failover_s = float(grace_s), float(failover_s)
        self.stop: threading.Event | None = None
        self._stop_at: float | None = None
        self._ops: dict[int, float] = {}  # thread id -> start of the operation it is in (monotonic)
        self._lock = threading.Lock()
        self.dead = False  # an operation was abandoned past its deadline: every later one fails at once
        self.opening = True  # while the store opens: no failover (a server not reached then is a setup error)
        self._closing_at: float | None = None  # the store's clean-up began (its own, shorter bound)
        self._stalled = False  # the first abandonment was an operation past stall_s with no stop yet
        self.answered_at: float | None = None  # the server's last answer (monotonic; RemoteStats.failover)
        self._silent_at_signal: bool | None = None  # at the stop signal, the server had stopped answering

    @property
    def stall_s(self) -> float:
        """The longest one operation waits on its server while the run has not stopped (before the
        window: preconditioning, pre-population, the I/O worker probe; or in a window longer than this):
        the failover budget (what a lost server is given) plus the grace. A frozen server then ends the
        run as one past the window's end does, ETIMEDOUT with the results, instead of waiting on the
        client's socket timeouts (a Redis server SIGSTOPped in preconditioning held the run 184 s)."""
        return self.failover_s + self.grace_s

    def watch(self, stop: threading.Event | None) -> None:
        """The run's stop event (serving/build.py open_cache hands it over once the tiers are open)."""
        self.stop = stop

    def stop_seen(self) -> float | None:
        """The monotonic time the stop was first seen set (None: not set)."""
        if self._stop_at is None and self.stop is not None and self.stop.is_set():
            self._stop_at = time.monotonic()
        return self._stop_at

    def begin(self) -> bool:
        """This thread starts an operation (False: it is already in one, which keeps its start)."""
        me = threading.get_ident()
        with self._lock:
            if me in self._ops:
                return False
            self._ops[me] = time.monotonic()
            return True

    def end(self) -> None:
        with self._lock:
            self._ops.pop(threading.get_ident(), None)

    def closing(self) -> None:
        """The store's clean-up starts: its requests get `grace_s` (CLOSE_AFTER_SIGNAL_S after a stop
        signal), then what is left is left for the next run's sweep."""
        self._closing_at = time.monotonic()

    def _silence_at_signal(self, now: float) -> bool:
        """Whether, when the stop signal was first seen, an operation had waited SILENT_S and the server
        had not answered anything for as long (frozen): its clean-up then gets POLL_S a request instead of
        CLOSE_AFTER_SIGNAL_S, so Ctrl-C ends the run within a second. An idle run (nothing in flight) or a
        server answering other requests is not silent."""
        if self._silent_at_signal is None:
            with self._lock:
                oldest = min(self._ops.values(), default=None)
            last = self.answered_at
            self._silent_at_signal = oldest is not None and now - oldest >= SILENT_S and (
                last is None or now - last >= SILENT_S)
        return self._silent_at_signal

    def _close_limit(self) -> float:
        """How long a clean-up request may wait on the server after a stop signal."""
        return POLL_S if self._silent_at_signal else CLOSE_AFTER_SIGNAL_S

    def _state(self, start: float | None) -> str | None:
        if self.dead:
            return "expired"
        at = self.stop_seen()
        now = time.monotonic()
        if ABANDON_IO.is_set():
            self._silence_at_signal(now)
        if self._closing_at is not None:
            limit = self._close_limit() if ABANDON_IO.is_set() else self.grace_s
            expired = now >= max(self._closing_at, start or 0.0) + limit
        elif ABANDON_IO.is_set():
            return "interrupted"
        else:
            expired = at is not None and now >= max(at, start or at) + self.grace_s
            if not expired and start is not None and now >= start + self.stall_s and (
                    self.answered_at is None or now >= self.answered_at + self.stall_s):
                # no stop yet (before the window, or a long one) and the server silent all that time: a slow
                # but answering server (a long multipart write on a thin link) is not abandoned
                expired = self._stalled = True
        if expired:
            self.dead = True
            return "expired"
        return None

    def state(self) -> str | None:
        """For this thread's operation: "interrupted" (a stop signal), "expired" (its grace after the stop
        is past), or None (keep waiting)."""
        with self._lock:
            start = self._ops.get(threading.get_ident())
        return self._state(start)

    def overdue(self) -> bool:
        """Whether some operation under way must not wait any longer (the Watchdog then reaps)."""
        with self._lock:
            starts = list(self._ops.values())
        return any(self._state(s) is not None for s in starts)

    def stopping(self) -> bool:
        return ABANDON_IO.is_set() or self.stop_seen() is not None

    def error(self, what: str, state: str) -> BaseException:
        if state == "interrupted":
            return IOAborted(f"{what}: abandoned at the stop signal (the server had not answered)")
        if self._closing_at is not None and ABANDON_IO.is_set():
            bound = f"{self._close_limit():g} s into the clean-up after a stop signal" + (
                " (the server had stopped answering before it)" if self._silent_at_signal else "")
        elif self._stalled and self._closing_at is None:
            bound = (f"in {self.stall_s:g} s, before the run's stop (--remote-failover-s {self.failover_s:g} + "
                     f"--remote-grace-s {self.grace_s:g})")
        else:
            bound = f"{self.grace_s:g} s after the run's stop (--remote-grace-s)"
        return OSError(errno.ETIMEDOUT, f"{what}: the server stopped answering: no reply {bound}; the operation "
                       "was abandoned")

    def check(self, what: str) -> None:
        """Raise the abandonment if this thread's operation must not wait any longer."""
        state = self.state()
        if state is not None:
            raise self.error(what, state)

    def result(self, future: Any, what: str, stats: RemoteStats | None = None) -> Any:
        """`future.result()`, given up (check) once the deadline passes or a stop signal comes."""
        import concurrent.futures  # noqa: PLC0415

        while True:
            try:
                return future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                state = self.state()
                if state is not None:
                    if stats is not None:
                        stats.abandoned(state)
                    raise self.error(what, state) from None

    def sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds` in this thread's operation; False when its deadline or a stop signal cut
        it short (a backoff that outlasts the run's stop still ends at the stop + grace)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return True
            if ABANDON_IO.wait(min(left, POLL_S)) or self.state() is not None:
                return False


class DaemonPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose threads are daemons, left out of the join concurrent.futures makes at the
    interpreter's exit: a thread blocked in a client call on a frozen server (obstore's, botocore's: calls
    that cannot be interrupted from Python) must hold neither the run's end nor the process's exit. (A
    pool's threads inherit the daemon flag of the thread that starts them: the main thread, closing the
    store, would otherwise start threads that the exit joins.)"""

    def _adjust_thread_count(self) -> None:
        if self._idle_semaphore.acquire(timeout=0):  # an idle thread takes the job (the steady state)
            return
        if len(self._threads) >= self._max_workers:
            return
        spawner = threading.Thread(target=super()._adjust_thread_count, daemon=True)  # its thread: a daemon
        spawner.start()
        spawner.join()
        import concurrent.futures.thread as cft  # noqa: PLC0415

        for t in list(self._threads):
            cft._threads_queues.pop(t, None)


class Watchdog:
    """One thread per remote store: notes the run's stop when it comes, and while an operation under way
    must not wait any longer (RunDeadline.overdue) calls `reap()` (shut the store's sockets down), so a
    thread blocked in a socket call on a frozen server returns at once."""

    def __init__(self, deadline: RunDeadline, reap, name: str):
        self.deadline, self.reap = deadline, reap
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"kv-{name}-watchdog", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.closed.wait(POLL_S):
            if self.deadline.overdue():
                try:
                    self.reap()
                except Exception:  # noqa: BLE001  (a socket already gone)
                    pass

    def close(self) -> None:
        self.closed.set()


@dataclass
class RemoteStats:
    """Counters of a remote store, for the results (measurement.remote_tier)."""

    throttled: int = 0  # requests the server throttled (each retried after a backoff)
    throttle_wait_s: float = 0.0  # time spent in those backoffs
    throttle_gave_up: int = 0  # operations still throttled after every backoff (raised as EAGAIN)
    reconnects: int = 0  # requests that failed on a lost connection (each retried within the failover budget)
    stopped_answering: int = 0  # operations abandoned past the run's deadline (stop + grace): ETIMEDOUT
    abandoned_at_signal: int = 0  # operations abandoned at a stop signal while waiting on the server
    outages: int = 0  # times the server was lost (a lost connection after a success, or at the first request)
    failover_retries: int = 0  # requests sent again after a lost connection, after a backoff with jitter
    failover_wait_s: float = 0.0  # time spent in those backoffs (all threads)
    longest_outage_s: float = 0.0  # the longest time from a loss to the next success
    failover_gave_up: int = 0  # requests still failing when the failover budget was spent (EHOSTDOWN)
    _outage_since: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def backoff(self, call, what: str):
        """`call()`, retried after BACKOFF_S waits while it raises Throttled; EAGAIN after the last."""
        for wait in (*BACKOFF_S, None):
            try:
                return call()
            except Throttled as exc:
                with self._lock:
                    self.throttled += 1
                    if wait is None:
                        self.throttle_gave_up += 1
                if wait is None:
                    raise OSError(errno.EAGAIN, f"{what}: still throttled after {len(BACKOFF_S)} backoffs "
                                  f"({exc})") from exc
                time.sleep(wait)
                with self._lock:
                    self.throttle_wait_s += wait
        raise AssertionError("unreachable")  # pragma: no cover

    def lost(self) -> None:
        with self._lock:
            self.reconnects += 1

    def abandoned(self, state: str) -> None:
        with self._lock:
            if state == "interrupted":
                self.abandoned_at_signal += 1
            else:
                self.stopped_answering += 1

    def failover(self, call, what: str, deadline: RunDeadline):
        """`call()`, sent again after a backoff with jitter (doubling from FAILOVER_FIRST_S up to
        FAILOVER_MAX_S, each wait drawn in [half, whole]) while it raises a lost connection (ENOTCONN),
        until the server answers or the failover budget (deadline.failover_s, counted from the loss, shared
        by every thread) is spent: then EHOSTDOWN, which stops the run. The retries also end at the
        operation's deadline (the run's stop + grace: ETIMEDOUT, the server stopped answering) and at a stop
        signal (IOAborted)."""
        if deadline.opening:
            return call()
        wait = FAILOVER_FIRST_S
        while True:
            state = deadline.state()
            if state is not None:
                self.abandoned(state)
                raise deadline.error(what, state)
            try:
                out = call()
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise
                state = deadline.state()
                if state is not None:  # the reaper shut the socket at the deadline or a stop signal
                    self.abandoned(state)
                    raise deadline.error(what, state) from exc
                now = time.monotonic()
                with self._lock:
                    if self._outage_since is None:
                        self._outage_since = now
                        self.outages += 1
                    down = now - self._outage_since
                left = deadline.failover_s - down
                if left <= 0:
                    with self._lock:
                        self.failover_gave_up += 1
                    raise OSError(errno.EHOSTDOWN, f"{exc.strerror}; the server did not answer for {down:.1f} s, "
                                  f"the failover budget ({deadline.failover_s:g} s, --remote-failover-s) is spent"
                                  ) from exc
                pause = min(left, wait / 2 + random.uniform(0, wait / 2))
                wait = min(FAILOVER_MAX_S, wait * 2)
                t = time.monotonic()
                slept = deadline.sleep(pause)
                with self._lock:
                    self.failover_retries += 1
                    self.failover_wait_s += time.monotonic() - t
                if not slept:
                    state = deadline.state() or "expired"
                    self.abandoned(state)
                    raise deadline.error(what, state) from exc
                continue
            deadline.answered_at = time.monotonic()
            if self._outage_since is not None:
                with self._lock:
                    if self._outage_since is not None:
                        self.longest_outage_s = max(self.longest_outage_s, time.monotonic() - self._outage_since)
                        self._outage_since = None
            return out

    def as_dict(self) -> dict[str, float | int]:
        with self._lock:
            return {"throttled_requests": self.throttled, "throttle_wait_s": round(self.throttle_wait_s, 3),
                    "throttled_gave_up": self.throttle_gave_up, "lost_connections": self.reconnects,
                    "outages": self.outages, "failover_retries": self.failover_retries,
                    "failover_wait_s": round(self.failover_wait_s, 3),
                    "longest_outage_s": round(self.longest_outage_s, 3), "failover_gave_up": self.failover_gave_up,
                    "stopped_answering": self.stopped_answering, "abandoned_at_stop_signal": self.abandoned_at_signal}


def s3_ring_slots(concurrency: int) -> int:
    """The slots of an S3 writing thread's ring: `concurrency` parts in flight + 2 (see SlotRing)."""
    return max(1, int(concurrency)) + 2


def ring_bytes(backend: str, chunk_bytes: int, *, pipeline: int = 8, part_bytes: int = 8 << 20,
               concurrency: int = 4) -> int:
    """The most one I/O worker's slot ring holds beside its two buffers, what the memory budget counts
    per worker (core/io_workers.py): S3, s3_ring_slots(concurrency) parts of `part_bytes`; any other
    tier, none (Redis and Valkey send their values from the worker's own write buffer: kvstore.py)."""
    if backend == "s3":
        return s3_ring_slots(concurrency) * int(part_bytes)
    return 0


class SlotRing:
    """A thread's preallocated stamped slots (WorkerBuffers of the same pool, write side only), used in
    turn. S3: obstore's writer keeps a reference to each slot until its part is sent, at most `concurrency`
    parts in flight, so a ring of (parts in flight + 2) parts' worth of slots is never rewritten early
    (the Redis tier writes from the worker's own buffer, kvstore.py)."""

    def __init__(self, slot_bytes: int, count: int, worker_id: int):
        self.slot_bytes = slot_bytes
        self.worker_id = worker_id
        self.slots: list[WorkerBuffers] = []
        self.grow(count)
        self.i = 0

    def grow(self, count: int) -> list:
        """At least `count` slots (those missing made now, numbered on from the last); the slots. Made
        together, so the fill is drawn once and copied to the others (WorkerBuffers fill_from)."""
        from kv_cache.storage.buffers import WorkerBuffers  # noqa: PLC0415

        first: WorkerBuffers | None = None
        while len(self.slots) < count:
            slot = WorkerBuffers(self.slot_bytes, 0, (self.worker_id << 8) + len(self.slots), read_bytes=BLOCK,
                                 fill_from=first)
            first = first or slot
            self.slots.append(slot)
        return self.slots

    def next(self) -> WorkerBuffers:
        slot = self.slots[self.i]
        self.i = (self.i + 1) % len(self.slots)
        return slot

    def close(self) -> None:
        for slot in self.slots:
            slot.close()


def release_thread_ring(tls: Any, lock: Any, rings: list) -> None:
    """Free the calling thread's SlotRing (`tls.ring`, listed in the store's `rings` under `lock`), for a
    thread that writes no more: the I/O worker probe's short-lived threads, each of which otherwise kept
    its ring to the end of the run (S3: concurrency + 2 parts). A later write of the thread makes a new
    one."""
    ring = getattr(tls, "ring", None)
    if ring is None:
        return
    del tls.ring
    with lock:
        if ring in rings:
            rings.remove(ring)
    ring.close()


class SharedSlots:
    """One slot ring that every thread of the I/O worker probe writes from (`store.shared_slots()`), in
    place of one ring per thread: the probe's bytes are not checked (its reads do not verify), so its
    threads may stamp and send the same slots at once. Without it a Redis probe step of 16 threads held
    16 chunks of slots at once: a default run that then chose 1 worker peaked at 371 MiB against 250 for
    `--io-workers 1` (issue 35: at most 1.5x the memory of the count chosen). `ring` is the store's
    shared SlotRing while the probe runs (None otherwise); the store's `_ring` hands it to every thread."""

    def __init__(self, store: Any, slot_bytes: int, count: int):
        self.store, self.slot_bytes, self.count = store, slot_bytes, count

    def __enter__(self) -> SlotRing:
        ring = SlotRing(self.slot_bytes, self.count, 0xFFFF)
        self.store._shared_ring = ring
        return ring

    def __exit__(self, *exc: object) -> None:
        ring, self.store._shared_ring = self.store._shared_ring, None
        if ring is not None:
            ring.close()


def deliver(body: memoryview, entry_off: int, nbytes: int, bufs: WorkerBuffers, kid: int, verify: bool,
            on_chunk: ChunkSink | None, chunk_index: int, name: str, key: str) -> int:
    """A received piece of an entry (a ranged GET's body: `body`, starting `entry_off` bytes into the entry
    of `nbytes`) copied into the worker's read buffer chunk by chunk, each chunk then checked and handed on
    (hand_on); returns the next chunk index. The one copy an S3 read costs: obstore hands back its own
    buffers (the Redis tier receives into the read buffer itself and calls hand_on alone)."""
    mv, chunk = bufs.read_mv, bufs.chunk_bytes
    for sub in range(0, len(body), chunk):
        n = min(chunk, len(body) - sub)
        mv[:n] = body[sub:sub + n]
        chunk_index = hand_on(n, entry_off + sub, nbytes, bufs, kid, verify, on_chunk, chunk_index, name, key)
    return chunk_index


def hand_on(n: int, entry_off: int, nbytes: int, bufs: WorkerBuffers, kid: int, verify: bool,
            on_chunk: ChunkSink | None, chunk_index: int, name: str, key: str) -> int:
    """The `n` bytes now at the start of the worker's read buffer, `entry_off` bytes into the entry of
    `nbytes`: their stamps checked in place with --verify (`kid`: the entry's key id), then handed to
    `on_chunk` (the entry's bytes only, not its padding); returns the next chunk index. `name` (the tier)
    and `key` name the entry in a stamp mismatch (formatted only then)."""
    if verify:
        bad = bufs.check_stamp(kid, entry_off // BLOCK, n // BLOCK)
        if bad >= 0:
            raise DataCorruption(f"{name}: entry {key!r} block {entry_off // BLOCK + bad} does not carry its stamp")
    if on_chunk is not None:
        on_chunk(chunk_index, bufs.read_mv[: min(n, max(0, nbytes - entry_off))])
    return chunk_index + 1


class RemoteStore(SizedStore):
    """What a store on a server (RedisStore, S3Store) is besides its client: written from stamped buffers
    (S3 from its own slot rings, Redis from the worker's write buffer), every operation under the run's deadline (RunDeadline, `watch`) and counted (RemoteStats), entries padded
    to whole blocks, the notes of the sweep of earlier runs' leftovers, and a close that takes the books once."""

    keeps_fill_layout = False  # --verify checks the stamps (S3 writes from its own slots, SlotRing)
    # the I/O worker probe may count a thread's first operation (io_workers.fit_ops): a server has no
    # device write cache for it to burst into (a first operation pays for a connection instead)
    probe_counts_first_op = True

    def __init__(self, name: str, grace_s: float, failover_s: float) -> None:
        self.name = name
        self.deadline = RunDeadline(grace_s, failover_s)
        self.stats = RemoteStats()
        self._tls = threading.local()
        self._shared_ring: SlotRing | None = None  # the probe's, while it runs (shared_slots)
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._closed = False
        self.swept: list[str] = []  # what the sweep did with earlier runs' namespaces (notes for the results)
        self.notes: list[str] = []  # what else the results should say of the server
        self.leftovers: str | None = None  # what close() could not remove, and how to
        # the writes in flight (id of the handle -> what each may have put on the server), and what the
        # writes that ended after close() began left there: close() removes both (settle_writes). Until 4 Dec
        # a write still in flight at a Ctrl-C aborted after close() had taken the books, its keys were on
        # nobody's list and the marker was gone: they stayed on the server for good (a sweep of 15 s windows
        # filled the server's maxmemory after 3 runs, and the next run stopped at ENOSPC after 4 s)
        self._writing: dict[int, Any] = {}
        self._dropped: list[Any] = []

    def watch(self, stop) -> None:
        """The run's stop event: an operation still waiting on the server `grace_s` after it is abandoned."""
        self.deadline.watch(stop)

    def footprint(self, nbytes: int) -> int:
        return padded(nbytes)

    def _writing_begins(self, h: Any, what: Any) -> None:
        """Count the write of handle `h` in flight, with `what` it may put on the server (close() removes
        it where the write has not ended by then)."""
        with self._lock:
            self._writing[id(h)] = what

    def _writing_ends(self, h: Any, dropped: bool = False) -> bool:
        """The write of `h` ended (committed, or `dropped`: aborted). True where a dropped write ended after
        close() began: what it left is then close()'s to remove (settle_writes), not the caller's, whose
        request to the server a stop signal would refuse at once. A dropped write before that stays counted
        in flight while the caller removes what it left (then _writing_ends(h), or _remove_later(what, h)):
        ended first, a removal refused as close() began was handed over after close() had stopped waiting,
        and its keys stayed with the marker gone."""
        with self._lock:
            if dropped and not self._closed:
                return False
            what = self._writing.pop(id(h), None)
            if dropped and what is not None:
                self._dropped.append(what)
                return True
            return False

    def _removing(self, what: Any) -> object:
        """A removal of `what` (an entry already off the books: delete) counted in flight until it ends
        (_writing_ends, or _remove_later where it failed), so that close() waits for it; the handle."""
        token = object()
        self._writing[id(token)] = what  # (the caller holds the lock: with the books it takes `what` from)
        return token

    def _remove_later(self, what: Any, h: Any = None) -> None:
        """What an aborted write (`h`, its count in flight ended here) or a delete could not remove itself (a
        stop signal refuses its request to the server at once): close() removes it with the books, in its
        own clean-up time."""
        with self._lock:
            if h is not None:
                self._writing.pop(id(h), None)
            self._dropped.append(what)

    def _open_or_abort(self, key: str, off: int) -> None:
        """Between a write's pieces: IOAborted once close() has begun (it waits for the writes in flight,
        settle_writes, and removes what they left)."""
        if self._closed:
            raise IOAborted(f"write of {key!r} aborted after {off} bytes: the store is closing", off)

    def settle_writes(self, wait_s: float = SETTLE_S) -> tuple[list[Any], int]:
        """At close, after _take_books: wait up to `wait_s` for the writes in flight to end (each aborts at
        its next piece, _open_or_abort); returns what they left on the server (the dropped ones' and the
        still running ones') and how many still run (their entries may still appear after the removal:
        close() then keeps the marker, and the next run on this server removes them)."""
        end = time.monotonic() + max(0.0, wait_s)
        while True:
            with self._lock:
                running = len(self._writing)
                if not running or time.monotonic() >= end:
                    left = [*self._dropped, *self._writing.values()]
                    self._dropped.clear()
                    return left, running
            time.sleep(0.01)

    def _take_books(self, books: dict[str, Any]) -> dict[str, Any] | None:
        """At close: the store marked closed, `books` (what the run created on the server) handed back and
        emptied with the sizes; None when it was closed before. The lock is waited for a moment at most (an
        interrupted caller may hold it: atexit, a signal)."""
        got = self._lock.acquire(timeout=1.0)
        try:
            if self._closed:
                return None
            self._closed = True
            taken = dict(books)
            books.clear()
            self._sizes.clear()
        finally:
            if got:
                self._lock.release()
        self.deadline.closing()
        return taken
