"""The storage tier as chunked keys in a Redis or Valkey server (RedisStore, pipelined SET/GET)."""

from __future__ import annotations

from kv_cache.storage.backends import Backend, BackendRequest, Capabilities, Option, register
from kv_cache.storage.tiername import TierName


def _open(request: BackendRequest):
    from kv_cache.storage.kvstore import RedisStore  # noqa: PLC0415  (redis-py only when this backend is chosen)

    t = request.tiers.remote
    store = RedisStore(t.redis_url or "", request.storage.chunk_bytes, t.redis_pipeline, request.workers,
                       grace_s=request.storage.remote_grace_s, failover_s=request.storage.remote_failover_s)
    request.notes.extend(store.swept)
    request.notes.extend(store.notes)
    request.notes.append(f"storage tier: {store.run_dir} ({store.io_mode_reason})")
    return store


BACKEND = register(Backend(
    name="redis", tier=TierName.STORAGE, summary="chunked keys in Redis/Valkey, pipelined SET/GET",
    capabilities=Capabilities(verify=True), open=_open,
    selects=lambda tiers: tiers.remote.storage_backend == "redis", priority=20,
    options=(Option("redis_url", "redis://host:port/db"), Option("chunk_bytes", "bytes per key"),
             Option("redis_pipeline", "chunk commands per round trip"),
             Option("remote_grace_s", "seconds an operation may wait after the run's stop"),
             Option("remote_failover_s", "seconds a lost server is retried"),
             Option("storage_capacity_gb", "the tier's capacity (0: the server's maxmemory left)")),
))
