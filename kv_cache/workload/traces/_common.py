"""Helpers shared by the format readers: field validation, JSON Lines reading, the row tuple."""

from __future__ import annotations

import csv
import hashlib
import json
from array import array
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

from .model import TraceError, TraceRequest, TraceStats

# A parsed request before the source numbers it: TraceRequest's fields but ``index``, in its order and with
# its defaults (one definition of the fields; the source makes ``TraceRequest(index, *row)``).
_FIELDS = fields(TraceRequest)[1:]
Row = namedtuple("Row", [f.name for f in _FIELDS], defaults=[f.default for f in _FIELDS if f.default is not MISSING])


class Bad(Exception):
    """A malformed row; ``args[0]`` is the reason counted in ``TraceStats.skipped_reasons``."""


_MISSING = object()

# A token count above this is no real request (no model has a billion-token window): the row is rejected
# as absurd rather than holding a worker for the rest of the run (e.g. output_length 1e30).
MAX_TOKENS = 1_000_000_000


def tokens(row: dict, key: str, default: Any = _MISSING) -> int:
    """A non-negative integer token count (ints, integral floats and numeric strings are accepted)."""
    value = row.get(key, _MISSING)
    if value is _MISSING or value is None or value == "":
        if default is _MISSING:
            raise Bad(f"missing_field:{key}")
        return default
    return to_count(value, key)


def to_count(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise Bad(f"bad_value:{key}")
    if isinstance(value, int):
        out = value
    else:
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise Bad(f"bad_value:{key}") from None
        if f != f or f in (float("inf"), float("-inf")) or not f.is_integer():
            raise Bad(f"bad_value:{key}")
        out = int(f)
    if out < 0:
        raise Bad(f"negative_value:{key}")
    if out > MAX_TOKENS:
        raise Bad(f"absurd_value:{key}")
    return out


def seconds(row: dict, key: str, scale: float = 1.0, default: Any = _MISSING) -> float | None:
    """A non-negative finite time, multiplied by ``scale`` (0.001 for milliseconds)."""
    value = row.get(key, _MISSING)
    if value is _MISSING or value is None or value == "":
        if default is _MISSING:
            raise Bad(f"missing_field:{key}")
        return default
    if isinstance(value, bool):
        raise Bad(f"bad_value:{key}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise Bad(f"bad_value:{key}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise Bad(f"bad_value:{key}")
    if f < 0:
        raise Bad(f"negative_value:{key}")
    return f * scale


def hash_list(row: dict, key: str = "hash_ids") -> tuple[int, ...] | None:
    """The row's hash ids as a tuple of ints, ``None`` if absent; anything else is malformed."""
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise Bad(f"bad_value:{key}")
    try:
        array("q", value)  # C-speed check that every element is an integer
    except TypeError:
        raise Bad(f"bad_value:{key}") from None
    except OverflowError:  # 64-bit unsigned ids (e.g. Bailian SipHash): check element by element
        if not all(type(x) is int for x in value):
            raise Bad(f"bad_value:{key}") from None
    return tuple(value)


def iter_jsonl(path: Path, stats: TraceStats) -> Iterator[dict]:
    """Stream the JSON objects of a JSON Lines file; blank lines are ignored, bad lines counted."""
    with open(path, "rb") as fp:
        first = True
        for line in fp:
            if first:
                line = line.removeprefix(b"\xef\xbb\xbf")
                first = False
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                stats.skip("bad_json")
                continue
            if not isinstance(obj, dict):
                stats.skip("not_an_object")
                continue
            yield obj


T = TypeVar("T")


def parsed_jsonl(path: Path, stats: TraceStats, parse: Callable[[dict], T]) -> Iterator[T]:
    """`parse` of each JSON object of a JSON Lines file; a row it rejects (`Bad`) is skipped for its reason."""
    for obj in iter_jsonl(path, stats):
        try:
            item = parse(obj)
        except Bad as exc:
            stats.skip(exc.args[0])
            continue
        yield item


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def new_tokens_full_context(
    input_tokens: int,
    prev_input: int,
    prev_output: int,
    ids: Sequence[int] | None,
    prev_ids: Sequence[int] | None,
    block_tokens: int | None,
) -> int:
    """``new_tokens`` of a full-context row (WEKA, Bailian, BurstGPT sessions) given the previous turn.

    If this request extends the previous one (its input is at least the previous input and, when both have
    hash ids, all of the previous ids but the last -- possibly partial -- block are a prefix of this
    request's ids), the previous context (input + output) is taken as retained and the rest is new:
    ``input - min(input, prev_input + prev_output)``. Otherwise the history was rewritten (compaction,
    truncation): only the shared hash-id prefix is retained (nothing without hash ids).
    """
    extends = input_tokens >= prev_input
    shared = 0
    if ids is not None and prev_ids is not None and block_tokens:
        m = max(0, len(prev_ids) - 1)
        if len(ids) >= m and tuple(ids[:m]) == tuple(prev_ids[:m]):
            shared = m
        else:
            shared = common_prefix(ids, prev_ids)
            extends = False
    if extends:
        return input_tokens - min(input_tokens, prev_input + prev_output)
    return max(0, input_tokens - min(input_tokens, shared * (block_tokens or 0)))


def synthetic_id(*parts: object) -> int:
    """A deterministic 62-bit id with bit 62 set, so it never equals a trace's own (small) ids."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 62) - 1)) | (1 << 62)


class SessionLimit:
    """Admit rows of at most ``limit`` distinct sessions (0 = no limit); sessionless rows always pass."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, int(limit))
        self.seen: set[str] = set()

    def admit(self, session_id: str | None) -> bool:
        if not self.limit or session_id is None or session_id in self.seen:
            return True
        if len(self.seen) >= self.limit:
            return False
        self.seen.add(session_id)
        return True


def csv_rows(path: Path, refuse: Callable[[list[str]], str | None]) -> Iterator[dict[str, str | None]]:
    """A CSV trace's non-blank rows as {header name: stripped field, None past a short row's end}; the names
    stripped, a BOM removed, blank lines before the header skipped. An empty (or blank) file, or a header
    `refuse(names)` returns a reason for, is a TraceError."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fp:
        reader = csv.reader(fp)
        # (blank lines before the header skipped, as detection's head skips them: formats.Head.text)
        header = next((fields for fields in reader if any(f.strip().strip("\ufeff") for f in fields)), None)
        if header is None:
            raise TraceError(path, "empty CSV file")
        names = [h.strip().lstrip("\ufeff") for h in header]
        reason = refuse(names)
        if reason:
            raise TraceError(path, reason)
        for fields in reader:
            if fields and any(f.strip() for f in fields):
                yield {name: (fields[i].strip() if i < len(fields) else None) for i, name in enumerate(names)}
