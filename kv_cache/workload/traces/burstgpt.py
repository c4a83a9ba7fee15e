"""BurstGPT CSV: ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
``Log Type``; newer files add ``Session ID`` and ``Elapsed time``.

Failed requests (0 response tokens) are skipped and counted (``skipped_reasons["failed_request"]``, not
malformed). Rows with a non-empty ``Session ID`` form sessions (turns in file order); BurstGPT logs the
token counts of the request as the API received it, so ``Request tokens`` is taken as the full context
and ``new_tokens`` follows ``_common.new_tokens_full_context`` (no hash ids: growth beyond the previous
prompt + response). Rows without a session are sessionless.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ._common import Bad, Row, SessionLimit, csv_rows, new_tokens_full_context, seconds, tokens
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceStats

REQUEST = "Request tokens"
RESPONSE = "Response tokens"


def _refused(names: list[str]) -> str | None:
    if REQUEST not in names or RESPONSE not in names:
        return f"not a BurstGPT CSV (needs '{REQUEST}' and '{RESPONSE}' columns)"
    return None


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    sessions: dict[str, tuple[int, int, int]] = {}  # session -> (turn, last input, last output)
    limit = SessionLimit(opts.max_conversations)
    for row in csv_rows(path, _refused):
        try:
            inp = tokens(row, REQUEST)
            out = tokens(row, RESPONSE)
            arrival = seconds(row, "Timestamp", default=None)
            if out == 0:
                stats.skip("failed_request", malformed=False)
                continue
            if inp == 0:
                raise Bad("zero_input")
        except Bad as exc:
            stats.skip(exc.args[0])
            continue
        sid = row.get("Session ID") or None
        if sid is not None and sid.lower() in ("nan", "none", "null"):
            sid = None
        if not limit.admit(sid):
            stats.skip("beyond_max_conversations", malformed=False)
            continue
        if sid is None:
            yield Row(None, 1, arrival, None, inp, inp, out, None, None)
            continue
        prev = sessions.get(sid)
        if prev is None:
            turn, new = 1, inp
        else:
            turn = prev[0] + 1
            new = new_tokens_full_context(inp, prev[1], prev[2], None, None, None)
        sessions[sid] = (turn, inp, out)
        yield Row(sid, turn, arrival, None, inp, new, out, None, None)


def _header(head: Head) -> bool:
    first = head.first_line
    return head.kind == "text" and "Request tokens" in first and "," in first


FORMAT = register(TraceFormat(
    name="burstgpt", summary="a BurstGPT CSV (Request tokens)", read=read, block_tokens=None,
    sniff=(SniffRule(40, _header),), options=("max_conversations", "max_context_tokens"),
))
