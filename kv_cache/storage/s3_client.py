"""The S3 tier's client: obstore, the credential chain and region it is given, and what its errors mean
for the run (throttling, refused credentials, a missing bucket or object, a lost connection)."""

from __future__ import annotations

import errno
import logging
import os
import re
from typing import Any

from kv_cache.errors import StorageSetupError
from kv_cache.storage.remote import (
    RemoteStats,
    Throttled,
    lost_connection,
    tls_refused,
    tls_verification_failure,
)

_STATUS = re.compile(r"status code: (\d{3})")
_LOST_WORDS = ("HTTP error", "error sending request", "connect", "onnection", "reset", "Broken pipe", "timed out",
               "imeout", "IncompleteMessage", "error decoding response body", "error reading a body")


def import_obstore() -> tuple[Any, Any]:
    """obstore and its S3Store class, or the one-line refusal naming the extra to install."""
    try:
        import obstore  # noqa: PLC0415  (optional dependency: only the s3 backend needs it)
        from obstore.store import S3Store as _S3  # noqa: PLC0415
    except ImportError:
        raise StorageSetupError("--storage-backend s3 needs obstore: pip install 'kv-cache[s3]'").about(
            "storage_backend") from None
    return obstore, _S3


def credentials() -> Any:
    """boto3's credential chain (environment, ~/.aws/credentials and config, SSO, instance roles) when
    boto3 is installed; otherwise obstore reads the AWS_* environment itself."""
    try:
        import boto3  # noqa: PLC0415
        from obstore.auth.boto3 import Boto3CredentialProvider  # noqa: PLC0415
    except ImportError:
        return None
    # boto3 logs "Found credentials in ..." at INFO on every run, ahead of the report or of a one-line error
    logging.getLogger("botocore.credentials").setLevel(logging.WARNING)
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    return Boto3CredentialProvider(session)


def ca_bundle() -> str | None:
    """The CA bundle boto3 trusts for https endpoints (``AWS_CA_BUNDLE``, or ``ca_bundle`` in
    ~/.aws/config): the part calls get it from botocore itself; obstore (``root_certificate``) and the reads'
    http.client connections are given the same file, so a server behind a private CA (a self-hosted MinIO)
    is trusted by all three clients or by none."""
    path = os.environ.get("AWS_CA_BUNDLE") or None
    if path is None:
        try:
            import boto3  # noqa: PLC0415

            path = boto3.Session().get_config_variable("ca_bundle") or None
        except Exception:  # boto3 missing, or a config it cannot read
            path = None
    return path


def region() -> str:
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        import boto3  # noqa: PLC0415

        return boto3.Session().region_name or "us-east-1"
    except ImportError:
        return "us-east-1"



def classify(obstore: Any, bucket: str, stats: RemoteStats, what: str, exc: Exception) -> BaseException:
    """An obstore error as what the run does with it (see the module docstring), from the HTTP status
    it carries (or its absence: the request never got an answer)."""
    ex = getattr(obstore, "exceptions", None)
    text = str(exc).split("Debug source:", 1)[0].strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    m = _STATUS.search(text)
    status = int(m.group(1)) if m else None
    if status in (429, 503) or "SlowDown" in text:
        return Throttled(first)
    if status in (401, 403) or (ex is not None and isinstance(exc, (ex.PermissionDeniedError,
                                                                      ex.UnauthenticatedError))):
        return OSError(errno.EACCES, f"{what}: the server refused the credentials ({first})")
    if status == 404 and "NoSuchBucket" in text:
        return FileNotFoundError(errno.ENOENT, f"{what}: bucket {bucket!r} not found")
    if status == 404 or (ex is not None and isinstance(exc, ex.NotFoundError)):
        return KeyError(what)
    tls = tls_verification_failure(exc)
    if tls is not None:
        return tls_refused(what, tls)
    if status is None and any(w in text for w in _LOST_WORDS):
        stats.lost()
        return lost_connection(what, exc)
    return OSError(errno.EIO, f"{what}: {first}")


def abort_uploads(bucket: str, endpoint: str | None, prefix: str) -> int | None:
    """Abort the incomplete multipart uploads under `prefix` (a dead run's: a write it was making when it
    was killed), which no listing of objects shows and S3 keeps, and bills, until aborted. Returns how many
    were aborted; None when they cannot be listed (boto3 missing, or the server refuses the call): obstore
    has no call for them."""
    try:
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415
    except ImportError:
        return None
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name=region(),  # one attempt per call: a
                              config=Config(s3={"addressing_style": "path"} if endpoint else {},  # failure is
                                            retries={"total_max_attempts": 1}, connect_timeout=5))  # None
        aborted = 0
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            for up in page.get("Uploads") or []:
                client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
                aborted += 1
        return aborted
    except Exception:  # an S3-compatible server without the call, or no permission for it
        return None
