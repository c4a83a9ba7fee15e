"""--io-trace-log: every tier a size-only NullStore; the cache logs each operation instead of doing it."""

from __future__ import annotations

from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.tracelog import NullStore


def _open(request: BackendRequest) -> NullStore:
    return NullStore(request.tier.legacy)


BACKEND = register(Backend(
    name="tracelog", tier=None, summary="no I/O: sizes only, every operation written to the trace log",
    capabilities=Capabilities(), open=_open,
    options=(Option("io_trace_log", "the log's path (.zst: compressed)"),),
))
