"""The remote storage tiers against real servers the tests start (tests/servers.py): moto's standalone
S3 server and a Debian redis-server, on 127.0.0.1 at free ports. Round trips with --verify, the run's own
namespace and the sweep of a dead run's, the faults (server down or credentials refused at start: exit 2;
connection lost mid-run: exit 3 with results; throttling retried and counted; maxmemory: the tier full) and
the loopback interface's bytes against the tier's. Skipped, with the reason, where a server is missing."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import servers

from kv_cache.storage import WorkerBuffers
from kv_cache.storage.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
MICRO = ("model_configs:\n  micro:\n    name: Micro test model\n    num_layers: 1\n    hidden_dim: 512\n"
         "    num_heads: 4\n    kv_heads: 1\n    dtype: float16\n")
MIB = 1 << 20
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}



def _need_s3() -> None:
    """Skip unless the S3 tier's client (obstore) and the tests' own (boto3) import: the Redis tests run
    without them."""
    pytest.importorskip("obstore", reason="the s3 tier needs obstore (pip install -e '.[dev]')")
    pytest.importorskip("boto3", reason="the S3 tests make buckets with boto3 (pip install -e '.[dev]')")


def _need_redis() -> None:
    """Skip unless redis-py imports: the S3 tests run without it."""
    pytest.importorskip("redis", reason="the redis tier needs redis-py (pip install -e '.[dev]')")


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")  # no config file of the machine's user
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


def _bucket(url: str, name: str) -> str:
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=name)
    return name


def _objects(url: str, bucket: str) -> list[str]:
    import boto3

    c = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing")
    return [o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.fixture(scope="module")
def moto():
    _need_s3()
    why = servers.missing(servers.MOTO)
    if why:
        pytest.skip(why)
    srv = servers.start_moto()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def redis_server():
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    srv = servers.start_redis()
    yield srv
    srv.stop()


def _bufs() -> WorkerBuffers:
    return WorkerBuffers(MIB, 7, 0)


def _round_trip(store, bufs) -> None:
    """Entries of none, part of one, one and many chunks (and many parts), written, read with --verify,
    moved out to RAM and back in, replaced by a smaller one."""
    for n in (0, 1000, MIB, 3 * MIB + 5, 12 * MIB + 4096):
        store.write(f"k{n}", n, bufs)
        assert store.read(f"k{n}", bufs, verify=True).nbytes == n
    ram = MemoryStore(64 * MIB)
    store.move_to(f"k{3 * MIB + 5}", ram, bufs)
    assert ram.read(f"k{3 * MIB + 5}", bufs, verify=True).nbytes == 3 * MIB + 5
    ram.write("up", 11 * MIB, bufs)
    ram.move_to("up", store, bufs)
    assert store.read("up", bufs, verify=True).nbytes == 11 * MIB
    store.write("k1000", 1000, bufs)  # replaced, smaller
    assert store.read("k1000", bufs, verify=True).nbytes == 1000
    ram.close()


@pytest.mark.parametrize("concurrency", [1, 3])
def test_s3_round_trip_with_verify_and_close_deletes_only_its_objects(moto, concurrency):
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, f"rt{concurrency}")
    import obstore
    from obstore.store import S3Store as Raw

    raw = Raw(bucket, endpoint=moto.url, region="us-east-1", client_options={"allow_http": True})
    obstore.put(raw, "runs/someone-elses.bin", b"x")  # a foreign object under the same prefix
    store = S3Store(bucket, moto.url, "runs", part_bytes=5 * MIB, concurrency=concurrency, workers=2,
                    chunk_bytes=MIB)
    bufs = _bufs()
    _round_trip(store, bufs)
    # an entry three times this worker's ring of slots: obstore holds each slot until its part is sent, so
    # the ring is reused inside the entry and --verify sees whether a slot was rewritten too early
    big = 3 * len(store._ring().slots) * MIB
    ring = store._ring()  # what the memory budget counts per worker is what the ring holds
    assert len(ring.slots) * ring.slot_bytes == store.ring_bytes == (concurrency + 2) * 5 * MIB
    store.write("ring", big, bufs)
    assert store.read("ring", bufs, verify=True).nbytes == big
    assert any(k.endswith("/.kv-cache-run") for k in _objects(moto.url, bucket))  # the run's marker
    store.close()
    assert _objects(moto.url, bucket) == ["runs/someone-elses.bin"]
    bufs.close()


def test_redis_round_trip_with_verify_and_close_deletes_only_its_keys(redis_server):
    import redis

    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    r.set("someone-elses", b"x")
    store = RedisStore(redis_server.url, MIB, pipeline=3, workers=2)
    assert store.hiredis == bool(__import__("redis").utils.HIREDIS_AVAILABLE)
    bufs = _bufs()
    _round_trip(store, bufs)
    assert store.ring_bytes == 0 and getattr(store._tls, "ring", None) is None  # sent from the worker's buffer
    assert r.dbsize() > 1
    store.close()
    assert r.keys("*") == [b"someone-elses"]
    r.delete("someone-elses")
    bufs.close()


def test_shaped_remote_tiers_keep_their_own_paths_and_round_trip(moto, redis_server):
    # --tier-bandwidth on an S3 / Redis tier: its own parallel / pipelined read and write run (paced per
    # entry), moves use the chunk primitives; every entry still round-trips with --verify
    from kv_cache.storage.kvstore import RedisStore
    from kv_cache.storage.s3 import S3Store
    from kv_cache.storage.shaped import ShapedStore, Shaping

    for inner in (S3Store(_bucket(moto.url, "shaped"), moto.url, "runs", part_bytes=5 * MIB, concurrency=3,
                          workers=2, chunk_bytes=MIB),
                  RedisStore(redis_server.url, MIB, pipeline=3, workers=2)):
        calls = []
        for op in ("read", "write"):
            own = getattr(inner, op)
            setattr(inner, op, lambda *a, _own=own, _op=op, _calls=calls, **k: _calls.append(_op) or _own(*a, **k))
        store = ShapedStore(inner, Shaping(bandwidth_gbps=1000.0, latency_ms=0.5))
        bufs = _bufs()
        _round_trip(store, bufs)
        assert "read" in calls and "write" in calls, type(inner).__name__
        assert store.read_bucket.bytes > 0 and store.write_bucket.bytes > 0
        store.close()
        bufs.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _marker(pid: int, host: str | None = None) -> bytes:
    import socket

    return json.dumps({"tool": "kv-cache", "pid": pid, "host": host or socket.gethostname()}).encode()


def test_s3_sweeps_a_dead_runs_prefix_and_keeps_another_hosts(moto):
    import obstore
    from obstore.store import S3Store as Raw

    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "sweep")
    raw = Raw(bucket, endpoint=moto.url, region="us-east-1", client_options={"allow_http": True})
    dead = f"p/kv-cache-run-20250101-000000-{_dead_pid()}-abcd"
    other = "p/kv-cache-run-20250101-000000-1-beef"
    for run, marker in ((dead, _marker(_dead_pid())), (other, _marker(1, "another-host"))):
        obstore.put(raw, f"{run}/.kv-cache-run", marker)
        obstore.put(raw, f"{run}/entry.kv", b"y" * 4096)
    store = S3Store(bucket, moto.url, "p/", part_bytes=5 * MIB, workers=1, chunk_bytes=MIB)
    assert len(store.swept) == 1 and dead in store.swept[0] and "is gone" in store.swept[0]
    store.close()
    assert sorted(_objects(moto.url, bucket)) == [f"{other}/.kv-cache-run", f"{other}/entry.kv"]


def test_redis_sweeps_a_dead_runs_keys(redis_server):
    import redis

    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    dead = f"kv-cache-run-20250101-000000-{_dead_pid()}-abcd"
    r.set(f"{dead}:.kv-cache-run", _marker(_dead_pid()))
    r.set(f"{dead}:e:0", b"z" * 4096)
    store = RedisStore(redis_server.url, MIB, workers=1)
    assert len(store.swept) == 1 and "1 key(s)" in store.swept[0]
    store.close()
    assert r.dbsize() == 0


def test_redis_maxmemory_refusal_is_the_tier_full():
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    from kv_cache.storage.kvstore import RedisStore

    srv = servers.start_redis(maxmemory="4mb")
    try:
        store = RedisStore(srv.url, MIB, workers=1)
        assert 0 < store.free_bytes() < 4 * MIB
        bufs = _bufs()
        with pytest.raises(OSError) as info:
            store.write("big", 16 * MIB, bufs)
        assert info.value.errno == errno.ENOSPC and "tier is full" in str(info.value)
        store.close()
        bufs.close()
    finally:
        srv.stop()


def test_s3_throttling_is_retried_with_backoff_and_counted(moto):
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "slow")
    proxy = servers.start_throttler(moto.port, every=9)
    try:
        store = S3Store(bucket, proxy.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        bufs = _bufs()
        for i in range(4):
            store.write(f"e{i}", 6 * MIB, bufs)
            store.read(f"e{i}", bufs, verify=True)
        stats = store.remote_stats()
        assert proxy.throttled > 0
        assert stats["throttled_requests"] >= 1 and stats["throttle_wait_s"] > 0
        store.close()
        bufs.close()
    finally:
        proxy.stop()


def _part_puts(proxy) -> list[tuple[str, bool]]:
    """The part uploads the proxy saw, as (upload id + part number, throttled)."""
    from urllib.parse import parse_qs, urlsplit

    out = []
    for method, path, slow in proxy.log:
        q = parse_qs(urlsplit(path).query)
        if method == "PUT" and "partNumber" in q:
            out.append((f"{q['uploadId'][0]}#{q['partNumber'][0]}", slow))
    return out


@pytest.mark.parametrize("status", [429, 503])
def test_s3_throttled_parts_are_sent_again_alone_and_the_write_completes(moto, status):
    """Every 5th request throttled (429, or 503 SlowDown): each throttled part is sent again alone after
    a backoff and counted, the multipart writes complete (no entry is started over), and the objects read
    back with --verify."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, f"parts{status}")
    proxy = servers.start_throttler(moto.port, every=5, status=status)
    try:
        store = S3Store(bucket, proxy.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        bufs = _bufs()
        sizes = [6 * MIB] * 6 + [16 * MIB + 4096, 3 * MIB]  # two parts each, four parts, one PUT
        for i, n in enumerate(sizes):
            store.write(f"e{i}", n, bufs)
            assert store.read(f"e{i}", bufs, verify=True).nbytes == n
        stats = store.remote_stats()
        parts = _part_puts(proxy)
        throttled_parts = [p for p, slow in parts if slow]
        sent = [p for p, slow in parts if not slow]
        starts = [path for method, path, slow in proxy.log if method == "POST" and path.endswith("?uploads") and not slow]
        assert throttled_parts and set(throttled_parts) <= set(sent)  # each throttled part went again, alone
        assert len(sent) == len(set(sent)) == 6 * 2 + 4  # every part crossed once, none resent with its entry
        assert len(starts) == 7  # one upload per multipart entry: none was started over
        assert stats["throttled_requests"] == proxy.throttled and stats["throttled_gave_up"] == 0
        assert stats["throttle_wait_s"] > 0
        store.close()
        bufs.close()
        assert _objects(moto.url, bucket) == []
    finally:
        proxy.stop()


def test_s3_parts_throttled_past_the_backoffs_fail_eagain_and_leave_no_upload(moto):
    """Every part upload throttled: the write fails with EAGAIN after the backoffs, and its multipart
    upload is aborted, so the bucket keeps no incomplete upload (nor an object) of it."""
    import boto3

    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "stuck")
    proxy = servers.start_throttler(moto.port, every=1, status=503, only="partNumber=")
    try:
        store = S3Store(bucket, proxy.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        bufs = _bufs()
        with pytest.raises(OSError) as info:
            store.write("e", 6 * MIB, bufs)
        assert info.value.errno == errno.EAGAIN and "still throttled after" in str(info.value)
        stats = store.remote_stats()
        assert stats["throttled_gave_up"] >= 1 and stats["throttled_requests"] == proxy.throttled
        c = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1", aws_access_key_id="testing",
                         aws_secret_access_key="testing")
        assert (c.list_multipart_uploads(Bucket=bucket).get("Uploads") or []) == []
        assert not any(k.endswith(".kv") for k in _objects(moto.url, bucket))
        store.close()
        bufs.close()
    finally:
        proxy.stop()


