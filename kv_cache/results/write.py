"""The one write policy of every results document (a run, a rank, a sessions ladder, a merge).

A run may take hours, so what it measured is never lost at the moment of writing it:
- an existing file at the path is kept, renamed to `PATH.1` (`.2`, ...), never overwritten;
- the document is written atomically (a temporary file in the same directory, fsync, rename), so a crash
  or Ctrl-C never leaves a half-written file;
- when the target cannot be written (full disk, a directory gone read-only), the document goes to a file
  in the temporary directory, and the returned Written names both the error and that file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kv_cache.host.files import atomic_target, keep_existing
from kv_cache.metrics.timeseries import Rows

__all__ = ["Written", "dumps", "fallback_path", "keep_existing", "replace_document", "write_document",
           "write_json_atomic"]

try:  # (a dependency; the standard library's json where it is missing)
    import orjson
except ImportError:  # pragma: no cover
    orjson = None


def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Rows):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(data: Any, **kwargs: Any) -> str:
    """`data` as JSON text with the writers' encoding: a document built in this process holds its per-request
    and per-operation lists as numpy arrays (results/summary.py `_seconds`), written as the lists they
    stand for (the standard library's json.dumps alone refuses them)."""
    return json.dumps(data, default=_default, allow_nan=False, **kwargs)


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """`data` as indented JSON at `path`, atomically (the old content or the new, never a part)."""
    with atomic_target(path) as tmp, open(tmp, "w") as fh:  # (host/files.py: fsync, rename, clean-up)
        json.dump(data, fh, indent=4, default=_default, allow_nan=False)
        fh.write("\n")
    return Path(path)


PIECE_VALUES = 4096  # arrays of at least this many values are serialised and written one at a time
PIECE_ROWS = 256  # a time series' rows are serialised this many at a time


def _lift_arrays(node: Any, token: str, lifted: list[np.ndarray | Rows]) -> Any:
    """`node` with each large array and each time series' Rows in its dicts replaced by a placeholder string
    (`token` and its index in `lifted`); the dicts on the way to one are copies, the rest is `node`'s own
    (never changed)."""
    if (isinstance(node, np.ndarray) and node.size >= PIECE_VALUES) or isinstance(node, Rows):
        lifted.append(node)
        return f"{token}{len(lifted) - 1}@"
    if isinstance(node, dict):
        out = None
        for k, v in node.items():
            new = _lift_arrays(v, token, lifted)
            if new is not v:
                out = dict(node) if out is None else out
                out[k] = new
        return node if out is None else out
    return node


def _orjson_pieces(data: dict[str, Any]) -> list[bytes]:
    """The orjson bytes of `data` as pieces: the document without its large arrays, cut where each stood,
    and each array's own bytes between (the same bytes as one orjson.dumps: it writes no whitespace). The
    largest transient is then one list's text (~4 MiB), not the document's (~30 MiB at 200,000 values a
    list), which glibc's heap kept resident until the next trim (docs/performance.md)."""
    token = f"@kv-cache-array-{uuid.uuid4().hex}-"
    lifted: list[np.ndarray | Rows] = []
    skeleton = orjson.dumps(_lift_arrays(data, token, lifted), default=_default,
                            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    if not lifted:
        return [skeleton]
    pieces: list[Any] = []
    rest = skeleton
    for i, array in enumerate(lifted):
        mark = f'"{token}{i}@"'.encode()
        head, rest = rest.split(mark, 1)
        pieces += [head, array]
    pieces.append(rest)
    return pieces


def replace_document(path: str | os.PathLike, data: dict[str, Any]) -> int:
    """`data` as JSON at `path`, atomically (a temporary file in the same directory, fsync, rename: a reader
    sees the old document or the new one, never a part), replacing what is there without keeping it: the
    writer's own earlier version (a rank's periodic document, benchmarks/standard/partial.py). orjson, not
    indented, to keep the writer's CPU time small; its large arrays serialised one at a time as they are
    written (`_orjson_pieces`). Returns the bytes written; an OSError is raised."""
    if orjson is not None:
        pieces = _orjson_pieces(data)
    else:  # pragma: no cover
        pieces = [(json.dumps(data, default=_default) + "\n").encode()]
    written = 0
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:  # (host/files.py: fsync, rename, clean-up)
        for piece in pieces:
            for raw in _piece_bytes(piece):
                fh.write(raw)
                written += len(raw)
                del raw
    return written


def _piece_bytes(piece: bytes | np.ndarray | Rows) -> Iterator[bytes]:
    """A piece's bytes: the skeleton's as they are, an array's in one orjson.dumps, a time series' rows
    PIECE_ROWS at a time (the bytes of one orjson.dumps of the list: "[", the slices' rows joined by ",",
    "]"), so no more than PIECE_ROWS rows are dicts at once."""
    if isinstance(piece, bytes):
        yield piece
    elif isinstance(piece, Rows):
        yield b"["
        for start in range(0, len(piece), PIECE_ROWS):
            text = orjson.dumps(piece[start:start + PIECE_ROWS], default=_default)
            yield (b"," if start else b"") + text[1:-1]
        yield b"]"
    else:
        yield orjson.dumps(piece, default=_default, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass(frozen=True)
class Written:
    """Where a document went: `path` (the one asked for, or the fallback), the older file's new name when
    one was kept, and the error that sent it to the fallback (None: written where asked)."""

    path: str
    kept_as: str | None = None
    error: str | None = None


def fallback_path(path: str) -> str:
    """A path in the temporary directory, named after the one that failed."""
    name = Path(path).name or "results.json"
    return os.path.join(tempfile.gettempdir(), f"kv-cache-fallback-{os.getpid()}-{int(time.time())}-{name}")


def write_document(path: str, document: Any, keep: bool = True) -> Written:
    """Write `document` (a dict, or anything with `to_json()`) to `path` under the policy above: an existing
    file there is kept (when `keep`; said in the document's `measurement.notes`), and on an OSError the
    document goes to fallback_path instead (an error there too is raised)."""
    data = document.to_json() if hasattr(document, "to_json") else document
    kept = None
    try:
        kept = keep_existing(path) if keep else None
        if kept is not None:
            data.setdefault("measurement", {}).setdefault("notes", []).append(
                f"an earlier results file at {path} was kept as {kept}")
        write_json_atomic(path, data)
        return Written(path, kept)
    except OSError as exc:
        error = f"{path}: {exc.strerror or exc}"
    other = fallback_path(path)
    write_json_atomic(other, data)
    return Written(other, kept, error)
