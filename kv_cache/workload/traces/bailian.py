"""Alibaba Bailian (Qwen) usage traces, JSON Lines.

``{"chat_id", "parent_chat_id" (-1 = session root), "timestamp" (s), "input_length", "output_length",
"type", "turn", "hash_ids"}``. Every row is a FULL-context request (a follow-up's ``input_length`` counts
the retained history plus the new text, and its ``hash_ids`` -- 16-token blocks -- cover that whole span).

Session = the root chat id, found by following ``parent_chat_id`` links through the rows seen so far (a
parent that is not in the trace, e.g. before its window, is taken as the root). ``turn`` comes from the
row's ``turn`` field (default 1). ``new_tokens`` compares the row with its parent: if it extends the
parent's context (input >= parent input and, with hash ids, the parent's ids but the last are a prefix),
``new = input - min(input, parent_input + parent_output)``; otherwise the history was rewritten and the
whole input counts as new. To stay streamable the reader remembers, per chat id, only its root, its token
counts and a digest of its hash-id prefix (at most ``MAX_CHATS`` chat ids, oldest forgotten first).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

from ._common import Bad, Row, SessionLimit, hash_list, parsed_jsonl, seconds, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceStats

BLOCK_TOKENS = 16
MAX_CHATS = 1 << 21


def _digest(ids: Sequence[int]) -> bytes:
    try:
        raw = array("Q", ids).tobytes()
    except (OverflowError, TypeError):
        raw = array("Q", [x & 0xFFFFFFFFFFFFFFFF for x in ids]).tobytes()
    return hashlib.blake2b(raw, digest_size=16).digest()


def _chat_key(value: object, field: str) -> str:
    if value is None or value == "" or isinstance(value, (dict, list, bool, float)):
        raise Bad(f"missing_field:{field}" if value in (None, "") else f"bad_value:{field}")
    return str(value)


def _fields(obj: dict) -> tuple[str, str | None, float | None, int, int, int, tuple[int, ...] | None]:
    """(chat, parent or None, arrival, input, output, turn, hash ids) of one row."""
    chat = _chat_key(obj.get("chat_id"), "chat_id")
    parent_raw = obj.get("parent_chat_id", -1)
    parent = None if parent_raw in (-1, "-1", None, "") else _chat_key(parent_raw, "parent_chat_id")
    arrival = seconds(obj, "timestamp", 1.0, default=None)
    inp = tokens(obj, "input_length")
    out = tokens(obj, "output_length")
    turn = tokens(obj, "turn", default=1) or 1
    ids = hash_list(obj)
    if inp == 0:
        raise Bad("zero_input")
    return chat, parent, arrival, inp, out, turn, ids


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    # chat id -> (root, input, output, len(ids) - 1 or -1, digest of ids[:-1])
    chats: dict[str, tuple[str, int, int, int, bytes]] = {}
    limit = SessionLimit(opts.max_conversations)
    for chat, parent, arrival, inp, out, turn, ids in parsed_jsonl(path, stats, _fields):
        info = chats.get(parent) if parent is not None else None
        root = chat if parent is None else (info[0] if info is not None else parent)
        if not limit.admit(root):
            stats.skip("beyond_max_conversations", malformed=False)
            continue
        new = inp
        if info is not None:
            _, p_in, p_out, p_m, p_digest = info
            extends = inp >= p_in
            if extends and ids is not None and p_m >= 0:
                extends = len(ids) >= p_m and _digest(ids[:p_m]) == p_digest
            if extends:
                new = inp - min(inp, p_in + p_out)
        if ids is not None and ids:
            m = len(ids) - 1
            entry = (root, inp, out, m, _digest(ids[:m]))
        else:
            entry = (root, inp, out, -1, b"")
        if len(chats) >= MAX_CHATS and chat not in chats:
            del chats[next(iter(chats))]
        chats[chat] = entry
        yield Row(root, turn, arrival, None, inp, new, out, ids, BLOCK_TOKENS)


def _keys(head: Head) -> bool:
    return bool((head.first_object_keys or frozenset()) & {"chat_id", "parent_chat_id"})


FORMAT = register(TraceFormat(
    name="bailian", summary="Bailian JSONL (chat_id, parent_chat_id)", read=read, block_tokens=BLOCK_TOKENS,
    sessions=True, sniff=(SniffRule(30, _keys),), options=("max_conversations", "max_context_tokens"),
))
