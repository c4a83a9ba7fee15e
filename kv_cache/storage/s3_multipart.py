"""The S3 tier's multipart writes as botocore part calls (create_multipart_upload, upload_part,
complete_multipart_upload), so that a part the server throttles (503 SlowDown, 429) is sent again alone,
after a backoff, counted (RemoteStats.backoff): obstore's writer has no per-part call, and its own
retries, which would resend a part, cannot be counted, so a throttled part used to cost the whole entry.

Each part's body is the memoryview of the worker's stamped slot itself: botocore signs it (SigV4's
SHA-256, as obstore does) and urllib3 hands the buffer to ``socket.sendall``, so nothing is copied; the
slot stays untouched until its part is acknowledged, retries included. botocore's parameter validator
only knows bytes and files, so it is off (this module builds every call's parameters itself), and its
default CRC32 of every body is off too (``request_checksum_calculation="when_required"``: S3 asks for
none on these calls). botocore's own retries are off (one attempt) so that every failure surfaces here:
throttling is retried with backoff, a lost connection sent again after backoffs within the failover
budget (counted; then EHOSTDOWN), refused credentials an EACCES (the run stops). A failed upload is aborted, so it leaves no incomplete
upload behind (and a killed run's are aborted by the next run's sweep).
"""

from __future__ import annotations

import errno
from collections import deque
from concurrent.futures import Future
from time import perf_counter_ns
from typing import Any

from kv_cache.errors import StorageSetupError
from kv_cache.storage.remote import DaemonPool, RemoteStats, RunDeadline, Throttled, lost_connection
from kv_cache.storage.s3_client import region

_THROTTLE_CODES = ("SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded")


def part_client(endpoint: str | None, pool: int) -> Any:
    """A botocore S3 client for the part calls: one attempt per call, no validator, no extra checksum,
    path-style addressing towards an explicit endpoint (MinIO, Ceph RGW, moto), boto3's credential chain."""
    try:
        import boto3  # noqa: PLC0415  (optional dependency: the s3 extra)
        from botocore.config import Config  # noqa: PLC0415
    except ImportError:
        raise StorageSetupError("--storage-backend s3 needs boto3 for multipart writes: pip install 'kv-cache[s3]'"
                                ).about("storage_backend") from None
    _python_signer()
    cfg = Config(max_pool_connections=max(1, pool), parameter_validation=False, connect_timeout=5, read_timeout=120,
                 request_checksum_calculation="when_required", response_checksum_validation="when_required",
                 retries={"total_max_attempts": 1}, s3={"addressing_style": "path"} if endpoint else {})
    client = boto3.Session().client("s3", endpoint_url=endpoint, region_name=region(), config=cfg)
    client.meta.events.register_first("choose-signer.s3.UploadPart", _choose_python_signer)
    return client


_SIGNER = "kv-cache-s3v4"


def _python_signer() -> None:
    """botocore's own SigV4 signer for S3 under a name of ours. With awscrt installed botocore signs with
    the CRT, which first copies the body into a BytesIO and hashes it through Python reads of 4 KiB (2 CPU-s
    per GiB on the moto benchmark); botocore's signer hashes the slot's memoryview in place (hashlib)."""
    from botocore import auth  # noqa: PLC0415

    auth.AUTH_TYPE_MAPS.setdefault(_SIGNER, auth.S3SigV4Auth)


def _choose_python_signer(signature_version: Any = None, **_: Any) -> Any:
    """The choose-signer hook of upload_part: botocore's Python SigV4 for what would be the CRT's."""
    return _SIGNER if signature_version in ("s3v4", "v4") else None


def classify_boto(stats: RemoteStats, bucket: str, what: str, exc: Exception) -> BaseException:
    """A botocore error as what the run does with it (as s3_client.classify does obstore's)."""
    from botocore import exceptions as bx  # noqa: PLC0415

    if isinstance(exc, bx.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(exc.response.get("Error", {}).get("Code", ""))
        first = f"HTTP {status} {code}".strip()
        if status in (429, 503) or code in _THROTTLE_CODES:
            return Throttled(first)
        if status in (401, 403):
            return OSError(errno.EACCES, f"{what}: the server refused the credentials ({first})")
        if code == "NoSuchBucket":
            return FileNotFoundError(errno.ENOENT, f"{what}: bucket {bucket!r} not found")
        return OSError(errno.EIO, f"{what}: {first}")
    if isinstance(exc, bx.NoCredentialsError):
        return OSError(errno.EACCES, f"{what}: no credentials found ({exc})")
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):
        stats.lost()
        return lost_connection(what, exc)
    return OSError(errno.EIO, f"{what}: {type(exc).__name__}: {exc}")


