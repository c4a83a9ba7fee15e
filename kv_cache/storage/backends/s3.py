"""The storage tier as objects in an S3 bucket (S3Store through obstore): MinIO, Ceph RGW, AWS..."""

from __future__ import annotations

from kv_cache.storage.backends import BackendRequest, Option, register, remote_backend


def _open(request: BackendRequest):
    from kv_cache.storage.s3 import S3Store  # noqa: PLC0415  (obstore only when this backend is chosen)

    t = request.tiers.remote
    return S3Store(t.s3_bucket or "", t.s3_endpoint, t.s3_prefix, t.s3_part_mb << 20, t.s3_concurrency,
                   request.workers, request.storage.chunk_bytes,
                   grace_s=request.storage.remote_grace_s, failover_s=request.storage.remote_failover_s)


BACKEND = register(remote_backend(
    "s3", "one S3 object per entry: multipart uploads, parallel ranged GETs", _open,
    (Option("s3_endpoint", "endpoint URL (none: AWS)"), Option("s3_bucket", "the bucket (it must exist)"),
     Option("s3_prefix", "key prefix of the run prefixes"), Option("s3_part_mb", "MiB per part / ranged GET"),
     Option("s3_concurrency", "parts in flight per entry")),
    capacity="unbounded"))
