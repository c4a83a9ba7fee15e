"""The storage tier as objects in an S3 bucket (S3Store through obstore): MinIO, Ceph RGW, AWS..."""

from __future__ import annotations

from urllib.parse import urlparse

from kv_cache.settings.fields import Flag
from kv_cache.settings.run import REMOTE_GROUP, redacted
from kv_cache.storage.backends import BackendRequest, Option, register, remote_backend
from kv_cache.storage.remote import ring_bytes


def _open(request: BackendRequest):
    from kv_cache.storage.s3 import S3Store  # noqa: PLC0415  (obstore only when this backend is chosen)

    t = request.tiers.remote
    return S3Store(t.s3_bucket or "", t.s3_endpoint, t.s3_prefix, t.s3_part_mb << 20, t.s3_concurrency,
                   request.workers, request.storage.chunk_bytes,
                   grace_s=request.storage.remote_grace_s, failover_s=request.storage.remote_failover_s)


def _endpoint(url: str | None) -> str | None:
    parts = urlparse(url or "")
    if url and (parts.scheme not in ("http", "https") or not parts.hostname):
        return f"--s3-endpoint must be an http:// or https:// URL with a host, got {url!r}"
    return None


def _prefix(prefix: str) -> str | None:
    segments = (prefix or "").strip("/")
    if segments and any(seg in ("", ".", "..") for seg in segments.split("/")):
        return (f"--s3-prefix {prefix!r} has an empty, '.' or '..' path segment (S3 clients refuse such keys); "
                "give segments joined by single '/'")
    return None


def _flag(name: str, help: str, **kw) -> Flag:
    return Flag(name, type=kw.pop("type", str), group=REMOTE_GROUP, help=help, **kw)


BACKEND = register(remote_backend(
    "s3", "one S3 object per entry: multipart uploads, parallel ranged GETs", _open,
    (Option("s3_endpoint", "endpoint URL (none: AWS)", None, _flag(
        "--s3-endpoint", "S3 endpoint URL (MinIO, Ceph RGW...; none: AWS, from the region). Credentials: the usual "
        "AWS environment and config files.", metavar="URL"), _endpoint, owned=True),
     Option("s3_bucket", "the bucket (it must exist)", None, _flag(
         "--s3-bucket", "Bucket of the s3 storage tier (it must exist)."), owned=True),
     Option("s3_prefix", "key prefix of the run prefixes", "", _flag(
         "--s3-prefix", "Key prefix under which each run makes its own run prefix (with a marker object)."),
         _prefix, owned=True),
     Option("s3_part_mb", "MiB per part / ranged GET", 8, _flag(
         "--s3-part-mb", "MiB per multipart-upload part and per ranged GET (S3's minimum part is 5).", type=int),
         lambda v: f"--s3-part-mb must be >= 5 (S3's smallest multipart part), got {v}" if v < 5 else None),
     Option("s3_concurrency", "parts in flight per entry", 4, _flag(
         "--s3-concurrency", "Parts (uploads or ranged GETs) in flight per entry.", type=int),
         lambda v: f"--s3-concurrency must be >= 1, got {v}" if v < 1 else None)),
    capacity="unbounded", choice="an object store, --s3-*", order=1,
    needs=(("s3_bucket", "--storage-backend s3 needs --s3-bucket"),),
    probe_entries=True, title="S3 object requests to the server, over the network",
    location=lambda r: (f"s3://{r.s3_bucket}/{r.s3_prefix}", redacted(r.s3_endpoint or "") or None),
    ring=lambda r, chunk: ring_bytes("s3", chunk, part_bytes=r.s3_part_mb << 20, concurrency=r.s3_concurrency)))
