"""kv-cache's S3 tier (obstore PUTs, botocore part calls, zero-copy ranged reads) against boto3 (part calls, s3transfer, the
CRT) on the same S3 server and workload: GiB/s and client CPU-seconds per GiB (this process's user +
system time; the server runs in its own process), next to the loopback interface's bytes.

Each client writes `--entries` objects of `--entry-mib` MiB from one page-aligned buffer, as multipart
uploads of `--part-mib` parts with `--concurrency` in flight, then reads each back as parallel ranged GETs
into one preallocated buffer. Variants:

* boto3-parts: the low-level calls kv-cache's S3 tier makes (create_multipart_upload / upload_part with a
  memoryview body / complete; get_object with a Range, read into the buffer), in a thread pool;
* boto3-s3transfer: the managed transfer (upload_fileobj / download_fileobj, TransferConfig);
* boto3-crt: s3transfer's CRT transfer manager (needs awscrt), upload / download of file objects over the
  same buffers (see boto_crt for why not through TransferConfig);
* kv-cache: kv-cache's own S3 tier (kv_cache.storage.s3.S3Store) driven through its write and read calls,
  exactly as a run makes them: writes from the stamped slots, an entry of one part as one obstore PUT, a
  larger one through botocore's part calls (`--part-mib` parts, `--concurrency` in flight,
  kv_cache/storage/s3_multipart.py); reads as presigned ranged GETs received straight into
  the worker's read buffer (kv_cache/storage/s3_reads.py);
* kv-cache-get_range: the same store, read the way the tier read before (obstore.get_range per part, each
  body in obstore's own buffer, copied into the read buffer): the zero-copy reads' baseline;
* boto3-parts-mv: the same part calls with the buffer's memoryview as each part's body (no copy), as
  kv-cache's S3 tier writes a multipart entry (storage/s3_multipart.py); reads as obstore's get_ranges;
* boto3-put-mv: one put_object per entry with the memoryview as its body (an entry of one part);
* obstore-writer: obstore.open_writer, written part by part (the S3 tier's writes before the part calls);
* obstore: obstore.put (its own multipart, chunk_size, max_concurrency) and obstore.get_ranges, copied
  into the buffer.

Every row prints GiB/s and this process's CPU-seconds per GiB per direction, and the bytes the loopback
interface (/proc/net/dev, kv_cache/host/netdev.py) carried in that phase next to the data's.

Without --endpoint it starts moto's standalone server (tests/servers.py) on 127.0.0.1: a functional
server, in Python, so its figures say more about the client's CPU cost than about any real store.

    PYTHONPATH=$PWD python3 benchmarks/s3_clients.py --entries 8 --entry-mib 64 --part-mib 8 --concurrency 4
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

from kv_cache.host.netdev import NetCounter  # noqa: E402

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


def _sink(rmv):
    """A file object that writes into the preallocated read buffer at the offsets it is seeked to (the
    managed transfers download into a file object)."""
    class Sink(io.RawIOBase):
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

    return Sink


def boto_transfer(endpoint, bucket, buf, rbuf, a, client: str = "classic"):
    from boto3.s3.transfer import TransferConfig

    c = _boto_client(endpoint, a.concurrency)
    cfg = TransferConfig(multipart_threshold=a.part_mib * MIB, multipart_chunksize=a.part_mib * MIB,
                         max_concurrency=a.concurrency, preferred_transfer_client=client)
    mv, rmv = memoryview(buf), memoryview(rbuf)

    sink = _sink(rmv)

    def put(key):
        c.upload_fileobj(io.BytesIO(mv), bucket, key, Config=cfg)

    def get(key):
        c.download_fileobj(bucket, key, sink(), Config=cfg)

    return put, get, lambda: None


def _tier(endpoint, bucket, a):
    from kv_cache.storage import WorkerBuffers
    from kv_cache.storage.s3 import S3Store

    store = S3Store(bucket, endpoint, "bench", part_bytes=a.part_mib * MIB, concurrency=a.concurrency, workers=1,
                    chunk_bytes=a.chunk_mib * MIB)
    return store, WorkerBuffers(a.chunk_mib * MIB, 0, 0)


def tier_client(endpoint, bucket, buf, rbuf, a, *, get_range: bool = False):
    """kv-cache's S3 tier itself: S3Store.write / S3Store.read, the calls a run makes (or, `get_range`,
    the reads as they were before: see _get_range_read)."""
    store, bufs = _tier(endpoint, bucket, a)
    size = a.entry_mib * MIB
    pool = ThreadPoolExecutor(a.concurrency)

    def put(key):
        store.write(key, size, bufs)

    def get(key):
        store.read(key, bufs, verify=a.verify)

    def close():
        pool.shutdown()
        store.close()
        bufs.close()

    return put, (_get_range_read(store, bufs, pool, a) if get_range else get), close


def _get_range_read(store, bufs, pool, a):
    """The tier's read before the zero-copy reads: obstore.get_range per part, `--concurrency` in flight,
    each body (in obstore's own buffer) copied chunk by chunk into the read buffer (remote.deliver)."""
    from kv_cache.storage.base import key_id, padded
    from kv_cache.storage.remote import deliver

    part = store.part_bytes

    def get(key):
        path, nbytes, _ = store._begin_read(key)
        total, kid = padded(nbytes), key_id(key)
        starts = list(range(0, total, part))

        def fetch(start):
            return store._call("read", lambda: store.obstore.get_range(store._s3, path, start=start,
                                                                        length=min(part, total - start)))

        futures = [pool.submit(fetch, o) for o in starts[: a.concurrency]]
        c = 0
        for i, start in enumerate(starts):
            data = futures[i].result()
            futures[i] = None
            if len(futures) < len(starts):
                futures.append(pool.submit(fetch, starts[len(futures)]))
            c = deliver(memoryview(data), start, nbytes, bufs, kid, a.verify, None, c, store.name, key)
            del data

    return get


def tier_get_range(endpoint, bucket, buf, rbuf, a):
    return tier_client(endpoint, bucket, buf, rbuf, a, get_range=True)


def boto_crt(endpoint, bucket, buf, rbuf, a):
    """s3transfer's CRT transfer manager (awscrt) with boto3's session credentials. Built here and not
    through TransferConfig(preferred_transfer_client="crt"): boto3 1.x makes its CRT client with
    endpoint_url None and TLS on (boto3/crt.py), so against any endpoint but AWS's it resolves
    <bucket>.s3.<region>.amazonaws.com and fails (here, offline: AWS_IO_DNS_INVALID_NAME; boto/boto3#4839)."""
    import botocore.session
    from botocore.config import Config
    from s3transfer.crt import (
        BotocoreCRTCredentialsWrapper,
        BotocoreCRTRequestSerializer,
        CRTTransferManager,
        create_s3_crt_client,
    )

    sess = botocore.session.Session()
    creds = BotocoreCRTCredentialsWrapper(sess.get_credentials()).to_crt_credentials_provider()
    crt = create_s3_crt_client("us-east-1", crt_credentials_provider=creds, use_ssl=endpoint.startswith("https"),
                               part_size=a.part_mib * MIB)
    tm = CRTTransferManager(crt, BotocoreCRTRequestSerializer(sess, {
        "region_name": "us-east-1", "endpoint_url": endpoint, "config": Config(s3={"addressing_style": "path"})}))
    mv = memoryview(buf)
    sink = _sink(memoryview(rbuf))

    def put(key):
        tm.upload(io.BytesIO(mv), bucket, key).result()

    def get(key):
        tm.download(bucket, key, sink()).result()

    return put, get, tm.shutdown


VARIANTS = {"kv-cache": tier_client, "kv-cache-get_range": tier_get_range, "boto3-parts": boto_parts,
            "boto3-parts-mv": boto_parts_mv, "boto3-put-mv": boto_put_mv, "obstore-writer": obstore_writer,
            "obstore": obstore_client, "boto3-s3transfer": boto_transfer, "boto3-crt": boto_crt}


def run(variant, endpoint, bucket, a):
    size = a.entry_mib * MIB
    buf = mmap.mmap(-1, size)
    buf.write(os.urandom(size))
    rbuf = mmap.mmap(-1, size)
    put, get, close = VARIANTS[variant](endpoint, bucket, buf, rbuf, a)
    keys = [f"{variant}/e{i}" for i in range(a.entries)]
    put(f"{variant}/warm")
    get(f"{variant}/warm")
    out = {}
    lo = NetCounter("lo")
    for op, fn in (("write", put), ("read", get)):
        n0, c0, t0 = lo.snapshot(), _cpu(), time.perf_counter()
        for k in keys:
            fn(k)
        wall, cpu, n1 = time.perf_counter() - t0, _cpu() - c0, lo.snapshot()
        gib = a.entries * size / GIB
        out[op] = (gib / wall, cpu / gib, (n1[0] - n0[0]) / GIB if n0 and n1 else float("nan"), gib)
    if not variant.startswith("kv-cache") and rbuf[: 1 << 16] != buf[: 1 << 16]:
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
    p.add_argument("--chunk-mib", type=int, default=16, help="the kv-cache rows' read buffer (--io-chunk-mb)")
    p.add_argument("--verify", action="store_true", help="the kv-cache rows check every block's stamp")
    p.add_argument("--repeat", type=int, default=1, help="run the variants this many times, in turn")
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    srv = None if a.endpoint else start_moto()
    endpoint = a.endpoint or srv.url
    try:
        _boto_client(endpoint, 1).create_bucket(Bucket="kv-bench")
        print(f"{a.entries} x {a.entry_mib} MiB, parts {a.part_mib} MiB, {a.concurrency} in flight, {endpoint}")
        print(f"{'':18s}   per direction: GiB/s, CPU-s/GiB, loopback GiB / data GiB")
        for _ in range(a.repeat):
            for v in a.variants.split(","):
                try:
                    r = run(v, endpoint, "kv-bench", a)
                except Exception as exc:  # a client that cannot run here
                    print(f"{v:18s} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                    continue
                w, rd = r["write"], r["read"]
                print(f"{v:18s} write {w[0]:6.3f} GiB/s {w[1]:5.2f} CPU-s/GiB lo {w[2]:6.3f}/{w[3]:.3f} | "
                      f"read {rd[0]:6.3f} GiB/s {rd[1]:5.2f} CPU-s/GiB lo {rd[2]:6.3f}/{rd[3]:.3f}", flush=True)
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
