"""The S3 tier's reads: ranged GETs whose bodies land straight in the worker's read buffer.

A read signs the object's URL once (obstore.sign: the store's own credentials, endpoint and region; about
12 us, so per read rather than cached, and never near its expiry) and fetches it as ranged GETs of
``part_bytes``, ``concurrency`` of them in flight, each on a connection of a pool made when the store
opens. No body is buffered anywhere but in ``bufs.read_buf``: the read buffer holds one chunk of the entry
at a time (a window), and each part's body is read from its socket (``http.client`` ``readinto``, which
receives into the caller's memory) into the slice of the window it covers, only while that window is the
current one. A part that spans several windows reads its next piece once the window has moved on; a part
whose window is not yet current has sent its request and waits with its body in the socket. When every
piece of a window has landed its stamps are checked in place (--verify) and it is handed to ``on_chunk``;
then the window moves on.

Per part: a 503 SlowDown / 429 is retried after a backoff and counted (RemoteStats); a 403 / 401 is an
EACCES, a 404 a KeyError (a missing bucket FileNotFoundError), a 416 or a body shorter than asked a
DataCorruption, any other status an EIO; a connection refused, reset, timed out or closed mid-body is an
ENOTCONN (counted as a lost connection; a request that got no answer is sent again within the failover
budget, a body cut part way fails the read, which the cache retries). ``device_ns`` is the time the read
waits for its parts (the network and the server), ``host_ns`` the checks, the hand-on and the bookkeeping.
A read stopped between windows still counts the bytes its parts under way received: they are read to
their end (into the window, which is discarded) before the read returns.
"""

from __future__ import annotations

import errno
import http.client
import re
import select
import threading
from collections.abc import Callable
from time import monotonic, perf_counter_ns
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kv_cache.storage.base import BLOCK, DataCorruption, IOAborted, IOResult
from kv_cache.storage.remote import POLL_S, RemoteStats, RunDeadline, Throttled, lost_connection

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import ThreadPoolExecutor

    from kv_cache.storage.base import ChunkSink
    from kv_cache.storage.buffers import WorkerBuffers

_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_NET_ERRORS = (OSError, http.client.HTTPException)


