"""ShareGPT JSON: ``[{"id": str, "conversations": [{"from": "human"|"gpt", "value": str}, ...]}, ...]``.

The array is streamed item by item (constant memory, whatever the file size). Each human message
followed by a gpt answer is one turn of the conversation's session (``session_id`` = the item's ``id``,
or ``"conv<n>"``). Tokens come from ``tokenizer.load_tokenizer`` (offline tiktoken cl100k_base, else
chars/4; the one used is in ``stats.tokenizer``). For turn n::

    input_tokens  = all earlier human + gpt messages + this human message   (full context)
    new_tokens    = this human message  (the previous gpt answer is already in the previous turn's context,
                    its KV produced by that turn's decode; this matches AIPerf's and the other formats' rule)
    output_tokens = this gpt answer

``system`` (and any other non-assistant) messages and consecutive human messages add to the next turn's
prompt; a gpt message with no
human message before it (e.g. a conversation opening with the assistant) joins the context without a
turn; a trailing human message without an answer is dropped. Items that are not objects, lack a
``conversations`` list, hold a message that is not ``{"from": str, "value": str}`` or yield no turn are
skipped and counted. The config's ``sharegpt`` section acts here: ``max_context_tokens`` truncates a turn's
prompt (full context), ``max_generation_tokens`` its answer, ``chars_per_token_estimate`` sets the chars
tokenizer (as the MLPerf tool). ``max_conversations`` stops after that many usable conversations. No timing:
``arrival_s`` and ``think_time_s`` are None.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ._common import Row
from ._options import Options
from .formats import Head, SniffRule, TraceFormat, register
from .model import TraceError, TraceStats
from .tokenizer import load_tokenizer

GPT = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}
CHUNK = 1 << 20
MAX_ITEM_CHARS = 64 << 20


def iter_json_array(path: Path, stats: TraceStats) -> Iterator[object]:
    """Yield the elements of a top-level JSON array without loading the whole file."""
    dec = json.JSONDecoder()
    with open(path, encoding="utf-8", errors="replace") as fp:
        buf = fp.read(CHUNK).lstrip("\ufeff")
        eof = not buf
        pos = 0

        def fill() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            more = fp.read(CHUNK)
            if not more:
                eof = True
                return False
            buf = buf[pos:] + more
            pos = 0
            return True

        def skip_ws() -> bool:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf):
                    return True
                if not fill():
                    return False

        if not skip_ws() or buf[pos] != "[":
            raise TraceError(path, "not a JSON array")
        pos += 1
        expect_item = True
        while True:
            if not skip_ws():
                stats.skip("truncated_json")
                return
            ch = buf[pos]
            if ch == "]":
                return
            if ch == ",":
                if expect_item:  # ",," or "[,"
                    stats.skip("bad_json")
                    return
                pos += 1
                expect_item = True
                continue
            while True:
                try:
                    obj, end = dec.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError:
                    if len(buf) - pos > MAX_ITEM_CHARS or not fill():
                        stats.skip("bad_json")
                        return
            pos = end
            expect_item = False
            if pos > CHUNK:
                buf = buf[pos:]
                pos = 0
            yield obj


def read(path: Path, stats: TraceStats, opts: Options) -> Iterator[Row]:
    name, count = load_tokenizer(opts.tokenizer, path, opts.chars_per_token)
    max_in, max_out = opts.sharegpt_max_context, opts.sharegpt_max_generation
    stats.tokenizer = name
    used = 0
    for n, item in enumerate(iter_json_array(path, stats)):
        if opts.max_conversations and used >= opts.max_conversations:
            stats.stopped_at = "max_conversations"  # (the rest of the file is not read)
            return
        if not isinstance(item, dict):
            stats.skip("not_an_object")
            continue
        msgs = item.get("conversations")
        if not isinstance(msgs, list):
            stats.skip("missing_field:conversations")
            continue
        if not all(isinstance(m, dict) and isinstance(m.get("from"), str) and isinstance(m.get("value"), str)
                   for m in msgs):
            stats.skip("bad_message")
            continue
        raw_id = item.get("id")
        sid = str(raw_id) if raw_id not in (None, "") and not isinstance(raw_id, (dict, list)) else f"conv{n}"
        history = 0
        prompt = 0
        turns: list[Row] = []
        for m in msgs:
            role = m["from"].strip().lower()
            t = count(m["value"])
            if role in GPT:
                if prompt:
                    full = history + prompt if not max_in else min(history + prompt, max_in)
                    out = t if not max_out else min(t, max_out)
                    turns.append(Row(sid, len(turns) + 1, None, None, full, min(prompt, full), out, None, None))
                history += prompt + t
                prompt = 0
            else:  # human, system and unknown roles are prompt text
                prompt += t
        if not turns:
            stats.skip("no_turns")
            continue
        used += 1
        yield from turns


def _array(head: Head) -> bool:
    return head.kind == "array" and '"conversations"' in head.text


FORMAT = register(TraceFormat(
    name="sharegpt", summary="a ShareGPT JSON array (conversations)", read=read, block_tokens=None,
    sessions=True, sniff=(SniffRule(40, _array),),
    options=("max_conversations", "tokenizer", "chars_per_token", "sharegpt_max_context",
             "sharegpt_max_generation", "max_context_tokens"),
))