def test_s3_part_uploads_send_the_slot_itself_not_a_copy(moto):
    """Each part's body is the slot's memoryview, signed in place: botocore's CRT signer (taken when awscrt
    is installed) would copy it into a BytesIO first, so the part calls pick botocore's own SigV4."""
    import tracemalloc

    from kv_cache.storage.remote import RemoteStats
    from kv_cache.storage.s3_multipart import PartWriter

    bucket = _bucket(moto.url, "nocopy")
    parts = PartWriter(bucket, moto.url, RemoteStats(), concurrency=1, threads=1)
    slot = WorkerBuffers(5 * MIB, 7, 0)
    up = parts.begin("k")
    up.send(slot.write_mv)
    up._settle_oldest()  # the first call's setup (connections, signer) outside the measurement
    tracemalloc.start()
    try:
        for _ in range(3):
            up.send(slot.write_mv)
            up._settle_oldest()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    up.complete()
    assert peak < MIB, f"{peak} bytes allocated to send 5 MiB parts"
    parts.close()
    slot.close()


@pytest.mark.parametrize("fault", ["server-gone", "credentials-refused"])
def test_s3_multipart_write_faults_keep_their_meaning(fault):
    """The part calls' errors mean what obstore's do: a server gone is retried within the failover budget
    (counted), then EHOSTDOWN (the run stops); refused credentials an EACCES (the run stops)."""
    _need_s3()
    if servers.missing(servers.MOTO):
        pytest.skip(servers.missing(servers.MOTO))
    from kv_cache.storage.s3 import S3Store

    srv = servers.start_moto(auth_after=6 if fault == "credentials-refused" else None)
    try:
        # then the sweep's listing, the marker, its read-back and botocore's HEAD of it: 5 requests let through
        bucket = _bucket(srv.url, "faults")
        store = S3Store(bucket, srv.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB,
                        failover_s=0.3)
        if fault == "server-gone":
            srv.stop()
        bufs = _bufs()
        with pytest.raises(OSError) as info:
            store.write("e", 12 * MIB, bufs)
        want = errno.EHOSTDOWN if fault == "server-gone" else errno.EACCES
        assert info.value.errno == want and "part" in str(info.value), info.value  # a part call's error
        stats = store.remote_stats()
        if fault == "server-gone":  # sent again after backoffs until the budget was spent, each loss counted
            # (the parts in flight each give up: how many started before the first failed is the scheduler's)
            assert stats["outages"] == 1 and stats["failover_gave_up"] >= 1
            assert stats["lost_connections"] >= stats["failover_retries"] + 1 > 1
        else:
            assert stats["lost_connections"] == 0
        store.close()
        bufs.close()
    finally:
        srv.stop()


def test_cli_s3_run_through_sustained_throttling_completes_and_reports_it(moto, tmp_path):
    """A run through a proxy answering every 5th request 429 passes --verify, and its results report the
    throttled requests, none given up."""
    bucket = _bucket(moto.url, "slowrun")
    proxy = servers.start_throttler(moto.port, every=5, status=429)
    try:
        proc = _run(_cmd(tmp_path, "--storage-backend", "s3", "--s3-endpoint", proxy.url, "--s3-bucket", bucket,
                         "--s3-part-mb", "5", "--verify", "--storage-capacity-gb", "0.05"))
    finally:
        proxy.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    rt = res["measurement"]["remote_tier"]
    assert rt["throttled_requests"] > 0 and rt["throttled_gave_up"] == 0
    assert res["measurement"]["storage_retries_total"] == 0
    print(f"[throttled run] {rt['throttled_requests']} throttled requests, {rt['throttle_wait_s']} s in backoffs")


