"""The Redis tier's own RESP data path (storage/resp.py) against a real redis-server the tests start
(tests/servers.py): SET values sent from the stamped slots themselves, GET values received straight into
the worker's read buffer, and what the exchange does when a reply is not the one expected (a missing key,
a corrupted or short or long value, an error reply, a connection lost part way). Beside
test_remote_tiers.py, which covers the tier through the CLI; skipped, with the reason, without redis-py or
redis-server."""

from __future__ import annotations

import errno
import threading

import pytest
import servers

from kv_cache.storage import WorkerBuffers
from kv_cache.storage.base import DataCorruption, IOAborted

MIB = 1 << 20


def _need() -> None:
    pytest.importorskip("redis", reason="the redis tier needs redis-py (pip install -e '.[dev]')")
    why = servers.missing(servers.REDIS)
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def srv():
    _need()
    s = servers.start_redis()
    yield s
    s.stop()


@pytest.fixture
def raw(srv):
    import redis

    return redis.Redis.from_url(srv.url)


@pytest.fixture
def store(srv):
    from kv_cache.storage.kvstore import RedisStore

    s = RedisStore(srv.url, MIB, pipeline=3, workers=2)
    yield s
    s.close()


@pytest.fixture
def bufs():
    b = WorkerBuffers(MIB, 7, 0)
    yield b
    b.close()


