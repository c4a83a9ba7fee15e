"""The storage tier as chunked keys in a Redis or Valkey server (RedisStore, pipelined SET/GET)."""

from __future__ import annotations

from kv_cache.storage.backends import BackendRequest, Option, register, remote_backend


def _open(request: BackendRequest):
    from kv_cache.storage.kvstore import RedisStore  # noqa: PLC0415  (redis-py only when this backend is chosen)

    t = request.tiers.remote
    return RedisStore(t.redis_url or "", request.storage.chunk_bytes, t.redis_pipeline, request.workers,
                      grace_s=request.storage.remote_grace_s, failover_s=request.storage.remote_failover_s)


BACKEND = register(remote_backend(
    "redis", "chunked keys in Redis/Valkey, pipelined SET/GET", _open,
    (Option("redis_url", "redis://host:port/db"), Option("chunk_bytes", "bytes per key"),
     Option("redis_pipeline", "chunk commands per round trip")),
    capacity="the server's maxmemory left"))