# ----------------------------------------------------------------------------- the CLI
def _cmd(tmp: Path, *extra: str, duration: int = 2) -> list[str]:
    config = tmp / "micro.yaml"
    config.write_text(MICRO)
    return [sys.executable, str(ROOT / "kv-cache.py"), "--config", str(config), "--model", "micro",
            "--num-users", "4", "--duration", str(duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
            "--generation-mode", "none", "--seed", "7", "--output", str(tmp / "r.json"), "--io-chunk-mb", "1",
            *extra]


def _env() -> dict[str, str]:
    return {**os.environ, **CREDS, "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _network_checked(res: dict) -> dict:
    rt = res["measurement"]["remote_tier"]
    net = rt["network"]
    assert net["interface"] == "lo"
    tool = net["tool_bytes_read"] + net["tool_bytes_written"]
    assert tool > 0
    assert net["bytes_received"] >= tool  # every byte of the tier crossed loopback (and maybe others' too)
    assert net["client_cpu_seconds"] > 0 and net["in_client_calls_seconds"] > 0
    return rt


def test_cli_s3_run_verifies_and_compares_loopback_bytes(moto, tmp_path):
    bucket = _bucket(moto.url, "cli")
    proc = _run(_cmd(tmp_path, "--storage-backend", "s3", "--s3-endpoint", moto.url, "--s3-bucket", bucket,
                     "--s3-part-mb", "5", "--verify", "--storage-capacity-gb", "0.05"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["measurement"]["tier_backends"]["storage"] == "s3"
    assert res["measurement"]["verify_failures" if "verify_failures" in res["measurement"] else "storage_errors_total"] == 0
    rt = _network_checked(res)
    assert "Interface lo saw" in proc.stdout
    assert _objects(moto.url, bucket) == []  # the run deleted its objects and its marker
    print(f"[s3] {rt['network']}")


def test_cli_redis_trace_replay_behind_a_ram_tier_in_block_layout(redis_server, tmp_path):
    import redis

    trace = ROOT / "tests" / "fixtures" / "traces" / "mooncake" / "conversation_trace_300.jsonl"
    proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url", redis_server.url, "--verify",
                     "--cpu-mem-gb", "0.02", "--kv-block-tokens", "512", "--trace", str(trace), "--trace-speedup", "0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["measurement"]["tier_backends"] == {"cpu": "memory", "storage": "redis"}
    _network_checked(res)
    assert res["trace_replay"]["format"]
    assert redis.Redis.from_url(redis_server.url).dbsize() == 0


def test_cli_rank_split_gives_each_rank_its_namespace_and_merges(redis_server, tmp_path):
    import redis

    proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url", redis_server.url, "--processes", "2",
                     duration=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = json.loads((tmp_path / "r.json").read_text())["measurement"]["remote_tier"]
    assert len(set(merged["per_rank_prefix"])) == 2
    assert merged["network"]["interface"] == "lo" and merged["network"]["bytes_received"] > 0
    assert redis.Redis.from_url(redis_server.url).dbsize() == 0


@pytest.mark.parametrize("backend", ["s3-down", "redis-down", "redis-password", "s3-no-bucket", "s3-credentials"])
def test_unreachable_server_or_refused_credentials_is_one_line_exit_2(backend, tmp_path, request):
    _need_s3() if backend.startswith("s3") else _need_redis()
    port = servers.free_port()
    if backend == "s3-down":
        extra = ["--storage-backend", "s3", "--s3-endpoint", f"http://127.0.0.1:{port}", "--s3-bucket", "b"]
        want = "cannot be reached"
    elif backend == "s3-no-bucket":
        moto = request.getfixturevalue("moto")
        extra = ["--storage-backend", "s3", "--s3-endpoint", moto.url, "--s3-bucket", "missing-bucket"]
        want = "not found"
    elif backend == "s3-credentials":  # moto with IAM checks on once the bucket exists: unknown keys refused
        srv = servers.start_moto(auth_after=1)
        request.addfinalizer(srv.stop)
        extra = ["--storage-backend", "s3", "--s3-endpoint", srv.url, "--s3-bucket", _bucket(srv.url, "locked")]
        want = "credentials were refused"
    elif backend == "redis-down":
        extra = ["--storage-backend", "redis", "--redis-url", f"redis://127.0.0.1:{port}/0"]
        want = "cannot be reached"
    else:
        srv = request.getfixturevalue("redis_server")
        import redis

        r = redis.Redis.from_url(srv.url)
        r.config_set("requirepass", "right")
        request.addfinalizer(lambda: redis.Redis.from_url(srv.url, password="right").config_set("requirepass", ""))
        extra = ["--storage-backend", "redis", "--redis-url", f"redis://:wrong@127.0.0.1:{srv.port}/0"]
        want = "credentials were refused"
    proc = _run(_cmd(tmp_path, *extra, duration=1))
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and want in err[-1], err
    print(f"[fault] {backend}: exit 2: {err[-1]}")


def _started(backend: str):
    _need_s3() if backend == "s3" else _need_redis()
    binary = servers.MOTO if backend == "s3" else servers.REDIS
    why = servers.missing(binary)
    if why:
        pytest.skip(why)
    return servers.start_moto() if backend == "s3" else servers.start_redis()


def _stored(backend: str, srv) -> int:
    if backend == "s3":
        return len(_objects(srv.url, "lost"))
    import redis

    return redis.Redis.from_url(srv.url).dbsize()


@pytest.mark.parametrize("backend", ["s3", "redis"])
def test_a_server_lost_mid_run_stops_it_with_exit_3_and_results(backend, tmp_path):
    srv = _started(backend)
    try:
        if backend == "s3":
            extra = ["--s3-endpoint", _bucket(srv.url, "lost") and srv.url, "--s3-bucket", "lost", "--s3-part-mb", "5"]
        else:
            extra = ["--redis-url", srv.url]
        proc = subprocess.Popen(_cmd(tmp_path, "--storage-backend", backend, *extra, "--remote-failover-s", "1",
                                     duration=30),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        deadline = time.monotonic() + 30
        while _stored(backend, srv) < 3 and time.monotonic() < deadline:  # the run is writing
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
    finally:
        srv.stop()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["measurement"]["stop_reason"] == "storage error"
    rt = res["measurement"]["remote_tier"]
    assert rt["lost_connections"] > 0 and rt["failover_retries"] > 0 and rt["failover_gave_up"] > 0
    assert "EHOSTDOWN" in err and "failover budget" in err and "Traceback" not in err
    line = next(line for line in err.splitlines() if "storage error" in line)
    print(f"[fault] {backend} server lost mid-run: exit 3: {line}")


def test_a_sessions_rung_offloads_to_the_remote_tier(redis_server):
    """`kv-cache sessions` takes the remote flags; its rungs' tier builder opens the redis backend."""
    import threading

    from kv_cache.benchmarks.sessions.rung_results import RemoteWatch
    from kv_cache.cli import parse_sessions_settings
    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.serving.tiers import TierSet, open_tiers
    from kv_cache.storage.tiername import TierName

    s = parse_sessions_settings(["--storage-backend", "redis", "--redis-url", redis_server.url, "--cpu-mem-gb", "0.01",
                                 "--tiers", "dram+storage"])
    ls = s.ladder_settings
    tiers = ls.tier_settings("dram+storage")
    stores = TierSet([])
    open_tiers(tiers, ls.storage, None, stores, workers=1, largest_entry=MIB)
    try:
        assert stores.backends[TierName.STORAGE].name == "redis"
        watch = RemoteWatch(stores.file_store)  # what a rung reports of its remote tier
        bufs = WorkerBuffers(ls.storage.chunk_bytes, 1, 0)
        stores.file_store.write("b", 2 * MIB, bufs, threading.Event())
        assert stores.file_store.read("b", bufs, verify=True).nbytes == 2 * MIB
        bufs.close()
        net = watch.result(RunMetrics())["remote_tier"]["network"]
        assert net["interface"] == "lo" and net["bytes_received"] >= 4 * MIB  # 2 MiB out and back in
    finally:
        stores.close()
    with pytest.raises(Exception, match="needs --redis-url"):
        parse_sessions_settings(["--storage-backend", "redis"])


def test_a_merge_sums_the_ranks_remote_counters_against_one_interface():
    from kv_cache.results.measurement import merge_remote

    rank = {"backend": "redis", "client": "redis-py", "throttled_requests": 1, "throttle_wait_s": 0.05,
            "throttled_gave_up": 0, "lost_connections": 2, "prefix": "p",
            "network": {"interface": "lo", "tool_bytes_read": 100, "tool_bytes_written": 50, "client_cpu_seconds": 1.0,
                        "in_client_calls_seconds": 2.0, "bytes_received": 320, "bytes_sent": 320,
                        "other_traffic": True}}
    merged = merge_remote([rank, {**rank, "network": {**rank["network"], "bytes_received": 310}}])
    assert merged["throttled_requests"] == 2 and merged["lost_connections"] == 4
    net = merged["network"]
    assert net["tool_bytes_read"] == 200 and net["bytes_received"] == 320  # each rank saw the whole interface
    assert net["received_over_tool"] == round(320 / 300, 4) and net["other_traffic"] is False


@pytest.mark.parametrize("extra, want", [
    (["--storage-backend", "s3", "--s3-bucket", "b", "--s3-endpoint", "127.0.0.1:9000"], "http:// or https:// URL"),
    (["--storage-backend", "s3", "--s3-bucket", "b", "--s3-endpoint", "htp://127.0.0.1:9000"], "http:// or https:// URL"),
    (["--redis-url", "redis://127.0.0.1:6379/0"], "add --storage-backend redis"),
    (["--s3-bucket", "b"], "add --storage-backend s3"),
    (["--storage-backend", "s3", "--s3-bucket", "b", "--s3-prefix", "runs//x"], "--s3-prefix 'runs//x' has an empty"),
    (["--storage-backend", "s3", "--s3-bucket", "b", "--s3-prefix", "../up"], "--s3-prefix '../up' has an empty"),
])
def test_a_mistyped_endpoint_or_a_forgotten_backend_is_one_line_exit_2(extra, want, tmp_path):
    """A scheme-less endpoint made obstore panic (a traceback); a remote flag without its --storage-backend
    silently measured the local directory instead."""
    proc = _run(_cmd(tmp_path, *extra, duration=1))
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1 and want in err[0], proc.stderr[-3000:]
    assert not (tmp_path / "r.json").exists()


def test_a_redis_url_that_answers_another_protocol_is_one_line_exit_2(moto, tmp_path):
    """A --redis-url pointing at an HTTP server (here moto's) was an internal error (exit 70)."""
    _need_redis()
    proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url", f"redis://127.0.0.1:{moto.port}/0",
                     duration=1))
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "is it a Redis/Valkey server?" in err[-1]


def test_the_tier_bytes_include_operations_aborted_at_the_stop():
    """Bytes an operation moved before the stop aborted it crossed the interface too: leaving them out
    flagged other traffic on a quiet loopback."""
    import resource

    from kv_cache.metrics.recorder import RunMetrics
    from kv_cache.results.measurement import network

    m = RunMetrics()
    m.record_aborted("storage", "read", 60 * MIB)
    m.record_aborted("storage", "write", 40 * MIB)
    net = network(m, "lo", (0, 0), (101 * MIB, 101 * MIB), resource.getrusage(resource.RUSAGE_SELF))
    assert net["tool_bytes_read"] == 60 * MIB and net["tool_bytes_written"] == 40 * MIB
    assert net["received_over_tool"] == 1.01 and net["other_traffic"] is False


def test_the_interface_bytes_start_at_the_window_not_before_preconditioning(redis_server, quick_settings,
                                                                            monkeypatch):
    """The interface was read before the preconditioning phase, whose writes the tier's bytes leave out:
    a quiet loopback showed twice the tier's bytes and was flagged as shared. The counters are read after
    the phases now. (Checked by the order of the calls, not by the loopback's bytes: on a shared host the
    loopback carries other processes' traffic too, 7.9 times the tier's in one run of this test.)"""
    import io

    from kv_cache.benchmarks.standard import run as run_mod
    from kv_cache.host.netdev import NetCounter

    calls: list[str] = []
    phases, snapshot = run_mod.run_phases, NetCounter.snapshot
    monkeypatch.setattr(run_mod, "run_phases", lambda *a, **k: (calls.append("phases"), phases(*a, **k))[1])
    monkeypatch.setattr(NetCounter, "snapshot", lambda self: (calls.append("snapshot"), snapshot(self))[1])
    settings = quick_settings("--storage-backend", "redis", "--redis-url", redis_server.url, "--precondition",
                              "--precondition-size-gb", "0.02", "--duration", "1")
    run_mod.run_benchmark(settings, io.StringIO())
    assert calls[:2] == ["phases", "snapshot"], calls  # the window's counters start after preconditioning


def test_a_sessions_rung_moves_blocks_through_redis_behind_dram(redis_server, tmp_path):
    """`kv-cache sessions` end to end: HBM and a small DRAM tier fill, blocks go out to Redis (stamped,
    --verify on), the rung reports the tier's bytes against loopback's and the tier's peak."""
    import redis

    out = tmp_path / "s.json"
    proc = _run([sys.executable, str(ROOT / "kv-cache.py"), "sessions", "--model", "tiny-1b", "--gpu-mem-gb", "2.2",
                 "--cpu-mem-gb", "0.05", "--tiers", "dram+storage", "--storage-backend", "redis", "--redis-url",
                 redis_server.url, "--ladder", "4", "--window", "4", "--warmup", "1", "--subwindows", "2", "--pace",
                 "fixed:0.2", "--verify", "--seed", "7", "--output", str(out)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rung = json.loads(out.read_text())["rungs"][0]
    net = rung["remote_tier"]["network"]
    assert rung["tier_backends"]["storage"] == "redis" and rung["verify"]["mismatches"] == 0
    assert net["interface"] == "lo" and net["tool_bytes_written"] > 0 and net["bytes_received"] >= net["tool_bytes_written"]
    storage = next(t for t in rung["offload_tier"]["tiers"] if t["tier"] == "storage")
    assert storage["peak_gib"] > 0
    assert redis.Redis.from_url(redis_server.url).dbsize() == 0


def test_an_aborted_s3_read_counts_the_ranged_gets_already_under_way(moto):
    """The stop aborts a read between parts, but the parts already being fetched still cross the wire:
    they were left out of the tier's bytes, so loopback looked shared with other traffic."""
    import threading

    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.s3 import S3Store

    store = S3Store(_bucket(moto.url, "abort"), moto.url, "", part_bytes=5 * MIB, concurrency=3, workers=1,
                    chunk_bytes=MIB)
    bufs = _bufs()
    try:
        store.write("e", 40 * MIB, bufs)
        stop = threading.Event()
        with pytest.raises(IOAborted) as info:
            store.read("e", bufs, stop, on_chunk=lambda c, mv: stop.set())  # stop after the first chunk
        # part 0 was read whole; parts 1 and 2 were fetched alongside it
        assert 15 * MIB <= info.value.device_bytes <= 40 * MIB and info.value.device_bytes % (5 * MIB) == 0
    finally:
        store.close()
        bufs.close()


@pytest.mark.parametrize("received, status", [(1.02, "ok"), (0.5, "suspect")])
def test_integrity_checks_a_remote_tier_by_its_interface_bytes(received, status):
    """A remote tier was 'suspect' in every run, for 'the page cache sits between the tool and the device'
    (there is none on an S3 or Redis client); its page-cache check is now the interface's bytes."""
    from kv_cache.results import integrity as integ

    tool = 100 * MIB
    doc = {"summary": {"cache_stats": {}}, "measurement": {
        "io_mode": "network", "fsync": True, "filesystem": "s3", "filesystem_kind": "network",
        "remote_tier": {"network": {"interface": "lo", "tool_bytes_read": tool // 2, "tool_bytes_written": tool // 2,
                                    "bytes_received": int(received * tool)}}}}
    checks = {c["check"]: c for c in integ.audit_facts(integ.facts_from_ours(doc))["checks"]}
    assert checks["page_cache"]["status"] == status and "interface lo" in checks["page_cache"]["reason"]
    assert checks["io_setup"]["status"] == "ok" and "page cache sits" not in checks["io_setup"]["reason"]


def test_a_capacity_over_redis_maxmemory_is_exit_2_naming_the_server(tmp_path):
    """The refusal named 'the filesystem of None' for a Redis tier (it has no --cache-dir)."""
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    srv = servers.start_redis(maxmemory="8mb")
    try:
        proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url", srv.url, "--storage-capacity-gb", "0.5",
                         duration=1))
    finally:
        srv.stop()
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and f"free on the server redis://127.0.0.1:{srv.port}/0" in err[-1], proc.stderr[-2000:]
    assert "None" not in err[-1]


def test_the_results_record_no_redis_password(tmp_path):
    """`--redis-url redis://:PASSWORD@host` (the README's form) put the password into run_parameters.command
    of every results file; it is recorded as ***."""
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    import redis

    srv = servers.start_redis()
    try:
        redis.Redis.from_url(srv.url).config_set("requirepass", "s3cr3t-pw")
        proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url",
                         f"redis://:s3cr3t-pw@127.0.0.1:{srv.port}/0", duration=1))
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "r.json").read_text()
    assert "s3cr3t-pw" not in text and "s3cr3t-pw" not in proc.stdout
    assert f"redis://:***@127.0.0.1:{srv.port}/0" in json.loads(text)["run_parameters"]["command"]


