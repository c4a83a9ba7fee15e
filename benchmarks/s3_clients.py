"""boto3 (+ s3transfer) against obstore on the same S3 server and workload: GiB/s and client
CPU-seconds per GiB (this process's user + system time; the server runs in its own process).

Each client writes `--entries` objects of `--entry-mib` MiB from one page-aligned buffer, as multipart
uploads of `--part-mib` parts with `--concurrency` in flight, then reads each back as parallel ranged GETs
into one preallocated buffer. Variants:

* boto3-parts: the low-level calls kv-cache's S3 tier makes (create_multipart_upload / upload_part with a
  memoryview body / complete; get_object with a Range, read into the buffer), in a thread pool;
* boto3-s3transfer: the managed transfer (upload_fileobj / download_fileobj, TransferConfig);
* boto3-crt: the same with preferred_transfer_client="crt" (needs awscrt; boto3 uses the CRT only where
  it supports the call, otherwise the classic transfer, so compare its figures with boto3-s3transfer's);
* boto3-parts-mv: the same part calls with the buffer's memoryview as each part's body (no copy), as
  kv-cache's S3 tier writes a multipart entry (storage/s3_multipart.py); reads as obstore's;
* boto3-put-mv: one put_object per entry with the memoryview as its body (an entry of one part);
* obstore-writer: obstore.open_writer, written part by part (the S3 tier's writes before the part calls);
* obstore: obstore.put (its own multipart, chunk_size, max_concurrency) and obstore.get_ranges, copied
  into the buffer.

Without --endpoint it starts moto's standalone server (tests/servers.py) on 127.0.0.1: a functional
server, in Python, so its figures say more about the client's CPU cost than about any real store.

    PYTHONPATH=$PWD python3 benchmarks/s3_clients.py --entries 8 --entry-mib 64
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from servers import start_moto  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _boto_client(endpoint: str, pool: int):
    import boto3
    from botocore.config import Config

    cfg = Config(max_pool_connections=pool, request_checksum_calculation="when_required", s3={"addressing_style": "path"},
                 response_checksum_validation="when_required", retries={"max_attempts": 3, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg)


def boto_parts(endpoint, bucket, buf, rbuf, a):
    c = _boto_client(endpoint, a.concurrency)
    part = a.part_mib * MIB
    size = a.entry_mib * MIB
    mv, rmv = memoryview(buf), memoryview(rbuf)
    pool = ThreadPoolExecutor(a.concurrency)

    def put(key):
        up = c.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        fut = [pool.submit(c.upload_part, Bucket=bucket, Key=key, UploadId=up, PartNumber=i + 1,
                           Body=io.BytesIO(mv[o:o + part])) for i, o in enumerate(range(0, size, part))]
        parts = [{"PartNumber": i + 1, "ETag": f.result()["ETag"]} for i, f in enumerate(fut)]
        c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts})

    def get_part(key, o):
        body = c.get_object(Bucket=bucket, Key=key, Range=f"bytes={o}-{o + part - 1}")["Body"]
        view, got = rmv[o:o + part], 0
        while got < part:
            n = body._raw_stream.readinto(view[got:])
            if not n:
                raise OSError("short body")
            got += n

    def get(key):
        for f in [pool.submit(get_part, key, o) for o in range(0, size, part)]:
            f.result()

    return put, get, pool.shutdown


def boto_parts_mv(endpoint, bucket, buf, rbuf, a):
    """The part calls kv-cache's S3 tier makes for a multipart entry (storage/s3_multipart.py): each
    upload_part's body the memoryview of the slot itself (parameter validation off: botocore's validator
    knows only bytes and files, the HTTP layer sends any buffer), no checksum beyond SigV4's."""
    from kv_cache.storage.s3_multipart import part_client

    c = part_client(endpoint, a.concurrency)
    part = a.part_mib * MIB
    size = a.entry_mib * MIB
    mv = memoryview(buf)
    pool = ThreadPoolExecutor(a.concurrency)

    def put(key):
        up = c.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        fut = [pool.submit(c.upload_part, Bucket=bucket, Key=key, UploadId=up, PartNumber=i + 1,
                           Body=mv[o:o + part]) for i, o in enumerate(range(0, size, part))]
        parts = [{"PartNumber": i + 1, "ETag": f.result()["ETag"]} for i, f in enumerate(fut)]
        c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts})

    _, get, _ = obstore_client(endpoint, bucket, buf, rbuf, a)
    return put, get, pool.shutdown


def boto_put_mv(endpoint, bucket, buf, rbuf, a):
    """One put_object per entry, the buffer's memoryview as the body (botocore's Python signer): what an
    entry of one part would cost through botocore instead of obstore's put (compare with --entry-mib at
    most --part-mib); reads as obstore's."""
    from kv_cache.storage.s3_multipart import _choose_python_signer, part_client

    c = part_client(endpoint, a.concurrency)
    c.meta.events.register_first("choose-signer.s3.PutObject", _choose_python_signer)
    mv = memoryview(buf)

    def put(key):
        c.put_object(Bucket=bucket, Key=key, Body=mv)

    _, get, _ = obstore_client(endpoint, bucket, buf, rbuf, a)
    return put, get, lambda: None


