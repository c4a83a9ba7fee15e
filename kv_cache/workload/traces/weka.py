"""WEKA kv-cache-tester agentic-coding traces: one JSON object per conversation.

A trace is a single ``.json`` file or a directory of them (all ``*.json`` in sorted name order, read one
file at a time). Per file: ``id``, ``block_size`` (64), ``hash_id_scope`` ("local"), ``requests``; a
request (``type`` "n"/"s") has ``t`` (s since the conversation start), ``in`` (the FULL context), ``out``,
``hash_ids`` (one id per COMPLETE 64-token block of the input: ``floor(in / 64)`` ids), ``input_types``,
``think_time``; a ``type`` "subagent" entry has ``agent_id``, ``duration_ms``, ``t`` and its own
``requests``.

What the data says, and what this reader does with it:

- ``think_time`` is the client pause BEFORE a request: on the published corpus it matches
  ``t[i] - (t[i-1] + api_time[i-1])`` (median error 0.3 s; as a pause after the request: 10 s). So a
  request's ``think_time_s`` (pause AFTER it) is the NEXT request's ``think_time`` in the same session
  (``None`` for the last one or where the next one has none).
- A sub-agent's ``t`` is its COMPLETION time: ``t - duration_ms / 1000`` falls right after the end of the
  parent request that launched it, and its requests' ``t`` count from that start. Sub-agents are flattened
  into CHILD sessions ``"<conversation id>/<agent_id>"`` (own turn numbers and think times, ``kind``
  "subagent"), because a sub-agent has its own context (its own system prompt and history) and runs
  concurrently with its siblings while the parent waits. All requests of a file are emitted in time order
  (parent and sub-agents merged by absolute time).
- ``arrival_s`` is the conversation-relative time: every conversation of a directory starts at 0, so
  ``arrival_s`` is not monotone across files (a replayer offsets each conversation's start as it likes).
- Hash ids are conversation-scoped ("local"; sub-agents share the parent's namespace), so they are
  namespaced per file: ``(file index << 40) | id``, with the file's index in the directory's sorted order
  (0 for a single file).
- ``kind`` of a parent request is the class of the pause after it: "agentic" when the next request carries
  a tool result, "human" when it carries only user text, "request" for the last one.
- ``new_tokens``: see ``_common.new_tokens_full_context`` (previous request of the same session).

A file that cannot be read or is not a conversation object is skipped and counted (``bad_file``) in a
directory, and is a TraceError as a single-file trace.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ._common import Bad, Row, hash_list, new_tokens_full_context, seconds, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceError, TraceStats

DEFAULT_BLOCK_TOKENS = 64
ID_BITS = 40
_ID_MASK = (1 << ID_BITS) - 1


def conversation_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.glob("*.json") if p.is_file())
    return [path]


def _load(path: Path) -> dict:
    try:
        with open(path, "rb") as fp:
            obj = json.load(fp)
    except OSError as exc:
        raise Bad(f"unreadable ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError):
        raise Bad("bad_json") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("requests"), list):
        raise Bad("not a conversation object with 'requests'")
    return obj


def _namespaced(ids: tuple[int, ...], ns: int) -> tuple[int, ...]:
    """``(ns | (id & (2**40 - 1)))`` for every id, vectorised."""
    try:
        arr = np.frombuffer(array("q", ids), dtype=np.int64)
    except OverflowError:
        return tuple(ns | (x & _ID_MASK) for x in ids)
    return tuple(((arr & _ID_MASK) | ns).tolist())


class _Rec:
    __slots__ = ("t", "inp", "out", "ids", "think_before", "types", "session", "sub", "seq")

    def __init__(self, t, inp, out, ids, think_before, types, session, sub, seq) -> None:
        self.t, self.inp, self.out, self.ids = t, inp, out, ids
        self.think_before, self.types = think_before, types
        self.session, self.sub, self.seq = session, sub, seq


def _records(reqs: list, start: float, session: str, sub: bool, ns: int, stats: TraceStats, seq: list[int]):
    out: list[_Rec] = []
    for r in reqs:
        if not isinstance(r, dict):
            stats.skip("not_an_object")
            continue
        if r.get("type") == "subagent":  # nested sub-agents are not in the format; skip, counted
            stats.skip("nested_subagent")
            continue
        try:
            t = seconds(r, "t")
            inp = tokens(r, "in")
            o = tokens(r, "out")
            ids = hash_list(r)
            think = seconds(r, "think_time", default=None)
            if inp == 0:
                raise Bad("zero_input")
        except Bad as exc:
            stats.skip(exc.args[0])
            continue
        if ids is not None:
            ids = _namespaced(ids, ns)
        types = r.get("input_types")
        seq[0] += 1
        out.append(_Rec(start + t, inp, o, ids, think, types if isinstance(types, list) else [], session, sub,
                        seq[0]))
    return out


def _conversation_rows(obj: dict, file_index: int, stem: str, stats: TraceStats) -> list[tuple[float, int, Row]]:
    bs = obj.get("block_size")
    block = bs if type(bs) is int and bs > 0 else DEFAULT_BLOCK_TOKENS
    conv = str(obj.get("id") or stem)
    ns = file_index << ID_BITS
    seq = [0]
    streams: list[list[_Rec]] = []
    parent_reqs = [r for r in obj["requests"] if not (isinstance(r, dict) and r.get("type") == "subagent")]
    streams.append(_records(parent_reqs, 0.0, conv, False, ns, stats, seq))
    n_sub = 0
    for r in obj["requests"]:
        if not (isinstance(r, dict) and r.get("type") == "subagent"):
            continue
        n_sub += 1
        try:
            end = seconds(r, "t")
            dur = seconds(r, "duration_ms", 0.001, default=0.0)
            reqs = r.get("requests")
            if not isinstance(reqs, list):
                raise Bad("bad_value:requests")
        except Bad as exc:
            stats.skip(f"subagent_{exc.args[0]}")
            continue
        stats.subagents += 1
        agent = str(r.get("agent_id") or f"sub{n_sub}")
        streams.append(_records(reqs, max(0.0, end - dur), f"{conv}/{agent}", True, ns, stats, seq))

    rows: list[tuple[float, int, Row]] = []
    for recs in streams:
        for i, rec in enumerate(recs):
            nxt = recs[i + 1] if i + 1 < len(recs) else None
            if i == 0:
                new = rec.inp
            else:
                prev = recs[i - 1]
                new = new_tokens_full_context(rec.inp, prev.inp, prev.out, rec.ids, prev.ids, block)
            if rec.sub:
                kind = "subagent"
            elif nxt is None:
                kind = "request"
            else:
                kind = "agentic" if "tool_result" in nxt.types else "human"
            think_after = nxt.think_before if nxt is not None else None
            row = Row(rec.session, i + 1, rec.t, think_after, rec.inp, new, rec.out, rec.ids, block, kind)
            rows.append((rec.t, rec.seq, row))
    rows.sort(key=lambda x: (x[0], x[1]))
    return rows


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    files = conversation_files(path)
    single = not path.is_dir()
    done = 0
    for file_index, f in enumerate(files):
        if opts.max_conversations and done >= opts.max_conversations:
            break
        try:
            obj = _load(f)
        except Bad as exc:
            if single:
                raise TraceError(f, exc.args[0]) from None
            stats.skip("bad_file")
            continue
        stats.files += 1
        done += 1
        for _, _, row in _conversation_rows(obj, file_index, f.stem, stats):
            yield row


FULL_PARSE_LIMIT = 64 << 20  # a JSON object file up to this size is parsed whole to find its requests


def _directory(head: Head) -> bool:
    if head.kind != "dir":
        return False
    files = conversation_files(head.path)
    if not files:
        raise TraceError(head.path, "directory holds no *.json conversation files")
    for f in files[:8]:
        try:
            with open(f, "rb") as fp:
                start = fp.read(64 << 10).decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
        except OSError as exc:
            raise TraceError(f, f"cannot read ({exc.strerror or exc})") from None
        if start.startswith("{") and '"requests"' in start:
            return True
    raise TraceError(head.path, "directory holds no WEKA conversation files (JSON objects with 'requests')")


def _keys(head: Head) -> bool:
    return "requests" in (head.first_object_keys or frozenset())


def _text(head: Head) -> bool:
    return head.kind == "object" and '"requests"' in head.text


def _whole(head: Head) -> bool:
    if head.kind != "object" or head.path.stat().st_size > FULL_PARSE_LIMIT:
        return False
    try:
        with open(head.path, "rb") as fp:
            obj = json.load(fp)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and "requests" in obj


FORMAT = register(TraceFormat(
    name="weka", summary="a WEKA conversation JSON file or directory (requests)", read=read,
    block_tokens=DEFAULT_BLOCK_TOKENS, sessions=True, directory=True,
    # a file's own first-object keys outrank the other formats'; the text and whole-file looks come last
    sniff=(SniffRule(100, _directory), SniffRule(40, _keys), SniffRule(5, _text), SniffRule(4, _whole)),
    options=("max_conversations", "max_context_tokens"),
))
