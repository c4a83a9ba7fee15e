"""The S3 tier against a real S3 server: Ceph's gateway (Debian's radosgw 16.2) on a one-node cluster the
tests start (tests/servers.py start_rgw: ceph-mon, one ceph-osd on memstore, radosgw, all on 127.0.0.1).
moto (tests/test_remote_tiers.py, test_remote_faults.py) stays for the fast cases; here run the round trip
with --verify and the fault cases on the real thing: the gateway frozen mid-window (SIGSTOP), the cluster
under it stalled (SIGSTOP of the OSD), Ctrl-C with a frozen gateway, the gateway killed, a failover (killed,
then started again on its port with the objects kept), and the multipart uploads a run leaves.

Skipped, with the reason, where the Ceph binaries are not installed (CI installs only redis-server: the
Debian packages take about 300 s, see benchmarks/rgw_suite.sh, which installs them and runs this file).
KV_CACHE_RGW=1 makes a missing or failed cluster an error instead; KV_CACHE_RGW=0 skips this file.

As in test_remote_faults.py, no test asserts a time, a rate or a count that depends on scheduling."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time

import pytest
import servers
from test_remote_faults import GUARD_S
from test_remote_tiers import CREDS, MIB, _bufs, _cmd, _dead_pid, _env, _marker, _need_s3, _round_trip

WANT = os.environ.get("KV_CACHE_RGW", "")


@pytest.fixture(scope="module")
def rgw():
    if WANT == "0":
        pytest.skip("KV_CACHE_RGW=0")
    try:
        _need_s3()
    except pytest.skip.Exception:
        if WANT == "1":
            raise RuntimeError("KV_CACHE_RGW=1: obstore or boto3 is not installed") from None
        raise
    why = servers.missing(servers.RGW)
    if why:
        if WANT == "1":
            raise RuntimeError(f"KV_CACHE_RGW=1: {why}")
        pytest.skip(why)
    cluster = servers.start_rgw()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    for k, v in CREDS.items():  # the keys of the cluster's S3 user (start_rgw), for the stores made here
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


@pytest.fixture
def gateway(rgw):
    """The cluster, whole again after each test: the OSD and the gateway woken, a gateway killed started."""
    yield rgw
    for p in (rgw.osd, rgw.proc):
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
    if rgw.proc.poll() is not None:
        rgw.restart_gateway()


def _client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _bucket(url: str, name: str) -> str:
    _client(url).create_bucket(Bucket=name)
    return name


def _objects(url: str, bucket: str) -> list[str]:
    return [o["Key"] for o in _client(url).list_objects_v2(Bucket=bucket).get("Contents", [])]


def _uploads(url: str, bucket: str) -> list[str]:
    return [u["Key"] for u in _client(url).list_multipart_uploads(Bucket=bucket).get("Uploads") or []]


def _tier(srv, bucket: str) -> list[str]:
    return ["--storage-backend", "s3", "--s3-endpoint", srv.url, "--s3-bucket", _bucket(srv.url, bucket),
            "--s3-part-mb", "5"]


def _writing(proc: subprocess.Popen, srv, bucket: str) -> None:
    """Until the run has stored a few objects (its window is open and it is writing)."""
    while len(_objects(srv.url, bucket)) < 3:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)


def _results(tmp_path) -> dict:
    return json.loads((tmp_path / "r.json").read_text())


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("concurrency", [1, 3])
def test_rgw_round_trip_with_verify_and_close_deletes_only_its_objects(gateway, concurrency):
    """Entries of none, part of one, one and many parts (multipart), written, read with --verify, moved to
    RAM and back, replaced; close deletes the run's objects and marker and leaves a foreign object."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(gateway.url, f"rt{concurrency}")
    _client(gateway.url).put_object(Bucket=bucket, Key="runs/someone-elses.bin", Body=b"x")
    store = S3Store(bucket, gateway.url, "runs", part_bytes=5 * MIB, concurrency=concurrency, workers=2,
                    chunk_bytes=MIB)
    bufs = _bufs()
    _round_trip(store, bufs)
    big = 3 * len(store._ring().slots) * MIB  # the ring of slots reused inside one entry
    store.write("ring", big, bufs)
    assert store.read("ring", bufs, verify=True).nbytes == big
    assert any(k.endswith("/.kv-cache-run") for k in _objects(gateway.url, bucket))
    store.close()
    assert _objects(gateway.url, bucket) == ["runs/someone-elses.bin"]
    assert _uploads(gateway.url, bucket) == []
    bufs.close()