def obstore_writer(endpoint, bucket, buf, rbuf, a):
    """obstore's open_writer (what the S3 tier used before the part calls): the entry written part by part."""
    import obstore

    s = _obstore(endpoint, bucket)
    part = a.part_mib * MIB
    size = a.entry_mib * MIB
    mv = memoryview(buf)

    def put(key):
        w = obstore.open_writer(s, key, buffer_size=part, max_concurrency=a.concurrency)
        for o in range(0, size, part):
            w.write(mv[o:o + part])
        w.close()

    _, get, _ = obstore_client(endpoint, bucket, buf, rbuf, a)
    return put, get, lambda: None


def boto_transfer(endpoint, bucket, buf, rbuf, a, client: str = "classic"):
    from boto3.s3.transfer import TransferConfig

    c = _boto_client(endpoint, a.concurrency)
    cfg = TransferConfig(multipart_threshold=a.part_mib * MIB, multipart_chunksize=a.part_mib * MIB,
                         max_concurrency=a.concurrency, preferred_transfer_client=client)
    mv, rmv = memoryview(buf), memoryview(rbuf)

    class Sink(io.RawIOBase):  # download_fileobj seeks and writes into the preallocated buffer
        def __init__(self):
            self.pos = 0

        def writable(self):
            return True

        def seekable(self):
            return True

        def seek(self, off, whence=0):
            self.pos = off
            return off

        def write(self, b):
            n = len(b)
            rmv[self.pos:self.pos + n] = b
            self.pos += n
            return n

    def put(key):
        c.upload_fileobj(io.BytesIO(mv), bucket, key, Config=cfg)

    def get(key):
        c.download_fileobj(bucket, key, Sink(), Config=cfg)

    return put, get, lambda: None


def _obstore(endpoint, bucket):
    from obstore.store import S3Store

    return S3Store(bucket, endpoint=endpoint, region="us-east-1", client_options={"allow_http": True},
                   access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
                   secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))


def obstore_client(endpoint, bucket, buf, rbuf, a):
    import obstore

    s = _obstore(endpoint, bucket)
    part = a.part_mib * MIB
    size = a.entry_mib * MIB
    mv, rmv = memoryview(buf), memoryview(rbuf)

    def put(key):
        obstore.put(s, key, mv, chunk_size=part, max_concurrency=a.concurrency)

    def get(key):
        starts = list(range(0, size, part))
        for o, b in zip(starts, obstore.get_ranges(s, key, starts=starts, ends=[o + part for o in starts]), strict=True):
            rmv[o:o + part] = memoryview(b)

    return put, get, lambda: None


def boto_crt(endpoint, bucket, buf, rbuf, a):
    """s3transfer with the AWS CRT under it (pip install awscrt; boto3 falls back to classic without it)."""
    import awscrt  # noqa: F401  (a clear ImportError when the CRT is missing)

    return boto_transfer(endpoint, bucket, buf, rbuf, a, client="crt")


VARIANTS = {"boto3-parts": boto_parts, "boto3-parts-mv": boto_parts_mv, "boto3-put-mv": boto_put_mv,
            "obstore-writer": obstore_writer,
            "boto3-s3transfer": boto_transfer, "boto3-crt": boto_crt,
            "obstore": obstore_client}


def run(variant, endpoint, bucket, a):
    size = a.entry_mib * MIB
    buf = mmap.mmap(-1, size)
    buf.write(os.urandom(size))
    rbuf = mmap.mmap(-1, size)
    put, get, close = VARIANTS[variant](endpoint, bucket, buf, rbuf, a)
    keys = [f"{variant}/e{i}" for i in range(a.entries)]
    put(f"{variant}/warm")
    out = {}
    for op, fn in (("write", put), ("read", get)):
        c0, t0 = _cpu(), time.perf_counter()
        for k in keys:
            fn(k)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        gib = a.entries * size / GIB
        out[op] = (gib / wall, cpu / gib)
    if rbuf[: 1 << 16] != buf[: 1 << 16]:
        raise SystemExit(f"{variant}: read back differs")
    close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint")
    p.add_argument("--entries", type=int, default=8)
    p.add_argument("--entry-mib", type=int, default=64)
    p.add_argument("--part-mib", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    srv = None if a.endpoint else start_moto()
    endpoint = a.endpoint or srv.url
    try:
        _boto_client(endpoint, 1).create_bucket(Bucket="kv-bench")
        print(f"{a.entries} x {a.entry_mib} MiB, parts {a.part_mib} MiB, {a.concurrency} in flight, {endpoint}")
        for v in a.variants.split(","):
            try:
                r = run(v, endpoint, "kv-bench", a)
            except Exception as exc:  # a client that cannot run here (the CRT against a 127.0.0.1 endpoint)
                print(f"{v:18s} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            print(f"{v:18s} write {r['write'][0]:6.3f} GiB/s {r['write'][1]:6.2f} CPU-s/GiB | "
                  f"read {r['read'][0]:6.3f} GiB/s {r['read'][1]:6.2f} CPU-s/GiB", flush=True)
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
