"""Block-level views of a trace: its own block reuse, and the KV-cache entry keys a request covers."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Iterable, Sequence

from .model import TraceRequest

_MASK64 = (1 << 64) - 1


def block_reuse(hash_id_lists: Iterable[Sequence[Hashable] | TraceRequest | None]) -> float:
    """Fraction of all blocks (over all requests, in order) whose id was already seen in an EARLIER request.

    Accepts id sequences (hash ids, or the keys of ``kv_block_keys``), ``TraceRequest`` objects (their
    ``hash_ids``) or ``None`` (skipped). A block repeated inside one request is not a reuse. 0.0 if there
    is no block at all.
    """
    seen: set = set()
    total = 0
    hits = 0
    for ids in hash_id_lists:
        if isinstance(ids, TraceRequest):
            ids = ids.hash_ids
        if not ids:
            continue
        distinct = set(ids)
        if len(distinct) == len(ids):
            hits += len(ids) - len(distinct - seen)
        else:
            hits += sum(1 for x in ids if x in seen)
        total += len(ids)
        seen |= distinct
    return hits / total if total else 0.0


def _pack(ids: Sequence[int]) -> bytes:
    """Ids as 8 bytes each (mod 2**64), the same bytes for an id whatever the rest of the list holds."""
    try:
        return array("Q", ids).tobytes()
    except (OverflowError, TypeError):
        return array("Q", [int(x) & _MASK64 for x in ids]).tobytes()


def kv_block_keys(req: TraceRequest, kv_block_tokens: int, namespace: str = "") -> list[tuple[str, int]]:
    """Keys and token counts of the KV entries that ``req``'s full input occupies in a cache whose entries
    hold ``kv_block_tokens`` tokens: entry j covers tokens [j*kv, min(input, (j+1)*kv)), the last one
    holding the remainder. Keys are ``namespace`` + 32 hex digits and name the whole PREFIX up to the end
    of the entry, so equal prefixes give equal keys and a prefix difference changes every later key.

    With hash ids (trace block size ``bt``): the key of an entry ending at token e hashes the chain of ids
    of the blocks 0..b, b = the block holding token e-1 (equivalently, a running hash of the id sequence):

    - e is the end of block b (always when kv is a multiple of bt, or for the trace's own partial last
      block): key = that chain, so with kv == bt one key per hash id and the keys' reuse equals the ids';
    - e cuts block b (kv smaller than bt, or not a multiple of it): key = chain + the offset of e inside
      block b (the sub-blocks of one trace block are told apart by position, deterministically);
    - e lies beyond the last id (WEKA lists ids only for complete blocks, so up to bt-1 tail tokens have
      none): key = chain of all ids + the number of tokens past them. Two requests share such a key only
      if all their ids and their input length agree.

    Without hash ids: ids are derived from (session, token position): key = hash(session_id, e), so a
    session's growing history shares every complete entry with its earlier turns, while a partial last
    entry (ending at the context length) is not reused by the next, longer turn. A sessionless request
    keys by its own index (no reuse).
    """
    kv = int(kv_block_tokens)
    if kv <= 0:
        raise ValueError("kv_block_tokens must be positive")
    total = req.input_tokens
    if total <= 0:
        return []
    n_entries = -(-total // kv)
    out: list[tuple[str, int]] = []
    ids = req.hash_ids
    bt = req.block_tokens
    if ids and bt:
        raw = memoryview(_pack(ids))
        n = len(ids)
        covered = min(total, n * bt)
        h = hashlib.blake2b(b"ids\x00" + bt.to_bytes(4, "little"), digest_size=16)
        fed = 0
        for j in range(n_entries):
            e = min(total, (j + 1) * kv)
            if e <= covered:
                b = (e - 1) // bt
                if b + 1 > fed:
                    h.update(raw[fed * 8 : (b + 1) * 8])
                    fed = b + 1
                if e == min((b + 1) * bt, total):
                    key = h.hexdigest()
                else:
                    hc = h.copy()
                    hc.update(b"@" + (e - b * bt).to_bytes(8, "little"))
                    key = hc.hexdigest()
            else:
                if fed < n:
                    h.update(raw[fed * 8 :])
                    fed = n
                hc = h.copy()
                hc.update(b"+" + (e - covered).to_bytes(8, "little"))
                key = hc.hexdigest()
            out.append((namespace + key, e - j * kv))
        return out
    if req.session_id is not None:
        base = b"s\x00" + req.session_id.encode("utf-8", "surrogatepass")
    else:
        base = b"r\x00" + str(req.index).encode()
    seed = hashlib.blake2b(b"pos\x00" + len(base).to_bytes(4, "little") + base, digest_size=16)
    for j in range(n_entries):
        e = min(total, (j + 1) * kv)
        hc = seed.copy()
        hc.update(e.to_bytes(8, "little"))
        out.append((namespace + hc.hexdigest(), e - j * kv))
    return out
