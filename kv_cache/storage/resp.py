"""The Redis tier's data commands on the wire (RESP), on the socket of a redis-py connection: pipelined
SETs sent as vectors of buffers (the command headers and the worker's stamped write buffer itself, via
``sendmsg``: no copy of a value), and the replies to pipelined GETs read with ``recv_into`` straight into
the caller's buffer (no bytes object per value, no copy).

redis-py still makes the connection (URL, AUTH, SELECT, TLS) and runs every other command; a connection
is used here only while redis-py has nothing to read on it (taken from its pool, which checks that), and
every reply sent on it is read here before it goes back to the pool. An exchange that stops part way (an
error reply, a lost connection, a --verify mismatch) leaves replies unread: the caller then disconnects it
(``Wire.abandon``) and redis-py reconnects it on its next use.

The reader keeps a small scratch buffer for the reply headers (``$<len>\\r\\n``, ``+OK\\r\\n``,
``-ERR ...\\r\\n``). It asks the socket for no more bytes than the header it expects, so the value that
follows lands in the caller's buffer, not in the scratch; where the reply is not the one expected (a nil,
an error, another length) the few bytes read ahead are taken from the scratch first.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

CRLF = b"\r\n"
_IOV_MAX = 512  # buffers per sendmsg call (Linux allows 1024)
_SCRATCH = 1 << 16  # bytes for reply headers and error lines
_AHEAD = 4096  # bytes asked for at a time for a line longer than the header expected


class WireLost(Exception):
    """The connection failed or closed during an exchange (the caller's lost-connection path)."""


class WireRefused(Exception):
    """The server answered a command with an error reply (``-OOM ...``, ``-NOAUTH ...``); the text after the ``-``."""


class WireGarbled(Exception):
    """What came back is not RESP (is it a Redis/Valkey server?)."""


def set_header(key: bytes, nbytes: int) -> bytes:
    """The header of ``SET key <a value of nbytes>``: what precedes the value's bytes on the wire."""
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n" % (len(key), key, nbytes)


def set_command(key: bytes, value: memoryview) -> list[Any]:
    """The buffers of ``SET key value``: the header, the value itself (not copied), the trailing CRLF."""
    return [set_header(key, len(value)), value, CRLF]


def get_commands(keys: list[bytes]) -> bytes:
    """``GET k`` for each key, packed once (one buffer for the round trip)."""
    return b"".join(b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(k), k) for k in keys)