@pytest.mark.parametrize("arg", [
    "redis://:s3cr3t-pw@host:6379/0", "redis://user:s3cr3t-pw@host:6379/0", "rediss://default:s3cr3t-pw@h:1/0",
    "redis://host:6379/0?password=s3cr3t-pw", "redis://host:6379/0?db=1&password=s3cr3t-pw&protocol=2",
    "--redis-url=redis://h:1/0?PASSWORD=s3cr3t-pw", "https://h/o?X-Amz-Signature=s3cr3t-pw&X-Amz-Expires=900",
    "redis://user:s3cr3t-pw@h:1/0?password=s3cr3t-pw"])
def test_every_form_of_a_url_credential_is_redacted(arg):
    from kv_cache.settings.run import redacted_argv

    out = redacted_argv(["kv-cache", arg])[1]
    assert "s3cr3t-pw" not in out and "***" in out, out
    assert out.split("***")[0] == arg.split("s3cr3t-pw")[0]  # what comes before the secret is kept


@pytest.mark.parametrize("arg", ["redis://user:p@ss-s3cr3t@127.0.0.1:6379/0", "redis://:a@b@c-s3cr3t@h:1/0?db=0"])
def test_a_password_with_an_unencoded_at_sign_is_redacted_whole(arg):
    """redis-py splits the authority at its last "@" (urlparse), so `user:p@ss@host` authenticates with
    "p@ss"; the mask stopped at the first "@" and wrote `user:***@ss-s3cr3t@host`."""
    from urllib.parse import urlparse

    from kv_cache.settings.run import redacted

    out = redacted(arg)
    assert "s3cr3t" not in out and "ss" not in out.split("@")[1], out
    assert out.split("***@")[1] == arg.split("@")[-1] and urlparse(arg).hostname in out  # the host is kept


