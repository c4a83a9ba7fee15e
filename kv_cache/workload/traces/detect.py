"""Trace format detection from a trace's first bytes (never a full read of a large file): the sniff
rules of the registered formats (formats.py) decide."""

from __future__ import annotations

import os
from pathlib import Path

from .formats import HEAD_BYTES, Head, sniff, unknown_message
from .model import TraceError


def _head(path: Path) -> tuple[str, bool]:
    try:
        with open(path, "rb") as fp:
            raw = fp.read(HEAD_BYTES)
    except IsADirectoryError:
        raise TraceError(path, "is a directory") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    return raw.decode("utf-8", errors="replace").lstrip("\ufeff"), len(raw) >= HEAD_BYTES


def read_head(path: Path) -> Head:
    """The Head of a trace path (a directory's is empty, of kind "dir")."""
    if path.is_dir():
        return Head(path, "", "dir")
    raw, truncated = _head(path)
    text = raw.lstrip()
    kind = "array" if text[:1] == "[" else "object" if text[:1] == "{" else "text"
    return Head(path, text, kind, truncated=truncated)


def detect_format(path: str | os.PathLike) -> str:
    """The registered format of a trace path (see each format's sniff rules; the built-in ones: a
    directory of ``*.json`` conversation objects or a JSON object with ``requests`` -> weka; JSON Lines
    whose first object has ``chat_id``/``parent_chat_id`` -> bailian, ``session_id``/``delay`` -> aiperf,
    ``input_length``/``hash_ids`` -> mooncake; a CSV whose header has ``Request tokens`` -> burstgpt; a JSON
    array whose items have ``conversations`` -> sharegpt). Raises TraceError (one line naming the file) for
    a missing, unreadable, empty or unrecognised path.
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(p, "no such file or directory")
    head = read_head(p)
    if head.kind != "dir" and not head.text:
        raise TraceError(p, "empty file")
    fmt = sniff(head)
    if fmt is None:
        raise TraceError(p, unknown_message())
    return fmt
