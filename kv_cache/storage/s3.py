"""The storage tier as objects in an S3 bucket (S3Store), through obstore (Rust object_store).

One object per entry (per block in the block layout) under this run's own prefix (remote.py): writes
stamp the entry part by part into the worker's ring of slots; an entry of one part is one obstore PUT, a
larger one a multipart upload of ``part_bytes`` parts, ``concurrency`` of them in flight, through botocore's
part calls (s3_multipart.py: a throttled part is sent again alone, counted); reads (s3_reads.py) fetch
``part_bytes`` ranged GETs of a presigned URL, ``concurrency`` in flight, whose bodies are received straight
into the worker's read buffer a chunk at a time (where --verify checks the stamps), with no buffer of
their own.

What is buffered besides the worker buffers is the client's, on writes: a part's request body is its slot's
memoryview (no copy: a slot rewritten before its part is acknowledged would change the object, so the ring
holds ``concurrency`` + 2 parts). Nothing is generated per request.

Why obstore for reads and PUTs, botocore for parts: benchmarks/s3_clients.py, same moto server and
workload (see the README).

``device_ns`` is the time inside the client's calls on writes (waiting for the network and the server, and
the client's own work there) and the time waiting for the parts on reads; the stamping, the copies of a
write moved in from another tier, the checks and the hand-on are ``host_ns``.
Server throttling (503 SlowDown, 429) is retried here with backoff and counted (RemoteStats); a lost
connection is sent again after backoffs within the failover budget, then EHOSTDOWN; a refusal of the
credentials mid-run is an EACCES, which stops the run. Every call the workers make waits within the run's
deadline (RunDeadline: obstore's and botocore's calls on pool threads, which cannot be interrupted, the
reads' sockets shut down by the Watchdog), so a frozen server holds the run no longer than its stop + grace.
"""

from __future__ import annotations

import errno
import logging
import platform
import threading
from datetime import timedelta
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from kv_cache.errors import StorageSetupError
from kv_cache.host.signals import ABANDON_IO
from kv_cache.settings.run import redacted
from kv_cache.storage.base import (
    BLOCK,
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
    DaemonPool,
    RemoteStore,
    SharedSlots,
    SlotRing,
    Throttled,
    Watchdog,
    marker_json,
    new_run_name,
    release_thread_ring,
    ring_bytes,
    s3_ring_slots,
    stale_owner,
)
from kv_cache.storage.s3_client import abort_uploads, ca_bundle, classify, credentials, import_obstore, region
from kv_cache.storage.s3_multipart import PartWriter, Upload
from kv_cache.storage.s3_reads import Connections, RangedReads

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.storage.base import ChunkSink
    from kv_cache.storage.buffers import WorkerBuffers

ENTRY_SUFFIX = ".kv"
log = logging.getLogger(__name__)


class _Pending:
    """An entry being written: its one part (held until the PUT at commit) or its multipart upload, and
    the part slot a move is filling."""

    __slots__ = ("fill", "key", "nbytes", "path", "single", "slot", "upload")

    def __init__(self, key: str, path: str, nbytes: int):
        self.key, self.path, self.nbytes = key, path, nbytes
        self.upload: Upload | None = None
        self.single: memoryview | None = None
        self.slot: Any = None
        self.fill = 0


