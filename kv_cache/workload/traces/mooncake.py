"""Mooncake FAST'25 JSON Lines: ``{"timestamp" ms, "input_length", "output_length", "hash_ids"}``.

Every row is a self-contained, sessionless request whose ``hash_ids`` cover its whole input in 512-token
blocks (``ceil(input_length / 512)`` ids, the last one possibly for a partial block).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ._common import Bad, Row, hash_list, parsed_jsonl, seconds, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceStats

BLOCK_TOKENS = 512


def _row(obj: dict) -> Row:
    arrival = seconds(obj, "timestamp", 0.001, default=None)
    inp = tokens(obj, "input_length")
    out = tokens(obj, "output_length")
    ids = hash_list(obj)
    if inp == 0:
        raise Bad("zero_input")
    return Row(None, 1, arrival, None, inp, inp, out, ids, BLOCK_TOKENS)


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    yield from parsed_jsonl(path, stats, _row)


def _keys(head: Head) -> bool:
    return bool((head.first_object_keys or frozenset()) & {"input_length", "hash_ids"})


FORMAT = register(TraceFormat(
    name="mooncake", summary="Mooncake JSONL (input_length, hash_ids)", read=read, block_tokens=512,
    sniff=(SniffRule(10, _keys),), options=("max_context_tokens",),
))
