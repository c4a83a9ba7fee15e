"""AIPerf agentic-code / multi-turn Mooncake JSON Lines (sessions of delta rows).

Turn 0 of a session: ``{"session_id", "input_length", "output_length", "hash_ids", "timestamp" (ms),
"group_id"[, "is_restart"]}``; later turns: ``{"session_id", "input_length", "output_length", "hash_ids",
"delay" (ms before this turn)}``.

The trap: ``input_length`` and ``hash_ids`` of a row are the NEW tokens of that turn only. AIPerf replays
such sessions in its ``deltas_without_responses`` context mode: each request is the whole conversation so
far -- every earlier turn's new tokens AND the assistant response to it -- followed by this turn's new
tokens. So the reconstruction is::

    input_tokens(n) = sum_{i<n} (input_length(i) + output_length(i)) + input_length(n)
    new_tokens(n)   = input_length(n)   (the previous response is already in the previous turn's context)

and ``hash_ids`` is rebuilt on the 512-token blocks of that FULL context (so ``len(hash_ids) ==
ceil(input_tokens / 512)`` and block k really is tokens [512k, 512k+512)):

- turn 1 keeps the trace's own ids (they are aligned: the context starts there), which is what lets
  sessions that share a system prompt share blocks;
- a later turn inherits every block that was already complete in the previous turn's input (the context is
  append-only), so its prefix ids equal the previous turn's;
- every other block (blocks completed by the previous response, by this turn's new tokens, or by a mix) gets
  a synthetic id, deterministic and unique to (session, block position) -- and a partial last block also to
  the context length, since it is completed differently later. The trace's ids for later turns' new tokens
  are NOT used: those segments start at arbitrary offsets of the real context (not on block boundaries),
  and because they follow session-specific history (earlier responses) no other session can share them as
  a KV prefix, so reusing the trace's ids there would only overstate reuse.

A session whose ``is_restart`` is true starts over (turn 1, fresh context) as session ``"<id>#r<k>"``.

Timing: turn 1's ``timestamp`` is its arrival (seconds). Later turns have no arrival (closed loop); their
``delay`` becomes the previous turn's ``think_time_s``. To fill it, a row is held back until its session's
next row is seen, at most ``lookahead_rows`` rows (output order is still file order); past that the row
goes out with ``think_time_s = None`` (counted in ``stats.think_time_unknown`` if a next turn appears).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

from ._common import Bad, Row, SessionLimit, hash_list, iter_jsonl, seconds, synthetic_id, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceStats

BLOCK_TOKENS = 512


class _Session:
    __slots__ = ("sid", "turn", "context", "last_out", "complete_ids", "has_ids", "restarts")

    def __init__(self, sid: str, restarts: int = 0) -> None:
        self.sid = sid
        self.turn = 0
        self.context = 0  # full input tokens of the last turn
        self.last_out = 0
        self.complete_ids: list[int] = []
        self.has_ids = False
        self.restarts = restarts


class _Pending:
    __slots__ = ("row", "think", "done")

    def __init__(self, row: Row) -> None:
        self.row = row
        self.think: float | None = None
        self.done = False


def _full_ids(sess: _Session, length: int) -> tuple[int, ...]:
    complete = length // BLOCK_TOKENS
    ids = sess.complete_ids
    for k in range(len(ids), complete):
        ids.append(synthetic_id("aiperf", sess.sid, k))
    out = ids[:complete]
    if length % BLOCK_TOKENS:
        out.append(synthetic_id("aiperf", sess.sid, complete, length))
    return tuple(out)


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    sessions: dict[str, _Session] = {}
    limit = SessionLimit(opts.max_conversations)
    pending: deque[_Pending] = deque()
    last_pending: dict[str, _Pending] = {}
    forced: set[str] = set()
    lookahead = max(0, opts.lookahead_rows)

    for obj in iter_jsonl(path, stats):
        try:
            raw = obj.get("session_id")
            if raw is None or raw == "" or isinstance(raw, (dict, list, bool)):
                raise Bad("missing_field:session_id")
            key = str(raw)
            inp = tokens(obj, "input_length")
            out = tokens(obj, "output_length")
            ids = hash_list(obj)
            arrival = seconds(obj, "timestamp", 0.001, default=None)
            delay = seconds(obj, "delay", 0.001, default=None)
            sess = sessions.get(key)
            restart = bool(obj.get("is_restart")) and sess is not None
            if (sess is None or restart) and inp == 0:
                raise Bad("zero_input")
        except Bad as exc:
            stats.skip(exc.args[0])
            continue
        if not limit.admit(key):
            stats.skip("beyond_max_conversations", malformed=False)
            continue

        if sess is None or restart:
            k = sess.restarts + 1 if sess is not None else 0
            if sess is not None:  # close the old instance: its last turn has no successor
                old = last_pending.pop(sess.sid, None)
                if old is not None:
                    old.done = True
            sess = _Session(f"{key}#r{k}" if k else key, k)
            sessions[key] = sess
            sess.turn = 1
            sess.context = inp
            sess.has_ids = ids is not None
            if ids is not None:
                need = -(-inp // BLOCK_TOKENS)
                full = list(ids[:need])
                full += [synthetic_id("aiperf", sess.sid, i, inp) for i in range(len(full), need)]
                sess.complete_ids = full[: inp // BLOCK_TOKENS]
                full_ids: tuple[int, ...] | None = tuple(full)
            else:
                full_ids = None
            context = inp
        else:
            prev = last_pending.pop(sess.sid, None)
            if prev is not None:
                prev.think = delay
                prev.done = True
            elif sess.sid in forced:
                stats.think_time_unknown += 1
            forced.discard(sess.sid)
            sess.turn += 1
            context = sess.context + sess.last_out + inp
            sess.context = context
            full_ids = _full_ids(sess, context) if sess.has_ids else None
        sess.last_out = out

        item = _Pending(Row(sess.sid, sess.turn, arrival, None, context, inp, out, full_ids, BLOCK_TOKENS))
        pending.append(item)
        last_pending[sess.sid] = item

        while pending and (pending[0].done or len(pending) > lookahead):
            head = pending.popleft()
            if not head.done:
                last_pending.pop(head.row.session_id, None)
                forced.add(head.row.session_id)
            yield head.row._replace(think_time_s=head.think)

    while pending:
        head = pending.popleft()
        yield head.row._replace(think_time_s=head.think)


def _keys(head: Head) -> bool:
    return bool((head.first_object_keys or frozenset()) & {"session_id", "delay"})


FORMAT = register(TraceFormat(
    name="aiperf", summary="AIPerf JSONL (session_id, delay)", read=read, block_tokens=BLOCK_TOKENS,
    sessions=True, sniff=(SniffRule(20, _keys),),
    options=("max_conversations", "lookahead_rows", "max_context_tokens"),
))
