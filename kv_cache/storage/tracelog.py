"""Logical trace mode (`--io-trace-log`): every cache operation is logged, no data is moved.

A NullStore stands in for every tier (sizes only, zero timings), so a trace of what the workload would
ask of each tier can be produced on any machine and replayed elsewhere. CSV columns (MLPerf kv-cache
tool compatible): Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase. A name ending in `.zst` is
compressed. An existing file at the path is kept as `PATH.1` (`.2`, ...) before the log is opened
(`kept_as`, named in the results' measurement.io_trace); the log is streamed to its path as the run goes,
so that a killed run leaves every row written so far (a temporary file renamed at the end would lose them).
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

from kv_cache.errors import StorageSetupError
from kv_cache.host.files import keep_existing
from kv_cache.storage.base import IOResult
from kv_cache.storage.tiername import TierName

TIER_LABELS = {t.legacy: f"Tier-{i}" for i, t in enumerate(TierName)}
HEADER = "Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase\n"


def check_trace_path(path: str) -> None:
    """Fail before the run if a .zst trace is asked for without the zstandard package."""
    if path.endswith(".zst"):
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise StorageSetupError(f"{path}: writing .zst needs the 'zstandard' package "
                                    "(pip install zstandard), or use a .csv name").about("io_trace_log") from None


class IOTraceWriter:
    """Thread-safe, buffered (not line-buffered) trace writer."""

    def __init__(self, path: str) -> None:
        check_trace_path(path)
        self.path = path
        self._lock = threading.Lock()
        self.kept_as = keep_existing(path)  # None for a new path or /dev/null
        self._raw = open(path, "wb")  # noqa: SIM115  (closed in close())
        self._zctx = None
        if path.endswith(".zst"):
            import zstandard

            self._zctx = zstandard.ZstdCompressor(level=3).stream_writer(self._raw)
            self._out: Any = io.TextIOWrapper(self._zctx, encoding="utf-8", write_through=False)
        else:
            self._out = io.TextIOWrapper(self._raw, encoding="utf-8")
        self._out.write(HEADER)
        self.rows = 0

    def log(self, op: str, nbytes: int, tier: str, key: str, cause: str) -> None:
        # MLPerf-compatible phases: demotions "Evict", every other write "Prefill", every other read "Decode".
        phase = "Evict" if cause == "demotion" else ("Decode" if op == "read" else "Prefill")
        row = (f"{time.time():.6f},{'Read' if op == 'read' else 'Write'},{nbytes},"
               f"{TIER_LABELS.get(tier, tier)},{key},{phase}\n")
        with self._lock:
            self._out.write(row)
            self.rows += 1

    def close(self) -> None:
        with self._lock:
            if self._out is None:
                return
            self._out.flush()
            self._out.close()  # closes the compressor (finalising the frame) and the file
            self._out = None


class NullStore:
    """A tier that keeps only entry sizes: every operation succeeds instantly (zero timings)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def write(self, key: str, nbytes: int, bufs=None, stop=None) -> IOResult:
        with self._lock:
            self._sizes[key] = nbytes
        return IOResult(nbytes, 0, 0, 0, 0)

    def read(self, key: str, bufs=None, stop=None, verify: bool = False) -> IOResult:
        with self._lock:
            nbytes = self._sizes[key]
        return IOResult(nbytes, 0, 0, 0, 0)

    def move_to(self, key: str, dst, bufs=None, stop=None) -> tuple[IOResult, IOResult]:
        read = self.read(key)
        write = dst.write(key, read.nbytes, bufs, stop)
        self.delete(key)
        return read, write

    def delete(self, key: str) -> None:
        with self._lock:
            self._sizes.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._sizes

    def close(self) -> None:
        with self._lock:
            self._sizes.clear()
