"""Trace formats, found by a registry: each reader module of this package registers one
:class:`TraceFormat` (its name, block size, whether its rows form sessions, how it is recognised, what
options it reads and its reader). The CLI's choices, format detection, the session formats of the
replay and the block sizes all derive from the registry, so adding a format is adding its reader module
(and its test).

Detection: every format gives :class:`SniffRule` s, each a priority and a test of the trace's first bytes
(:class:`Head`); the highest-priority rule that holds names the format. Entries are loaded on the first
lookup, by importing every module of this package once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from kv_cache.registry import Registry

from .model import TraceError

if TYPE_CHECKING:  # pragma: no cover
    from ._common import Row
    from ._options import Options
    from .model import TraceStats

__all__ = ["Head", "SniffRule", "TraceFormat", "all_formats", "get", "names", "register", "session_formats"]

HEAD_BYTES = 64 << 10  # what detection reads of a file (never a full read of a large one)


@dataclass
class Head:
    """The first bytes of a trace, as the sniff rules see them. `kind`: "dir" (a directory), "array" (a
    JSON array), "object" (JSON objects, one per line or one in all) or "text" (anything else, CSV)."""

    path: Path
    text: str  # the first HEAD_BYTES decoded, BOM and leading blanks removed ("" for a directory)
    kind: str
    truncated: bool = False  # the file is longer than the head

    @cached_property
    def first_object_keys(self) -> frozenset[str] | None:
        """Keys of the first JSON-object line among the first 64 complete lines (None: no such line)."""
        if self.kind != "object":
            return None
        lines = self.text.splitlines()
        for line in (lines[:-1] if self.truncated else lines)[:64]:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return frozenset(obj)
        return None

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""


@dataclass(frozen=True)
class SniffRule:
    """`test(head)` true means the trace is this format, unless a rule of higher `priority` also holds."""

    priority: int
    test: Callable[[Head], bool]


Reader = Callable[[Path, "TraceStats", "Options"], Iterator["Row"]]


@dataclass(frozen=True)
class TraceFormat:
    """One format. `block_tokens`: tokens per hash id its rows carry (None: no hash ids; a file may say
    its own, as WEKA's do); `sessions`: its rows form multi-turn sessions (replayed closed loop, one user
    per session) rather than independent requests; `directory`: it can read a directory of files;
    `options`: the reader options (fields of the readers' Options) it honours."""

    name: str
    summary: str  # how a user recognises it, e.g. "Mooncake JSONL (input_length, hash_ids)"
    read: Reader
    block_tokens: int | None = None
    sessions: bool = False
    directory: bool = False
    sniff: tuple[SniffRule, ...] = ()
    options: tuple[str, ...] = field(default=())


_REGISTRY: Registry[TraceFormat] = Registry("trace format", __package__, [os.path.dirname(__file__)],
                                            key=lambda e: e.name,
                                            skip=lambda name: name.startswith("_") or name == "formats")
_ENTRIES = _REGISTRY.entries  # (tests register a toy entry into it)
register = _REGISTRY.register
all_formats = _REGISTRY.all  # in registration order of the package's modules (alphabetical)


def names() -> tuple[str, ...]:
    return tuple(f.name for f in all_formats())


def get(name: str) -> TraceFormat:
    _REGISTRY.load()
    fmt = _ENTRIES.get(name)
    if fmt is None:
        raise KeyError(name)
    return fmt


def session_formats() -> tuple[str, ...]:
    """The formats whose rows form sessions (replayed closed loop, one user per session)."""
    return tuple(f.name for f in all_formats() if f.sessions)


def unknown_message() -> str:
    return "unknown trace format (expected " + ", ".join(f.summary for f in all_formats()) + ")"


def sniff(head: Head) -> str | None:
    """The format whose highest-priority rule holds for `head` (None: no rule does)."""
    rules = sorted(((r.priority, f.name, r) for f in all_formats() for r in f.sniff), key=lambda x: -x[0])
    for _, name, rule in rules:
        if rule.test(head):
            return name
    return None


def check_known(path: Path, fmt: str) -> TraceFormat:
    try:
        return get(fmt)
    except KeyError:
        raise TraceError(path, f"unknown trace format {fmt!r} (expected auto or one of {', '.join(names())})") from None