class _StopAfter(threading.Event):
    """A stop event that turns set after `n` looks (deterministic: the store looks once per round trip)."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0


def test_values_go_out_from_the_write_buffer_and_land_in_the_read_buffer_in_order(store, bufs, monkeypatch):
    """No redis-py data command is used (its GET/SET/pipeline would raise here); every large buffer sent
    is the worker's own write buffer (no slot ring: a buffer made in the write would raise here); each
    chunk handed on is the read buffer itself, in order, trimmed to the entry."""
    from kv_cache.storage import resp

    def refuse(*a, **k):
        raise AssertionError("a data command went through redis-py")

    for name in ("get", "set", "pipeline"):
        monkeypatch.setattr(store._r, name, refuse)
    sent = []
    real_send = resp.Wire.send

    def spy(self, pieces):
        sent.extend(p for p in pieces if len(p) >= 4096)
        return real_send(self, pieces)

    monkeypatch.setattr(resp.Wire, "send", spy)
    from kv_cache.storage import buffers

    def no_buffers(*a, **k):
        raise AssertionError("the write made a buffer of its own")

    monkeypatch.setattr(buffers.WorkerBuffers, "__init__", no_buffers)
    nbytes = 7 * MIB + 5  # 8 chunk keys: three round trips of up to 3
    store.write("e", nbytes, bufs)
    assert len(sent) == 8 and all(isinstance(p, memoryview) and p.obj is bufs._write_mm for p in sent)
    seen = []

    def sink(i, mv):
        assert mv.obj is bufs._read_mm  # the worker's read buffer, not a client's copy
        seen.append((i, len(mv)))

    r = store.read("e", bufs, verify=True, on_chunk=sink)
    assert r.nbytes == nbytes and r.device_ns > 0
    assert seen == [(i, MIB) for i in range(7)] + [(7, 5)]
    assert "recv_into" in store.io_mode_reason and "recv_into" in store.remote_stats()["parsing"]


def test_a_key_wider_than_the_read_buffer_lands_a_worker_chunk_at_a_time(srv, bufs):
    from kv_cache.storage.kvstore import RedisStore

    s = RedisStore(srv.url, 4 * MIB, pipeline=2, workers=1)
    try:
        s.write("w", 10 * MIB, bufs)  # keys of 4, 4 and 2 MiB, each sent from the 1 MiB write buffer in pieces
        import redis

        r = redis.Redis.from_url(srv.url)
        assert [r.strlen(f"{s._base('w')}:{i}") for i in range(3)] == [4 * MIB, 4 * MIB, 2 * MIB]
        r.close()
        seen = []
        assert s.read("w", bufs, verify=True, on_chunk=lambda i, mv: seen.append(i)).nbytes == 10 * MIB
        assert seen == list(range(10))
    finally:
        s.close()


def test_a_write_whose_connection_is_lost_mid_round_trip_is_sent_again_whole(store, bufs, monkeypatch):
    """The values are stamped into the one write buffer as they are sent: a round trip lost after some of
    its pieces went out is stamped and sent again from its first chunk (the failover's retry), and every
    chunk reads back with its own stamps."""
    from kv_cache.storage import resp

    real_send = resp.Wire.send
    calls = [0]

    def flaky(self, pieces):
        calls[0] += 1
        if calls[0] == 6:  # inside the second round trip (chunks 3-5), after its first SET went out
            raise resp.WireLost("sending: the test cut the connection")
        return real_send(self, pieces)

    monkeypatch.setattr(resp.Wire, "send", flaky)
    store.write("f", 8 * MIB, bufs)
    assert store.stats.reconnects == 1 and store.stats.failover_retries == 1
    monkeypatch.setattr(resp.Wire, "send", real_send)
    assert store.read("f", bufs, verify=True).nbytes == 8 * MIB


def test_a_missing_key_mid_pipeline_is_eio_and_the_next_read_works(store, raw, bufs):
    store.write("a", 3 * MIB, bufs)
    store.write("b", 2 * MIB, bufs)
    raw.delete(f"{store._base('a')}:1")  # the middle key of one round trip
    with pytest.raises(OSError) as info:
        store.read("a", bufs, verify=True)
    assert not isinstance(info.value, DataCorruption) and info.value.errno == errno.EIO
    assert "gone from the server" in str(info.value)
    assert store.read("b", bufs, verify=True).nbytes == 2 * MIB  # the abandoned connection was replaced
    assert store.stats.reconnects == 0


def test_a_corrupted_value_is_a_verify_mismatch_and_a_short_one_corruption(store, raw, bufs):
    store.write("c", 3 * MIB, bufs)
    raw.setrange(f"{store._base('c')}:1", 5 * 4096, b"\xff" * 8)  # block 5 of key 1: its stamp
    with pytest.raises(DataCorruption, match=r"block 261 does not carry its stamp"):
        store.read("c", bufs, verify=True)
    assert store.read("c", bufs).nbytes == 3 * MIB  # without --verify the bytes are not looked at
    store.write("c", 3 * MIB, bufs)  # whole again
    assert store.read("c", bufs, verify=True).nbytes == 3 * MIB
    raw.set(f"{store._base('c')}:2", b"x" * 1000)
    with pytest.raises(DataCorruption, match="is short"):
        store.read("c", bufs, verify=True)
    store.write("d", MIB, bufs)
    raw.append(f"{store._base('d')}:0", b"tail")  # longer than written: the rest is read and dropped
    assert store.read("d", bufs, verify=True).nbytes == MIB
    assert store.read("d", bufs, verify=True).nbytes == MIB  # and the connection is in step


def test_an_error_reply_is_classified_as_before(store, raw, bufs):
    """A GET of a key of another type answers -WRONGTYPE: an EIO naming it; -OOM is ENOSPC (the tier full,
    test_remote_tiers.py), both through resp.py now."""
    store.write("t", MIB, bufs)
    k = f"{store._base('t')}:0"
    raw.delete(k)
    raw.rpush(k, b"x")
    with pytest.raises(OSError) as info:
        store.read("t", bufs)
    assert info.value.errno == errno.EIO and "WRONGTYPE" in str(info.value)


def test_oom_on_a_pipelined_set_is_the_tier_full_and_the_store_still_answers():
    _need()
    from kv_cache.storage.kvstore import RedisStore

    s = servers.start_redis(maxmemory="6mb")
    try:
        store = RedisStore(s.url, MIB, pipeline=4, workers=1)
        b = WorkerBuffers(MIB, 7, 0)
        store.write("small", MIB, b)
        with pytest.raises(OSError) as info:
            store.write("big", 16 * MIB, b)
        assert info.value.errno == errno.ENOSPC and "tier is full" in str(info.value)
        assert "OOM" in str(info.value)
        assert store.read("small", b, verify=True).nbytes == MIB
        store.close()
        b.close()
    finally:
        s.stop()


def test_a_stop_between_round_trips_counts_the_bytes_moved(store, bufs):
    with pytest.raises(IOAborted) as info:
        store.write("s", 7 * MIB, bufs, stop=_StopAfter(2))  # two round trips of 3 chunks, then the stop
    assert info.value.device_bytes == 6 * MIB and info.value.device_ns > 0
    assert "s" not in store
    store.write("s", 7 * MIB, bufs)
    with pytest.raises(IOAborted) as info:
        store.read("s", bufs, stop=_StopAfter(1))
    assert info.value.device_bytes == 3 * MIB and info.value.device_ns > 0


def test_a_connection_lost_mid_value_is_retried_within_the_failover_budget_and_counted(bufs):
    """The server killed while a 64 MiB value streams in (more than the kernel's socket buffers hold): the
    read sees the connection close part way, the round trip is sent again after backoffs (each counted)
    until the failover budget is spent, then EHOSTDOWN (the run stops); the next operation finds the
    budget spent and the server still gone at once."""
    _need()
    from kv_cache.storage.kvstore import RedisStore

    s = servers.start_redis()
    try:
        store = RedisStore(s.url, 64 * MIB, pipeline=1, workers=1, failover_s=0.3)
        store.write("big", 64 * MIB, bufs)
        got = []

        def kill_at_first(i, mv):
            got.append(i)
            if i == 0:
                s.proc.kill()
                s.proc.wait()

        with pytest.raises(OSError) as info:
            store.read("big", bufs, verify=True, on_chunk=kill_at_first)
        assert info.value.errno == errno.EHOSTDOWN and "connection to the server lost" in str(info.value)
        assert "failover budget (0.3 s" in str(info.value)
        stats = store.remote_stats()
        assert 0 < len(got) < 64 and stats["outages"] == 1 and stats["failover_gave_up"] == 1
        assert stats["lost_connections"] == stats["failover_retries"] + 1 > 1
        with pytest.raises(OSError) as info:
            store.read("big", bufs)
        assert info.value.errno == errno.EHOSTDOWN and store.remote_stats()["failover_gave_up"] == 2
        store.close()
    finally:
        s.stop()


def test_a_tls_server_round_trips_through_the_same_path():
    """rediss://: redis-py makes the TLS connection; the values go through its SSL socket (sendall per
    buffer: an SSL socket has no sendmsg) and are received into the read buffer the same way."""
    _need()
    if servers.shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test server's certificate)")
    from kv_cache.storage.kvstore import RedisStore

    s = servers.start_redis(tls=True)
    try:
        store = RedisStore(s.url, MIB, pipeline=3, workers=1)
        b = WorkerBuffers(MIB, 7, 0)
        store.write("e", 5 * MIB + 3, b)
        assert store.read("e", b, verify=True).nbytes == 5 * MIB + 3
        assert store._tls.wire.vector is False  # the SSL socket's path was the one taken
        rt = store.remote_stats()  # recorded as it is: TLS on, the certificate not verified (ssl_cert_reqs=none)
        assert rt["scheme"] == "rediss" and rt["endpoint"].startswith("rediss://")
        assert rt["tls"]["on"] is True and rt["tls"]["verify"] is False and rt["tls"]["cert_reqs"] == "none"
        store.close()
        b.close()
        from kv_cache.errors import StorageSetupError

        with pytest.raises(StorageSetupError) as info:  # verified against the system's CAs: a self-signed one fails
            RedisStore(s.url.replace("ssl_cert_reqs=none", "ssl_cert_reqs=required"), MIB, pipeline=3, workers=1)
        msg = str(info.value)
        assert "TLS certificate failed verification" in msg and "cannot be reached" not in msg, msg
    finally:
        s.stop()


def test_a_read_and_a_write_allocate_nothing_of_a_values_size(store, bufs):
    """redis-py allocated 16 MiB for an 8 MiB SET through hiredis (bytes of the memoryview, then the packed
    command) and 8 MiB per GET; the store's own path allocates only headers and key names."""
    import tracemalloc

    store.write("warm", 3 * MIB, bufs)
    store.read("warm", bufs, verify=True)  # this thread's slots and wire exist now
    tracemalloc.start()
    try:
        store.write("e", 12 * MIB, bufs)
        _, wrote = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        store.read("e", bufs, verify=True)
        _, read = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wrote < 256 * 1024 and read < 256 * 1024, (wrote, read)


def test_a_unix_socket_url_round_trips_and_compares_no_interface():
    """unix://PATH: the values go over the unix socket the same way; the tier names the socket (it showed
    ``redis://?:?/0``) and has no interface towards its server (it watched loopback, which the socket's
    traffic never crosses, and the audit graded the run SUSPECT at 0% of the tier's bytes received)."""
    _need()
    from kv_cache.host.netdev import NetCounter
    from kv_cache.storage.kvstore import RedisStore

    s = servers.start_redis(unix=True)
    try:
        store = RedisStore(s.url, MIB, pipeline=3, workers=1)
        b = WorkerBuffers(MIB, 7, 0)
        store.write("e", 5 * MIB + 3, b)
        assert store.read("e", b, verify=True).nbytes == 5 * MIB + 3
        assert store.cache_dir.startswith("unix://") and store.cache_dir.endswith("redis.sock?db=0")
        assert store.endpoint_host is None and NetCounter.for_host(store.endpoint_host) is None
        assert any("unix socket" in n for n in store.notes)
        store.close()
        b.close()
    finally:
        s.stop()
