"""A stopped multipart write counts only the parts that crossed the wire: parts queued behind the ones in
flight and cancelled by the abort were counted as sent, a small overcount against the interface's bytes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("botocore")

from kv_cache.storage.remote import RemoteStats, RunDeadline  # noqa: E402
from kv_cache.storage.s3_multipart import Upload  # noqa: E402

MIB = 1 << 20


class _Client:
    """upload_part blocks until released (so later parts stay queued); counts what it was given."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sent: list[int] = []
        self.aborted = 0

    def upload_part(self, *, Body, PartNumber, **_):  # noqa: N803  (botocore's names)
        self.release.wait(30)
        self.sent.append(len(Body))
        return {"ETag": f"e{PartNumber}"}

    def abort_multipart_upload(self, **_):
        self.aborted += 1


def test_abort_returns_the_bytes_of_the_parts_it_cancelled_before_they_were_sent():
    client = _Client()
    pool = ThreadPoolExecutor(1)  # one part in flight at a time: the others wait in the queue
    owner = SimpleNamespace(concurrency=4, pool=pool, client=client, bucket="b", deadline=RunDeadline(),
                            stats=RemoteStats(), call=lambda what, fn, *a, **k: fn(*a, **k),
                            attempts=lambda what, fn, *a, **k: fn(*a, **k))
    up = Upload(owner, "obj", "id")
    body = memoryview(bytearray(3 * MIB))
    for n in (MIB, 2 * MIB, 3 * MIB):
        up.send(body[:n])
    timer = threading.Timer(0.2, client.release.set)  # lets the part under way finish during the abort
    timer.start()
    try:
        unsent = up.abort()
    finally:
        timer.cancel()
        client.release.set()
        pool.shutdown()
    assert client.sent == [MIB]  # only the first part reached the server
    assert unsent == 5 * MIB and client.aborted == 1