def test_rgw_a_corrupted_object_is_caught_by_verify(gateway):
    from kv_cache.storage.base import DataCorruption
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(gateway.url, "corrupt")
    store = S3Store(bucket, gateway.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB)
    bufs = _bufs()
    store.write("e", 6 * MIB, bufs)
    _client(gateway.url).put_object(Bucket=bucket, Key=store._object("e"), Body=b"\0" * (6 * MIB))
    with pytest.raises(DataCorruption) as info:
        store.read("e", bufs, verify=True)
    assert str(info.value).startswith("s3: entry 'e' block ")
    store.close()
    bufs.close()


def test_rgw_cli_run_verifies_and_leaves_nothing(gateway, tmp_path):
    proc = subprocess.run(_cmd(tmp_path, *_tier(gateway, "cli"), "--verify", "--storage-capacity-gb", "0.05"),
                          capture_output=True, text=True, timeout=GUARD_S, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _results(tmp_path)["measurement"]
    assert m["tier_backends"]["storage"] == "s3" and m["storage_errors_total"] == 0
    assert "Integrity: OK" in proc.stdout and "S3 object requests" in proc.stdout
    net = m["remote_tier"]["network"]
    assert net["interface"] == "lo" and net["bytes_received"] >= net["tool_bytes_read"] + net["tool_bytes_written"] > 0
    assert _objects(gateway.url, "cli") == [] and _uploads(gateway.url, "cli") == []


# ----------------------------------------------------------------------------- faults
@pytest.mark.parametrize("frozen", ["gateway", "osd"])
def test_rgw_frozen_mid_window_ends_the_run_at_the_grace_with_its_results(gateway, frozen, tmp_path):
    """SIGSTOP of radosgw (a frozen server), or of the OSD under it (a stalled cluster: the gateway takes
    the requests and waits on RADOS): every operation waiting is abandoned at the window's end + the grace,
    counted as the server stopped answering (exit 3), the results written and the leftovers reported with
    the command that removes them. Woken again, the next run on the bucket sweeps what was left, multipart
    uploads too."""
    from kv_cache.storage.s3 import S3Store

    bucket = f"frozen-{frozen}"
    proc = subprocess.Popen(_cmd(tmp_path, *_tier(gateway, bucket), "--remote-grace-s", "1", duration=3),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    victim = gateway.proc if frozen == "gateway" else gateway.osd
    try:
        _writing(proc, gateway, bucket)
        victim.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        out, err = proc.communicate(timeout=GUARD_S)
        took = time.monotonic() - frozen_at
    finally:
        victim.send_signal(signal.SIGCONT)
    assert proc.returncode == 3, err[-3000:]
    rt = _results(tmp_path)["measurement"]["remote_tier"]
    print(f"[rgw] {frozen} frozen in a 3 s window, grace 1 s: exit 3 {took:.1f} s after SIGSTOP, "
          f"{rt['stopped_answering']} operation(s) stopped answering")
    assert rt["stopped_answering"] > 0 and rt["abandoned_at_stop_signal"] == 0
    assert "ETIMEDOUT" in err and "the server stopped answering" in err and "Traceback" not in err
    assert "the next run on this" in err and "aws s3 rm" in err
    store = S3Store(bucket, gateway.url, "", part_bytes=5 * MIB, workers=1, chunk_bytes=MIB)
    assert len(store.swept) == 1 and "is gone" in store.swept[0], store.swept
    store.close()
    assert _objects(gateway.url, bucket) == [] and _uploads(gateway.url, bucket) == []


def test_rgw_ctrl_c_with_a_frozen_gateway_is_honoured_at_once(gateway, tmp_path):
    """A grace of 600 s: only the stop signal can end the waits on the frozen gateway before the guard."""
    proc = subprocess.Popen(_cmd(tmp_path, *_tier(gateway, "ctrlc"), "--remote-grace-s", "600", "--io-workers", "4",
                                 duration=600),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _writing(proc, gateway, "ctrlc")
        gateway.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=GUARD_S)
        took = time.monotonic() - sent
    finally:
        gateway.proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 130, err[-3000:]
    print(f"[rgw] Ctrl-C with the gateway frozen: exit 130 {took:.1f} s after SIGINT")
    m = _results(tmp_path)["measurement"]
    assert m["stop_reason"] == "interrupted" and m["remote_tier"]["stopped_answering"] == 0
    assert "Traceback" not in err


def test_rgw_a_gateway_killed_mid_run_stops_it_with_exit_3_and_results(gateway, tmp_path):
    """kill -9 of radosgw, not started again: retried within the failover budget (1 s), then EHOSTDOWN."""
    proc = subprocess.Popen(_cmd(tmp_path, *_tier(gateway, "lost"), "--remote-failover-s", "1", duration=30),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    _writing(proc, gateway, "lost")
    gateway.proc.kill()
    gateway.proc.wait()
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 3, err[-3000:]
    m = _results(tmp_path)["measurement"]
    assert m["stop_reason"] == "storage error"
    rt = m["remote_tier"]
    assert rt["lost_connections"] > 0 and rt["failover_retries"] > 0 and rt["failover_gave_up"] > 0
    assert "EHOSTDOWN" in err and "failover budget" in err and "Traceback" not in err
    print(f"[rgw] gateway killed: exit 3, {rt['lost_connections']} lost connection(s), "
          f"{rt['failover_retries']} retries")


def test_rgw_a_failover_is_ridden_through_and_counted(gateway, tmp_path):
    """kill -9 of radosgw mid-window and a gateway started again on its port 2 s later, the objects kept in
    the cluster (a load balancer's next gateway): the run rides through it (exit 0), its lost requests sent
    again after backoffs, the outage counted, and it passes --verify (no entry lost or torn)."""
    proc = subprocess.Popen(_cmd(tmp_path, *_tier(gateway, "failover"), "--verify", duration=6),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    _writing(proc, gateway, "failover")
    gateway.proc.kill()
    gateway.proc.wait()
    time.sleep(2)
    gateway.restart_gateway()
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err[-3000:]
    m = _results(tmp_path)["measurement"]
    rt = m["remote_tier"]
    assert rt["outages"] >= 1 and rt["failover_retries"] > 0 and rt["failover_gave_up"] == 0
    assert rt["longest_outage_s"] > 0 and rt["stopped_answering"] == 0
    assert m["storage_errors_total"] == 0 and "Integrity: OK" in out
    print(f"[rgw] failover (killed, a gateway again 2 s later): exit 0, {rt['outages']} outage(s), "
          f"{rt['failover_retries']} retries, longest outage {rt['longest_outage_s']:.2f} s, --verify clean")
    assert _objects(gateway.url, "failover") == [] and _uploads(gateway.url, "failover") == []


# ----------------------------------------------------------------------------- multipart uploads left behind
def test_rgw_close_aborts_the_runs_unfinished_multipart_uploads_and_no_others(gateway):
    """An upload under the run's own prefix that no write finished (a part thread left on a frozen
    server) is aborted at close; another prefix's is left."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(gateway.url, "uploads-close")
    c = _client(gateway.url)
    store = S3Store(bucket, gateway.url, "u", part_bytes=5 * MIB, workers=1, chunk_bytes=MIB)
    for key in (f"{store.run_prefix}stuck.kv", "elsewhere/e.kv"):
        up = c.create_multipart_upload(Bucket=bucket, Key=key)
        c.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"p" * (5 * MIB))
    store.close()
    assert store.leftovers is None
    assert _uploads(gateway.url, bucket) == ["elsewhere/e.kv"]


def test_rgw_sweep_aborts_a_dead_runs_incomplete_multipart_uploads(gateway):
    """A run killed mid-write leaves an incomplete upload no listing of objects shows; the next run's sweep
    aborts the dead run's and leaves another host's."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(gateway.url, "uploads-sweep")
    c = _client(gateway.url)
    dead = f"u/kv-cache-run-20250101-000000-{_dead_pid()}-abcd"
    other = "u/kv-cache-run-20250101-000000-1-beef"
    for run, marker in ((dead, _marker(_dead_pid())), (other, _marker(1, "another-host"))):
        c.put_object(Bucket=bucket, Key=f"{run}/.kv-cache-run", Body=marker)
        up = c.create_multipart_upload(Bucket=bucket, Key=f"{run}/e.kv")
        c.upload_part(Bucket=bucket, Key=f"{run}/e.kv", UploadId=up["UploadId"], PartNumber=1, Body=b"p" * (5 * MIB))
    store = S3Store(bucket, gateway.url, "u", part_bytes=5 * MIB, workers=1, chunk_bytes=MIB)
    assert len(store.swept) == 1 and "1 incomplete multipart upload(s) aborted" in store.swept[0], store.swept
    store.close()
    assert _uploads(gateway.url, bucket) == [f"{other}/e.kv"]


def test_rgw_a_write_whose_parts_fail_leaves_no_upload(gateway):
    """The gateway killed under a multipart write: the write fails (EHOSTDOWN once the failover budget is
    spent) and, the gateway back, its upload is gone by the store's close: nothing billed is left."""
    from kv_cache.storage.s3 import S3Store

    bucket = _bucket(gateway.url, "uploads-fail")
    store = S3Store(bucket, gateway.url, "", part_bytes=5 * MIB, concurrency=2, workers=1, chunk_bytes=MIB,
                    failover_s=0.3)
    bufs = _bufs()
    store.write("first", 6 * MIB, bufs)
    gateway.proc.kill()
    gateway.proc.wait()
    with pytest.raises(OSError) as info:
        store.write("e", 12 * MIB, bufs)
    assert info.value.errno == errno.EHOSTDOWN, info.value
    gateway.restart_gateway()
    store.close()
    bufs.close()
    assert _objects(gateway.url, bucket) == [] and _uploads(gateway.url, bucket) == []
