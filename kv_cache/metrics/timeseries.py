"""The run as a time series: one row per bucket (1 s by default), in bounded memory per bucket.

While a bucket is open the recorder adds each completed I/O operation's bytes, count and latency (an
HdrHistogram per tier and direction, reused from bucket to bucket) and each completed request; the driver
closes the bucket at its 1-second tick, adding gauges it alone knows (cache occupancy, queue depth, active
users). Rows are flat dicts, so they go straight into the results JSON and into plots:

    t_s, seconds, requests, <tier>_<op>_ops, <tier>_<op>_bytes, <tier>_<op>_gibps,
    <tier>_<op>_p50_ms / _p95_ms / _p99_ms (only when the bucket had operations), plus the gauges.

Bounded for long runs: past MAX_ROWS rows, neighbouring rows are joined two by two (their counts and bytes
added, GiB/s recomputed, percentiles the higher of the two (an upper bound), gauges time-weighted), so a
24-hour run keeps at most MAX_ROWS rows of 2**k seconds each (`seconds` says how long each row lasted).
The rows are held compactly (`Rows`: 8 bytes a figure in one flat array, each row's keys shared with every
row of the same shape): a row costs ~0.3 KiB, not the ~4 KiB of a dict with its own key strings and float
objects, and a run's series allocates its MAX_ROWS rows' figures (RESERVED) when it starts, so its memory
does not rise as the rows fill (it added ~1 MiB an hour to the 1-hour soak's before).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from kv_cache.metrics.histograms import clear, new_histogram, percentiles_ms, record

GIB = float(1 << 30)
MAX_ROWS = 4096  # rows kept: beyond, neighbouring rows are joined two by two (1 s rows up to ~68 min)
_SUMMED = ("_ops", "_bytes")
# Figures a run's series allocates when it starts (1.5 MiB): MAX_ROWS rows of 48 figures (3 tiers x 2
# directions x 6, the time, length and requests, and the gauges); a run whose rows hold more grows past it.
RESERVED = MAX_ROWS * 48


@dataclass
class Bucket:
    """What one open bucket has gathered so far."""

    counts: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    hists: dict[tuple[str, str], HdrHistogram] = field(default_factory=dict)
    requests: int = 0

    def add_io(self, tier: str, op: str, nbytes: int, total_ns: int) -> None:
        c = self.counts[(tier, op)]
        c[0] += 1
        c[1] += nbytes
        h = self.hists.get((tier, op))
        if h is None:
            h = self.hists[(tier, op)] = new_histogram()
        record(h, total_ns)

    def clear(self) -> None:
        """Empty the bucket for reuse (the histograms keep their memory)."""
        self.counts.clear()
        for h in self.hists.values():
            clear(h)
        self.requests = 0


def bucket_row(t_s: float, seconds: float, bucket: Bucket, gauges: dict[str, float] | None = None) -> dict:
    """One time-series row from a closed bucket that lasted `seconds` and ended at `t_s` into the window."""
    row: dict[str, float] = {"t_s": round(t_s, 3), "seconds": round(seconds, 3), "requests": bucket.requests}
    for (tier, op), (ops, nbytes) in sorted(bucket.counts.items()):
        key = f"{tier}_{op}"
        row[f"{key}_ops"] = ops
        row[f"{key}_bytes"] = nbytes
        row[f"{key}_gibps"] = nbytes / GIB / seconds if seconds > 0 else 0.0
        h = bucket.hists.get((tier, op))
        if h is not None:
            row.update({f"{key}_{k}_ms": v for k, v in percentiles_ms(h).items()})
    row.update(gauges or {})
    return row


_EXACT_INT = 1 << 53  # an int a double holds exactly


class Rows(Sequence):
    """A list of flat rows ({key: int | float}) in compact memory: every figure as a double in one flat
    array, a row's shape (its keys in order and which were ints) stored once for all rows that share it.
    Reading a row gives back a dict equal to the one appended, key order and int / float types included,
    so the results' JSON is the same as from a list of the dicts (held by
    tests/test_histograms.py::test_time_series_rows_read_back_as_appended). A row with any other value (a
    bool, a string, None, an int past 2**53) is kept as it is. A read-only Sequence (index, count, `in`,
    reversed) whose `+` with a list is a list, as a reader of the list it stands for expects."""

    __slots__ = ("_vals", "_nvals", "_start", "_shape", "_shapes", "_shape_index", "_odd")

    def __init__(self, rows: list[dict] | None = None, reserve: int = 0) -> None:
        """`reserve`: figures to allocate (zero-filled, so resident) now, as a run's series does (RESERVED):
        its memory then does not rise for as long as the rows fill."""
        self._vals = array("d", bytes(8 * reserve))
        self._nvals = 0  # figures held (the first _nvals of _vals)
        self._start = array("q")  # where row i's figures start in _vals
        self._shape = array("i")  # row i's shape (index in _shapes), -1: kept as it is in _odd
        self._shapes: list[tuple[tuple[str, ...], tuple[bool, ...]]] = []  # (keys, is_int)
        self._shape_index: dict[tuple[tuple[str, ...], tuple[bool, ...]], int] = {}
        self._odd: dict[int, dict] = {}
        for row in rows or ():
            self.append(row)

    def append(self, row: dict) -> None:
        values = list(row.values())
        is_int = []
        for v in values:
            t = type(v)
            if t is int and -_EXACT_INT < v < _EXACT_INT:
                is_int.append(True)
            elif t is float:
                is_int.append(False)
            else:
                self._odd[len(self._start)] = dict(row)
                self._start.append(self._nvals)
                self._shape.append(-1)
                return
        shape = (tuple(row), tuple(is_int))
        i = self._shape_index.get(shape)
        if i is None:
            i = self._shape_index[shape] = len(self._shapes)
            self._shapes.append(shape)
        self._start.append(self._nvals)
        self._shape.append(i)
        end = self._nvals + len(values)
        if end <= len(self._vals):
            self._vals[self._nvals:end] = array("d", values)
        else:
            del self._vals[self._nvals:]
            self._vals.extend(values)
        self._nvals = end

    def copy(self) -> Rows:
        """A copy of the rows so far (memcpys of the figures, the shapes shared: no dict per row), without
        the reserve (a copy is read, not appended to)."""
        other = Rows.__new__(Rows)
        other._vals, other._nvals = array("d", self._vals[:self._nvals]), self._nvals
        other._start, other._shape = array("q", self._start), array("i", self._shape)
        other._shapes, other._shape_index = list(self._shapes), dict(self._shape_index)
        other._odd = {i: dict(row) for i, row in self._odd.items()}
        return other

    def _row(self, i: int) -> dict:
        k = self._shape[i]
        if k < 0:
            return dict(self._odd[i])
        keys, is_int = self._shapes[k]
        s = self._start[i]
        return {key: int(v) if whole else v
                for key, whole, v in zip(keys, is_int, self._vals[s:s + len(keys)], strict=True)}

    def __len__(self) -> int:
        return len(self._start)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        return self._row(i)

    def __iter__(self) -> Iterator[dict]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Rows, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable)

    def __add__(self, other: object) -> list[dict]:
        return list(self) + list(other) if isinstance(other, (Rows, list)) else NotImplemented

    def __radd__(self, other: object) -> list[dict]:
        return list(other) + list(self) if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return f"Rows({list(self)!r})"


class TimeSeries:
    """Double-buffered buckets: recording goes on into one while the other is turned into a row.

    Not locked itself: the recorder calls `add_io`, `add_request` and `swap` under its own lock, and
    `close` (the percentile work) outside it."""

    def __init__(self) -> None:
        self.rows = Rows(reserve=RESERVED)
        self._open = Bucket()
        self._spare = Bucket()

    def add_io(self, tier: str, op: str, nbytes: int, total_ns: int) -> None:
        self._open.add_io(tier, op, nbytes, total_ns)

    def add_request(self) -> None:
        self._open.requests += 1

    def snapshot(self) -> TimeSeries:
        """The closed rows so far (a compact copy: no dict per row, see Rows.copy), with empty buckets: what
        a snapshot of the recorder carries (RunMetrics.snapshot)."""
        other = TimeSeries.__new__(TimeSeries)
        other.rows, other._open, other._spare = self.rows.copy(), Bucket(), Bucket()
        return other

    def swap(self) -> Bucket:
        """Start a new bucket; returns the closed one (to be passed to `close`)."""
        closed, self._open = self._open, self._spare
        self._spare = closed
        return closed

    def close(self, closed: Bucket, t_s: float, seconds: float, gauges: dict[str, float] | None = None) -> dict:
        row = bucket_row(t_s, seconds, closed, gauges)
        closed.clear()
        self.rows.append(row)
        if len(self.rows) > MAX_ROWS:
            self.rows = coarsened(self.rows)
        return row


def join_rows(a: dict, b: dict) -> dict:
    """Two consecutive rows as one lasting both: counts and bytes added, GiB/s from them, percentiles the
    higher (an upper bound of the joined bucket's), other figures (gauges) weighted by each row's time."""
    sa, sb = float(a.get("seconds") or 0.0), float(b.get("seconds") or 0.0)
    total = sa + sb
    out: dict = {"t_s": b.get("t_s"), "seconds": round(total, 3)}
    for key in dict.fromkeys([*a, *b]):
        if key in ("t_s", "seconds") or key.endswith("_gibps"):
            continue
        va, vb = a.get(key), b.get(key)
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
            out[key] = vb if vb is not None else va
        elif key == "requests" or key.endswith(_SUMMED):
            out[key] = va + vb
        elif key.endswith("_ms"):
            out[key] = max(va, vb)
        else:
            out[key] = (va * sa + vb * sb) / total if total > 0 else vb
    for key in [k for k in out if k.endswith("_bytes") and f"{k[:-6]}_gibps" in a | b]:
        out[f"{key[:-6]}_gibps"] = out[key] / GIB / total if total > 0 else 0.0
    return out


def coarsen(rows: list[dict]) -> list[dict]:
    """Rows joined two by two (an odd last row stays as it is): half as many, each twice as long."""
    out = [join_rows(rows[i], rows[i + 1]) for i in range(0, len(rows) - 1, 2)]
    if len(rows) % 2:
        out.append(rows[-1])
    return out


def coarsened(rows: Sequence[dict]) -> Rows:
    """`rows` joined two by two (as `coarsen`) into a new Rows with a run's reserve, a pair at a time. The
    4,097 rows read out as dicts at once (coarsen(list(rows))) were ~16 MiB of small objects, and the
    process's resident floor rose 5.6 MiB at that moment of a soak (4,096 s, 37cf429) and stayed there."""
    out = Rows(reserve=RESERVED)
    n = len(rows)
    for i in range(0, n - 1, 2):
        out.append(join_rows(rows[i], rows[i + 1]))
    if n % 2:
        out.append(rows[n - 1])
    return out


def merge_rows(ranks_rows: list[list[dict]]) -> list[dict]:
    """The time series of several ranks' windows as one: row i of the merge is the sum of the ranks' row i
    (requests, operations, bytes, and the gauges: occupancy, queue depth, in flight, active users), its
    GiB/s recomputed from the summed bytes, and its latency percentiles the highest rank's of that bucket
    (a bucket's histogram is not kept, so a per-bucket percentile of the union cannot be had; the highest
    is an upper bound of it). `t_s` / `seconds` are the first rank's that has the row."""
    merged: list[dict] = []
    kinds: dict[str, str] = {}  # key -> "max" | "sum" | "skip", decided once per key
    for rows in ranks_rows:
        for i, row in enumerate(rows):
            if i == len(merged):
                merged.append({"t_s": row.get("t_s"), "seconds": row.get("seconds")})
            into = merged[i]
            for key, value in row.items():
                kind = kinds.get(key)
                if kind is None:
                    kind = kinds[key] = _merge_kind(key, value)
                if kind == "sum":
                    into[key] = into.get(key, 0) + value
                elif kind == "max":
                    into[key] = max(into.get(key, value), value)
    for row in merged:
        seconds = row.get("seconds") or 0.0
        for key in [k for k in row if k.endswith("_bytes") and not k.startswith("occupancy")]:
            row[f"{key[:-6]}_gibps"] = row[key] / GIB / seconds if seconds > 0 else 0.0
    return merged


def _merge_kind(key: str, value: object) -> str:
    if key in ("t_s", "seconds") or not isinstance(value, (int, float)) or key.endswith("_gibps"):
        return "skip"
    return "max" if key.endswith("_ms") else "sum"