class S3Store(RemoteStore):
    """Entries as objects under ``s3://bucket/<prefix>kv-cache-run-.../`` (see the module docstring)."""

    def __init__(self, bucket: str, endpoint: str | None = None, prefix: str = "", part_bytes: int = 8 << 20,
                 concurrency: int = 4, workers: int = 8, chunk_bytes: int = 16 << 20, *, name: str = "s3",
                 grace_s: float = GRACE_S, failover_s: float = FAILOVER_S):
        self.obstore, s3_class = import_obstore()
        super().__init__(name, grace_s, failover_s)
        self._rings: list[SlotRing] = []
        self.slot_bytes = int(part_bytes)  # a write slot is one part: each part's body is one slot's view
        self.bucket, self.endpoint = bucket, endpoint
        self.shown_endpoint = redacted(endpoint) if endpoint else endpoint  # what messages and results show
        self.part_bytes, self.concurrency = int(part_bytes), max(1, int(concurrency))
        self.ring_bytes = ring_bytes("s3", chunk_bytes, part_bytes=self.part_bytes, concurrency=self.concurrency)
        self.base_prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        options: dict[str, Any] = {"timeout": "120s", "connect_timeout": "5s",
                                   "pool_max_idle_per_host": str(max(16, workers * self.concurrency))}
        if endpoint and endpoint.startswith("http://"):
            options["allow_http"] = True
        ca = ca_bundle()
        if ca:
            try:
                with open(ca, "rb") as fh:
                    options["root_certificate"] = fh.read()
            except OSError as e:
                raise StorageSetupError(f"s3: cannot read the CA bundle {ca!r} (AWS_CA_BUNDLE): {e.strerror}").about(
                    "s3_endpoint") from None
        kwargs: dict[str, Any] = {"region": region(), "client_options": options,
                                  "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}}
        if endpoint:
            kwargs["endpoint"] = endpoint
        provider = credentials()
        if provider is not None:
            kwargs["credential_provider"] = provider
        try:
            self._s3 = s3_class(bucket, **kwargs)
        except Exception as e:
            raise StorageSetupError(f"s3: cannot configure the client for bucket {bucket!r}: {e}").about(
                "s3_bucket") from None
        # multipart writes' part calls (before anything is written: a missing boto3 is a setup error)
        self._parts = PartWriter(bucket, endpoint, self.stats, self.concurrency, max(2, workers * self.concurrency),
                                 self.deadline)
        self._calls = DaemonPool(workers + 2, thread_name_prefix="kv-s3-call")  # obstore's calls, waited
        # for within the run's deadline (RunDeadline.result): a frozen server cannot hold a worker past it
        self._paths: dict[str, str] = {}  # key -> object path of every object we created and did not delete
        self.run_name = new_run_name()
        self.run_prefix = f"{self.base_prefix}{self.run_name}/"
        self._sweep()  # its listing is also the check that the server answers, the bucket exists, the keys work
        marker = marker_json()
        self._setup_call("write the marker", lambda: self.obstore.put(self._s3, self.run_prefix + MARKER, marker))
        self._pool = DaemonPool(max(2, workers * self.concurrency), thread_name_prefix="kv-s3")
        self._reads = RangedReads(self._sign, self._pool, Connections(
            self._setup_call("sign a request", lambda: self._sign(self.run_prefix + MARKER)),
            workers * self.concurrency, 120.0, ca), self.stats, self.part_bytes, self.concurrency, bucket, name,
            self.deadline)
        close_at_exit(self)
        self._check_clients(len(marker))
        self._watchdog = Watchdog(self.deadline, self._reads.conns.reap, "s3")
        self.deadline.opening = False  # from here on a lost server is retried within the failover budget
        self.ca = ca

    def _check_clients(self, marker_bytes: int) -> None:
        """Prove, before anything runs, the two clients the listing and the marker did not use: the reads'
        connections (a ranged GET of the marker: TLS trust and the presigned URL) and botocore's part
        calls (a HEAD of the marker: its own credential chain and CA bundle). Either failing used to show
        only mid-run, as lost connections or refused writes; now it is a one-line setup error, exit 2, and
        the marker is removed."""
        path = self.run_prefix + MARKER
        try:
            self._setup_call("read through the read path's connections",
                             lambda: self._reads.get(path, 0, memoryview(bytearray(marker_bytes))))
            self._setup_call("reach the server through botocore's part calls", lambda: self._parts.setup_call(
                f"s3 HEAD of {path}", self._parts.client.head_object, Bucket=self.bucket, Key=path))
        except StorageSetupError:
            self.close()
            raise

    # ------------------------------------------------------------------ info (as FileStore's)
    fs_type = "s3"
    io_mode = "network"

    @property
    def io_mode_reason(self) -> str:
        return (f"S3 objects through obstore (multipart writes through botocore's part calls): parts of "
                f"{self.part_bytes >> 20} MiB, {self.concurrency} in flight per entry")

    @property
    def run_dir(self) -> str:
        return f"s3://{self.bucket}/{self.run_prefix}"

    @property
    def cache_dir(self) -> str:
        return f"s3://{self.bucket}/{self.base_prefix}"

    @property
    def endpoint_host(self) -> str:
        """The server's host name (the network counters follow the interface towards it)."""
        from urllib.parse import urlparse  # noqa: PLC0415

        return (urlparse(self.endpoint).hostname if self.endpoint else None) or "s3.amazonaws.com"

    def free_bytes(self) -> int | None:
        """None: a bucket has no free space to read (the capacity is --storage-capacity-gb, or unbounded)."""
        return None

    def path_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object(key)}"

    def _object(self, key: str) -> str:
        return self.run_prefix + file_name(key)[: -len(".npy")] + ENTRY_SUFFIX

    def remote_stats(self) -> dict[str, Any]:
        return {"backend": "s3", "client": f"obstore {getattr(self.obstore, '__version__', '')}".strip(),
                "endpoint": self.shown_endpoint or "AWS", "scheme": self.scheme, "tls": self.tls(),
                "bucket": self.bucket, "prefix": self.run_prefix,
                "multipart_client": f"botocore {self._parts.version}",
                "read_client": f"http.client (Python {platform.python_version()}), presigned by obstore, into the read buffer",
                "part_bytes": self.part_bytes, "concurrency": self.concurrency, **self.stats.as_dict()}

    @property
    def scheme(self) -> str:
        """https or http: how the endpoint is reached (AWS itself: https)."""
        return "http" if self.endpoint and self.endpoint.startswith("http://") else "https"

    def tls(self) -> dict[str, Any]:
        """TLS as the three clients use it: on or off, the certificate always verified (none of them is
        told otherwise), and the CA trusted: AWS_CA_BUNDLE / ca_bundle, else each client's default roots."""
        if self.scheme != "https":
            return {"on": False}
        return {"on": True, "verify": True, "ca": getattr(self, "ca", None) or
                "the default roots (obstore: its bundled webpki roots; botocore: certifi; reads: the system's)"}

    def _sign(self, path: str) -> str:
        """The presigned GET URL of `path` (the client's own credentials and endpoint; good 15 minutes,
        signed afresh for every read)."""
        return self.obstore.sign(self._s3, "GET", path, timedelta(minutes=15))

    # ------------------------------------------------------------------ errors
    def _classify(self, what: str, exc: Exception) -> BaseException:
        """An obstore error as what the run does with it (s3_client.classify)."""
        return classify(self.obstore, self.bucket, self.stats, what, exc)

    def _call(self, what: str, fn, failover: bool = True):
        """`fn()` with throttling retried after backoffs, and obstore's errors classified, as an operation of
        the run: run on a pool thread and waited for within the run's deadline; with `failover`, a lost
        connection is sent again within the failover budget (RemoteStats.failover); without (the calls made
        while the store opens), it is an error at once."""
        def once():
            try:
                return fn()
            except (OSError, KeyError, Throttled):
                raise
            except Exception as exc:
                raise self._classify(what, exc) from exc

        def attempt():
            return self.stats.backoff(once, what)

        def waited():
            try:
                future = self._calls.submit(attempt)
            except RuntimeError:  # the interpreter is exiting (close at exit): in this thread
                return attempt()
            return self.deadline.result(future, what, self.stats)
        first = self.deadline.begin()
        try:  # (no failover: a call made while the store opens is still waited for within the deadline)
            return self.stats.failover(waited, what, self.deadline) if failover else waited()
        finally:
            if first:
                self.deadline.end()

    def _setup_call(self, what: str, fn):
        """A call made while opening: any failure is a one-line StorageSetupError (exit 2). It is waited for
        within the run's deadline as every call is (RunDeadline.stall_s: no answer in --remote-failover-s +
        --remote-grace-s abandons it), not only within the clients' own timeouts: a server frozen while the
        store opened held the run 120 s per call (obstore's timeout), then was named as not reached."""
        try:
            return self._call(f"s3 {what}", fn, failover=False)
        except (KeyError, FileNotFoundError):
            raise StorageSetupError(f"s3: bucket {self.bucket!r} not found {self._where()}").about("s3_bucket") from None
        except OSError as e:
            raise self._setup_error(what, e) from None

    def _where(self) -> str:
        return f"s3://{self.bucket}" + (f" at {self.shown_endpoint}" if self.endpoint else "")

    def _setup_error(self, what: str, e: OSError) -> StorageSetupError:
        """The one-line setup error of a failed call made while opening."""
        if e.errno == errno.ETIMEDOUT:
            why = (f"the server took the connection but did not answer in {self.deadline.stall_s:g} s "
                   f"(--remote-failover-s {self.deadline.failover_s:g} + --remote-grace-s {self.deadline.grace_s:g}): "
                   "a frozen or overloaded server")
        elif e.errno == errno.EACCES and "TLS certificate failed verification" in (e.strerror or ""):
            why = e.strerror.split(": ", 1)[-1]
        elif e.errno == errno.EACCES:
            why = "the credentials were refused"
        elif e.errno == errno.ENOTCONN:
            cause = e.__cause__ or e
            why = "the server cannot be reached" + (f" ({type(cause).__name__}: {(str(cause).splitlines() or [''])[0]})"
                                                    if "SSL" in type(cause).__name__ else "")
        else:
            why = str(e).split(": ", 1)[-1]
        return StorageSetupError(f"s3: cannot {what} in {self._where()}: {why}").about("s3_endpoint")

    # ------------------------------------------------------------------ leftovers
    def _sweep(self) -> None:
        """Remove the namespaces of dead runs of this host under the prefix (remote.py). Every call is waited
        for within the run's deadline (_call): a server frozen during the sweep is a setup error."""
        listing = self._setup_call("list", lambda: self.obstore.list_with_delimiter(self._s3, self.base_prefix or None))
        try:
            for sub in listing.get("common_prefixes", []):
                self._sweep_one(sub)
        except OSError as e:
            raise self._setup_error("remove an earlier run's leftovers", e) from None

    def _sweep_one(self, sub: str) -> None:
        name = sub[len(self.base_prefix):].rstrip("/")

        def call(what: str, fn):
            return self._call(f"s3 {what} under {sub}", fn, failover=False)
        try:
            marker = bytes(call("read of the marker", lambda: self.obstore.get(self._s3, f"{sub.rstrip('/')}/{MARKER}")
                                .bytes()))
        except Exception:
            if self.deadline.dead or ABANDON_IO.is_set():  # (not answered: never taken for a missing marker)
                raise
            marker = None  # (no marker, or not readable: the namespace is kept)
        why = stale_owner(name, marker)
        if why is None:
            return
        uploads = call("abort of the multipart uploads", lambda: abort_uploads(self.bucket, self.endpoint,
                                                                              sub.rstrip("/") + "/"))
        parts = ("; its incomplete multipart uploads not checked (boto3 lists them)" if uploads is None
                 else f", {uploads} incomplete multipart upload(s) aborted" if uploads else "")
        objects = call("list", lambda: [m for batch in self.obstore.list(self._s3, sub.rstrip("/") + "/")
                                        for m in batch])
        mine = [m["path"] for m in objects if m["path"].endswith(ENTRY_SUFFIX)]
        kept = [m["path"] for m in objects if not m["path"].endswith((ENTRY_SUFFIX, "/" + MARKER))]
        freed = sum(m["size"] for m in objects if m["path"].endswith(ENTRY_SUFFIX))
        for i in range(0, len(mine), 1000):  # (a batch a call, as close() deletes: each call has the deadline)
            call("delete", lambda b=mine[i:i + 1000]: self.obstore.delete(self._s3, b))
        if kept:
            self.swept.append(f"left the run prefix s3://{self.bucket}/{sub} of an earlier run ({why}): it "
                              f"holds {len(kept)} object(s) that are not a run's{parts}")
            return
        call("delete of the marker", lambda: self.obstore.delete(self._s3, f"{sub.rstrip('/')}/{MARKER}"))
        self.swept.append(f"removed the run prefix s3://{self.bucket}/{sub} left by an earlier run ({why}): "
                          f"{len(mine)} object(s), {freed / (1 << 20):.1f} MiB{parts}")

    # ------------------------------------------------------------------ writes
    def _ring(self) -> SlotRing:
        """This thread's ring of stamped slots, one part each (made on its first write, kept for the run);
        while the I/O worker probe runs, the one ring all its threads share (remote.py SharedSlots)."""
        if self._shared_ring is not None:
            return self._shared_ring
        ring = getattr(self._tls, "ring", None)
        if ring is None:
            ring = self._tls.ring = SlotRing(self.slot_bytes, s3_ring_slots(self.concurrency),
                                             threading.get_ident() & 0xFFFF)
            with self._lock:
                self._rings.append(ring)
        return ring

    def shared_slots(self) -> SharedSlots:
        """A context in which every thread writes from one shared ring of concurrency + 2 parts (the I/O
        worker probe's threads, whose bytes are not checked): the probe's slots cost one ring, not one per
        thread."""
        return SharedSlots(self, self.slot_bytes, s3_ring_slots(self.concurrency))

    def release_thread(self) -> None:
        """Free the calling thread's slot ring (concurrency + 2 parts), for a thread whose writes have all
        returned and that writes no more (the I/O worker probe's: without this each of its short-lived
        threads kept its ring to the end of the run); a later write of the thread makes a new one."""
        release_thread_ring(self._tls, self._lock, self._rings)

    def _begin_write(self, key: str, nbytes: int) -> tuple[_Pending, int]:
        """An entry of one part is one PUT (at commit); a larger one a multipart upload, started here."""
        path = self._object(key)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: store is closed")
            self._sizes.pop(key, None)
            self._paths[key] = path
        h = _Pending(key, path, nbytes)
        self._writing_begins(h, path)
        if padded(nbytes) <= self.part_bytes:
            return h, 0
        t = perf_counter_ns()
        try:
            h.upload = self._parts.begin(path)
        except BaseException:
            self._abort(h)  # the entry is not stored (nor the one it was replacing)
            raise
        return h, perf_counter_ns() - t

    def _send(self, h: _Pending, view: memoryview) -> int:
        """One stamped part (a whole slot's view, zero copy) on its way: a part of the multipart upload,
        sent and retried alone when throttled; or the entry's only part, PUT at commit."""
        if h.upload is not None:
            return h.upload.send(view)
        h.single = view
        return 0

    def _put(self, h: _Pending, offset: int, view: memoryview, first: bool) -> tuple[int, int]:
        """A chunk moved in from the tier above: copied into this thread's part slot, sent when full."""
        self._open_or_abort(h.key, offset)
        ring, ns, n, done = self._ring(), 0, len(view), 0
        while done < n:
            if h.slot is None:
                h.slot, h.fill = ring.next(), 0
            m = min(self.slot_bytes - h.fill, n - done)
            h.slot.write_mv[h.fill:h.fill + m] = view[done:done + m]
            h.fill += m
            done += m
            if h.fill == self.slot_bytes:
                ns += self._send(h, h.slot.write_mv)
                h.slot = None
        return n, ns

    def _commit(self, h: _Pending) -> int:
        if h.slot is not None and h.fill:  # the last, partial part of a move
            ns = self._send(h, h.slot.write_mv[:h.fill])
            h.slot = None
        else:
            ns = 0
        t = perf_counter_ns()
        if h.upload is not None:
            h.upload.complete()  # on a failure _abort still finds the upload to abort
            h.upload = None
        else:
            body = h.single if h.single is not None else b""
            self._call(f"s3 write of {h.path}", lambda: self.obstore.put(self._s3, h.path, body, use_multipart=False))
        h.single = None
        ns += perf_counter_ns() - t
        self._record(self._paths, h.key, h.path, h.nbytes)
        self._writing_ends(h)
        return ns

    def _abort(self, h: _Pending) -> int:
        """Drop the entry being written (its upload aborted, its object deleted); returns the bytes handed
        to `_send` that never crossed the wire (an unsent single part, parts cancelled before they started)."""
        unsent = len(h.single) if h.single is not None else 0
        upload, h.upload, h.single, h.slot = h.upload, None, None, None
        if upload is not None:
            unsent += upload.abort()
        self._unbook(self._paths, h.key, h.path)
        if self._writing_ends(h, dropped=True):  # close() has begun: it deletes the object (settle_writes)
            return unsent
        try:  # within the run's deadline: a frozen server cannot hold the abort either
            self._delete_or_later(h.path, h)
        except (Exception, IOAborted):  # refused at a stop signal, or the server is gone: close() tries again
            pass
        return unsent

    def _delete_or_later(self, path: str, h: Any) -> None:
        """Delete the object at `path` (the removal `h`, counted in flight); refused at a stop signal or with
        the server gone (raised), it is close()'s to delete (_remove_later)."""
        done = False
        try:
            self._call(f"s3 delete of {path}", lambda: self.obstore.delete(self._s3, path))
            done = True
        finally:
            if done:
                self._writing_ends(h)
            else:
                self._remove_later(path, h)

    def write(self, key: str, nbytes: int, bufs: WorkerBuffers, stop: threading.Event | None = None) -> IOResult:
        """Stamp the entry part by part into this thread's ring and send each part as it is stamped
        (`concurrency` in flight); a part the server throttles is sent again alone after a backoff."""
        t0 = perf_counter_ns()
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        kid, total, ring = key_id(key), padded(nbytes), self._ring()
        h, dev_ns = self._begin_write(key, nbytes)
        off = 0
        try:
            while off < total:
                if stop is not None and stop.is_set():
                    raise IOAborted(f"write of {key!r} aborted after {off} bytes", off)
                self._open_or_abort(key, off)
                n = min(ring.slot_bytes, total - off)
                slot = ring.next()
                slot.stamp(kid, off // BLOCK, n // BLOCK)
                dev_ns += self._send(h, slot.write_mv[:n])
                off += n
            dev_ns += self._commit(h)
        except IOAborted as e:  # only what was sent counts: the network carried that, not the stamped rest
            e.device_bytes, e.device_ns = off - self._abort(h), dev_ns
            raise
        except BaseException:
            self._abort(h)
            raise
        t1 = perf_counter_ns()
        return IOResult(nbytes, total, t1 - t0, dev_ns, t1 - t0 - dev_ns)

    def _begin_read(self, key: str) -> tuple[Any, int, int]:
        with self._lock:
            nbytes = self._sizes[key]
            path = self._paths[key]
        return path, nbytes, 0

    def _get(self, h: Any, offset: int, view: memoryview) -> tuple[int, int]:
        """Object bytes [offset, offset + len(view)) straight into `view` (s3_reads.py)."""
        return self._reads.get(h, offset, view)

    def _end_read(self, h: Any) -> int:
        return 0

    def read(self, key: str, bufs: WorkerBuffers, stop: threading.Event | None = None, verify: bool = False,
             on_chunk: ChunkSink | None = None) -> IOResult:
        """The entry as ranged GETs of part_bytes, `concurrency` in flight, their bodies received straight
        into bufs.read_buf a chunk at a time, each chunk verified there with --verify and handed on in
        order (s3_reads.py)."""
        path, nbytes, _ = self._begin_read(key)
        return self._reads.read(key, path, nbytes, padded(nbytes), bufs, key_id(key) if verify else 0, verify,
                                on_chunk, stop)

    # ------------------------------------------------------------------ public
    def delete(self, key: str) -> None:
        with self._lock:  # off the books and counted in flight at once: close() waits for it or has it
            path = self._paths.pop(key, None)
            self._sizes.pop(key, None)
            h = self._removing(path) if path is not None else None
        if path is not None:  # raises where refused (an eviction's after a Ctrl-C): close() deletes it then
            try:
                self._delete_or_later(path, h)
            except KeyError:
                pass

    def close(self) -> None:
        """Delete the objects this run created, then its marker; never anything else. Idempotent."""
        taken = self._take_books(self._paths)
        if taken is None:
            return
        # the writes in flight abort at their next part: their objects are deleted with the books'
        pending, running = self.settle_writes()
        paths = list(dict.fromkeys([*taken.values(), *pending]))
        left, uploads, why = len(paths), 0, ""
        try:  # a throttled delete is retried after backoffs (it used to leave the run's objects, marker too)
            if self.deadline.dead:
                raise OSError(errno.ETIMEDOUT, "the server had stopped answering")
            for i in range(0, len(paths), 1000):
                batch = paths[i:i + 1000]
                self._call("s3 delete of the run's objects", lambda b=batch: self.obstore.delete(self._s3, b))
                left -= len(batch)
            # the multipart uploads this run started and did not finish (a write abandoned on a fault, a part
            # thread left on a frozen server): aborted, or S3 keeps (and bills) their parts
            uploads = self._call("s3 abort of the run's multipart uploads",
                                 lambda: abort_uploads(self.bucket, self.endpoint, self.run_prefix)) or 0
            if running:  # they may still put objects after the deletion: the marker stays for the next run's sweep
                raise OSError(errno.EBUSY, f"{running} write(s) still in flight after {SETTLE_S:.1f} s")
            self._call("s3 delete of the marker", lambda: self.obstore.delete(self._s3, self.run_prefix + MARKER))
        except Exception as exc:  # the server is gone: the next run's sweep removes what is left
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            what = "any object those writes put" if running and not left else f"{left} object(s) of this run"
            self.leftovers = (f"{self.name}: left {what}, its marker and any multipart upload "
                              f"under s3://{self.bucket}/{self.run_prefix} ({why}): the next run on this bucket removes "
                              f"them, or now: {self.removal_command()}")
            log.warning("%s", self.leftovers)
        if uploads:
            log.info("s3: aborted %d multipart upload(s) the run had left unfinished", uploads)
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._parts.close()
        self._reads.conns.close()
        for ring in self._rings:
            ring.close()
        forget_at_exit(self)

    def removal_command(self) -> str:
        """The shell commands that remove what this run left in the bucket (objects, unfinished uploads)."""
        ep = f" --endpoint-url {self.shown_endpoint}" if self.endpoint else ""
        return (f"aws s3 rm --recursive s3://{self.bucket}/{self.run_prefix}{ep}; aws s3api list-multipart-uploads "
                f"--bucket {self.bucket} --prefix {self.run_prefix}{ep} (then abort-multipart-upload each)")

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, prefix={self.run_prefix!r}, endpoint={self.shown_endpoint!r})"