def test_a_password_in_the_redis_urls_query_is_not_recorded(tmp_path):
    """`--redis-url redis://host:port/0?password=PW` (redis-py's query form) was written in clear in
    run_parameters.command, while the userinfo forms were masked."""
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    import redis

    srv = servers.start_redis()
    try:
        redis.Redis.from_url(srv.url).config_set("requirepass", "s3cr3t-qpw")
        proc = _run(_cmd(tmp_path, "--storage-backend", "redis", "--redis-url",
                         f"redis://127.0.0.1:{srv.port}/0?password=s3cr3t-qpw", duration=1))
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "r.json").read_text()
    assert "s3cr3t-qpw" not in text + proc.stdout + proc.stderr
    assert "?password=***" in json.loads(text)["run_parameters"]["command"]


@pytest.mark.parametrize("where", ["environment", "credentials-file"])
def test_s3_keys_from_the_environment_or_the_aws_config_files_are_never_written(where, moto, tmp_path):
    """The S3 tier's keys come from the environment or ~/.aws/credentials (boto3's chain): neither the
    results, nor the console, nor the log carries them (the tier records the endpoint, scheme, TLS and CA)."""
    bucket = _bucket(moto.url, "keys")
    secret = "s3cr3t-" + where
    env = _env()
    if where == "environment":
        env["AWS_SECRET_ACCESS_KEY"] = secret
    else:
        creds = tmp_path / "credentials"
        creds.write_text(f"[default]\naws_access_key_id = AKIDTEST\naws_secret_access_key = {secret}\n")
        env.pop("AWS_ACCESS_KEY_ID")
        env.pop("AWS_SECRET_ACCESS_KEY")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    proc = subprocess.run(_cmd(tmp_path, "--storage-backend", "s3", "--s3-endpoint", moto.url, "--s3-bucket", bucket,
                               "--s3-part-mb", "5", duration=1), capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "r.json").read_text()
    assert secret not in text + proc.stdout + proc.stderr
    rt = json.loads(text)["measurement"]["remote_tier"]
    assert rt["scheme"] == "http" and rt["tls"] == {"on": False}


def test_a_key_the_server_dropped_is_a_read_error_not_a_verify_mismatch():
    """A server whose maxmemory-policy evicts (allkeys-lru, common for caches) drops the run's keys
    silently: a read found None and counted it as a --verify mismatch. Now the open says the server
    evicts, and the read is an EIO naming the policy."""
    _need_redis()
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)
    import redis

    from kv_cache.storage.base import DataCorruption
    from kv_cache.storage.kvstore import RedisStore

    srv = servers.start_redis(maxmemory="64mb")
    try:
        r = redis.Redis.from_url(srv.url)
        r.config_set("maxmemory-policy", "allkeys-lru")
        store = RedisStore(srv.url, MIB, workers=1)
        assert store.evicting == "allkeys-lru" and "allkeys-lru" in store.notes[0]
        bufs = _bufs()
        store.write("e", 3 * MIB, bufs)
        r.delete(f"{store._base('e')}:1")  # what an eviction does
        with pytest.raises(OSError) as info:
            store.read("e", bufs, verify=True)
        assert not isinstance(info.value, DataCorruption) and info.value.errno == errno.EIO
        assert "gone from the server" in str(info.value) and "allkeys-lru" in str(info.value)
        store.close()
        bufs.close()
    finally:
        srv.stop()


