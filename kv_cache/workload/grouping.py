"""Trace rows -> sessions: the one grouping used by trace replay and by `kv-cache sessions`.

Rows WITH a session id belong to that session, in trace order (sessions may interleave in the file).
Rows WITHOUT one (Mooncake has no session field) are either sessions of their own, or, when asked to
infer, grouped by hash ids: a row CONTINUES an earlier session when all the complete blocks of that
session's latest row (at least ``MIN_SHARED_BLOCKS`` of them, so that the one-block system prompt every
Mooncake row starts with does not chain unrelated requests) are a prefix of the row's ids; the longest such
prefix wins (then the latest session). Otherwise the row starts a new session ``"<format>-<row index>"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kv_cache.workload.traces import TraceRequest

MIN_SHARED_BLOCKS = 2  # a continuation must share at least this many complete blocks


@dataclass
class SessionRows:
    """One session's rows in order; `matched[i]`: complete blocks row i shares with the session's previous
    row when the session was inferred from hash ids (None for its first row and for rows with a session id)."""

    key: str
    rows: list[TraceRequest] = field(default_factory=list)
    matched: list[int | None] = field(default_factory=list)


@dataclass
class Grouped:
    sessions: list[SessionRows]
    block_tokens: int | None  # the first block size a row declared (None: no row did)


class _Node:
    __slots__ = ("children", "sessions")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.sessions: list[int] = []


class PrefixGrouper:
    """Which inferred session a sessionless row continues: a trie of each session's latest complete blocks."""

    def __init__(self) -> None:
        self.root = _Node()
        self.marker: dict[int, _Node] = {}  # session number -> node of its latest row's complete blocks

    def match(self, ids: tuple[int, ...]) -> tuple[int | None, int]:
        """(session whose latest row's complete blocks are the longest prefix of ``ids``, that length)."""
        node, best, best_len = self.root, None, 0
        for depth, block in enumerate(ids, 1):
            node = node.children.get(block)
            if node is None:
                break
            if node.sessions and depth >= MIN_SHARED_BLOCKS:
                best, best_len = node.sessions[-1], depth
        return best, best_len

    def mark(self, session: int, complete_ids: tuple[int, ...]) -> None:
        old = self.marker.pop(session, None)
        if old is not None:
            old.sessions.remove(session)
        if len(complete_ids) < MIN_SHARED_BLOCKS:
            return
        node = self.root
        for block in complete_ids:
            node = node.children.setdefault(block, _Node())
        node.sessions.append(session)
        self.marker[session] = node


def complete_ids(req: TraceRequest, block: int) -> tuple[int, ...]:
    """The hash ids of the row's complete blocks (a partial last block is not reusable)."""
    if not req.hash_ids:
        return ()
    return tuple(req.hash_ids[: req.input_tokens // block])


def group_sessions(rows: Iterable[TraceRequest], *, infer_sessionless: bool, max_sessions: int = 0,
                   max_rows: int = 0, fmt: str = "trace", default_block_tokens: int = 512) -> Grouped:
    """Sessions in order of their first row. `max_sessions`: rows of sessions beyond the first N are
    skipped (0 = all); `max_rows`: stop after N rows were taken (0 = all). Sessionless rows not inferred
    are one-row sessions keyed ``row_<index>``."""
    sessions: list[SessionRows] = []
    by_id: dict[str, SessionRows] = {}
    inferred: list[SessionRows] = []
    grouper = PrefixGrouper()
    block_seen: int | None = None
    taken = 0
    for req in rows:
        if max_rows and taken >= max_rows:
            break
        if block_seen is None and req.block_tokens:
            block_seen = int(req.block_tokens)
        if req.session_id is not None or not infer_sessionless:
            key = req.session_id if req.session_id is not None else f"row_{req.index}"
            group = by_id.get(key)
            if group is None:
                if max_sessions and len(sessions) >= max_sessions:
                    continue
                group = by_id[key] = SessionRows(key)
                sessions.append(group)
            group.rows.append(req)
            group.matched.append(None)
            taken += 1
            continue
        ids = complete_ids(req, req.block_tokens or default_block_tokens)
        number, matched = grouper.match(tuple(req.hash_ids or ()))
        if number is None:
            if max_sessions and len(sessions) >= max_sessions:
                continue
            number, group, continued = len(inferred), SessionRows(f"{fmt}-{req.index}"), None
            inferred.append(group)
            sessions.append(group)
        else:
            group, continued = inferred[number], matched
        group.rows.append(req)
        group.matched.append(continued)
        taken += 1
        grouper.mark(number, ids)
    return Grouped(sessions, block_seen)
