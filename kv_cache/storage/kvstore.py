"""The storage tier as chunked keys in a Redis or Valkey server (RedisStore), the way LMCache's remote
backend keeps KV chunks: entry ``k`` of this run is the keys ``<run>:<k>:0``, ``<run>:<k>:1``... of one
worker chunk each, written with pipelined SETs and read with pipelined GETs, ``pipeline`` commands per
round trip.

redis-py makes and keeps the connections (URL, AUTH, SELECT, TLS, the pool) and runs the control commands
(PING, INFO, CONFIG, SCAN, UNLINK, the marker), with the hiredis parser when it is installed. The data
commands, SET and GET of the chunk keys, go on the wire here (storage/resp.py), on the socket of a
connection taken from redis-py's pool: redis-py would copy a value it sends (its hiredis packer makes
bytes of a memoryview, then packs them into one more) and hand back a new bytes object per value read.

Writes stamp the worker's own write buffer (its WorkerBuffers, so --verify works) a worker chunk at a
time and send it with the SET headers (``sendmsg``), ``pipeline`` SETs per round trip, then read their
replies: a blocking send has copied the bytes into the kernel when it returns, so the buffer is stamped
again for the next piece at once. Reads send the round trip's GETs packed in one buffer and receive each
value with ``recv_into`` straight into the worker's read buffer, chunk by chunk, where --verify checks
the stamps in place: nothing per request is buffered beyond the worker buffers (and one 64 KiB scratch
per thread for the reply headers). Until 4 Dec each thread wrote from a ring of ``pipeline`` slots of its
own (8 x 16 MiB, each filled with random bytes as its first write came): at 16 workers the rings held
2 GiB and making them took 30 % of the run's samples (py-spy, 16 workers, 15 s window), so the run's workers
scaled worse than the I/O worker probe's, which share one buffer (issue 35).

A ``maxmemory`` refusal (OOM) is the tier being full: ENOSPC, which stops the run as a full disk does. A lost
connection is sent again after backoffs within the failover budget, then EHOSTDOWN (remote.py
RemoteStats.failover); an operation still waiting on a frozen server past the run's deadline is abandoned
(the Watchdog shuts the pool's sockets down) as ETIMEDOUT, at a stop signal as IOAborted (RunDeadline).
"""

from __future__ import annotations

import errno
import logging
import threading
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from kv_cache.errors import StorageSetupError
from kv_cache.settings.run import redacted_argv
from kv_cache.storage.base import (
    BLOCK,
    DataCorruption,
    IOAborted,
    IOResult,
    close_at_exit,
    forget_at_exit,
    key_id,
    padded,
)
from kv_cache.storage.files import file_name
from kv_cache.storage.remote import (
    FAILOVER_S,
    GRACE_S,
    MARKER,
    SETTLE_S,
    RemoteStore,
    Watchdog,
    hand_on,
    lost_connection,
    marker_json,
    new_run_name,
    ring_bytes,
    stale_owner,
    tls_refused,
    tls_verification_failure,
)
from kv_cache.storage.resp import (
    CRLF,
    Wire,
    WireGarbled,
    WireLost,
    WireRefused,
    get_commands,
    set_command,
    set_header,
)

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.storage.base import ChunkSink
    from kv_cache.storage.buffers import WorkerBuffers


log = logging.getLogger(__name__)
SETUP_TIMEOUT_S = 60.0  # redis-py's socket timeout: what bounds a frozen server while the store opens (no Watchdog yet)


def _import_redis():
    try:
        import redis  # noqa: PLC0415  (optional dependency: only the redis backend needs it)
        from redis.utils import HIREDIS_AVAILABLE  # noqa: PLC0415
    except ImportError:
        raise StorageSetupError("--storage-backend redis needs redis-py: pip install 'kv-cache[redis]'").about(
            "storage_backend") from None
    return redis, HIREDIS_AVAILABLE


