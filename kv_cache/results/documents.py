"""The results documents as typed classes, read back by their schema version.

Three kinds, each a JSON object whose first key is `schema_version`:
- `kv-cache-results/1` (RunDocument): one standard run, or one rank of a run of several;
- `kv-cache-sessions/1` (SessionsDocument): a `kv-cache sessions` ladder;
- `kv-cache-merged/1` (MergedDocument): the merge of a run's ranks (`--processes`, mpirun, `kv-cache merge`).

A class keeps the document's mapping as written (so `to_json()` gives back every key, byte for byte) and
adds the typed accessors the readers use: kind, schema version, run id, rank, world size, window, storage,
summary and its typed figures (`figures`, results/figures.py). `load` picks the class from VERSIONS by `schema_version`, never by sniffing keys (the two
foreign kinds below excepted, by their documented shape); a file with no version, or one this kv-cache does not know, is a DocumentError (one line, exit 2). Bump a number
when a key changes meaning or goes away (adding keys keeps it), and keep the old number's class here with
a test file of it in tests/fixtures/results/.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from kv_cache.errors import DocumentError
from kv_cache.results.figures import Figures
from kv_cache.results.mlperf_tool import (
    HarnessSummary,
    MlperfToolRank,
    is_harness_summary,
    is_mlperf_tool_file,
    rank_view,
)

try:  # 3-4x faster to parse than the standard library: a merge of hundreds of ranks is mostly parsing
    from orjson import loads as _loads
except ImportError:  # pragma: no cover  (orjson is a dependency; the standard library still reads them)
    _loads = json.loads



def _parse(raw: bytes) -> Any:
    """The JSON of a file; the standard library's reading where the fast parser refuses NaN / Infinity, which
    Python's json.dump writes by default (the MLPerf tool writes its files with it)."""
    try:
        return _loads(raw)
    except json.JSONDecodeError:
        if not any(token in raw for token in (b"NaN", b"Infinity")):
            raise
        return json.loads(raw)


__all__ = ["HarnessSummaryDocument", "MERGED_SCHEMA_VERSION", "MlperfToolDocument", "SCHEMA_VERSION", "SESSIONS_SCHEMA_VERSION", "VERSIONS", "MergedDocument",
           "ResultsDocument", "RunDocument", "SessionsDocument", "load"]

SCHEMA_VERSION = "kv-cache-results/1"
SESSIONS_SCHEMA_VERSION = "kv-cache-sessions/1"
MERGED_SCHEMA_VERSION = "kv-cache-merged/1"


class ResultsDocument:
    """One results document: `data` is its mapping as written; `source` the file it was read from."""

    kind: ClassVar[str] = ""
    schema: ClassVar[str] = ""

    def __init__(self, data: dict[str, Any], source: str | None = None) -> None:
        self.data = data
        self.source = source

    def to_json(self) -> dict[str, Any]:
        """The document as written (every key; what the write policy serialises)."""
        return self.data

    @property
    def schema_version(self) -> str:
        return str(self.data.get("schema_version", self.schema))

    @property
    def run_id(self) -> str | None:
        """The id every rank of one run shares (None in documents written before kv-cache recorded it)."""
        return self.data.get("run_id")

    @property
    def rank(self) -> int | None:
        return None

    @property
    def world_size(self) -> int:
        return 1

    @property
    def window(self) -> dict[str, Any]:
        """{"seconds", "start_unix", "end_unix", ...}: the measured window ({} when the kind has none)."""
        return {}

    @property
    def storage(self) -> dict[str, Any]:
        """What storage was measured: path, filesystem, I/O mode, block device ({} when unknown)."""
        return {}

    @property
    def summary(self) -> dict[str, Any]:
        return self.data.get("summary") or {}

    @property
    def figures(self) -> Figures:
        """The summary's figures, typed (results/figures.py): each one None where the document lacks it."""
        return Figures.from_json(self.summary)

    @property
    def has_figures(self) -> bool:
        """Holds a run's storage figures (a summary with its `cache_stats`), whatever their age."""
        summary = self.data.get("summary")
        return isinstance(summary, dict) and summary.get("cache_stats") is not None

    @property
    def interrupted(self) -> bool:
        return bool(self.data.get("interrupted"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source or self.schema_version})"