def test_s3_sweep_aborts_a_dead_runs_incomplete_multipart_uploads(moto):
    """A run killed mid-write leaves an incomplete multipart upload no object listing shows (S3 keeps and
    bills its parts until aborted); the sweep aborts the dead run's, and leaves another host's."""
    import boto3

    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "uploads")
    c = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing")
    dead = f"u/kv-cache-run-20250101-000000-{_dead_pid()}-abcd"
    other = "u/kv-cache-run-20250101-000000-1-beef"
    for run, marker in ((dead, _marker(_dead_pid())), (other, _marker(1, "another-host"))):
        c.put_object(Bucket=bucket, Key=f"{run}/.kv-cache-run", Body=marker)
        up = c.create_multipart_upload(Bucket=bucket, Key=f"{run}/e.kv")
        c.upload_part(Bucket=bucket, Key=f"{run}/e.kv", UploadId=up["UploadId"], PartNumber=1, Body=b"p" * (5 * MIB))
    store = S3Store(bucket, moto.url, "u", part_bytes=5 * MIB, workers=1, chunk_bytes=MIB)
    assert len(store.swept) == 1 and "1 incomplete multipart upload(s) aborted" in store.swept[0], store.swept
    store.close()
    left = [u["Key"] for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads") or []]
    assert left == [f"{other}/e.kv"]


# ----------------------------------------------------------------------------- S3 reads into the read buffer
def _s3(url: str, bucket: str, chunk: int = MIB, **kw):
    from kv_cache.storage.s3 import S3Store

    kw = {"part_bytes": 5 * MIB, "concurrency": 2, "workers": 1, **kw}
    return S3Store(_bucket(url, bucket), url, "", chunk_bytes=chunk, **kw), WorkerBuffers(chunk, 7, 0)


def _client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


@pytest.mark.parametrize(("chunk_mib", "concurrency"), [(1, 3), (8, 3), (8, 1), (16, 2)])
def test_s3_reads_land_in_the_worker_read_buffer_in_order_with_verify(moto, monkeypatch, chunk_mib, concurrency):
    """No ranged GET goes through a buffer of the client's: each chunk handed on is a view of the worker's
    read buffer, verified there, in order, whether the buffer is smaller than a part (1 MiB) or larger
    (8 and 16 MiB, a window of parts, more of them than are in flight); move_to out of S3 reads into the
    same buffer."""
    import obstore

    from kv_cache.storage.base import padded

    store, bufs = _s3(moto.url, f"direct{chunk_mib}-{concurrency}", chunk_mib * MIB, concurrency=concurrency)

    def client_buffer(*a, **k):
        raise AssertionError("a read went through obstore's own buffer")

    for call in ("get", "get_range", "get_ranges"):
        monkeypatch.setattr(obstore, call, client_buffer)
    try:
        for n in (0, 1000, 5 * MIB, 13 * MIB + 5, 21 * MIB):
            store.write(f"e{n}", n, bufs)
            seen = []

            def on_chunk(c, mv, seen=seen):
                assert mv.obj is bufs.read_mv.obj
                seen.append((c, len(mv)))

            res = store.read(f"e{n}", bufs, verify=True, on_chunk=on_chunk)
            assert (res.nbytes, res.device_bytes) == (n, padded(n))
            assert [c for c, _ in seen] == list(range(len(seen)))
            assert sum(k for _, k in seen) == n and all(k == chunk_mib * MIB for _, k in seen[:-1])
        ram = MemoryStore(64 * MIB)
        store.move_to(f"e{13 * MIB + 5}", ram, bufs)
        assert ram.read(f"e{13 * MIB + 5}", bufs, verify=True).nbytes == 13 * MIB + 5
        ram.close()
    finally:
        store.close()
        bufs.close()


def test_s3_read_with_verify_finds_a_corrupted_a_truncated_and_a_missing_object(moto):
    from kv_cache.storage.base import BLOCK, DataCorruption

    store, bufs = _s3(moto.url, "corrupt")
    c = _client(moto.url)
    try:
        for key in ("bad", "short", "gone"):
            store.write(key, 6 * MIB, bufs)
        path = store._object("bad")
        body = bytearray(c.get_object(Bucket="corrupt", Key=path)["Body"].read())
        body[5 * MIB + 3 * BLOCK + 8] ^= 0xFF  # the block index stamped in block 1283 (the second part's)
        c.put_object(Bucket="corrupt", Key=path, Body=bytes(body))
        with pytest.raises(DataCorruption, match="'bad' block 1283 does not carry its stamp"):
            store.read("bad", bufs, verify=True)
        assert store.read("bad", bufs).nbytes == 6 * MIB  # unchecked without --verify, and the store still reads
        c.put_object(Bucket="corrupt", Key=store._object("short"), Body=bytes(body[: 4 * MIB]))
        with pytest.raises(DataCorruption, match="ends"):
            store.read("short", bufs, verify=True)
        c.delete_object(Bucket="corrupt", Key=store._object("gone"))
        with pytest.raises(KeyError):
            store.read("gone", bufs, verify=True)
    finally:
        store.close()
        bufs.close()


@pytest.mark.parametrize("status", [503, 429])
def test_s3_throttled_ranged_gets_are_retried_per_part_and_counted(moto, status):
    """Only the throttled part is asked again (after a backoff), not the whole entry: the ranged GETs the
    server saw are the entry's parts plus one per throttled answer, and each is counted."""
    from s3_faults import FaultProxy, ranged_gets

    decide, seen = ranged_gets(status, every=3)
    seen["armed"] = False  # the open's read-back of the marker is not counted
    proxy = FaultProxy(moto.port, decide)
    store, bufs = _s3(proxy.url, f"throttle{status}")
    seen["armed"] = True
    try:
        store.write("e", 20 * MIB, bufs)
        assert store.read("e", bufs, verify=True).nbytes == 20 * MIB
        stats = store.remote_stats()
        assert seen["failed"] >= 1 and proxy.answered[status] == seen["failed"]
        assert stats["throttled_requests"] == seen["failed"] and stats["throttle_wait_s"] > 0
        assert seen["ranged"] == 4 + seen["failed"]
    finally:
        store.close()
        bufs.close()
        proxy.stop()


def test_s3_refused_ranged_get_is_eacces(moto):
    from s3_faults import FaultProxy, ranged_gets

    decide, seen = ranged_gets(403, every=1)
    seen["armed"] = False  # refused from the first read on, not at the open's read-back of the marker
    proxy = FaultProxy(moto.port, decide)
    store, bufs = _s3(proxy.url, "denied")
    seen["armed"] = True
    try:
        store.write("e", 6 * MIB, bufs)
        with pytest.raises(OSError) as info:
            store.read("e", bufs, verify=True)
        assert info.value.errno == errno.EACCES and "refused the credentials" in str(info.value)
    finally:
        store.close()
        bufs.close()
        proxy.stop()


def test_s3_connection_lost_mid_body_is_enotconn_counted_and_a_retry_reads_it(moto):
    """A ranged GET whose connection drops halfway through its body: the read fails with ENOTCONN (what
    the cache retries and the error policy counts), the loss is counted, and the read tried again gets
    the entry whole."""
    from s3_faults import FaultProxy, ranged_gets

    every_2nd, seen = ranged_gets("cut", every=2)

    def decide(method: str, headers: dict, n: int):  # one cut only: the read's other parts may or may not
        return None if seen["failed"] else every_2nd(method, headers, n)  # start before it winds up (load)

    proxy = FaultProxy(moto.port, decide)
    store, bufs = _s3(proxy.url, "cut")
    try:
        store.write("e", 12 * MIB, bufs)
        with pytest.raises(OSError) as info:
            store.read("e", bufs, verify=True)
        assert info.value.errno == errno.ENOTCONN and "connection to the server lost" in str(info.value)
        assert proxy.cut == 1 and store.remote_stats()["lost_connections"] == 1
        seen["armed"] = False
        assert store.read("e", bufs, verify=True).nbytes == 12 * MIB
    finally:
        store.close()
        bufs.close()
        proxy.stop()


def test_s3_reads_reuse_kept_alive_connections_whose_descriptors_are_above_1023(moto):
    """A server that keeps connections alive (the fault proxy, as AWS, MinIO and RGW do): each read finds
    its connection idle in the pool and checks it for an EOF first. That check was a select(), which
    refuses a descriptor above 1023 (ValueError: filedescriptor out of range), so every read after the
    first failed in a process with that many files or sockets open (many workers, many connections)."""
    from s3_faults import FaultProxy, ranged_gets

    decide, seen = ranged_gets(503, every=1)
    seen["armed"] = False  # nothing is throttled: the proxy only keeps its connections alive
    import gc

    proxy = FaultProxy(moto.port, decide)
    gc.collect()  # earlier tests' sockets closed now, not mid-test (a freed low descriptor would be reused)
    gc.disable()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the sockets made next are above 1023
    store, bufs = _s3(proxy.url, "manyfds")
    try:
        store.write("e", 11 * MIB, bufs)
        for _ in range(3):
            assert store.read("e", bufs, verify=True).nbytes == 11 * MIB
        idle = [c.sock.fileno() for c in store._reads.conns._idle if c.sock is not None]
        # the connections were kept, and reused above 1023 (at least one: a descriptor that another thread of
        # this process frees meanwhile, a leaked socket of an earlier test, can be taken by a later connection)
        assert idle and max(idle) > 1023, idle
        assert store.remote_stats()["lost_connections"] == 0
    finally:
        store.close()
        bufs.close()
        proxy.stop()
        for fd in held:
            os.close(fd)
        gc.enable()


def test_s3_over_https_behind_a_private_ca_trusts_aws_ca_bundle_in_every_client(monkeypatch):
    """An https endpoint whose certificate a private CA signed (a self-hosted MinIO): AWS_CA_BUNDLE names
    it. botocore (the part calls) always read it; obstore and the reads' http.client connections did not, so
    the run stopped at start with "the server cannot be reached". Now all three trust it: an entry of one
    part (obstore PUT), a multipart one (botocore) and their ranged GETs (http.client over TLS)."""
    _need_s3()
    why = servers.missing(servers.MOTO) or (None if servers.shutil.which("openssl") else "openssl is missing")
    if why:
        pytest.skip(why)
    srv = servers.start_moto(tls=True)
    try:
        monkeypatch.setenv("AWS_CA_BUNDLE", srv.extra["ca"])
        import boto3

        boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1").create_bucket(Bucket="tls")
        from kv_cache.storage.s3 import S3Store

        store = S3Store("tls", srv.url, "runs", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        bufs = WorkerBuffers(MIB, 7, 0)
        for n in (1000, 12 * MIB + 5):
            store.write(f"e{n}", n, bufs)
            assert store.read(f"e{n}", bufs, verify=True).nbytes == n
        assert store._reads.conns.context is not None
        store.close()
        bufs.close()
        monkeypatch.setenv("AWS_CA_BUNDLE", srv.extra["ca"] + ".missing")
        from kv_cache.errors import StorageSetupError

        with pytest.raises(StorageSetupError, match="cannot read the CA bundle"):
            S3Store("tls", srv.url, "runs", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
    finally:
        srv.stop()


def test_s3_a_read_path_that_cannot_verify_the_servers_certificate_is_a_setup_error(monkeypatch):
    """obstore trusts the server (it made the listing and the marker), but the reads' http.client
    connections do not (here: Python's TLS contexts load no CA file; elsewhere, a host whose OpenSSL has
    no CA store while obstore carries its own roots). The store opened, and every read of the run failed
    as a lost connection; now the open reads the marker back through the read path first: a one-line
    StorageSetupError naming the TLS failure, and the marker is removed."""
    import ssl

    _need_s3()
    why = servers.missing(servers.MOTO) or (None if servers.shutil.which("openssl") else "openssl is missing")
    if why:
        pytest.skip(why)
    srv = servers.start_moto(tls=True)
    try:
        monkeypatch.setenv("AWS_CA_BUNDLE", srv.extra["ca"])
        import boto3

        boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1").create_bucket(Bucket="tls2")
        from kv_cache.errors import StorageSetupError
        from kv_cache.storage.s3 import S3Store

        monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *a, **k: None)
        with pytest.raises(StorageSetupError) as info:
            S3Store("tls2", srv.url, "runs", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        msg = str(info.value)
        assert "read path" in msg and "TLS certificate failed verification" in msg and "CERTIFICATE_VERIFY_FAILED" in msg
        assert "cannot be reached" not in msg and "\n" not in msg, msg
        monkeypatch.undo()
        monkeypatch.setenv("AWS_CA_BUNDLE", srv.extra["ca"])
        keys = boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1").list_objects_v2(Bucket="tls2")
        assert keys.get("KeyCount") == 0  # the marker was removed
    finally:
        srv.stop()


def test_s3_close_retries_a_throttled_delete_and_leaves_nothing(moto):
    """The run's objects are deleted at close in batches; a batch the server throttled was given up at
    once, with the marker after it, so the run left everything it wrote on the server. Now the batch is
    sent again after a backoff (counted), and nothing is left."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "closethrottled")
    proxy = servers.start_throttler(moto.port, every=2, status=503, only="?delete")
    try:
        store = S3Store(bucket, proxy.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
        bufs = _bufs()
        for i in range(3):
            store.write(f"e{i}", 2 * MIB, bufs)
        proxy.count = 1  # the next batch delete is the 2nd counted: throttled; the one after it passes
        store.close()
        bufs.close()
        assert _objects(moto.url, bucket) == []
        assert proxy.throttled >= 1 and store.remote_stats()["throttled_requests"] == proxy.throttled
    finally:
        proxy.stop()


def test_s3_a_read_path_refused_at_start_is_a_setup_error_and_leaves_no_marker(moto):
    """Ranged GETs refused (403) while the listing and the marker PUT pass: the open's read-back of the
    marker makes it a one-line setup error (exit 2) naming the read path, not a refusal on the run's first
    read; the marker is removed."""
    from s3_faults import FaultProxy, ranged_gets

    from kv_cache.errors import StorageSetupError

    decide, _ = ranged_gets(403, every=1)
    proxy = FaultProxy(moto.port, decide)
    try:
        with pytest.raises(StorageSetupError, match="read path's connections .*credentials were refused"):
            _s3(proxy.url, "deniedatstart")
        assert _objects(moto.url, "deniedatstart") == []
    finally:
        proxy.stop()


def test_a_thread_that_writes_no_more_frees_its_slot_ring(moto):
    """release_thread (called by each I/O worker probe thread as it ends) drops the calling thread's ring of
    stamped slots; a later write of the thread makes a new one, and the store still round-trips."""
    import threading

    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "release")
    for store, rings in ((S3Store(bucket, moto.url, "runs", part_bytes=5 * MIB, workers=2, chunk_bytes=MIB), "_rings"),):
        bufs = _bufs()

        def once(k: str) -> None:
            store.write(k, MIB, bufs)  # noqa: B023  (called at once)
            store.release_thread()  # noqa: B023

        t = threading.Thread(target=once, args=("a",))
        t.start()
        t.join()
        assert getattr(store, rings) == []
        store.write("b", 2 * MIB, bufs)
        assert len(getattr(store, rings)) == 1 and store.read("a", bufs, verify=True).nbytes == MIB
        store.close()
        bufs.close()


def test_redis_writes_from_the_workers_buffer_holding_nothing_per_thread(redis_server):
    """Writes from several threads, one chunk and several round trips, make no buffers of the store's own
    (the worker's write buffer is stamped and sent a piece at a time: 4 Dec, 16 workers held 2 GiB of
    per-thread slots); each thread's entries read back with --verify."""
    import threading

    from kv_cache.storage import buffers
    from kv_cache.storage.kvstore import RedisStore

    store = RedisStore(redis_server.url, MIB, pipeline=3, workers=4)
    made = [0]
    real_init = buffers.WorkerBuffers.__init__

    def counted(self, *a, **k):
        made[0] += 1
        real_init(self, *a, **k)

    own = [_bufs() for _ in range(4)]
    buffers.WorkerBuffers.__init__ = counted
    try:
        ts = [threading.Thread(target=lambda i=i: [store.write(f"t{i}-{n}", n, own[i]) for n in (MIB - 4096, 5 * MIB)])
              for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        buffers.WorkerBuffers.__init__ = real_init
    assert made[0] == 0
    for i in range(4):
        for n in (MIB - 4096, 5 * MIB):
            assert store.read(f"t{i}-{n}", own[i], verify=True).nbytes == n
    store.close()
    for b in own:
        b.close()


def test_a_password_in_the_s3_endpoints_userinfo_is_not_shown(moto, monkeypatch):
    """`--s3-endpoint http://KEY:SECRET@host` (the clients take no credentials there, so the store fails to
    open): its setup error printed the secret in clear; results, the leftovers command and the store's
    repr showed the endpoint as given."""
    from kv_cache.errors import StorageSetupError
    from kv_cache.storage.s3 import S3Store

    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    bucket = _bucket(moto.url, "userinfo")
    with pytest.raises(StorageSetupError) as info:
        S3Store(bucket, moto.url.replace("http://", "http://AKID:s3cr3t-ep@"), part_bytes=5 * MIB, workers=1)
    assert "s3cr3t-ep" not in str(info.value) and "http://AKID:***@127.0.0.1" in str(info.value), info.value


def test_the_sessions_document_masks_the_s3_endpoints_password():
    from types import SimpleNamespace

    from kv_cache.results.sessions_document import sessions_storage_location

    remote = SimpleNamespace(storage_backend="s3", s3_endpoint="http://AKID:s3cr3t-ep@h:9000", s3_bucket="b",
                             s3_prefix="", redis_url=None)
    got = sessions_storage_location(SimpleNamespace(remote=remote), ["dram+storage"])
    assert got["mount_source"] == "http://AKID:***@h:9000"
    remote.s3_endpoint = None  # AWS itself: no endpoint, as before
    assert sessions_storage_location(SimpleNamespace(remote=remote), ["dram+storage"])["mount_source"] is None


def test_a_slot_rings_fill_is_drawn_once_and_copied_to_its_other_slots(monkeypatch):
    """S3's ring of concurrency + 2 slots is made at a worker's first write, inside the window: each slot
    drew its own random fill (6 draws of 8 MiB a worker, 16 % of a 16-worker run's samples). Now the first
    slot's fill is copied to the others: one draw a ring, and every slot's bytes are those of a fresh
    buffer of the same seed (what a reader's check of the fill expects)."""
    import numpy as np

    from kv_cache.storage.remote import SlotRing

    draws = [0]
    real = np.random.default_rng

    def counted(*a, **k):
        draws[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(np.random, "default_rng", counted)
    ring = SlotRing(64 * 1024, 6, 3)
    assert draws[0] == 1 and len(ring.slots) == 6
    fresh = WorkerBuffers(64 * 1024, 0, 99, read_bytes=4096)
    assert draws[0] == 2
    assert all(bytes(s.write_mv) == bytes(fresh.write_mv) for s in ring.slots)
    assert len({id(s._write_mm) for s in ring.slots}) == 6  # six buffers, not one shared
    other = WorkerBuffers(64 * 1024, 5, 1, fill_from=fresh)  # another seed: drawn, not copied
    assert draws[0] == 3 and bytes(other.write_mv) != bytes(fresh.write_mv)
    for b in (*ring.slots, fresh, other):
        b.close()


def _held_write(store, method: str, key: str, nbytes: int):
    """A write of `key` in a thread of its own, held after its first piece (`method`, the store's call that
    sends a piece) until the returned `go` is set: (thread, started, go, outcome)."""
    import threading

    started, go, outcome = threading.Event(), threading.Event(), []
    send = getattr(store, method)

    def held(*a, **k):
        done = send(*a, **k)
        if not started.is_set():
            started.set()
            go.wait(10)
        return done

    setattr(store, method, held)

    def write():
        bufs = _bufs()
        try:
            store.write(key, nbytes, bufs)
            outcome.append("written")
        except Exception as e:  # noqa: BLE001  (what the write ended with is the test's to judge)
            outcome.append(e)
        finally:
            bufs.close()

    t = threading.Thread(target=write)
    t.start()
    assert started.wait(10)
    return t, started, go, outcome


def _close_while(store, go) -> None:
    """close() on a thread of its own; `go` set once the store says it is closed (the write held in
    flight then goes on, sees the store closing and aborts)."""
    import threading

    closer = threading.Thread(target=store.close)
    closer.start()
    deadline = time.monotonic() + 10
    while not store._closed and time.monotonic() < deadline:
        time.sleep(0.005)
    go.set()
    closer.join(20)


def test_redis_a_write_in_flight_at_close_leaves_no_key_behind(redis_server):
    """A write still under way when close() began (a Ctrl-C abandons the requests in flight) wrote keys
    after close had taken the books: they stayed on the server for good, marker gone (3 of 3 runs stopped
    at 20 s left 15-27 keys, and a sweep's next runs met a full maxmemory)."""
    import redis

    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    store = RedisStore(redis_server.url, MIB, pipeline=1, workers=2)
    t, _, go, outcome = _held_write(store, "_set_round_from", "k", 6 * MIB)
    assert r.dbsize() == 2  # the marker and the first chunk key
    _close_while(store, go)
    t.join(10)
    assert isinstance(outcome[0], IOAborted) and "closing" in str(outcome[0])
    assert r.keys("*") == [] and store.leftovers is None


def test_redis_an_abort_its_server_refused_is_removed_at_close(redis_server, monkeypatch):
    """An aborted write whose own delete is refused (a stop signal refuses a request at once) hands its
    keys to close(), which removes them in its own clean-up time; they were left before."""
    import redis

    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    store = RedisStore(redis_server.url, MIB, pipeline=1, workers=1)
    send, call, rounds = store._set_round_from, store._call, []

    def second_round_aborts(*a):
        rounds.append(1)
        if len(rounds) == 2:
            raise IOAborted("abandoned at the stop signal")
        return send(*a)

    def refused_delete(what, fn):
        if what.startswith("redis delete of 'k'"):
            raise IOAborted(f"{what}: abandoned at the stop signal")
        return call(what, fn)

    store._set_round_from, store._call = second_round_aborts, refused_delete
    bufs = _bufs()
    with pytest.raises(IOAborted):
        store.write("k", 4 * MIB, bufs)
    assert r.dbsize() == 2  # the marker and the chunk the first round set
    store.close()
    assert r.keys("*") == [] and store.leftovers is None
    bufs.close()


def test_redis_a_write_still_running_after_the_settle_keeps_the_marker(redis_server):
    """A write that has not ended when close() stops waiting (a frozen socket) may set keys after the
    removal: the marker stays, so the next run's sweep removes them, and the leftovers say so."""
    import redis

    from kv_cache.storage.kvstore import RedisStore
    from kv_cache.storage.remote import RemoteStore

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    store = RedisStore(redis_server.url, MIB, pipeline=1, workers=2)
    store.settle_writes = lambda: RemoteStore.settle_writes(store, 0.05)
    t, _, go, _ = _held_write(store, "_set_round_from", "k", 6 * MIB)
    store.close()  # the write is held past the settle
    assert [k.decode() for k in r.keys("*")] == [f"{store.run_name}:.kv-cache-run"]
    assert "1 write(s) still in flight" in store.leftovers and "the next run on this server removes" in store.leftovers
    go.set()
    t.join(10)
    r.flushall()


def test_s3_a_write_in_flight_at_close_leaves_no_object_behind(moto):
    """As Redis's: a single-part entry PUT at commit after close() had taken the books stayed in the
    bucket; now the write aborts (the store is closing) and close() deletes its object."""
    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "inflight")
    store = S3Store(bucket, moto.url, "runs", part_bytes=5 * MIB, concurrency=1, workers=2, chunk_bytes=MIB)
    t, _, go, outcome = _held_write(store, "_send", "k", 12 * MIB)  # a multipart upload, held after part 1
    _close_while(store, go)
    t.join(10)
    assert isinstance(outcome[0], (IOAborted, RuntimeError))
    assert _objects(moto.url, bucket) == [] and store.leftovers is None


def test_redis_an_abort_whose_delete_is_refused_as_close_begins_leaves_no_key(redis_server):
    """A write aborted just before close() began: its own delete, refused at the stop signal, handed its
    keys over after close() had stopped waiting for the writes in flight (none was counted: the abort had
    ended its count first), so the keys stayed and the marker went."""
    import threading

    import redis

    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    store = RedisStore(redis_server.url, MIB, pipeline=1, workers=2)
    send, call, rounds = store._set_round_from, store._call, []
    deleting, settling = threading.Event(), threading.Event()
    settle = store.settle_writes

    def second_round_aborts(*a):
        rounds.append(1)
        if len(rounds) == 2:
            raise IOAborted("abandoned at the stop signal")
        return send(*a)

    def refused_delete(what, fn):
        if what.startswith("redis delete of 'k'"):
            deleting.set()
            settling.wait(10)
            time.sleep(0.1)  # close() is in its wait for the writes in flight, or past it
            raise IOAborted(f"{what}: abandoned at the stop signal")
        return call(what, fn)

    def settle_writes(*a):
        settling.set()
        return settle(*a)

    store._set_round_from, store._call, store.settle_writes = second_round_aborts, refused_delete, settle_writes
    outcome = []

    def write():
        bufs = _bufs()
        try:
            store.write("k", 4 * MIB, bufs)
        except IOAborted as e:
            outcome.append(e)
        finally:
            bufs.close()

    t = threading.Thread(target=write)
    t.start()
    assert deleting.wait(10)
    store.close()
    t.join(10)
    assert outcome and r.keys("*") == [] and store.leftovers is None


def test_redis_a_delete_refused_at_the_stop_signal_is_removed_at_close(redis_server):
    """An eviction's delete after a Ctrl-C is refused at once (the stop signal): the entry was off the
    books already, so close() did not remove its keys and the marker went."""
    import redis

    from kv_cache.host.signals import ABANDON_IO
    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.kvstore import RedisStore

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    store = RedisStore(redis_server.url, MIB, pipeline=1, workers=1)
    bufs = _bufs()
    store.write("k", 3 * MIB, bufs)
    bufs.close()
    ABANDON_IO.set()
    try:
        with pytest.raises(IOAborted):
            store.delete("k")
        store.close()
    finally:
        ABANDON_IO.clear()
    assert r.keys("*") == [] and store.leftovers is None


def test_s3_a_delete_refused_at_the_stop_signal_is_removed_at_close(moto):
    """As Redis's: the object of an entry whose delete a Ctrl-C refused stayed in the bucket."""
    from kv_cache.host.signals import ABANDON_IO
    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "refuseddelete")
    store = S3Store(bucket, moto.url, "runs", part_bytes=5 * MIB, concurrency=1, workers=1, chunk_bytes=MIB)
    bufs = _bufs()
    store.write("k", 2 * MIB, bufs)
    bufs.close()
    ABANDON_IO.set()
    try:
        with pytest.raises(IOAborted):
            store.delete("k")
        store.close()
    finally:
        ABANDON_IO.clear()
    assert _objects(moto.url, bucket) == [] and store.leftovers is None


def test_s3_an_abort_whose_delete_is_refused_as_close_begins_leaves_no_object(moto):
    """As Redis's: an entry PUT, then its write aborted (a stop signal) just before close() began, its own
    delete refused: the object stayed, the marker went."""
    import threading

    from kv_cache.storage.base import IOAborted
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(moto.url, "abortrace")
    store = S3Store(bucket, moto.url, "runs", part_bytes=5 * MIB, concurrency=1, workers=2, chunk_bytes=MIB)
    call, settle = store._call, store.settle_writes
    deleting, settling = threading.Event(), threading.Event()

    def put_then_abort(what, fn):
        if what.startswith("s3 write of"):
            call(what, fn)
            raise IOAborted(f"{what}: abandoned at the stop signal")
        if what.startswith("s3 delete of runs/"):
            deleting.set()
            settling.wait(10)
            time.sleep(0.1)  # close() is in its wait for the writes in flight, or past it
            raise IOAborted(f"{what}: abandoned at the stop signal")
        return call(what, fn)

    def settle_writes(*a):
        settling.set()
        return settle(*a)

    store._call, store.settle_writes = put_then_abort, settle_writes
    outcome = []

    def write():
        bufs = _bufs()
        try:
            store.write("k", 2 * MIB, bufs)
        except IOAborted as e:
            outcome.append(e)
        finally:
            bufs.close()

    t = threading.Thread(target=write)
    t.start()
    assert deleting.wait(10)
    store.close()
    t.join(10)
    assert outcome and _objects(moto.url, bucket) == [] and store.leftovers is None