class PartWriter:
    """The store's part calls: one botocore client and one thread pool for the parts in flight (and the
    control calls, so that a worker waits on each within the run's deadline, RunDeadline.result)."""

    def __init__(self, bucket: str, endpoint: str | None, stats: RemoteStats, concurrency: int, threads: int,
                 deadline: RunDeadline | None = None):
        self.bucket, self.stats, self.concurrency = bucket, stats, max(1, concurrency)
        self.deadline = deadline or RunDeadline()
        self.client = part_client(endpoint, threads)
        from botocore import __version__  # noqa: PLC0415  (importable: part_client checked)

        self.version = __version__
        self.pool = DaemonPool(max(1, threads), thread_name_prefix="kv-s3-part")  # (never holds the exit)

    def _once(self, what: str, fn, args: tuple, kwargs: dict) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise classify_boto(self.stats, self.bucket, what, exc) from exc

    def setup_call(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        """A call made while the store opens, in this thread: throttling retried, no failover (a server
        that cannot be reached then is a setup error)."""
        return self.stats.backoff(lambda: self._once(what, fn, args, kwargs), what)

    def attempts(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in this thread, throttling retried after backoffs, a lost connection sent
        again within the failover budget (both counted), other errors classified."""
        first = self.deadline.begin()
        try:
            return self.stats.failover(lambda: self.stats.backoff(lambda: self._once(what, fn, args, kwargs), what),
                                       what, self.deadline)
        finally:
            if first:
                self.deadline.end()

    def call(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        """`attempts` on the pool, waited for within the run's deadline (a frozen server cannot hold the
        calling worker past it)."""
        try:
            future = self.pool.submit(self.attempts, what, fn, *args, **kwargs)
        except RuntimeError:  # the interpreter is exiting (close at exit): in this thread
            return self.attempts(what, fn, *args, **kwargs)
        return self.deadline.result(future, what, self.stats)

    def begin(self, path: str) -> Upload:
        """A new multipart upload of the object `path`."""
        up = self.call(f"s3 start of the multipart write of {path}", self.client.create_multipart_upload,
                       Bucket=self.bucket, Key=path)
        return Upload(self, path, up["UploadId"])

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Upload:
    """One entry's multipart upload: parts sent in order, at most `concurrency` in flight, each retried
    alone when throttled. A part's buffer must stay unchanged until `send` has returned for the part
    `concurrency` after it (or `complete`/`abort` has returned)."""

    def __init__(self, owner: PartWriter, path: str, upload_id: str):
        self.owner, self.path, self.upload_id = owner, path, upload_id
        self.flying: deque[tuple[Future, int]] = deque()  # (the part's future, its bytes)
        self.etags: list[str] = []
        self.sent = 0

    def _part(self, number: int, body: memoryview) -> str:
        o = self.owner
        return o.attempts(f"s3 write of part {number} of {self.path}", o.client.upload_part, Bucket=o.bucket,
                      Key=self.path, UploadId=self.upload_id, PartNumber=number, Body=body)["ETag"]

    def _settle_oldest(self) -> None:
        self.etags.append(self.owner.deadline.result(self.flying.popleft()[0], f"s3 write of a part of {self.path}",
                                                     self.owner.stats))

    def send(self, body: memoryview) -> int:
        """Start the next part (`body`, the slot's view) once fewer than `concurrency` are in flight;
        returns the nanoseconds waited for the server."""
        t = perf_counter_ns()
        while len(self.flying) >= self.owner.concurrency:
            self._settle_oldest()
        ns = perf_counter_ns() - t
        self.sent += 1
        self.flying.append((self.owner.pool.submit(self._part, self.sent, body), len(body)))
        return ns

    def complete(self) -> int:
        """Wait for the parts in flight and complete the upload (the object appears); nanoseconds taken."""
        t = perf_counter_ns()
        while self.flying:
            self._settle_oldest()
        o = self.owner
        parts = [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(self.etags)]
        o.call(f"s3 completion of the multipart write of {self.path}", o.client.complete_multipart_upload,
               Bucket=o.bucket, Key=self.path, UploadId=self.upload_id, MultipartUpload={"Parts": parts})
        return perf_counter_ns() - t

    def abort(self) -> int:
        """Cancel the parts not started, wait for those under way, abort the upload (its parts freed on the
        server; throttling retried); returns the bytes of the parts cancelled before they were sent (they
        never crossed the wire). Never raises: what cannot be aborted now the next run's sweep aborts."""
        unsent = sum(n for f, n in self.flying if f.cancel())
        for f, _ in self.flying:
            if f.cancelled():
                continue
            try:
                self.owner.deadline.result(f, f"s3 write of a part of {self.path}")
            except BaseException:  # noqa: BLE001  (the failure being handled is the caller's)
                if self.owner.deadline.state() is not None:  # abandoned: the parts still under way are left
                    break
        self.flying.clear()
        o = self.owner
        try:
            o.call(f"s3 abort of the multipart write of {self.path}", o.client.abort_multipart_upload,
                   Bucket=o.bucket, Key=self.path, UploadId=self.upload_id)
        except Exception:  # noqa: BLE001
            pass
        return unsent
