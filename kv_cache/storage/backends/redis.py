"""The storage tier as chunked keys in a Redis or Valkey server (RedisStore, pipelined SET/GET)."""

from __future__ import annotations

from kv_cache.settings.fields import Flag
from kv_cache.settings.run import REMOTE_GROUP, redacted
from kv_cache.storage.backends import BackendRequest, Option, register, remote_backend
from kv_cache.storage.remote import ring_bytes


def _open(request: BackendRequest):
    from kv_cache.storage.kvstore import RedisStore  # noqa: PLC0415  (redis-py only when this backend is chosen)

    t = request.tiers.remote
    return RedisStore(t.redis_url or "", request.storage.chunk_bytes, t.redis_pipeline, request.workers,
                      grace_s=request.storage.remote_grace_s, failover_s=request.storage.remote_failover_s)


BACKEND = register(remote_backend(
    "redis", "chunked keys in Redis/Valkey, pipelined SET/GET", _open,
    (Option("redis_url", "redis://host:port/db", None, Flag(
        "--redis-url", type=str, metavar="URL", group=REMOTE_GROUP,
        help="redis://[user:password@]host:port/db of the redis storage tier (Valkey too)."), owned=True),
     Option("chunk_bytes", "bytes per key"),
     Option("redis_pipeline", "chunk commands per round trip", 8, Flag(
         "--redis-pipeline", type=int, group=REMOTE_GROUP, help="Chunk SETs/GETs per pipelined round trip."),
         lambda v: f"--redis-pipeline must be >= 1, got {v}" if v < 1 else None)),
    capacity="the server's maxmemory left", choice="a Redis/Valkey server, --redis-url", order=2,
    needs=(("redis_url", "--storage-backend redis needs --redis-url (redis://host:port/db)"),),
    title="Redis/Valkey key requests to the server, over the network",
    # the probe's operation is a run worker's: an entry, `--redis-pipeline` chunk keys a round trip. One key a
    # round trip rose to 16-32 workers (writes 0.7 -> 1.7 GiB/s) where the run's pipelined workers did best
    # at 1-4 (0.72-0.89 GiB/s, flat to 32): one pipelined worker hides the round trips a probe thread waited on
    probe_entries=True, probe_op_chunks=lambda r: r.redis_pipeline,
    location=lambda r: (redacted(r.redis_url or ""), None),
    ring=lambda r, chunk: ring_bytes("redis", chunk, pipeline=r.redis_pipeline)))