class Connections:
    """HTTP(S) connections to one host, made once (``size`` of them, each connecting on first use and
    kept alive while the server allows), lent to one part at a time. https: one TLS context for all,
    trusting the system's roots and `cafile` (the CA bundle boto3 and obstore are given)."""

    def __init__(self, url: str, size: int, timeout: float, cafile: str | None = None):
        u = urlsplit(url)
        self.scheme, self.netloc, self.timeout = u.scheme, u.netloc, timeout
        self.context = None
        if self.scheme == "https":
            import ssl  # noqa: PLC0415

            self.context = ssl.create_default_context()
            if cafile:
                self.context.load_verify_locations(cafile=cafile)
        self._lock = threading.Lock()
        self._idle = [self._new() for _ in range(max(1, size))]
        self._lent: set[http.client.HTTPConnection] = set()

    def _new(self) -> http.client.HTTPConnection:
        if self.context is not None:
            return http.client.HTTPSConnection(self.netloc, timeout=self.timeout, context=self.context)
        return http.client.HTTPConnection(self.netloc, timeout=self.timeout)

    def get(self) -> http.client.HTTPConnection:
        """An idle connection (a new one only if all are lent); one the server closed is reopened."""
        with self._lock:
            conn = self._idle.pop() if self._idle else self._new()
            self._lent.add(conn)
        sock = conn.sock
        if sock is not None and _readable(sock):  # EOF (or junk) on an idle connection
            conn.close()
        return conn

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._lent.discard(conn)
            self._idle.append(conn)

    def reap(self) -> None:
        """Shut down the sockets of the connections lent out (a part blocked on a frozen server returns)."""
        import socket  # noqa: PLC0415

        with self._lock:
            lent = list(self._lent)
        for conn in lent:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _readable(sock: Any) -> bool:
    """Whether `sock` has something to read now (poll, not select: select refuses a descriptor above 1023,
    which a run with many workers and connections, or a process with many files open, has)."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(0))


def _status_error(status: int, body: bytes, what: str, bucket: str, name: str, path: str, start: int
                  ) -> BaseException:
    """An error answer to a ranged GET as what the run does with it (see the module docstring)."""
    m = _CODE.search(body)
    code = m.group(1).decode(errors="replace") if m else ""
    first = f"HTTP {status}" + (f" {code}" if code else "")
    if status in (429, 503) or code == "SlowDown":
        return Throttled(first)
    if status in (401, 403):
        return OSError(errno.EACCES, f"{what}: the server refused the credentials ({first})")
    if status == 404:
        return (FileNotFoundError(errno.ENOENT, f"{what}: bucket {bucket!r} not found") if code == "NoSuchBucket"
                else KeyError(what))
    if status == 416:
        return DataCorruption(f"{name}: object {path} ends before byte {start}")
    return OSError(errno.EIO, f"{what}: {first}")


class _Read:
    """One read's turn-taking over the read buffer: which window is current, the pieces each window still
    waits for, the bytes received, the first error, and whether the read is being wound up."""

    def __init__(self, pieces: list[int]):
        self.cond = threading.Condition()
        self.current = 0
        self.left = pieces
        self.got = 0
        self.finished = 0  # parts whose whole body is in
        self.error: BaseException | None = None
        self.ending = False  # the read stopped or failed: parts read their bodies out (or drop them) and end
        self.drain = False  # ...reading them out (a stop: their bytes cross the wire and are counted)


class RangedReads:
    """The S3 tier's read path (see the module docstring). ``sign(path)`` is the presigned GET URL of an
    object; ``pool`` runs the parts; ``connections`` is the host's connection pool."""

    def __init__(self, sign: Callable[[str], str], pool: ThreadPoolExecutor, connections: Connections,
                 stats: RemoteStats, part_bytes: int, concurrency: int, bucket: str, name: str,
                 deadline: RunDeadline | None = None):
        self.sign, self.pool, self.conns, self.stats = sign, pool, connections, stats
        self.deadline = deadline or RunDeadline()
        self.part_bytes, self.concurrency = part_bytes, concurrency
        self.bucket, self.name = bucket, name

    # ------------------------------------------------------------------ one part
    def _open(self, target: str, start: int, end: int, what: str, path: str
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send the ranged GET of [start, end) and read its answer's head, retried after a backoff while
        throttled; returns the connection and the response whose body is still in the socket."""
        def once():
            for attempt in (0, 1):
                conn = self.conns.get()
                reused = conn.sock is not None
                try:
                    conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
                    resp = conn.getresponse()
                    break
                except _NET_ERRORS as exc:
                    conn.close()
                    self.conns.put(conn)
                    if reused and attempt == 0:  # a kept-alive connection the server had closed: once more, fresh
                        continue
                    self.stats.lost()
                    raise lost_connection(what, exc) from exc
            if resp.status in (200, 206):
                have = resp.length if resp.length is not None else end - start
                if resp.status == 200 and start:  # the server ignored the Range
                    resp.close()
                    conn.close()
                    self.conns.put(conn)
                    raise OSError(errno.EIO, f"{what}: the server answered a ranged GET with the whole object")
                if have < end - start:
                    resp.close()
                    conn.close()
                    self.conns.put(conn)
                    raise DataCorruption(f"{self.name}: object {path} ends at {start + have}, expected {end}")
                return conn, resp
            try:
                body = resp.read()
            except _NET_ERRORS:
                body = b""
                conn.close()
            self.conns.put(conn)
            raise _status_error(resp.status, body, what, self.bucket, self.name, path, start)
        first = self.deadline.begin()
        try:
            return self.stats.failover(lambda: self.stats.backoff(once, what), what, self.deadline)
        finally:
            if first:
                self.deadline.end()

    def _fill(self, resp: http.client.HTTPResponse, view: memoryview, rd: _Read, what: str) -> None:
        """Receive exactly len(view) bytes of the body into `view` (zero copy: recv_into the buffer)."""
        got, n = 0, len(view)
        try:
            while got < n:
                k = resp.readinto(view[got:])
                if not k:
                    raise http.client.IncompleteRead(b"", n - got)
                got += k
                self.deadline.answered_at = monotonic()  # a body still arriving: the server answers
        except _NET_ERRORS as exc:
            self.stats.lost()
            raise lost_connection(what, exc) from exc
        finally:
            with rd.cond:
                rd.got += got

    def _part(self, rd: _Read, target: str, path: str, start: int, end: int, origin: int, mv: memoryview,
              window: int) -> None:
        """Fetch object bytes [start, end) into the windows of `mv` they fall in (window w holds object
        bytes [origin + w * window, origin + (w + 1) * window))."""
        what = f"s3 read of {path}"
        conn = None
        if rd.ending:  # the read ended before this part was sent: nothing to fetch
            return
        try:
            conn, resp = self._open(target, start, end, what, path)
            off = start
            while off < end:
                w = (off - origin) // window
                stop = min(end, origin + (w + 1) * window)
                with rd.cond:
                    rd.cond.wait_for(lambda w=w: rd.current >= w or rd.ending)
                    if rd.ending and not rd.drain:
                        break
                base = (off - origin) - w * window
                self._fill(resp, mv[base: base + (stop - off)], rd, what)
                off = stop
                if off == end:  # the whole body is in: the connection goes back before the window is told
                    if resp.length:  # (a server that sent more than the range: not reusable as it is)
                        conn.close()
                    self.conns.put(conn)
                    conn = None
                with rd.cond:
                    rd.left[w] -= 1
                    rd.finished += off == end
                    rd.cond.notify_all()
        except BaseException as exc:
            with rd.cond:
                if rd.error is None:
                    rd.error = exc
                rd.cond.notify_all()
        finally:
            if conn is not None:  # a body not read to its end: the connection cannot be reused as it is
                conn.close()
                self.conns.put(conn)

    # ------------------------------------------------------------------ reads
    def fetch(self, path: str, origin: int, length: int, mv: memoryview, window: int,
              landed: Callable[[int, int], None], stop: threading.Event | None = None, label: str = ""
              ) -> tuple[int, int]:
        """Object bytes [origin, origin + length) into `mv` a window of `window` bytes at a time; calls
        `landed(w, n)` once window w's n bytes are all in mv[:n]. Returns (bytes received, ns waited).
        A stop seen between windows is an IOAborted (of the read of `label`) carrying the bytes received
        and the time waited."""
        target = self._target(path)
        nwin = -(-length // window) if length else 0
        part = self.part_bytes
        parts = [(s, min(s + part, origin + length)) for s in range(origin, origin + length, part)]
        pieces = [0] * nwin
        for s, e in parts:
            for w in range((s - origin) // window, (e - 1 - origin) // window + 1):
                pieces[w] += 1
        rd = _Read(pieces)
        futures: list[Any] = []
        wait_ns = 0
        # the read is an operation of this thread: a server silent for RunDeadline.stall_s mid-body (no
        # stop yet: the probe, preconditioning) abandons it there, and the Watchdog shuts its parts' sockets;
        # before, only the connections' 120 s socket timeout ended a part's wait, once per retry of the read
        first = self.deadline.begin()
        try:
            for w in range(nwin):
                if stop is not None and stop.is_set():
                    raise IOAborted(f"read of {label or path} aborted after {w * window} bytes")
                t = perf_counter_ns()
                with rd.cond:
                    rd.current = w
                    rd.cond.notify_all()
                while True:  # parts are sent as those before them finish, `concurrency` in flight
                    with rd.cond:
                        while not rd.cond.wait_for(lambda w=w: rd.left[w] == 0 or rd.error is not None or (
                                len(futures) < len(parts) and len(futures) - rd.finished < self.concurrency),
                                POLL_S):
                            state = self.deadline.state()  # a frozen server: given up at the deadline
                            if state is not None:
                                self.stats.abandoned(state)
                                raise self.deadline.error(f"s3 read of {label or path}", state)
                        err, full = rd.error, rd.left[w] == 0
                        free = min(self.concurrency - len(futures) + rd.finished, len(parts) - len(futures))
                    if err is not None:
                        state = self.deadline.state() if getattr(err, "errno", None) == errno.ENOTCONN else None
                        if state is not None:  # a part's socket shut by the Watchdog: the deadline's doing
                            self.stats.abandoned(state)
                            raise self.deadline.error(f"s3 read of {label or path}", state) from err
                        raise err
                    for _ in range(free):
                        s, e = parts[len(futures)]
                        futures.append(self.pool.submit(self._part, rd, target, path, s, e, origin, mv, window))
                    if full:
                        break
                wait_ns += perf_counter_ns() - t
                landed(w, min(window, length - w * window))
        except BaseException as exc:
            with rd.cond:
                rd.ending = True
                rd.drain = isinstance(exc, IOAborted)
                rd.cond.notify_all()
            for f in futures:
                if not f.cancel():
                    try:  # (_part keeps its error) the read buffer is ours again, or the parts were reaped
                        self.deadline.result(f, f"s3 read of {label or path}")
                    except BaseException:  # noqa: BLE001  (abandoned: the reaper shut their sockets)
                        break
            if isinstance(exc, IOAborted):
                exc.device_bytes, exc.device_ns = rd.got, wait_ns
            raise
        finally:
            if first:
                self.deadline.end()
        return rd.got, wait_ns

    def _target(self, path: str) -> str:
        """The presigned URL's path and query (the connection pool holds its host)."""
        try:
            u = urlsplit(self.sign(path))
        except Exception as exc:
            raise OSError(errno.EACCES, f"s3 read of {path}: cannot sign the request ({exc})") from exc
        return f"{u.path}?{u.query}"

    def read(self, key: str, path: str, nbytes: int, total: int, bufs: WorkerBuffers, kid: int, verify: bool,
             on_chunk: ChunkSink | None, stop: threading.Event | None) -> IOResult:
        """The entry (`nbytes` of payload, `total` stored) through bufs.read_buf a chunk at a time, each
        chunk verified in place and handed on in order."""
        t0 = perf_counter_ns()
        mv, chunk = bufs.read_mv, bufs.chunk_bytes

        def landed(c: int, n: int) -> None:
            off = c * chunk
            if verify:
                bad = bufs.check_stamp(kid, off // BLOCK, n // BLOCK)
                if bad >= 0:
                    raise DataCorruption(f"{self.name}: entry {key!r} block {off // BLOCK + bad} "
                                         "does not carry its stamp")
            if on_chunk is not None:
                on_chunk(c, mv[: min(n, max(0, nbytes - off))])

        _, wait_ns = self.fetch(path, 0, total, mv, chunk, landed, stop, repr(key))
        t1 = perf_counter_ns()
        return IOResult(nbytes, total, t1 - t0, wait_ns, t1 - t0 - wait_ns)

    def get(self, path: str, offset: int, view: memoryview) -> tuple[int, int]:
        """Object bytes [offset, offset + len(view)) into `view` (one window; parts in parallel)."""
        n = len(view)
        if not n:
            return 0, 0
        _, ns = self.fetch(path, offset, n, view, n, lambda w, k: None)
        return n, ns
