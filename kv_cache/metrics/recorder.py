"""The only place statistics are written.

Every I/O operation and every request is recorded at completion with its end time; anything that
completes after the measured window closed is kept apart (counted as "late", never mixed into rates).
Rates divide by the window's real length, not the nominal duration.
"""

from __future__ import annotations

import errno
import resource
import threading
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kv_cache.metrics.histograms import decode, new_histogram, record
from kv_cache.metrics.histograms import merge as merge_histograms
from kv_cache.metrics.histograms import percentiles_ms as histogram_percentiles_ms
from kv_cache.metrics.reservoir import RECENT, SAMPLE_CAP, LatencySamples
from kv_cache.metrics.stats import mean, percentile, percentiles
from kv_cache.metrics.timeseries import TimeSeries
from kv_cache.storage.tiername import TierName

if TYPE_CHECKING:  # only the type: the recorder sits below storage and must not import it
    from typing import Protocol

    from kv_cache.storage.base import IOResult

    class ChunkProgress(Protocol):  # storage/buffers.py ChunkMarks
        total: int
        seq: int
        t0: int

        def bytes_by(self, t_ns: int) -> int | None: ...

        def split_by(self, t_ns: int) -> tuple[int, int] | None: ...


_END_OF_TIME = 1 << 62  # a time after every chunk mark (ChunkMarks.split_by: a move's totals per side)
PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99}
GIB = float(1 << 30)


def percentiles_ms(samples_ns: LatencySamples | array | list,
                   keys: dict[str, float] = PERCENTILES) -> dict[str, float]:
    """The ``keys`` percentiles of nanosecond samples, in milliseconds ({} when there is none)."""
    if len(samples_ns) == 0:
        return {}
    if isinstance(samples_ns, LatencySamples):
        values = samples_ns.percentiles(list(keys.values()))
    else:
        values = percentiles(samples_ns, list(keys.values()))
    return {k: v / 1e6 for k, v in zip(keys, values, strict=True)}


def mean_ms(samples_ns: LatencySamples | array | list) -> float:
    """Mean of nanosecond samples in milliseconds (0.0 when there is none; exact for LatencySamples)."""
    if len(samples_ns) == 0:
        return 0.0
    if isinstance(samples_ns, LatencySamples):
        return samples_ns.mean() / 1e6
    return mean(samples_ns) / 1e6


def _op_list(recent: int = 0):
    return lambda: LatencySamples(SAMPLE_CAP, recent=recent)


def _request_list(cap: int = SAMPLE_CAP, histogram: bool = True):
    return lambda: LatencySamples(cap, histogram=histogram)


def _op_stats(cap: int):
    """The factory of RunMetrics.io: not a bound method of the recorder, whose defaultdict would then hold
    the recorder (a reference cycle: a periodic document's snapshot, its lists and histograms, would wait
    for the cyclic collector's full pass instead of being freed when dropped)."""
    return lambda: TierOpStats(LatencySamples(cap, recent=RECENT), LatencySamples(cap), LatencySamples(cap))


@dataclass
class TierOpStats:
    """One tier x one direction: per-operation timings (bounded: metrics/reservoir.py) and byte counts."""

    total_ns: LatencySamples = field(default_factory=_op_list(RECENT))
    device_ns: LatencySamples = field(default_factory=_op_list())
    host_ns: LatencySamples = field(default_factory=_op_list())
    ops: int = 0
    bytes: int = 0
    device_bytes: int = 0
    busy_ns: int = 0  # sum of device time (for achieved queue depth = busy / window)
    # Bytes of operations cut off by the end of the window (aborted at the next chunk, or finishing just
    # after it): their data did move while the window was open, so bandwidth counts it (as fio counts
    # completed I/O units), while their latency and operation count are not recorded.
    partial_bytes: int = 0

    @property
    def window_bytes(self) -> int:
        return self.bytes + self.partial_bytes


@dataclass
class RequestStats:
    """Per-request latencies: count, exact sum and max, a bounded list and a histogram each."""

    e2e_ns: LatencySamples = field(default_factory=_request_list())
    storage_ns: LatencySamples = field(default_factory=_request_list())
    generation_ns: LatencySamples = field(default_factory=_request_list())
    prefill_ns: LatencySamples = field(default_factory=_request_list())
    decode_ns: LatencySamples = field(default_factory=_request_list())
    completed: int = 0
    tokens_generated: int = 0
    context_tokens: int = 0


