"""An HTTP proxy in front of the tests' S3 server (tests/servers.py start_moto) that fails chosen requests
the way a real server or network does: answers them with an error status (503 SlowDown, 429, 403), or
sends a ranged GET's head and half its body and then drops the connection. Which requests fail is
decided per request by a function of (method, headers, request number), so the tests are deterministic."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Callable

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
DENIED = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code></Error>'

# decide(method, headers, n) -> None (pass through), an HTTP status to answer, or "cut"
Decide = Callable[[str, dict, int], "int | str | None"]


class FaultProxy:
    """Forwards to 127.0.0.1:`upstream_port`; `decide` picks the requests that fail (module docstring).
    Counts the requests seen, the ranged GETs among them, and each kind of failure made."""

    def __init__(self, upstream_port: int, decide: Decide):
        self.decide = decide
        self.requests = self.ranged = self.cut = 0
        self.answered: dict[int, int] = {}
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                return self.wfile.write(body)

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                with lock:
                    outer.requests += 1
                    outer.ranged += self.command == "GET" and "Range" in self.headers
                    what = outer.decide(self.command, dict(self.headers), outer.requests)
                if isinstance(what, int):
                    with lock:
                        outer.answered[what] = outer.answered.get(what, 0) + 1
                    body = DENIED if what in (401, 403) else SLOW_DOWN
                    return self._reply(what, body, [("Content-Type", "application/xml")])
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                conn.request(self.command, self.path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                conn.close()
                if what != "cut":
                    return self._reply(resp.status, payload, resp.getheaders())
                with lock:
                    outer.cut += 1
                self.send_response(resp.status)  # the whole length announced, half of it sent, then gone
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                return None

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ranged_gets(action: int | str, every: int, first: int = 0) -> tuple[Decide, dict]:
    """A `decide` that fails every `every`-th ranged GET (counted from the first one after `first`
    ranged GETs) with `action`; the dict it returns counts the ranged GETs and those failed."""
    seen = {"ranged": 0, "failed": 0, "armed": True}

    def decide(method: str, headers: dict, n: int):
        if method != "GET" or "Range" not in headers or not seen["armed"]:
            return None
        seen["ranged"] += 1
        k = seen["ranged"] - first
        if k > 0 and k % every == 0:
            seen["failed"] += 1
            return action
        return None

    return decide, seen