def _refusal(what: str, text: str) -> OSError:
    """An error reply (redis-py's ResponseError or one read here) as the OSError the cache classifies."""
    if text.startswith("OOM") or "maxmemory" in text:
        return OSError(errno.ENOSPC, f"{what}: the server's maxmemory is reached, the tier is full ({text})")
    if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
        return OSError(errno.EACCES, f"{what}: the server refused the credentials ({text})")
    return OSError(errno.EIO, f"{what}: {text}")


class RedisStore(RemoteStore):
    """Entries as chunked keys under this run's namespace (see the module docstring)."""

    def __init__(self, url: str, chunk_bytes: int, pipeline: int = 8, workers: int = 8, *, name: str = "redis",
                 grace_s: float = GRACE_S, failover_s: float = FAILOVER_S):
        self.redis, self.hiredis = _import_redis()
        super().__init__(name, grace_s, failover_s)
        self.url = url
        self.chunk_bytes = int(chunk_bytes)
        self.pipeline = max(1, int(pipeline))
        self.ring_bytes = ring_bytes("redis", self.chunk_bytes, pipeline=self.pipeline)  # 0: no slots beside the buffers
        self._chunks: dict[str, int] = {}  # key -> chunk keys it has on the server (created, not deleted)
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        try:
            # RESP2 (a URL's protocol= wins): the data path reads its replies itself (resp.py), and RESP3
            # would let a server push notifications in between them
            self._r = self.redis.Redis.from_url(url, socket_timeout=SETUP_TIMEOUT_S, socket_connect_timeout=5, protocol=2,
                                                max_connections=workers + 4, retry=Retry(NoBackoff(), 0))
        except ValueError as e:
            raise StorageSetupError(f"redis: bad --redis-url {redacted_argv([url])[0]!r}: {e}").about("redis_url") from None
        self._setup("reach the server", self._r.ping)
        self.evicting = self._eviction_policy()
        if self.evicting:
            self.notes.append(
                f"redis: the server evicts keys on its own at maxmemory (maxmemory-policy {self.evicting}): entries "
                "it drops are read errors, not a full tier; set maxmemory-policy noeviction to have a full tier "
                "refuse writes (ENOSPC)")
        if self.endpoint_host is None:
            self.notes.append("redis: the server is reached over a unix socket, which crosses no network interface: "
                              "no interface's bytes are compared with the tier's")
        self.run_name = new_run_name()
        self._sweep()
        self._setup("write the marker", lambda: self._r.set(f"{self.run_name}:{MARKER}", marker_json()))
        self._watchdog = Watchdog(self.deadline, self._reap, "redis")
        self.deadline.opening = False  # from here on a lost server is retried within the failover budget
        close_at_exit(self)

    def _reap(self) -> None:
        """Shut every connection down (the Watchdog, once an operation is past its deadline): a thread
        blocked in a socket call on a frozen server returns at once."""
        self._r.connection_pool.disconnect(inuse_connections=True)

    # ------------------------------------------------------------------ info (as FileStore's)
    fs_type = "redis"
    io_mode = "network"

    @property
    def io_mode_reason(self) -> str:
        return (f"chunked keys of {self.chunk_bytes >> 20} MiB, {self.pipeline} per pipelined round trip, "
                f"{self.parsing}")

    @property
    def parsing(self) -> str:
        """Who parses what: the data replies here, the control commands' replies redis-py's parser."""
        parser = "its hiredis parser" if self.hiredis else "its pure-Python parser"
        return ("SET/GET replies parsed by kv-cache's own RESP code, values sent from the stamped slots (sendmsg) "
                f"and received into the worker's read buffer (recv_into); redis-py ({parser}) for the connection "
                "and the control commands")

    @property
    def run_dir(self) -> str:
        return f"{self._where()}/{self.run_name}:*"

    @property
    def cache_dir(self) -> str:
        return self._where()

    def _where(self) -> str:
        kw = self._r.connection_pool.connection_kwargs
        if kw.get("path"):  # a unix:// URL: the socket's path, not a host and port
            return f"unix://{kw['path']}?db={kw.get('db', 0)}"
        return f"{self.scheme}://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"

    @property
    def scheme(self) -> str:
        """rediss (TLS), redis or unix: how the server is reached, as the URL said."""
        pool = self._r.connection_pool
        if pool.connection_kwargs.get("path"):
            return "unix"
        return "rediss" if issubclass(pool.connection_class, self.redis.SSLConnection) else "redis"

    def tls(self) -> dict[str, Any]:
        """TLS as the connections use it: on or off, the certificate verified or not, the CA trusted."""
        if self.scheme != "rediss":
            return {"on": False}
        kw = self._r.connection_pool.connection_kwargs
        reqs = kw.get("ssl_cert_reqs", "required")
        reqs = getattr(reqs, "name", reqs)
        verify = str(reqs).lower() not in ("none", "cert_none", "0")
        return {"on": True, "verify": verify, "cert_reqs": str(reqs).lower(),
                "ca": kw.get("ssl_ca_certs") or kw.get("ssl_ca_path") or ("the system's default CA store" if verify
                                                                          else None),
                "check_hostname": bool(kw.get("ssl_check_hostname", verify))}

    @property
    def endpoint_host(self) -> str | None:
        """The server's host name (the network counters follow the interface towards it); None over a unix
        socket, whose traffic crosses no interface (so no interface's bytes are compared with the tier's)."""
        kw = self._r.connection_pool.connection_kwargs
        return None if kw.get("path") else str(kw.get("host", "localhost"))

    def free_bytes(self) -> int | None:
        """maxmemory less used_memory (None: no maxmemory set, the tier is unbounded)."""
        info = self._call("redis INFO", lambda: self._r.info("memory"))
        limit = int(info.get("maxmemory", 0))
        return max(0, limit - int(info.get("used_memory", 0))) if limit else None

    def path_of(self, key: str) -> str:
        return f"{self._where()}/{self._base(key)}:*"

    def _base(self, key: str) -> str:
        return f"{self.run_name}:{file_name(key)[:-4]}"

    def remote_stats(self) -> dict[str, Any]:
        redis_py = f"redis-py {self.redis.__version__}" + (" + hiredis" if self.hiredis else "")
        return {"backend": "redis", "client": f"{redis_py} (connections, control commands) and kv-cache's RESP code "
                "(SET/GET values)", "parsing": self.parsing, "endpoint": self._where(), "scheme": self.scheme, "tls": self.tls(),
                "prefix": f"{self.run_name}:",
                "chunk_bytes": self.chunk_bytes, "pipeline": self.pipeline, **self.stats.as_dict()}

    # ------------------------------------------------------------------ errors
    def _call(self, what: str, fn):
        """`fn()` as an operation of the run: abandoned past its deadline or at a stop signal
        (RunDeadline), a lost connection sent again within the failover budget (RemoteStats.failover)."""
        first = self.deadline.begin()
        try:
            return self.stats.failover(lambda: self._once(what, fn), what, self.deadline)
        finally:
            if first:
                self.deadline.end()

    def _once(self, what: str, fn):
        try:
            return fn()
        except (self.redis.ConnectionError, self.redis.TimeoutError, WireLost) as exc:
            state = self.deadline.state()
            if state is not None:  # the Watchdog shut the socket: the deadline passed, or a stop signal
                self.stats.abandoned(state)
                raise self.deadline.error(what, state) from exc
            if isinstance(exc, self.redis.AuthenticationError):
                raise OSError(errno.EACCES, f"{what}: the server refused the credentials ({exc})") from exc
            tls = tls_verification_failure(exc)
            if tls is not None:
                raise tls_refused(what, tls) from exc
            self.stats.lost()
            raise lost_connection(what, exc) from exc
        except (self.redis.ResponseError, WireRefused) as exc:
            raise _refusal(what, str(exc)) from exc
        except (self.redis.RedisError, WireGarbled) as exc:  # e.g. InvalidResponse: not a Redis server
            raise OSError(errno.EIO, f"{what}: {type(exc).__name__}: {exc} (is it a Redis/Valkey server?)") from exc

    def _exchange(self, fn):
        """`fn(wire)` on a connection of redis-py's pool, its replies all read by this thread's Wire; a
        connection left with replies unread (an exchange that raised) is disconnected (resp.py)."""
        wire = getattr(self._tls, "wire", None)
        if wire is None:
            wire = self._tls.wire = Wire()
        pool = self._r.connection_pool
        t = perf_counter_ns()
        conn = pool.get_connection()
        wire.ns += perf_counter_ns() - t
        try:
            wire.attach(conn)
            out = fn(wire)
            if not wire.idle():
                raise WireGarbled("bytes after the last reply")
            return out
        except BaseException:
            wire.abandon(conn)
            raise
        finally:
            wire.sock = None
            pool.release(conn)

    def _wire_ns(self) -> None:
        """Zero this thread's socket time: the device time of the operation starting (_spent reads it)."""
        wire = getattr(self._tls, "wire", None)
        if wire is not None:
            wire.ns = 0

    def _spent(self) -> int:
        wire = getattr(self._tls, "wire", None)
        return 0 if wire is None else wire.ns

    def _setup(self, what: str, fn):
        try:
            return self._once(f"redis {what}", fn)
        except OSError as e:
            why = {errno.EACCES: "the credentials were refused", errno.ENOTCONN: "the server cannot be reached"}.get(
                e.errno, (e.strerror or str(e)).split(": ", 1)[-1])
            if "TLS certificate failed verification" in (e.strerror or ""):
                why = e.strerror.split(": ", 1)[-1]
            elif e.errno == errno.ENOTCONN and isinstance(e.__cause__, self.redis.TimeoutError) \
                    and "reading" in str(e.__cause__):  # connected, then no reply: not a server that is away
                why = (f"the server took the connection but did not answer in {SETUP_TIMEOUT_S:g} s (redis-py's "
                       "socket timeout): a frozen or overloaded server")
            raise StorageSetupError(f"redis: cannot {what} at {self._where()}: {why}").about("redis_url") from None

    def _gone(self, k: str) -> OSError:
        """A chunk key this run wrote and did not delete is not on the server: the server dropped it (its
        maxmemory-policy evicts, a FLUSHALL, a restart without persistence), not a --verify mismatch."""
        why = f" (maxmemory-policy {self.evicting})" if self.evicting else ""
        return OSError(errno.EIO, f"redis read of {k}: the key is gone from the server, which dropped it{why}")

    def _eviction_policy(self) -> str | None:
        """The server's maxmemory-policy when it evicts keys on its own (maxmemory set, not noeviction)."""
        try:
            cfg = self._r.config_get("maxmemory*")
        except Exception:  # CONFIG may be disabled (managed services): unknown
            return None
        policy = cfg.get("maxmemory-policy") or cfg.get(b"maxmemory-policy")
        limit = cfg.get("maxmemory") or cfg.get(b"maxmemory") or 0
        policy = policy.decode() if isinstance(policy, bytes) else policy
        return policy if int(limit) and policy and policy != "noeviction" else None

    # ------------------------------------------------------------------ leftovers
    def _sweep(self) -> None:
        """Remove the namespaces of dead runs of this host (remote.py)."""
        for mk in self._setup("scan", lambda: list(self._r.scan_iter(match=f"kv-cache-run-*:{MARKER}", count=1000))):
            run = mk.decode()[: -len(MARKER) - 1]
            why = stale_owner(run, self._r.get(mk))
            if why is None:
                continue
            keys = [k for k in self._r.scan_iter(match=f"{run}:*", count=1000) if k != mk]
            freed = 0
            for i in range(0, len(keys), 500):
                batch = keys[i:i + 500]
                pipe = self._r.pipeline(transaction=False)
                for k in batch:
                    pipe.strlen(k)
                freed += sum(pipe.execute())
                self._r.unlink(*batch)
            self._r.unlink(mk)
            self.swept.append(f"removed the namespace {run}: on {self._where()} left by an earlier run ({why}): "
                              f"{len(keys)} key(s), {freed / (1 << 20):.1f} MiB")

    def _chunk_keys(self, key: str, n: int, start: int = 0) -> list[str]:
        base = self._base(key)
        return [f"{base}:{i}" for i in range(start, n)]

    # ------------------------------------------------------------------ primitives
    def _begin_write(self, key: str, nbytes: int) -> tuple[Any, int]:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            self._sizes.pop(key, None)
            old = self._chunks.get(key, 0)
        n = -(-padded(nbytes) // self.chunk_bytes) or 1
        ns = 0
        if old > n:  # a replaced entry that had more chunks: drop the extra ones
            t = perf_counter_ns()
            self._call(f"redis delete of {key!r}", lambda: self._r.unlink(*self._chunk_keys(key, old, n)))
            ns = perf_counter_ns() - t
        with self._lock:
            self._chunks[key] = n  # (the extra chunks of a longer entry it replaces are gone)
        h = [key, nbytes, n]
        self._writing_begins(h, (key, n))
        return h, ns

    def _put(self, h: Any, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        """One chunk moved in from the tier above (a whole chunk of the grid: key offset // chunk)."""
        self._open_or_abort(h[0], offset)
        k = f"{self._base(h[0])}:{offset // self.chunk_bytes}"
        self._wire_ns()
        self._call(f"redis write of {k}", lambda: self._exchange(
            lambda w: self._set_round(w, set_command(k.encode(), view), 1)))
        return len(view), self._spent()

    def _commit(self, h: Any) -> int:
        with self._lock:
            if self._closed or h[0] not in self._chunks:
                raise RuntimeError(f"{self.name}: entry {h[0]!r} was removed or the store closed during its write")
            self._sizes[h[0]] = h[1]
        self._writing_ends(h)
        return 0

    def _abort(self, h: Any) -> None:
        with self._lock:
            n = self._chunks.pop(h[0], 0)
            self._sizes.pop(h[0], None)
        if self._writing_ends(h, dropped=True):  # close() has begun: it removes the keys (settle_writes)
            return
        n = max(n, h[2])  # the books may have been taken meanwhile: the keys this write made
        try:
            self._unlink_or_later(h[0], n, h)
        except Exception:  # refused at a stop signal, or the server is gone: close() tries again
            pass

    def _unlink_or_later(self, key: str, n: int, h: Any) -> None:
        """Unlink the `n` chunk keys of `key` (the removal `h`, counted in flight); refused at a stop signal
        or with the server gone (raised), they are close()'s to remove (_remove_later)."""
        done = False
        try:
            if n:
                self._call(f"redis delete of {key!r}", lambda: self._r.unlink(*self._chunk_keys(key, n)))
            done = True
        finally:
            if done:
                self._writing_ends(h)
            else:  # refused at a stop signal, or the server is gone: close() tries again
                self._remove_later((key, n), h)

    def _set_round(self, wire: Wire, pieces: list[Any], count: int) -> None:
        wire.send(pieces)
        err = wire.status_replies(count)
        if err is not None:
            raise WireRefused(err)

    def _begin_read(self, key: str) -> tuple[Any, int, int]:
        with self._lock:
            nbytes = self._sizes[key]
        return key, nbytes, 0

    def _get(self, h: Any, offset: int, view: memoryview) -> tuple[int, int]:
        k = f"{self._base(h)}:{offset // self.chunk_bytes}"
        self._wire_ns()

        def one(wire: Wire) -> None:
            wire.send([get_commands([k.encode()])])
            self._value_into(wire, k, len(view), view)

        self._call(f"redis read of {k}", lambda: self._exchange(one))
        return len(view), self._spent()

    def _value_into(self, wire: Wire, k: str, want: int, into: memoryview | None) -> int:
        """The header of the next GET reply, for a value of `want` bytes (a nil: the key is gone; shorter: a
        DataCorruption); with `into`, the value read into it, the rest dropped. Returns the value's length."""
        n = wire.bulk_length(want)
        if n < 0:
            raise self._gone(k)
        if n < want:
            raise DataCorruption(f"{self.name}: key {k} is short")
        if into is not None:
            wire.into(into)
            wire.skip(n - want)
            wire.crlf()
        return n

    def _end_read(self, h: Any) -> int:
        return 0

    # ------------------------------------------------------------------ pipelined operations
    def write(self, key: str, nbytes: int, bufs: WorkerBuffers, stop: threading.Event | None = None) -> IOResult:
        """SET up to `pipeline` chunk keys per round trip, each value stamped into bufs.write_buf a worker
        chunk at a time and sent from there (`_set_round_from`), then the round trip's replies read."""
        t0 = perf_counter_ns()
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        kid, total, chunk = key_id(key), padded(nbytes), self.chunk_bytes
        h, dev_ns = self._begin_write(key, nbytes)
        keys = self._chunk_keys(key, h[2])
        off = 0
        self._wire_ns()
        try:
            for g in range(0, len(keys), self.pipeline):
                if stop is not None and stop.is_set():
                    raise IOAborted(f"write of {key!r} aborted after {off} bytes", off)
                self._open_or_abort(key, off)
                group = keys[g:g + self.pipeline]
                # a retry after a lost connection stamps and sends the round trip again from `off`
                self._call(f"redis write of {key!r}", lambda: self._exchange(
                    lambda w: self._set_round_from(w, group, kid, off, total, bufs)))  # noqa: B023  (called at once)
                off = min(total, off + len(group) * chunk)
            dev_ns += self._spent() + self._commit(h)
        except IOAborted as e:
            self._abort(h)
            e.device_bytes, e.device_ns = off, dev_ns + self._spent()
            raise
        except BaseException:
            self._abort(h)
            raise
        t1 = perf_counter_ns()
        return IOResult(nbytes, total, t1 - t0, dev_ns, t1 - t0 - dev_ns)

    def _set_round_from(self, wire: Wire, group: list[str], kid: int, off: int, total: int,
                        bufs: WorkerBuffers) -> None:
        """One round trip of SETs: the chunk keys `group`, the first `off` bytes into an entry of `total`
        padded bytes, their values stamped into `bufs`' write buffer a piece (bufs.chunk_bytes) at a time,
        each piece sent before the next is stamped (a blocking send returns once the kernel holds the
        bytes); then every reply read."""
        mv, step = bufs.write_mv, bufs.chunk_bytes
        pending: list[Any] = []
        for k in group:
            n = min(self.chunk_bytes, total - off)
            pending.append(set_header(k.encode(), n))
            for sub in range(0, n, step):
                m = min(step, n - sub)
                bufs.stamp(kid, (off + sub) // BLOCK, m // BLOCK)
                pending.append(mv[:m])
                wire.send(pending)
                pending = []
            pending.append(CRLF)
            off += n
        wire.send(pending)
        err = wire.status_replies(len(group))
        if err is not None:
            raise WireRefused(err)

    def read(self, key: str, bufs: WorkerBuffers, stop: threading.Event | None = None, verify: bool = False,
             on_chunk: ChunkSink | None = None) -> IOResult:
        """GET up to `pipeline` chunk keys per round trip; each value received straight into bufs.read_buf,
        a worker chunk at a time, its stamps checked there (--verify) and handed to `on_chunk` in order."""
        t0 = perf_counter_ns()
        with self._lock:
            nbytes = self._sizes[key]
        total = padded(nbytes)
        keys = self._chunk_keys(key, -(-total // self.chunk_bytes))
        kid = key_id(key) if verify else 0
        at = [0, 0]  # [bytes of the entry read, next chunk index]
        self._wire_ns()

        def round_trip(wire: Wire, group: list[str]) -> None:
            wire.send([get_commands([k.encode() for k in group])])
            for k in group:
                want = min(self.chunk_bytes, total - at[0])
                n = self._value_into(wire, k, want, None)
                mv, step = bufs.read_mv, bufs.chunk_bytes
                for sub in range(0, want, step):
                    m = min(step, want - sub)
                    wire.into(mv[:m])
                    at[1] = hand_on(m, at[0] + sub, nbytes, bufs, kid, verify, on_chunk, at[1], self.name, key)
                wire.skip(n - want)
                wire.crlf()
                at[0] += want

        for g in range(0, len(keys), self.pipeline):
            if stop is not None and stop.is_set():
                raise IOAborted(f"read of {key!r} aborted after {at[0]} bytes", at[0], self._spent())
            group = keys[g:g + self.pipeline]
            self._call(f"redis read of {key!r}", lambda: self._exchange(lambda w: round_trip(w, group)))  # noqa: B023
        t1 = perf_counter_ns()
        dev_ns = self._spent()
        return IOResult(nbytes, total, t1 - t0, dev_ns, t1 - t0 - dev_ns)

    # ------------------------------------------------------------------ public
    def delete(self, key: str) -> None:
        with self._lock:
            n = self._chunks.pop(key, 0)
            self._sizes.pop(key, None)
            h = self._removing((key, n)) if n else None
        if n:  # raises where refused (an eviction's delete after a Ctrl-C): close() removes the keys then
            self._unlink_or_later(key, n, h)

    def close(self) -> None:
        """Delete the keys this run created, then its marker; never anything else. Idempotent."""
        chunks = self._take_books(self._chunks)
        if chunks is None:
            return
        # the writes in flight abort at their next round trip: their keys are removed with the books'
        pending, running = self.settle_writes()
        for key, n in pending:
            chunks[key] = max(n, chunks.get(key, 0))
        keys = [k for key, n in chunks.items() for k in self._chunk_keys(key, n)]
        left, why = len(keys), ""
        try:
            if self.deadline.dead:
                raise OSError(errno.ETIMEDOUT, "the server had stopped answering")
            for i in range(0, len(keys), 1000):
                self._call("redis delete of the run's keys", lambda b=keys[i:i + 1000]: self._r.unlink(*b))
                left -= len(keys[i:i + 1000])
            if running:  # they may still set keys after the removal: the marker stays for the next run's sweep
                raise OSError(errno.EBUSY, f"{running} write(s) still in flight after {SETTLE_S:.1f} s")
            self._call("redis delete of the marker", lambda: self._r.unlink(f"{self.run_name}:{MARKER}"))
        except Exception as exc:  # the server is gone: the next run's sweep removes what is left
            why = str(exc) if not isinstance(exc, OSError) or not exc.strerror else exc.strerror
            what = ("any key those writes set and its marker" if running and not left
                    else f"{left} key(s) of this run and its marker")
            self.leftovers = (f"{self.name}: left {what} on {self._where()} ({why}): "
                              f"the next run on this server removes them, or now: {self.removal_command()}")
            log.warning("%s", self.leftovers)
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.close()
        self._r.close()
        forget_at_exit(self)

    def removal_command(self) -> str:
        """The shell command that removes this run's keys (and marker) from the server."""
        url = redacted_argv([self._where() if self.scheme == "unix" else self.url])[0]
        cmd = f"redis-cli -u '{url}' --scan --pattern '{self.run_name}:*' | xargs -r redis-cli -u '{url}' unlink"
        return cmd + (" (with the password where the URL shows ***)" if "***" in url else "")

    def __repr__(self) -> str:
        return f"RedisStore({self._where()}, run={self.run_name!r})"