class Wire:
    """One thread's reader and writer of RESP on a connection's socket (``attach`` it per exchange).

    ``ns`` accumulates the time spent in the socket calls (sending, and waiting for replies), which the
    store reports as device time.
    """

    def __init__(self) -> None:
        self.scratch = bytearray(_SCRATCH)
        self.mv = memoryview(self.scratch)
        self.pos = self.end = 0
        self.sock: Any = None
        self.vector = True
        self.ns = 0

    def attach(self, conn: Any) -> None:
        """Use the socket of redis-py connection ``conn`` (connected, nothing pending) from now on."""
        sock = conn._sock  # redis-py's Connection keeps it here once connected
        if sock is None:
            raise WireLost("the connection has no socket")
        self.sock = sock
        self.vector = not hasattr(sock, "cipher")  # an ssl.SSLSocket has no sendmsg: sendall per buffer
        self.pos = self.end = 0

    def idle(self) -> bool:
        """Nothing read and left unconsumed (the exchange ended on a reply boundary)."""
        return self.pos == self.end

    def abandon(self, conn: Any) -> None:
        """An exchange stopped part way: its unread replies make the connection unusable; close it."""
        self.pos = self.end = 0
        self.sock = None
        try:
            conn.disconnect()
        except Exception:  # already gone
            pass

    # ------------------------------------------------------------------ sending
    def send(self, pieces: list[Any]) -> None:
        """Send every buffer of ``pieces`` in order (a short send resumes where it stopped)."""
        t = perf_counter_ns()
        try:
            if not self.vector:
                for p in pieces:
                    self.sock.sendall(p)
                return
            views = [memoryview(p) for p in pieces if len(p)]
            i = 0
            while i < len(views):
                sent = self.sock.sendmsg(views[i:i + _IOV_MAX])
                while sent and i < len(views):
                    n = views[i].nbytes
                    if sent < n:
                        views[i] = views[i][sent:]
                        break
                    sent -= n
                    i += 1
        except OSError as exc:  # includes socket.timeout
            raise WireLost(f"sending: {type(exc).__name__}: {exc}") from exc
        finally:
            self.ns += perf_counter_ns() - t

    # ------------------------------------------------------------------ receiving
    def _fill(self, want: int) -> None:
        """Receive up to ``want`` more bytes into the scratch (at least one)."""
        have = self.end - self.pos
        if not have:
            self.pos = self.end = 0
        elif self.end + want > _SCRATCH:
            if have + want > _SCRATCH:
                raise WireGarbled(f"a reply line longer than {_SCRATCH} bytes")
            self.mv[:have] = self.mv[self.pos:self.end]
            self.pos, self.end = 0, have
        t = perf_counter_ns()
        try:
            got = self.sock.recv_into(self.mv[self.end:self.end + want])
        except OSError as exc:
            raise WireLost(f"receiving: {type(exc).__name__}: {exc}") from exc
        finally:
            self.ns += perf_counter_ns() - t
        if not got:
            raise WireLost("the server closed the connection")
        self.end += got

    def _line(self, expect: int) -> tuple[int, int]:
        """The next reply line, as (first byte, end index of its text in the scratch), consumed. ``expect``:
        the length of the line expected (CRLF included), the most asked of the socket at first."""
        while True:
            i = self.scratch.find(CRLF, self.pos, self.end)
            if i >= 0:
                start, self.pos = self.pos, i + 2
                return start, i
            have = self.end - self.pos
            self._fill(expect - have if have < expect else _AHEAD)

    def _text(self, start: int, stop: int) -> str:
        return self.scratch[start + 1:stop].decode("utf-8", "replace")

    def bulk_length(self, expect: int) -> int:
        """The length of the next bulk reply (-1: nil, the key is missing); ``expect``: the value length
        expected. An error reply raises WireRefused."""
        start, stop = self._line(len(str(expect)) + 3)
        kind = self.scratch[start]
        if kind == 0x24:  # '$'
            try:
                return int(self.scratch[start + 1:stop])
            except ValueError:
                raise WireGarbled(f"a bulk reply of length {self._text(start, stop)!r}") from None
        if kind == 0x2D:  # '-'
            raise WireRefused(self._text(start, stop))
        if kind == 0x5F and stop == start + 1:  # '_': RESP3's nil (a URL that asks for protocol=3)
            return -1
        raise WireGarbled(f"an unexpected reply {bytes(self.scratch[start:min(stop, start + 40)])!r}")

    def status_replies(self, count: int) -> str | None:
        """Read ``count`` simple replies (``+OK``); every one is read, and the first error's text returned
        (None: all OK), as redis-py's pipeline reports the first error after reading all replies."""
        first = None
        for _ in range(count):
            start, stop = self._line(5 * count)
            kind = self.scratch[start]
            if kind == 0x2D and first is None:
                first = self._text(start, stop)
            elif kind not in (0x2B, 0x2D):  # '+', '-'
                raise WireGarbled(f"an unexpected reply {bytes(self.scratch[start:min(stop, start + 40)])!r}")
        return first

    def into(self, dest: memoryview) -> None:
        """Fill ``dest`` with the next ``len(dest)`` bytes of the stream: what the scratch holds first (only
        where a reply was not the one expected), then straight from the socket."""
        off, n = 0, len(dest)
        have = self.end - self.pos
        if have:
            off = min(have, n)
            dest[:off] = self.mv[self.pos:self.pos + off]
            self.pos += off
        if off == n:
            return
        sock = self.sock
        t = perf_counter_ns()
        try:
            while off < n:
                got = sock.recv_into(dest[off:])
                if not got:
                    raise WireLost("the server closed the connection")
                off += got
        except OSError as exc:
            raise WireLost(f"receiving: {type(exc).__name__}: {exc}") from exc
        finally:
            self.ns += perf_counter_ns() - t

    def skip(self, n: int) -> None:
        """Read and drop ``n`` bytes (the tail of a value longer than asked for), through the scratch."""
        while n > 0:
            have = self.end - self.pos
            if not have:
                self._fill(min(n, _SCRATCH))
                continue
            k = min(have, n)
            self.pos += k
            n -= k

    def crlf(self) -> None:
        """The CRLF that ends a bulk reply."""
        while self.end - self.pos < 2:
            self._fill(2 - (self.end - self.pos))
        if self.scratch[self.pos] != 0x0D or self.scratch[self.pos + 1] != 0x0A:
            raise WireGarbled("a bulk reply not ended by CRLF")
        self.pos += 2


__all__ = ["CRLF", "Wire", "WireGarbled", "WireLost", "WireRefused", "get_commands", "set_command"]
