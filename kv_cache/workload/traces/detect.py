"""Trace format detection from a file's first bytes (never a full read of a large file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .model import TraceError
from .weka import conversation_files

HEAD_BYTES = 64 << 10
FULL_PARSE_LIMIT = 64 << 20
UNKNOWN = ("unknown trace format (expected Mooncake/AIPerf/Bailian JSONL, a WEKA conversation JSON file or "
           "directory, a BurstGPT CSV or a ShareGPT JSON array)")


def _head(path: Path) -> str:
    try:
        with open(path, "rb") as fp:
            raw = fp.read(HEAD_BYTES)
    except IsADirectoryError:
        raise TraceError(path, "is a directory") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    return raw.decode("utf-8", errors="replace").lstrip("\ufeff")


def _classify_keys(keys: set[str]) -> str | None:
    if "requests" in keys:
        return "weka"
    if "chat_id" in keys or "parent_chat_id" in keys:
        return "bailian"
    if "session_id" in keys or "delay" in keys:
        return "aiperf"
    if "input_length" in keys or "hash_ids" in keys:
        return "mooncake"
    return None


def _detect_dir(path: Path) -> str:
    files = conversation_files(path)
    if not files:
        raise TraceError(path, "directory holds no *.json conversation files")
    for f in files[:8]:
        head = _head(f).lstrip()
        if head.startswith("{") and '"requests"' in head:
            return "weka"
    raise TraceError(path, "directory holds no WEKA conversation files (JSON objects with 'requests')")


def detect_format(path: str | os.PathLike) -> str:
    """The format of a trace path: mooncake | aiperf | bailian | weka | burstgpt | sharegpt.

    Rules: a directory of ``*.json`` conversation objects -> weka; a JSON object with ``requests`` ->
    weka; JSON Lines whose first object has ``chat_id``/``parent_chat_id`` -> bailian, ``session_id``/
    ``delay`` -> aiperf, ``input_length``/``hash_ids`` -> mooncake; a CSV whose header has ``Request
    tokens`` -> burstgpt; a JSON array whose items have ``conversations`` -> sharegpt. Raises TraceError
    (one line naming the file) for a missing, unreadable, empty or unrecognised path.
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(p, "no such file or directory")
    if p.is_dir():
        return _detect_dir(p)
    head = _head(p)
    text = head.lstrip()
    if not text:
        raise TraceError(p, "empty file")
    if text[0] == "[":
        if '"conversations"' in text:
            return "sharegpt"
        raise TraceError(p, UNKNOWN)
    if text[0] == "{":
        lines = text.splitlines()
        complete = lines if len(head.encode()) < HEAD_BYTES else lines[:-1]
        for line in complete[:64]:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                fmt = _classify_keys(set(obj))
                if fmt is not None:
                    return fmt
                break
        if '"requests"' in text:
            return "weka"
        if p.stat().st_size <= FULL_PARSE_LIMIT:
            try:
                with open(p, "rb") as fp:
                    obj = json.load(fp)
            except (OSError, ValueError, UnicodeDecodeError):
                obj = None
            if isinstance(obj, dict) and "requests" in obj:
                return "weka"
        raise TraceError(p, UNKNOWN)
    first = text.splitlines()[0]
    if "Request tokens" in first and "," in first:
        return "burstgpt"
    raise TraceError(p, UNKNOWN)