class RunMetrics:
    """Thread-safe recorder for one measured window.

    Its memory does not grow with the run's length: each per-operation and per-request list keeps at most
    `sample_cap` values (a uniform reservoir beyond, metrics/reservoir.py), with exact counts, sums and
    maxima, and HdrHistograms (within 0.1 %) for the percentiles once a list samples. A merge of ranks
    builds one with a larger cap (results/merge.py EXACT_CAP) and no per-request histograms."""

    def __init__(self, sample_cap: int = SAMPLE_CAP, request_histograms: bool = True) -> None:
        self.sample_cap = sample_cap
        self._request_histograms = request_histograms
        self._lock = threading.Lock()
        self.window_start_ns: int | None = None
        self.window_end_ns: int | None = None
        self.window_rusage = None  # the process's resource usage when the window opened (open_window)
        self.io: dict[tuple[str, str], TierOpStats] = defaultdict(_op_stats(sample_cap))
        self.io_by_cause: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])  # ops, bytes
        self.counters: dict[str, float] = defaultdict(int)
        new_list = _request_list(sample_cap, request_histograms)
        self.requests = RequestStats(*(new_list() for _ in range(5)))
        self.qos_e2e_ns: dict[str, LatencySamples] = defaultdict(new_list)
        self.late = defaultdict(int)  # work that finished after the window closed
        # per turn number: [requests, context tokens, bytes read, bytes written] (context growth per turn)
        self.turns: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.errors: dict[str, int] = defaultdict(int)
        self.first_error: str | None = None
        # storage errors left after retries: (tier, operation, error name) -> count; retries per (tier, op)
        self.storage_errors: dict[tuple[str, str, str], int] = defaultdict(int)
        self.storage_retries: dict[tuple[str, str], int] = defaultdict(int)
        self.verify_mismatches = 0
        # The window's edge, measured: operations that straddle its end or are aborted after it, the bytes
        # of theirs counted in the window (chunks completed by its end) and those left out; operations of a
        # store that marks no chunk times are counted whole and named here ("unmeasured").
        self.edge: dict[str, int] = defaultdict(int)
        self._edge_seen: set[tuple[int, int]] = set()
        # Bounded-memory distributions (HdrHistogram) beside the per-operation lists above:
        # (tier, op, "total" | "device" | "host") and ("request", "e2e", "total").
        self.histograms: dict[tuple[str, str, str], object] = {}
        self.series = TimeSeries()
        self._bucket_start_ns: int | None = None
        # (tier, op) whose per-operation lists are a subsample (a merge of ranks that kept every k-th
        # sample): their percentiles come from the HdrHistograms instead (op_percentiles_ms).
        self.subsampled: set[tuple[str, str]] = set()
        self._frozen: dict[tuple[str, str, str], dict[str, float]] | None = None  # see freeze()

    # -- window -------------------------------------------------------------------------------
    def open_window(self, start_ns: int | None = None) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)  # the window's CPU counts from here (run.py)
        with self._lock:
            self.window_rusage = usage
            self.window_start_ns = time.perf_counter_ns() if start_ns is None else start_ns
            self.window_end_ns = None
            self._bucket_start_ns = self.window_start_ns

    def close_window(self, end_ns: int | None = None) -> None:
        with self._lock:
            if self.window_end_ns is None:
                self.window_end_ns = time.perf_counter_ns() if end_ns is None else end_ns

    @property
    def window_seconds(self) -> float:
        if self.window_start_ns is None:
            return 0.0
        end = self.window_end_ns if self.window_end_ns is not None else time.perf_counter_ns()
        return max(0.0, (end - self.window_start_ns) / 1e9)

    def _in_window(self, end_ns: int) -> bool:
        return self.window_start_ns is not None and (self.window_end_ns is None or end_ns <= self.window_end_ns)

    def reset(self) -> None:
        """Forget everything recorded so far (used after warm-up phases)."""
        self.__init__(self.sample_cap, self._request_histograms)

    # -- recording ----------------------------------------------------------------------------
    def _edge_bytes(self, nbytes: int, marks: ChunkProgress | None, tier: str = "storage", side: str = "") -> int:
        """The part of `nbytes` that moved by the window's end, from the operation's chunk marks (bytes
        of the chunks completed by then, in proportion to what the marks cover); the whole of it (and
        counted as unmeasured) when the store marks no chunk. The bytes are the storage tier's in the
        edge record's main keys (the integrity check compares them with the storage tier's bytes), the RAM
        and GPU tiers' under `other_tiers_*`; the operations count whatever the tier (workers' bound).
        `side` ("read" / "write"): `nbytes` is that side of a move (a demotion), whose marks keep each
        side's bytes (ChunkMarks.add_move): its own side's chunks are the measure."""
        done = marks_total = None
        if marks is not None and self.window_end_ns is not None:
            split = marks.split_by(self.window_end_ns) if side else None
            if split is not None:
                i = 0 if side == "read" else 1
                done, marks_total = split[i], marks.split_by(_END_OF_TIME)[i]
            else:  # (a move's sides not marked apart: the operation's bytes)
                done = marks.bytes_by(self.window_end_ns)
                marks_total = marks.total
        if marks is not None:
            seen = (id(marks), marks.seq)
            if seen in self._edge_seen:  # the write half of a demotion already counted as an operation
                self.edge["edge_ops"] -= 1
            self._edge_seen.add(seen)
        self.edge["edge_ops"] += 1
        marked = marks_total or 0
        if tier != "storage":
            inside = nbytes if done is None or marked <= 0 or done >= marked else int(nbytes * done / marked)
            self.edge["other_tiers_counted_bytes"] += inside
            return inside
        if done is None:
            self.edge["unmeasured_ops"] += 1
            self.edge["unmeasured_bytes"] += nbytes
            return nbytes
        inside = nbytes if marked <= 0 or done >= marked else int(nbytes * done / marked)
        self.edge["counted_bytes"] += inside
        self.edge["excluded_bytes"] += nbytes - inside
        return inside

    def record_io(self, tier: str, op: str, res: IOResult, end_ns: int, cause: str,
                  marks: ChunkProgress | None = None, side: str = "") -> bool:
        """Record one storage operation; returns False if it completed after the window. `marks`: the
        operation's chunk completion times (storage/buffers.py ChunkMarks), so that one which straddles the
        window's end adds only the chunks completed inside it; `side`: `res` is that side ("read" /
        "write") of a move, measured by its own side's chunks."""
        with self._lock:
            if not self._in_window(end_ns):
                self.late[f"{tier}_{op}_bytes"] += res.nbytes
                self.late[f"{tier}_{op}_device_bytes"] += res.device_bytes
                self.late[f"{tier}_{op}_ops"] += 1
                # a side of a move: its total_ns is that side's part only (a RAM read's memcpys), so the move's
                # begin (the marks') says whether it began inside the window
                begun = min(end_ns - res.total_ns, marks.t0) if side and marks is not None else end_ns - res.total_ns
                if self._in_window(begun):
                    if side != "write":  # (a move's write side: the operation its read side counted)
                        self.edge["straddling_ops"] += 1
                    self.io[(tier, op)].partial_bytes += self._edge_bytes(res.nbytes, marks, tier, side)
                return False
            s = self.io[(tier, op)]
            s.total_ns.append(res.total_ns)
            s.device_ns.append(res.device_ns)
            s.host_ns.append(res.host_ns)
            s.ops += 1
            s.bytes += res.nbytes
            s.device_bytes += res.device_bytes
            s.busy_ns += res.device_ns
            if s.total_ns.count > s.total_ns.cap:  # the lists now sample: percentiles from the histograms
                self.subsampled.add((tier, op))
            c = self.io_by_cause[(tier, op, cause)]
            c[0] += 1
            c[1] += res.nbytes
            self._histogram(tier, op, "total", res.total_ns)
            self._histogram(tier, op, "device", res.device_ns)
            self._histogram(tier, op, "host", res.host_ns)
            self.series.add_io(tier, op, res.nbytes, res.total_ns)
            return True

    def _histogram(self, a: str, b: str, kind: str, value_ns: int) -> None:
        h = self.histograms.get((a, b, kind))
        if h is None:
            h = self.histograms[(a, b, kind)] = new_histogram()
        record(h, value_ns)

    def record_aborted(self, tier: str, op: str, device_bytes: int, marks: ChunkProgress | None = None) -> None:
        """An operation abandoned at stop: the bytes it moved inside the window count for bandwidth (those
        of its chunks completed by the window's end, from `marks`; all of them when the window is open)."""
        with self._lock:
            self.late[f"{tier}_{op}_aborted_device_bytes"] += device_bytes
            self.late[f"{tier}_{op}_aborted_ops"] += 1
            if self.window_start_ns is None:
                return
            if self.window_end_ns is None:
                self.io[(tier, op)].partial_bytes += device_bytes
                return
            if marks is not None and marks.t0 > self.window_end_ns:
                return  # begun after the window's end: nothing of it moved inside; not an edge operation
            self.edge["aborted_ops"] += 1
            self.io[(tier, op)].partial_bytes += self._edge_bytes(device_bytes, marks, tier)

    def record_aborted_move(self, src: str, dst: str, read_bytes: int, write_bytes: int,
                            marks: ChunkProgress | None = None) -> None:
        """A move (a demotion from tier `src` to `dst`) abandoned at stop: one aborted operation, whose two
        sides count apart, as a finished demotion's do: the bytes read from `src` for `src`'s reads and those
        written to `dst` for `dst`'s writes, each limited to its chunks completed by the window's end
        (`marks`, ChunkMarks.add_move). Counted as one (`dst`, "demote") abort, one edge operation."""
        with self._lock:
            self.late[f"{src}_read_aborted_device_bytes"] += read_bytes
            self.late[f"{dst}_write_aborted_device_bytes"] += write_bytes
            self.late[f"{dst}_demote_aborted_ops"] += 1
            if self.window_start_ns is None:
                return
            if self.window_end_ns is None:
                self.io[(src, "read")].partial_bytes += read_bytes
                self.io[(dst, "write")].partial_bytes += write_bytes
                return
            if marks is not None and marks.t0 > self.window_end_ns:
                return  # begun after the window's end: nothing of it moved inside; not an edge operation
            self.edge["aborted_ops"] += 1
            self.io[(src, "read")].partial_bytes += self._edge_bytes(read_bytes, marks, src, "read")
            self.io[(dst, "write")].partial_bytes += self._edge_bytes(write_bytes, marks, dst, "write")
            if marks is None:  # (with marks, _edge_bytes counts the second side as the same operation)
                self.edge["edge_ops"] -= 1

    def edge_record(self) -> dict[str, int]:
        """The window's edge as measured (see `edge`), JSON-ready."""
        with self._lock:
            keys = ("edge_ops", "straddling_ops", "aborted_ops", "counted_bytes", "excluded_bytes", "unmeasured_ops",
                    "unmeasured_bytes", "other_tiers_counted_bytes")
            return {k: int(self.edge.get(k, 0)) for k in keys}

    def count(self, name: str, n: float = 1, end_ns: int | None = None) -> None:
        """Add to a counter if the event (now, unless end_ns is given) lies inside the window."""
        if end_ns is None:
            end_ns = time.perf_counter_ns()
        with self._lock:
            if self._in_window(end_ns):
                self.counters[name] += n

    def record_error(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.errors[what] += 1
            if self.first_error is None:
                self.first_error = f"{what}: {exc}"

    def record_storage_error(self, tier: str, op: str, exc: BaseException) -> None:
        """A tier operation that failed for good (after its retries), counted by tier, operation and error."""
        code = getattr(exc, "errno", None)
        kind = errno.errorcode.get(code, str(code)) if code is not None else type(exc).__name__
        with self._lock:
            self.storage_errors[(tier, op, kind)] += 1

    def record_retry(self, tier: str, op: str) -> None:
        with self._lock:
            self.storage_retries[(tier, op)] += 1

    def count_mismatch(self) -> int:
        """One more --verify mismatch; returns how many so far."""
        with self._lock:
            self.verify_mismatches += 1
            return self.verify_mismatches

    def storage_error_table(self) -> dict[str, dict[str, dict[str, int]]]:
        """{tier: {operation: {"failed": n, "retried": n, "by_error": {name: n}}}} (JSON-ready)."""
        with self._lock:
            errors, retries = dict(self.storage_errors), dict(self.storage_retries)
        table: dict[str, dict[str, dict]] = {}
        for (tier, op), n in retries.items():
            table.setdefault(tier, {}).setdefault(op, {"failed": 0, "retried": 0, "by_error": {}})["retried"] = n
        for (tier, op, kind), n in errors.items():
            cell = table.setdefault(tier, {}).setdefault(op, {"failed": 0, "retried": 0, "by_error": {}})
            cell["failed"] += n
            cell["by_error"][kind] = n
        return table

    def record_request(
        self,
        qos_level: str,
        end_ns: int,
        e2e_ns: int,
        storage_ns: int,
        generation_ns: int,
        prefill_ns: int | None,
        decode_ns: int | None,
        generate_tokens: int,
        context_tokens: int,
        turn: int = 0,
        read_bytes: int = 0,
        written_bytes: int = 0,
    ) -> bool:
        with self._lock:
            if not self._in_window(end_ns):
                self.late["requests"] += 1
                return False
            r = self.requests
            r.completed += 1
            r.tokens_generated += generate_tokens
            r.context_tokens += context_tokens
            r.e2e_ns.append(e2e_ns)
            r.storage_ns.append(storage_ns)
            r.generation_ns.append(generation_ns)
            if prefill_ns is not None:
                r.prefill_ns.append(prefill_ns)
            if decode_ns is not None:
                r.decode_ns.append(decode_ns)
            self.qos_e2e_ns[qos_level].append(e2e_ns)
            self._histogram("request", "e2e", "total", e2e_ns)
            self.series.add_request()
            t = self.turns[turn]
            t[0] += 1
            t[1] += context_tokens
            t[2] += read_bytes
            t[3] += written_bytes
            return True

    # -- interval views (time series, autoscaler) ------------------------------------------------
    def mark(self) -> dict[str, int]:
        """Cumulative positions to diff against a later mark."""
        with self._lock:
            r = self.requests
            rd, wr = self.io.get((TierName.STORAGE, "read")), self.io.get((TierName.STORAGE, "write"))
            return {
                "t_ns": time.perf_counter_ns(),
                "requests": r.completed,
                "tokens": r.tokens_generated,
                "read_bytes": rd.window_bytes if rd else 0,
                "write_bytes": wr.window_bytes if wr else 0,
                "read_n": len(rd.total_ns) if rd else 0,
                "write_n": len(wr.total_ns) if wr else 0,
            }

    def p95_ms_since(self, tier: str, op: str, start: int) -> float | None:
        """P95 of the operations recorded after sample index `start` (None if there were none)."""
        with self._lock:
            s = self.io.get((tier, op))
            if s is None or len(s.total_ns) <= start:
                return None
            arr = s.total_ns.since(start)  # the last RECENT at most, once the list samples
        return percentile(arr, 95) / 1e6

    def close_bucket(self, now_ns: int, gauges: dict[str, float] | None = None) -> dict:
        """Close the open time-series bucket at `now_ns` (the driver's 1-second tick); returns its row."""
        with self._lock:
            start = self._bucket_start_ns if self._bucket_start_ns is not None else now_ns
            self._bucket_start_ns = now_ns
            closed = self.series.swap()
            t0 = self.window_start_ns if self.window_start_ns is not None else start
        return self.series.close(closed, (now_ns - t0) / 1e9, (now_ns - start) / 1e9, gauges)

    # -- views --------------------------------------------------------------------------------
    def tier_op(self, tier: str, op: str) -> TierOpStats:
        with self._lock:
            found = self.io.get((tier, op))
        # none recorded: empty lists of cap 0 (a run's lists take their cap when made, 1.6 MiB each)
        return found if found is not None else TierOpStats(LatencySamples(0), LatencySamples(0), LatencySamples(0))

    def snapshot_counters(self) -> dict[str, float]:
        with self._lock:
            return dict(self.counters)

    def op_percentiles_ms(self, tier: str, op: str, part: str = "total") -> dict[str, float]:
        """The PERCENTILES of one tier and direction's `part` ("total", "device" or "host") time, in ms:
        exact, of every sample, unless the lists are a subsample (`subsampled`): then from the HdrHistogram
        (3 significant digits; {} for a part without one)."""
        key = (tier, op, part)
        if self._frozen is not None and key in self._frozen:
            return self._frozen[key]
        if (tier, op) not in self.subsampled:
            out = percentiles_ms(getattr(self.tier_op(tier, op), f"{part}_ns"))
        else:
            h = self.histograms.get(key)
            out = histogram_percentiles_ms(h, tuple(PERCENTILES.values())) if h is not None else {}
        if self._frozen is not None:
            self._frozen[key] = out
        return out

    def freeze(self) -> None:
        """Nothing more will be recorded (a merge of ranks, once added up): percentiles are kept once
        computed, so the summary and the merged latency blocks sort each list once."""
        self._frozen = {}

    def snapshot(self, at_ns: int | None = None) -> RunMetrics:
        """A copy of everything recorded so far, as one consistent state (taken under the recorder's lock,
        so no operation is half in it), with its window closed at `at_ns` (now): what a rank's periodic
        document is built from while the run goes on recording into this one. The copy is memcpys of the
        held lists and histograms (no per-value work); the time-series rows are shared (closed rows are
        never changed; the caller is the thread that closes them). Not meant to be recorded into."""
        snap = RunMetrics.__new__(RunMetrics)
        with self._lock:
            end = time.perf_counter_ns() if at_ns is None else at_ns
            snap.__dict__.update(
                sample_cap=self.sample_cap, _request_histograms=self._request_histograms, _lock=threading.Lock(),
                window_start_ns=self.window_start_ns, window_rusage=self.window_rusage,
                window_end_ns=self.window_end_ns if self.window_end_ns is not None else end,
                io=defaultdict(_op_stats(self.sample_cap), {
                    k: TierOpStats(s.total_ns.copy(), s.device_ns.copy(), s.host_ns.copy(), s.ops, s.bytes,
                                   s.device_bytes, s.busy_ns, s.partial_bytes) for k, s in self.io.items()}),
                io_by_cause=defaultdict(lambda: [0, 0], {k: list(v) for k, v in self.io_by_cause.items()}),
                counters=defaultdict(int, self.counters),
                requests=RequestStats(*(getattr(self.requests, f"{n}_ns").copy()
                                        for n in ("e2e", "storage", "generation", "prefill", "decode")),
                                      self.requests.completed, self.requests.tokens_generated,
                                      self.requests.context_tokens),
                qos_e2e_ns=defaultdict(_request_list(self.sample_cap, self._request_histograms),
                                       {k: v.copy() for k, v in self.qos_e2e_ns.items()}),
                late=defaultdict(int, self.late),
                turns=defaultdict(lambda: [0, 0, 0, 0], {k: list(v) for k, v in self.turns.items()}),
                errors=defaultdict(int, self.errors), first_error=self.first_error,
                storage_errors=defaultdict(int, self.storage_errors),
                storage_retries=defaultdict(int, self.storage_retries),
                verify_mismatches=self.verify_mismatches, edge=defaultdict(int, self.edge), _edge_seen=set(),
                histograms={k: merge_histograms([h]) for k, h in self.histograms.items()},
                series=self.series.snapshot(), _bucket_start_ns=self._bucket_start_ns,
                subsampled=set(self.subsampled), _frozen=None)
        return snap

    # -- the recorder as data (a rank's document carries it; a merge adds the ranks' up) -------------
    def state(self) -> dict:
        """Everything this recorder holds except the sample lists, histograms and time series (which
        the document carries in their own blocks), JSON-ready for results/write.py (the per-QoS lists are
        int64 arrays, written as lists): what `absorb_state` adds back up."""
        with self._lock:
            return {
                "io": {f"{t}/{o}": {"ops": s.ops, "bytes": s.bytes, "device_bytes": s.device_bytes,
                                    "busy_ns": s.busy_ns, "partial_bytes": s.partial_bytes}
                       for (t, o), s in sorted(self.io.items())},
                "io_by_cause": {f"{t}/{o}/{c}": list(v) for (t, o, c), v in sorted(self.io_by_cause.items())},
                "counters": dict(self.counters),
                "requests": {"completed": self.requests.completed,
                             "tokens_generated": self.requests.tokens_generated,
                             "context_tokens": self.requests.context_tokens},
                "qos_e2e_ns": {level: v.array().copy()  # (an array of its own: no int object per value)
                               for level, v in sorted(self.qos_e2e_ns.items())},
                "late": dict(self.late),
                "turns": {str(t): list(v) for t, v in sorted(self.turns.items())},
                "errors": dict(self.errors),
                "first_error": self.first_error,
                "storage_errors": {f"{t}/{o}/{k}": n for (t, o, k), n in sorted(self.storage_errors.items())},
                "storage_retries": {f"{t}/{o}": n for (t, o), n in sorted(self.storage_retries.items())},
                "verify_mismatches": self.verify_mismatches,
                "edge": dict(self.edge),
            }

    def absorb_state(self, state: dict) -> None:
        """Add another recorder's `state()` to this one (counts add up; the first error seen stays)."""
        with self._lock:
            for key, v in state.get("io", {}).items():
                s = self.io[_pair(key)]
                s.ops += v["ops"]
                s.bytes += v["bytes"]
                s.device_bytes += v["device_bytes"]
                s.busy_ns += v["busy_ns"]
                s.partial_bytes += v["partial_bytes"]
            for key, (ops, nbytes) in state.get("io_by_cause", {}).items():
                c = self.io_by_cause[tuple(key.split("/"))]
                c[0] += ops
                c[1] += nbytes
            _add(self.counters, state.get("counters", {}))
            r = state.get("requests", {})
            self.requests.completed += r.get("completed", 0)
            self.requests.tokens_generated += r.get("tokens_generated", 0)
            self.requests.context_tokens += r.get("context_tokens", 0)
            for level, values in state.get("qos_e2e_ns", {}).items():
                self.qos_e2e_ns[level].frombytes(_int64_bytes(values))  # (a rank's reservoir, bounded)
            _add(self.late, state.get("late", {}))
            for turn, values in state.get("turns", {}).items():
                t = self.turns[int(turn)]
                for i, x in enumerate(values):
                    t[i] += x
            _add(self.errors, state.get("errors", {}))
            self.first_error = self.first_error or state.get("first_error")
            for key, n in state.get("storage_errors", {}).items():
                self.storage_errors[tuple(key.split("/"))] += n
            for key, n in state.get("storage_retries", {}).items():
                self.storage_retries[_pair(key)] += n
            self.verify_mismatches += state.get("verify_mismatches", 0)
            _add(self.edge, state.get("edge", {}))

    def absorb_samples(self, tier: str, op: str, part: str, values_ns) -> None:
        """Append per-operation samples (ns) of another recorder to one of this one's lists."""
        with self._lock:
            getattr(self.io[(tier, op)], f"{part}_ns").frombytes(_int64_bytes(values_ns))

    def absorb_request_samples(self, name: str, values_ns) -> None:
        """Append per-request samples (ns) of another recorder: `name` is e2e, storage, generation,
        prefill or decode."""
        with self._lock:
            getattr(self.requests, f"{name}_ns").frombytes(_int64_bytes(values_ns))

    def absorb_histogram(self, key: tuple[str, str, str], encoded: str) -> None:
        """Add another recorder's HdrHistogram (its encoded form, as a document carries it)."""
        with self._lock:
            h = self.histograms.get(key)
            if h is None:
                h = self.histograms[key] = new_histogram()
            h.add(decode(encoded))


def _int64_bytes(values) -> bytes:
    """`values` (ints, or floats holding whole numbers) as the machine's int64s, the lists' item type."""
    return np.asarray(values, dtype=np.int64).tobytes()


def _pair(key: str) -> tuple[str, str]:
    tier, op = key.split("/")
    return tier, op


def _add(into: dict, more: dict) -> None:
    for k, n in more.items():
        into[k] += n