class RunDocument(ResultsDocument):
    """A standard run (or one rank of a run of several): the MLPerf tool's layout plus our blocks."""

    kind = "run"
    schema = SCHEMA_VERSION

    @property
    def parameters(self) -> dict[str, Any]:
        return self.data.get("run_parameters") or {}

    @property
    def measurement(self) -> dict[str, Any]:
        return self.data.get("measurement") or {}

    @property
    def rank(self) -> int | None:
        rank = self.parameters.get("mpi_rank")
        return int(rank) if rank is not None else None

    @property
    def world_size(self) -> int:
        size = self.data.get("world_size", self.parameters.get("mpi_world_size"))
        return int(size) if size else 1

    @property
    def window(self) -> dict[str, Any]:
        m = self.measurement
        clock = m.get("window_wallclock") or {}
        return {"seconds": float(m.get("window_seconds") or 0.0), "start_unix": clock.get("start_unix"),
                "end_unix": clock.get("end_unix"), "barrier_aligned": bool(clock.get("barrier_aligned"))}

    @property
    def storage(self) -> dict[str, Any]:
        m = self.measurement
        return {k: m.get(k) for k in ("run_dir", "filesystem", "filesystem_kind", "io_mode")
                if m.get(k) is not None} | (
            {"block_device": m["block_device"].get("device")}
            if isinstance(m.get("block_device"), dict) and m["block_device"].get("device") else {})

    @property
    def mergeable(self) -> bool:
        """Carries the recorder's state (kv-cache writes it since the run id): a merge can rebuild it."""
        return isinstance(self.data.get("recorder"), dict)


class SessionsDocument(ResultsDocument):
    """A `kv-cache sessions` ladder: rungs, per-config summary, parameters."""

    kind = "sessions"
    schema = SESSIONS_SCHEMA_VERSION

    @property
    def rungs(self) -> list[dict[str, Any]]:
        return list(self.data.get("rungs") or [])

    @property
    def grid(self) -> list[dict[str, Any]]:
        """`--models` / `--gpus`: one cell document per (model, GPU) (`parameters`, `rungs`, `summary`,
        `warnings`); [] for a single cell, whose keys are the document's own (so are the first cell's)."""
        return list(self.data.get("grid") or [])

    @property
    def window(self) -> dict[str, Any]:
        window_s = (self.data.get("parameters") or {}).get("window_s")
        return {"seconds": float(window_s)} if window_s is not None else {}


class MergedDocument(ResultsDocument):
    """The merge of one run's ranks: the single-run summary over the merged recorders, and per-rank rows."""

    kind = "merged"
    schema = MERGED_SCHEMA_VERSION

    @property
    def world_size(self) -> int:
        return int(self.data.get("world_size") or self.data.get("ranks") or 1)

    @property
    def window(self) -> dict[str, Any]:
        return dict(self.data.get("window") or {})

    @property
    def per_rank(self) -> list[dict[str, Any]]:
        return list(self.data.get("per_rank") or [])

    @property
    def storage(self) -> dict[str, Any]:
        return dict((self.data.get("measurement") or {}).get("storage") or {})


class MlperfToolDocument(ResultsDocument):
    """A per-rank results file of the MLPerf tool (recognised by its shape): `view` reads its keys with their
    meaning and names the ones it lacks."""

    kind = "mlperf-tool"
    schema = "mlperf-tool-rank"  # a label for messages: the file itself has no schema_version

    @property
    def view(self) -> MlperfToolRank:
        return rank_view(self.data, self.source)

    @property
    def rank(self) -> int | None:
        return self.view.rank

    @property
    def window(self) -> dict[str, Any]:
        elapsed = self.view.elapsed_s
        return {"seconds": elapsed} if elapsed is not None else {}


class HarnessSummaryDocument(ResultsDocument):
    """The mlpstorage harness's `summary.json` (recognised by its shape): its aggregates per option."""

    kind = "mlperf-harness-summary"
    schema = "mlpstorage-summary/1.0"

    @property
    def view(self) -> HarnessSummary:
        return HarnessSummary(self.data, self.source)


VERSIONS: dict[str, type[ResultsDocument]] = {cls.schema: cls for cls in (RunDocument, SessionsDocument,
                                                                          MergedDocument)}


def load(source: str | os.PathLike | Mapping[str, Any] | ResultsDocument) -> ResultsDocument:
    """The typed document of a path or an already-parsed mapping, by its `schema_version`.

    DocumentError (one line) when the file cannot be read, is not a JSON object, has no schema_version or
    one not in VERSIONS. The MLPerf tool's rank files and the harness's summary.json are recognised by
    their shape first (MlperfToolDocument, HarnessSummaryDocument)."""
    if isinstance(source, ResultsDocument):
        return source
    if isinstance(source, Mapping):
        data, name = dict(source), str(source.get("_source") or "the document")
    else:
        name = os.fspath(source)
        try:
            data = _parse(Path(name).read_bytes())
        except OSError as exc:
            raise DocumentError(f"cannot read {name}: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DocumentError(f"{name} is not a JSON results file: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError(f"{name} is not a kv-cache results file (a JSON {type(data).__name__}, not an object)")
    source_name = None if isinstance(source, Mapping) else name
    if is_mlperf_tool_file(data):
        return MlperfToolDocument(data, source_name)
    if is_harness_summary(data):
        return HarnessSummaryDocument(data, source_name)
    version = data.get("schema_version")
    if version is None:
        raise DocumentError(f"{name} is not a kv-cache results file (no schema_version)")
    cls = VERSIONS.get(version)
    if cls is None:
        raise DocumentError(f"{name}: unknown schema_version {version!r} (this kv-cache reads "
                            f"{', '.join(sorted(VERSIONS))})")
    return cls(data, None if isinstance(source, Mapping) else name)
