"""What the remote storage tiers (S3 objects, Redis/Valkey keys) share: the run's own namespace with its
marker, the sweep of a killed run's leftovers, server throttling retried with backoff and counted, and
lost connections raised as the transient OSErrors the cache retries and the error policy counts.

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
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
from kv_cache.storage.base import BLOCK, DataCorruption

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.storage.base import ChunkSink
    from kv_cache.storage.buffers import WorkerBuffers

__all__ = ["MARKER", "RemoteStats", "SlotRing", "Throttled", "deliver", "hand_on", "lost_connection", "marker_json", "new_run_name",
           "stale_owner"]

BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # waits before each retry of a throttled request (then EAGAIN)


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


def lost_connection(what: str, exc: BaseException) -> OSError:
    """A lost or refused connection as the transient OSError (ENOTCONN) the cache retries."""
    first = (str(exc).splitlines() or [""])[0]
    err = OSError(errno.ENOTCONN, f"{what}: connection to the server lost ({type(exc).__name__}: {first})")
    err.__cause__ = exc
    return err


class Throttled(Exception):
    """The server asked the client to slow down (S3 503 SlowDown, HTTP 429)."""


@dataclass
class RemoteStats:
    """Counters of a remote store, for the results (measurement.remote_tier)."""

    throttled: int = 0  # requests the server throttled (each retried after a backoff)
    throttle_wait_s: float = 0.0  # time spent in those backoffs
    throttle_gave_up: int = 0  # operations still throttled after every backoff (raised as EAGAIN)
    reconnects: int = 0  # operations that failed on a lost connection (raised as ENOTCONN, retried above)
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

    def as_dict(self) -> dict[str, float | int]:
        with self._lock:
            return {"throttled_requests": self.throttled, "throttle_wait_s": round(self.throttle_wait_s, 3),
                    "throttled_gave_up": self.throttle_gave_up, "lost_connections": self.reconnects}


class SlotRing:
    """A thread's preallocated stamped slots (WorkerBuffers of the same pool, write side only), used in
    turn. S3: obstore's writer keeps a reference to each slot until its part is sent, at most `concurrency`
    parts in flight, so a ring of (parts in flight + 2) parts' worth of slots is never rewritten early;
    Redis: a ring of `pipeline` slots, reused after each round trip."""

    def __init__(self, slot_bytes: int, count: int, worker_id: int):
        from kv_cache.storage.buffers import WorkerBuffers  # noqa: PLC0415  (numpy: with the first write)

        self.slot_bytes = slot_bytes
        self.slots = [WorkerBuffers(slot_bytes, 0, (worker_id << 8) + i, read_bytes=BLOCK) for i in range(count)]
        self.i = 0

    def next(self) -> WorkerBuffers:
        slot = self.slots[self.i]
        self.i = (self.i + 1) % len(self.slots)
        return slot

    def close(self) -> None:
        for slot in self.slots:
            slot.close()


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
