"""How many I/O workers a run uses, and why: sized to the device, bounded by what the buffers cost.

- ``--io-workers N`` sets the count exactly (bounded only by memory, below).
- Auto (0): a probe of the storage tier before the window, in the preparation phase: for each count in
  PROBE_COUNTS, that many threads write entries through the tier's own store (files, S3 or Redis alike,
  with the tier's own concurrency: its client's calls, one per thread), of one chunk on the file tiers, of
  the run's entry sizes (at most REMOTE_OP_CHUNKS chunks on S3, one pipelined round trip on Redis: op_sizes), for PROBE_SECONDS
  (at least MIN_OPS each, the first not counted; fewer, down to one counted from the thread's start,
  where the budget is short: fit_ops; on the remote tiers, S3 and Redis, one a thread at least, after one
  uncounted warm-up operation), then as many read them back; then a second pass, the
  counts in descending order (a drift of the machine's load is in both passes' mean alike). The rule
  (`plateau`) judges one figure, the rate of writing bytes and reading them back (`mixed_rate`): the
  count is the smallest that no larger count beats by more than 5 % (1/PROBE_FRACTION) beyond the noise
  (PROBE_Z standard errors of the difference of the mean log rates; the noise of one figure pooled from
  the counts measured more than once, `noise`). A count is as good as a larger one unless the larger is
  shown better: the smallest count of a noisy plateau; the top of a real rise however far. The
  comparison the choice hangs on most narrowly (`closest_call`) is measured again in CONFIRM_PAIRS
  alternating pairs, and the rule applied again, up to CONFIRM_ROUNDS times, while the budget has room.
  `decide` is the rule on the figures alone (tests/test_io_workers.py feeds it synthetic ones).
  Then the step up (`step_up`): the rule's burden is on the larger count (it must be shown more than 5 %
  better), so a real step of 10 % at 15-40 % noise per figure passed as a plateau and the run took the
  count below it (ext4 here: 4 workers, up to 16 % under the plateau from 8). The most workers whose
  memory (the process's resident memory at the probe plus their buffers and slot rings) stays within
  STEP_UP_MEMORY of the chosen count's is measured against it in CONFIRM_PAIRS alternating pairs, and
  taken only where the median of the pairs' ratios is at least STEP_UP_GAIN (2.5 % better): under doubt
  the smaller count, whose memory is certain where the larger's gain is not (taken unless 2.5 % worse,
  as before, a toss-up drifted to the larger: on a flat curve it took it in 52-63 of 100 draws). It
  goes at most to the figures' own knee (`knee`: the smallest count within 5 % of the best mean
  figure), so a choice already at or past it stays (issue
  35: within 5 % of the best, at no more than 1.5x the memory). Paired ratios, not the two counts' rates
  apart: the disk's drift over the pairs is in both counts of a pair alike.
  The whole probe keeps to a wall-clock budget (probe_budget_s). A run shorter than PROBE_MIN_RUN_S is
  not probed (the probe would rival its window).
  The probe's threads share one pair of chunk buffers (their bytes are not checked), so the probe costs
  two chunks of memory, not two per thread; on S3 they write from one shared slot ring too
  (store.shared_slots, storage/remote.py SharedSlots), not one ring per thread. Without a storage tier (or in trace mode, moving no data) the
  count is one per user up to DEFAULT_MAX_WORKERS, as before.
- Memory: each worker holds a read and a write buffer of one chunk, and on S3 its slot ring
  (storage/remote.py ring_bytes; a Redis worker sends from its own write buffer and has none). They may
  take at most WORKER_MEMORY_FRACTION of what the run's RAM tiers may use (serving/tiers.py ram_budget_bytes); a count beyond that is clamped with a warning and a
  note, or refused (exit 2) under --strict-memory; a budget that limits the probe's counts is warned of.

The run reports the count, how it was chosen and the probe's figures (measurement.io_workers_choice).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kv_cache.core.pool import DEFAULT_MAX_WORKERS, Stream, buffer_id, run_threads
from kv_cache.errors import StorageSetupError
from kv_cache.host.memlimit import MemoryLimit
from kv_cache.storage.buffers import WorkerBuffers

log = logging.getLogger("kv_cache")

PROBE_COUNTS = (1, 2, 4, 8, 16, 32)
PROBE_SECONDS = 0.2  # per count and direction, in each of two passes: the passes take about 9 s here
CONFIRM_PAIRS = 3  # alternating pairs per confirmation of the chosen count against a larger one
CONFIRM_ROUNDS = 3  # confirmations at most (each may move the count, and so call for another)
PROBE_Z = 1.645  # standard errors a larger count must be better by, beyond the 5 % margin (one-sided 95 %)
NOISE_FLOOR = 0.01  # the least relative noise of one figure the rule assumes
MIN_OPS = 3  # per thread and step: the first is not counted (a burst into the device's cache)
OPS_LADDER = (MIN_OPS, 2, 1)  # operations per thread a step may take, where the budget is short (fit_ops)
PROBE_MIN_RUN_S = 120  # shorter runs are not probed (the probe, up to ~10 s, would rival their window)
PROBE_FRACTION = 0.95  # the smallest count reaching this share of the best rate
PROBE_BUDGET_FRACTION = 0.1  # of the run's duration: the whole probe's wall-clock allowance (12 s at 120 s)
PROBE_BUDGET_MAX_S = 30.0
STEP_UP_MEMORY = 1.5  # the step up (step_up): at most this many times the chosen count's memory
STEP_UP_GAIN = 1.025  # the step up is taken only where the larger count's median ratio is at least this
WORKER_MEMORY_FRACTION = 0.5  # of the RAM budget: the rest stays for the CPU tier
MEMORY_FRACTION = 0.9  # as serving/tiers.py: of what the process may use
RESERVE_BYTES = 256 << 20
GIB = float(1 << 30)
KEYS = ("write_gibps", "read_gibps")
REMOTE_OP_CHUNKS = 2  # a remote probe operation: the run's entry size, at most this many chunks (op_sizes)
MIXED = "mixed_gibps"  # the rule's figure: each byte written once and read back once (see mixed_rate)


@dataclass
class WorkerChoice:
    """The count and how it was chosen (JSON: `as_dict`)."""

    count: int
    how: str  # "--io-workers", "probe", "one per user (no storage tier to probe)", ...
    probe: list[dict[str, float]] = field(default_factory=list)  # [{"workers", "gibps", "seconds"}]
    clamped: str | None = None  # why the memory budget capped it (None: it did not)
    memory_cap: int = 0
    op_bytes: tuple[int, ...] = ()  # the probe's operation sizes, cycled (op_sizes); () where not probed

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "how": self.how, "probe": self.probe, "probe_fraction": PROBE_FRACTION,
                "probe_z": PROBE_Z, "noise": noise(self.probe) if self.probe else None,
                "clamped": self.clamped, "memory_cap": self.memory_cap, "op_bytes": list(self.op_bytes)}

    def line(self) -> str:
        """The console's account of it."""
        text = f"I/O workers: {self.count} ({self.how}"
        if self.probe:
            text += "; " + probe_text(self.probe)
        text += ")"
        return text + (f"; {self.clamped}" if self.clamped else "")


def probe_seconds(duration_s: float, max_requests: int = 0) -> float:
    """Each probe step's length: PROBE_SECONDS; 0 (no probe) for a run shorter than PROBE_MIN_RUN_S, or
    one that ends after --max-requests (its length unknown), whose window the probe (several seconds, more
    where each thread's three operations take longer) could rival."""
    return PROBE_SECONDS if float(duration_s or 0) >= PROBE_MIN_RUN_S and not max_requests else 0.0


def probe_budget_s(duration_s: float) -> float:
    """The whole probe's wall-clock allowance: PROBE_BUDGET_FRACTION of the run, at most PROBE_BUDGET_MAX_S.
    MIN_OPS per thread made a step on a slow tier long (moto at 0.05 GiB/s: 32 threads x 3 x 16 MiB is
    30 s a direction), and an unbounded probe of S3 ran for minutes before a 120 s window."""
    return min(PROBE_BUDGET_MAX_S, PROBE_BUDGET_FRACTION * float(duration_s or 0))


def op_sizes(chunk_bytes: int, entry_bytes: tuple[int, ...] = (), most_chunks: int = REMOTE_OP_CHUNKS) -> tuple[int, ...]:
    """The bytes of the probe's operations, cycled over its threads and operations: without `entry_bytes`
    (the file tiers, Redis) one chunk less its 4 KiB header, one chunk-sized syscall as the run's; with
    them (S3, whose run writes each entry as one object: benchmarks/standard/setup.py) the run's
    entry sizes, each at most REMOTE_OP_CHUNKS chunks (less the header) so that the probe's budget still
    reaches the larger counts. On moto 16 MiB objects made 1 worker the best (reads 0.5 GiB/s at 1
    against 0.29-0.69 at 4-8) where objects of 32-128 MiB, as the run's, rose 1.3-1.5x from 1 to 4-8
    (reads 0.07-0.2 GiB/s): the server's cost of an object grows faster than its size. `most_chunks`: the
    cap in chunks (the backend's, Backend.probe_op_chunks: on Redis one pipelined round trip)."""
    one = max(1, chunk_bytes - 4096)
    if not entry_bytes:
        return (one,)
    most = max(one, max(1, most_chunks) * chunk_bytes - 4096)
    return tuple(max(1, min(int(e), most)) for e in entry_bytes)


def mean_op(sizes: tuple[int, ...]) -> int:
    return max(1, sum(sizes) // max(1, len(sizes)))


class ProbeBudget:
    """The probe's remaining wall-clock time; `cut` says what it left out (None: nothing)."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.end = time.perf_counter() + self.seconds
        self.cut: str | None = None
        self.held = 0.0  # seconds kept for what comes after (the step up's pairs, while confirming)
        self.refused: str | None = None  # the smallest count whose writes the tier refused for room (ENOSPC)
        self.refused_at: int | None = None  # the smallest such count: the step up stays below it

    def room(self) -> float:
        return self.end - time.perf_counter() - self.held

    def fits(self, estimate_s: float) -> bool:
        return estimate_s <= self.room()


def step_estimate(n: int, gibps: float, nbytes: int, seconds: float, ops: int = MIN_OPS) -> float:
    """How long a step of `n` threads takes at `gibps` (a rate measured before): `seconds`, or the time
    its `ops` operations per thread need at that rate, whichever is longer (inf without a rate)."""
    if gibps <= 0:
        return float("inf")
    return max(seconds, n * ops * nbytes / (gibps * GIB))


def fit_ops(n: int, gibps: float, nbytes: int, seconds: float, room_s: float, share_s: float,
            steps: int = 2, least: int = 1) -> int:
    """The operations per thread a probe step of `n` threads takes (0: none fits): the most of OPS_LADDER
    whose `steps` steps (a write and a read) fit in `share_s` (the step's share of what is left: the room
    over the counts still to come), else the fewest that fit in `room_s`. On a slow tier (moto at 0.05
    GiB/s: 16 MiB in 0.3 s) MIN_OPS per thread let a 12 s budget reach only 1-4 workers, where a run did
    best at 8: a larger count measured with fewer operations (at 1, its one operation counted from the
    thread's start, _timed) is a figure where it was none. `least`: the fewest allowed (2 on the file
    tiers, whose first operation may burst into the device's write cache: it is never counted there)."""
    for ops in (o for o in OPS_LADDER if o >= least):
        if steps * step_estimate(n, gibps, nbytes, seconds, ops) <= share_s:
            return ops
    return least if steps * step_estimate(n, gibps, nbytes, seconds, least) <= room_s else 0


def probe_text(rows: list[dict[str, Any]]) -> str:
    """'probe GiB/s write/read 1: 0.40/0.90, 2: ...; again 32: ..., 16: ...; pairs 16: .../..., 8: ...'."""
    def fig(r: dict[str, Any]) -> str:
        return f"{r['workers']}: {r.get('write_gibps', 0):.2f}/{r.get('read_gibps', 0):.2f}"

    first = (fig(r) for r in rows if not r.get("confirm") and not r.get("step_up") and r.get("pass", 1) == 1)
    text = "probe GiB/s write/read " + ", ".join(first)
    again = [fig(r) for r in rows if r.get("pass") == 2]
    pairs = [fig(r) for r in rows if r.get("confirm")]
    ups = [fig(r) for r in rows if r.get("step_up")]
    return (text + ("; again " + ", ".join(again) if again else "") + ("; pairs " + ", ".join(pairs) if pairs else "")
            + ("; step up " + ", ".join(ups) if ups else ""))


def buffer_bytes(workers: int, chunk_bytes: int, ring: int = 0) -> int:
    """What `workers` workers' buffers hold: a read and a write buffer of one chunk each, and `ring`
    bytes each of the remote tier's slot ring (storage/remote.py ring_bytes; 0 on the file tiers)."""
    return (2 * chunk_bytes + max(0, ring)) * max(0, workers)


def memory_cap(chunk_bytes: int, limit: MemoryLimit, ring: int = 0) -> int:
    """The most workers whose buffers (and slot rings) fit in WORKER_MEMORY_FRACTION of the RAM budget
    (at least 1)."""
    if chunk_bytes <= 0:
        return 1 << 30
    budget = max(0, int(MEMORY_FRACTION * limit.available) - RESERVE_BYTES)
    return max(1, int(WORKER_MEMORY_FRACTION * budget) // buffer_bytes(1, chunk_bytes, ring))


def per_worker_text(chunk_bytes: int, ring: int) -> str:
    """'2 x 16 MiB each' or '2 x 16 MiB + a 128 MiB slot ring each'."""
    text = f"2 x {chunk_bytes >> 20} MiB"
    return text + (f" + a {ring / (1 << 20):.0f} MiB slot ring" if ring > 0 else "") + " each"


def bounded(requested: int, chunk_bytes: int, limit: MemoryLimit, strict: bool, notes: list[str],
            flag: str = "--io-workers", quiet: bool = False, ring: int = 0) -> tuple[int, str | None]:
    """`requested` workers, or the most that fit (with a warning and a note); refused under `strict`."""
    cap = memory_cap(chunk_bytes, limit, ring)
    if requested <= cap:
        return requested, None
    need = buffer_bytes(requested, chunk_bytes, ring)
    room = (f"{requested} I/O workers need {need / GIB:.2f} GiB of buffers ({per_worker_text(chunk_bytes, ring)}), "
            f"more than {WORKER_MEMORY_FRACTION:.0%} of the memory the run may use ({MEMORY_FRACTION:.0%} of "
            f"{limit.describe()}, less {RESERVE_BYTES >> 20} MiB reserve)")
    if strict:
        raise StorageSetupError(f"{requested}: {room} (--strict-memory); give at most {cap}").about("io_workers")
    message = f"{flag} {room}; clamped to {cap}"
    if not quiet:
        log.warning(message)
        notes.append(message)
    return cap, message


def _timed(n: int, seconds: float, op, stop: threading.Event | None, done=None,
           ops: int = MIN_OPS) -> tuple[float, float]:
    """`n` threads calling op(i, k) -> bytes until `seconds` have passed and each has done at least
    MIN_OPS: (GiB/s, seconds the step took). The rate is steady state: from the moment every thread has
    finished its first operation (a burst into whatever cache the device has) to the moment the first
    thread stopped, the bytes of the operations that ended in between over its length; where that span is
    empty, the bytes after each thread's first operation over the time from the first such end to the
    last thread's end. `done()`, when given, is called by each thread as it ends (the store frees what the
    thread held: its slot ring). `ops` (< MIN_OPS where the budget is short, fit_ops): the operations
    each thread does at least; at 1 its first is counted too, from the thread's start (a mark of 0 bytes
    at that moment stands for the operation not counted)."""
    ends: list[list[tuple[float, int]]] = [[] for _ in range(n)]  # per thread: (end time, bytes) per op
    start = time.perf_counter()
    deadline = start + seconds
    least = ops + 1 if ops < 2 else ops  # with the start mark

    def work(i: int) -> None:
        mine = ends[i]
        if ops < 2:
            mine.append((time.perf_counter(), 0))
        try:
            while len(mine) < least or time.perf_counter() < deadline:
                if stop is not None and stop.is_set():
                    break
                b = op(i, len(mine))
                mine.append((time.perf_counter(), b))
        finally:
            if done is not None:
                done()

    run_threads(work, n, "kv-probe")
    return steady_rate(ends), time.perf_counter() - start


def steady_rate(ends: list[list[tuple[float, int]]]) -> float:
    """GiB/s from each thread's operations [(end time, bytes), ...] (each starts where the one before it
    ended): from the moment every thread has finished its first operation to the moment the first
    thread stopped, each operation's bytes counted for the share of it that lies in that span (pro rata
    of its time). Counted whole by its end time, one late first operation made the span a fraction of a
    millisecond holding whole 16 MiB operations: 59 GiB/s from a disk that does 1.5. Where the span is
    empty, the bytes after each thread's first operation over the time from the first such end to the
    last thread's end."""
    if not ends or any(len(e) < 2 for e in ends):
        return 0.0
    t0, t1 = max(e[0][0] for e in ends), min(e[-1][0] for e in ends)
    if t1 > t0:
        moved = 0.0
        for e in ends:
            for (a, _), (b, nbytes) in zip(e, e[1:], strict=False):
                lo, hi = max(a, t0), min(b, t1)
                if hi > lo:
                    moved += nbytes * (hi - lo) / (b - a)
        return moved / GIB / (t1 - t0)
    first, last = min(e[0][0] for e in ends), max(e[-1][0] for e in ends)
    moved = sum(b for e in ends for _, b in e[1:])
    return moved / GIB / (last - first) if last > first else 0.0


def probe(store: Any, chunk_bytes: int, seed: int, counts: tuple[int, ...] = PROBE_COUNTS,
          seconds: float = PROBE_SECONDS, stop: threading.Event | None = None,
          directions: tuple[str, ...] = ("write", "read"),
          budget: ProbeBudget | None = None, known: dict[int, float] | None = None,
          label: str = "", entry_bytes: tuple[int, ...] = (), warm: bool = False,
          op_chunks: int = REMOTE_OP_CHUNKS) -> list[dict[str, float]]:
    """The storage tier's write rate and read rate at each count: [{"workers", "write_gibps",
    "read_gibps", "seconds"}]. With `budget`, a count whose write and read steps would not fit in what is
    left of it (estimated, step_estimate, from the rate `known` at that count, a pass before, else from
    the count before it) is not probed, nor any after it; with `known` (the descending second pass, whose
    counts after it cost less) the counts after it still are, where they fit.

    Writes: each thread writes entries under its own keys for `seconds` (and at least MIN_OPS of them),
    of one chunk, or with `entry_bytes` (S3) of the run's entry sizes, cycled over the threads
    and their operations (op_sizes); each row's "op_bytes" is then the mean size of the writes it
    measured. Reads: each thread reads back, as long, the entries the writes left (round robin from its
    own offset), so the reads meet data written before them, as a run's do. Rates are steady state (see
    _timed). The entries are deleted afterwards. `warm` (the first pass, on a remote tier: with `entry_bytes`
    or a store that counts its first operation, probe_counts_first_op): one entry of
    the largest size written and read back first, not counted, so that the first step, whose one operation
    a thread is counted from its start, does not pay for what any first operation pays once (the shared
    slot ring grown to its size, the connections opened)."""
    bufs = WorkerBuffers(chunk_bytes, seed, buffer_id(Stream.PROBE, 0))
    sizes = op_sizes(chunk_bytes, entry_bytes, op_chunks)
    nbytes = mean_op(sizes)  # what an operation moves, for the budget's estimates
    tally = [0, 0]  # the step's write bytes and operations (its row's op_bytes)
    written: set[str] = set()
    warmed: list[str] = []  # the warm-up's entry (warm), not among the ones the reads meet
    rows: list[dict[str, float]] = []
    lock = threading.Lock()
    release = getattr(store, "release_thread", None)  # remote tiers: each thread's slot ring, freed as it ends
    shared = getattr(store, "shared_slots", None)  # remote tiers: one slot ring for all the probe's threads
    slots = shared() if shared is not None else contextlib.nullcontext()
    least = 1 if getattr(store, "probe_counts_first_op", False) else 2  # fit_ops

    def write(i: int, k: int) -> int:
        key = f"kv-cache-probe-{i}-{k % 2}"
        size = sizes[(i + k) % len(sizes)]
        try:
            done = store.write(key, size, bufs).nbytes
        except BaseException:  # a write the tier refused (ENOSPC, a count left out) leaves no entry to read
            with lock:
                written.discard(key)
            raise
        with lock:
            written.add(key)
            tally[0] += size
            tally[1] += 1
        return done

    def read_step(row: dict[str, float]) -> bool:
        """The reads at the row's count, of the entries written so far (False: none, or stopped)."""
        keys = sorted(written)
        if stop is not None and stop.is_set() or not keys or "read" not in directions:
            return False
        gibps, elapsed = _timed(int(row["workers"]), seconds,
                                lambda i, k: store.read(keys[(i * 7 + k) % len(keys)], bufs).nbytes,
                                stop, release, int(row.get("ops", MIN_OPS)))
        row["read_gibps"] = gibps
        row["seconds"] = round(row["seconds"] + elapsed, 3)
        return True

    try:
        slots.__enter__()
        if warm and (entry_bytes or least == 1) and not (stop is not None and stop.is_set()):
            warmed.append("kv-cache-probe-warm")
            store.write(warmed[0], max(sizes), bufs)
            store.read(warmed[0], bufs)
        for j, n in enumerate(counts):
            if stop is not None and stop.is_set():
                break
            # with the run's entry sizes each count's reads follow its writes (read_step), and the estimate
            # takes both: the writes' rate alone (moto: 0.04 GiB/s writes, 0.2 reads) left 8 workers out
            last = (mixed_rate(rows[-1]) if entry_bytes else rows[-1]["write_gibps"]) if rows else 0.0
            rate = (known or {}).get(n) or last
            # the run's entry sizes on a remote tier that counts a first operation: one each from the start
            # (moto writes 32 MiB objects at 0.03-0.06 GiB/s: MIN_OPS at 1 worker took 3.6 s of a 12 s budget)
            # (Redis too: at a load of 11-17 its probe's 3 a thread at 32 workers took 10.5 s of a 12 s budget,
            # estimated from one lucky figure at 16, and no count was measured twice)
            ops = least if least == 1 and budget is not None else MIN_OPS
            if budget is not None and (rows or known):
                room = budget.room()
                ops = fit_ops(n, rate, nbytes, seconds, room, room / (len(counts) - j), len(directions), least)
                if least == 1:  # one a thread: an estimate from one noisy figure let 3 at 32 take 17 s of 12
                    ops = min(ops, least)
                if not ops:
                    est = len(directions) * step_estimate(n, rate, nbytes, seconds, least)
                    more = f"about {est:.1f} s more" + (f", {budget.held:.1f} s kept for the step up"
                                                         if budget.held > 0 else "")
                    if known is not None:  # a later pass, descending: the smaller counts after it cost less
                        budget.cut = budget.cut or f"{label}{n} workers ({more})"
                        continue
                    budget.cut = budget.cut or f"{label}{n} workers and more ({more})"
                    break
            tally[:] = [0, 0]
            try:
                gibps, elapsed = _timed(n, seconds, write, stop, release, ops)
            except OSError as exc:
                # the tier refused the writes of n workers for room (a Redis server's maxmemory holds every
                # pipelined round trip in flight: 32 workers x 8 x 16 MiB is 4 GiB): the run could not use n
                # either, so n is left out, not the whole probe (which fell back to one worker per user)
                if exc.errno != errno.ENOSPC or budget is None or (not rows and known is None):
                    raise
                if budget.refused_at is None or n < budget.refused_at:  # the account names the smallest
                    budget.refused, budget.refused_at = f"{label}{n} workers ({exc.strerror or exc})", n
                if known is not None:  # a later pass, descending: the smaller counts after it need less room
                    continue
                break
            rows.append({"workers": n, "write_gibps": gibps, "seconds": round(elapsed, 3)}
                        | ({"ops": ops} if ops != MIN_OPS else {})
                        | ({"op_bytes": tally[0] // tally[1]} if entry_bytes and tally[1] else {}))
            if entry_bytes and not read_step(rows[-1]):
                break
        for row in rows if not entry_bytes else ():
            if not read_step(row):
                break
    finally:
        slots.__exit__(None, None, None)
        for key in [*written, *warmed]:
            try:
                store.delete(key)
            except Exception:  # noqa: BLE001  (a probe entry left behind is removed with the run dir)
                pass
        bufs.close()
    return rows


def both_rates(store: Any, chunk_bytes: int, seed: int, n: int, seconds: float,
               stop: threading.Event | None = None, budget: ProbeBudget | None = None,
               known: dict[int, float] | None = None, label: str = "",
               entry_bytes: tuple[int, ...] = (), op_chunks: int = REMOTE_OP_CHUNKS) -> dict[str, float]:
    """The write and the read rate of `store` at `n` workers ({} where none was measured: with `budget`,
    where no step fits what is left of it, estimated from `known`, fit_ops), and "ops" where fewer than
    MIN_OPS per thread were done; `entry_bytes` as in probe ("op_bytes" then too)."""
    rows = probe(store, chunk_bytes, seed, (n,), seconds, stop, budget=budget,
                 known=known if budget is not None else None, label=label, entry_bytes=entry_bytes,
                 op_chunks=op_chunks)
    if not rows or not all(k in rows[0] for k in KEYS):
        return {}
    return {k: rows[0][k] for k in (*KEYS, "ops", "op_bytes") if k in rows[0]}


def mixed_rate(row: dict[str, Any]) -> float:
    """The rate at which the tier writes bytes and reads them back, 2 / (1/write + 1/read) GiB/s, the
    figure the rule judges: a run's storage bandwidth is its reads and writes together (a KV cache reads
    back what it wrote), and one figure makes one comparison per pair of counts, not two, each a chance
    for the noise to pass as a rise. 0 where either rate is missing."""
    w, r = row.get("write_gibps") or 0.0, row.get("read_gibps") or 0.0
    return 2 / (1 / w + 1 / r) if w > 0 and r > 0 else 0.0


def figures(rows: list[dict[str, Any]], key: str = MIXED) -> dict[int, list[float]]:
    """The natural logs of the `key` rates (MIXED: mixed_rate) measured at each count, over every row
    (both passes and the confirmation pairs); a rate <= 0 (none measured) is left out."""
    out: dict[int, list[float]] = {}
    for r in rows:
        v = mixed_rate(r) if key == MIXED else r.get(key)
        if isinstance(v, (int, float)) and v > 0:
            out.setdefault(int(r["workers"]), []).append(math.log(v))
    return out


def noise(rows: list[dict[str, Any]]) -> float | None:
    """The relative noise of one figure, from the counts measured more than once: each log mixed rate's
    deviation from its count's mean, scaled by sqrt(k / (k - 1)) (k figures at that count), and the median
    of their sizes over 0.6745 (a normal noise's median absolute deviation), at least NOISE_FLOOR. The
    median, not the root mean square: one stalled step (a neighbour's burst on a shared disk; a write
    figure of 0.11 GiB/s between two of 0.9) made the pooled standard deviation 39 % where the other
    figures spread by 13 %, and at that noise no rise on the curve is beyond it. None where no count was
    measured twice (then the rule has no interval and compares the figures as they are)."""
    dev: list[float] = []
    for logs in figures(rows).values():
        k = len(logs)
        if k > 1:
            m = sum(logs) / k
            dev += [abs(x - m) * math.sqrt(k / (k - 1)) for x in logs]
    if not dev:
        return None
    dev.sort()
    mid = len(dev) // 2
    median = dev[mid] if len(dev) % 2 else (dev[mid - 1] + dev[mid]) / 2
    return max(NOISE_FLOOR, median / 0.6745)


def beat_score(big: list[float], small: list[float], sigma: float | None) -> float:
    """How far the count with log rates `big` is better than the one with `small` beyond what the rule
    asks (> 0: better beyond the noise): its mean log rate's excess over the smaller count's, less the
    PROBE_FRACTION margin (log 1/0.95: 5 % more) and PROBE_Z standard errors of the difference (sigma x
    sqrt(1/k_big + 1/k_small)). Without a noise figure (sigma None): less the margin alone."""
    excess = sum(big) / len(big) - sum(small) / len(small) + math.log(PROBE_FRACTION)
    se = sigma * math.sqrt(1 / len(big) + 1 / len(small)) if sigma else 0.0
    return excess - PROBE_Z * se


def plateau(rows: list[dict[str, Any]]) -> int:
    """The rule on the figures alone: the smallest count that no larger count beats beyond the noise
    (beat_score > 0: a mixed rate more than 5 % higher, by more than PROBE_Z standard errors). A count is
    as good as a larger one unless the larger is shown better: on a noisy plateau that is the smallest
    count of it; up a real rise, however far, the top of the rise (1 without figures). A count measured
    once beats a smaller one only where the next larger count measured bears it out (`beats`)."""
    sigma, figs = noise(rows), figures(rows)
    counts = sorted(figs)
    for n in counts:
        if not any(beats(figs, m, n, sigma) for m in counts if m > n):
            return n
    return 1


def beats(figs: dict[int, list[float]], big: int, small: int, sigma: float | None) -> bool:
    """Whether count `big` is shown better than `small` (beat_score > 0), its one figure (where it was
    measured once) borne out by the next larger count measured, if any: that count not shown more than
    5 % below it (beyond PROBE_Z standard errors). A real rise holds past the count it reaches, one lucky
    figure does not: a Redis probe took 16 workers from one figure of 0.96 GiB/s (1-8: 0.26-0.45, 32:
    0.32; 9.2x the memory of the best count, 1). A rise to the largest count measured has nothing above
    it to bear it out, and stands."""
    if beat_score(figs[big], figs[small], sigma) <= 0:
        return False
    above = [c for c in figs if c > big]
    if len(figs[big]) > 1 or not above:
        return True
    nxt, one = figs[min(above)], figs[big]
    se = sigma * math.sqrt(1 / len(nxt) + 1) if sigma else 0.0
    return sum(nxt) / len(nxt) - one[0] > math.log(PROBE_FRACTION) - PROBE_Z * se


def closest_call(rows: list[dict[str, Any]], count: int) -> tuple[int, int] | None:
    """The comparison the rule's choice of `count` hangs on most narrowly, to be measured again, as
    (smaller, larger): (`count`, the larger count nearest to beating it), or (the count below `count`, the
    larger count that beats it by the least, whose beating put the choice above it): the one whose
    beat_score is nearest 0. None where there is neither."""
    sigma, figs = noise(rows), figures(rows)
    if count not in figs:
        return None
    calls = [(abs(beat_score(figs[m], figs[count], sigma)), count, m) for m in figs if m > count]
    below = [m for m in figs if m < count]
    if below:
        b = max(below)
        beaters = [(beat_score(figs[m], figs[b], sigma), b, m) for m in figs if m > b]
        beaters = [c for c in beaters if c[0] > 0]
        if len(beaters) == 1:  # with two or more, one more look at one of them would not lift the count below
            calls.append(beaters[0])
    if not calls:
        return None
    _, small, big = min(calls)
    return small, big


def decide(rows: list[dict[str, Any]], measure: Callable[[int], dict[str, float]], pairs: int = CONFIRM_PAIRS,
           stop: threading.Event | None = None, rounds: int = CONFIRM_ROUNDS) -> tuple[int, list[dict]]:
    """The rule (plateau) on the probe's figures `rows`, then confirmed where it is a close call: the
    comparison it hangs on most narrowly (closest_call: the chosen count against the larger count nearest
    to beating it, or the count below it against what beat that) is measured again in `pairs` alternating
    pairs (the larger, the smaller, the larger, the smaller: the same drift in both), `measure(n)` giving
    the write and read rates at n workers ({}: the budget has no room). The pairs' figures join the others
    (and the noise figure) and the rule is applied again, `rounds` times at most. Returns the count and
    the pairs' figures (rows marked "confirm", "vs": the count each was measured against)."""
    if not rows:
        return 1, []
    extra: list[dict] = []
    count = plateau(rows)
    for _ in range(rounds):
        call = closest_call([*rows, *extra], count)
        if call is None or (stop is not None and stop.is_set()):
            break
        small, big = call
        got: list[dict] = []
        for _ in range(pairs):
            pair = [(n, vs, measure(n)) for n, vs in ((big, small), (small, big))]
            if not all(rates for _, _, rates in pair):
                break
            got += [{"workers": n, "vs": vs, "confirm": True, **rates} for n, vs, rates in pair]
        if not got:
            break
        extra += got
        count = plateau([*rows, *extra])
    return count, extra


def step_target(count: int, top: int, worker_bytes: int, base_bytes: int) -> int:
    """The most workers, at most `top`, whose memory (`base_bytes` and `worker_bytes` each) is within
    STEP_UP_MEMORY of `count` workers' (`count` itself where none more is)."""
    if worker_bytes <= 0 or count >= top:
        return count
    room = STEP_UP_MEMORY * (max(0, base_bytes) + count * worker_bytes) - max(0, base_bytes)
    return max(count, min(top, int(room // worker_bytes)))


def knee(rows: list[dict[str, Any]]) -> int:
    """The figures at face value: the smallest count whose mean log mixed rate is within 5 %
    (PROBE_FRACTION) of the best count's (1 without figures). Where the step up may go at most: where the
    rule's choice is already there or beyond (a noisy plateau's high end), a step up adds only memory
    (a sweep here: the rule took 16, the step up 20, 1.56x the memory of the best count, 12)."""
    means = {n: sum(v) / len(v) for n, v in figures(rows).items()}
    if not means:
        return 1
    top = max(means.values())
    return min(n for n, m in means.items() if m >= top + math.log(PROBE_FRACTION))


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def step_up(count: int, target: int, measure: Callable[[int], dict[str, float]], pairs: int = CONFIRM_PAIRS,
            stop: threading.Event | None = None) -> tuple[int, list[dict], str]:
    """`target` workers (step_target: the most within STEP_UP_MEMORY of `count`'s memory) against `count`
    in `pairs` alternating pairs (target, count, target, count: the drift in both alike), `measure(n)`
    giving the write and read rates ({}: no room in the budget); a pair with a rate missing, zero or
    not finite is left out. `target` only where the median of the pairs' ratios of the mixed rate is at
    least STEP_UP_GAIN (the larger count 2.5 % better: half the goal's 5 %): under doubt the smaller
    count, since the larger one's memory is certain and its gain is not. On a flat curve at 5-10 % noise
    per figure the larger is taken in about a third of the draws, across a real 10 % step in three
    quarters or more (tests/test_io_workers.py). Returns the count, the pairs' rows (marked "step_up", "vs") and what was done, for
    the run's account ("" where nothing was measured: target is count, or no room)."""
    if target <= count:
        return count, [], ""
    rows: list[dict] = []
    logs: list[float] = []
    for _ in range(pairs):
        if stop is not None and stop.is_set():
            break
        got = [(n, vs, measure(n)) for n, vs in ((target, count), (count, target))]
        if not all(rates for _, _, rates in got):
            break
        rows += [{"workers": n, "vs": vs, "step_up": True, **rates} for n, vs, rates in got]
        if all(math.isfinite(rates.get(k) or 0.0) for _, _, rates in got for k in KEYS):
            big, small = mixed_rate(got[0][2]), mixed_rate(got[1][2])
        else:
            big = small = 0.0
        if big > 0 and small > 0:
            logs.append(math.log(big / small))
    head = f"then {target} workers (the most within {STEP_UP_MEMORY:g}x the memory of {count}) against {count}"
    if not logs:
        return count, rows, f"{head}: no pair measured" + (" (the budget had no room)" if not rows else "")
    r = math.exp(median(logs))
    chosen = target if r >= STEP_UP_GAIN else count
    return chosen, rows, (f"{head} in {len(logs)} alternating pair{'s' if len(logs) > 1 else ''}: median ratio "
                          f"{r:.3f}, so {chosen}")


def resident_bytes() -> int:
    """The process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096)
    except (OSError, ValueError, IndexError):
        return 0


def choose(io_workers: int, users: int, limit_allocs: int, chunk_bytes: int, mem: MemoryLimit, strict: bool,
           notes: list[str], store: Any = None, seed: int = 0,
           stop: threading.Event | None = None, probe_seconds: float = PROBE_SECONDS,
           demand: int = 0, ranks: int = 1, budget_s: float = PROBE_BUDGET_MAX_S,
           ring: int | None = None, base_bytes: int | None = None,
           entry_bytes: tuple[int, ...] = (), op_chunks: int = REMOTE_OP_CHUNKS) -> WorkerChoice:
    """The run's count: --io-workers when given, else the probe's (or one per user without a tier to
    probe), at most `limit_allocs` when it is > 0 (--max-concurrent-allocs), bounded by memory: each
    worker's two buffers and `ring` bytes of slot ring (None: the store's `ring_bytes`, 0 for a store
    without one). `demand` (> 0): the most requests that can be in flight at once (closed loop: one per
    user), above which a probed count adds only buffers. `ranks` > 1: several ranks of one run (MPI,
    --processes) are not probed: their probes would measure each other, and a rank waiting at a barrier
    meanwhile. `base_bytes`: the memory besides the workers' for the step up (None: the process's resident
    memory at the probe, resident_bytes). `entry_bytes`: the run's entry sizes, the probe's operations
    on S3 and Redis (op_sizes, at most `op_chunks` chunks each; () for one chunk each: the file tiers)."""
    ring = int(getattr(store, "ring_bytes", 0) or 0) if ring is None else ring
    sizes: tuple[int, ...] = ()
    cap = memory_cap(chunk_bytes, mem, ring)
    if io_workers:
        count, clamped = bounded(io_workers, chunk_bytes, mem, strict, notes, ring=ring)
        how = "--io-workers"
        rows: list[dict[str, Any]] = []
    else:
        counts = tuple(c for c in PROBE_COUNTS if c <= cap) or (1,)
        why_not = ("no storage tier to probe" if store is None or chunk_bytes <= 0 else
                   f"{ranks} ranks: not probed (their probes would measure each other)" if ranks > 1 else
                   f"a run shorter than {PROBE_MIN_RUN_S} s, or ended by --max-requests, is not probed"
                   if probe_seconds <= 0 else "")
        rows = []
        if not why_not:
            try:
                budget = ProbeBudget(budget_s)
                sizes = op_sizes(chunk_bytes, entry_bytes, op_chunks)
                rows = probe(store, chunk_bytes, seed, counts, probe_seconds, stop, budget=budget,
                             entry_bytes=entry_bytes, warm=True, op_chunks=op_chunks)
                known = {int(r["workers"]): mixed_rate(r) if entry_bytes else min(r.get(k, 0.0) for k in KEYS)
                         for r in rows}
                again = probe(store, chunk_bytes, seed, tuple(sorted(known, reverse=True)), probe_seconds, stop,
                              budget=budget, known=known, label="the second pass at ",  # descending: drift cancels
                              entry_bytes=entry_bytes, op_chunks=op_chunks)
                rows += [{**r, "pass": 2} for r in again]

                base = resident_bytes() if base_bytes is None else base_bytes
                per_worker = buffer_bytes(1, chunk_bytes, ring)

                def rate_at(n: int) -> float:
                    below = max((k for k in known if k <= n), default=0)  # a count not probed: the one below
                    return known.get(n) or known.get(below) or max(known.values(), default=0.0)

                least = 1 if getattr(store, "probe_counts_first_op", False) else 2  # as in probe

                def cost(n: int) -> float:  # a write and a read step at n workers, estimated (the fewest ops)
                    return 2 * step_estimate(n, rate_at(n), mean_op(sizes), probe_seconds, least)

                def pairs_cost(count: int) -> float:  # the step up's pairs from `count`
                    target = min(step_target(count, counts[-1], per_worker, base), max(count, knee(rows)))
                    return CONFIRM_PAIRS * (cost(target) + cost(count)) if target > count else 0.0

                def room_left(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
                    """The figures below the smallest count the tier refused for room (ENOSPC): a count the
                    second pass found refused kept its first pass's figure, and the rule chose it."""
                    cut = budget.refused_at
                    return rs if cut is None else [r for r in rs if int(r["workers"]) < cut]

                reserve = [pairs_cost(plateau(room_left(rows)))]  # the step up's room, kept from the confirmations

                def measure(n: int, what: str = "a confirmation") -> dict[str, float]:  # if the budget has room
                    budget.held = reserve[0]
                    try:
                        return both_rates(store, chunk_bytes, seed, n, probe_seconds, stop, budget,
                                          {n: rate_at(n)}, f"{what} at ", entry_bytes, op_chunks)
                    finally:
                        budget.held = 0.0

                picked, pairs = decide(room_left(rows), measure, stop=stop)
                if budget.refused_at is not None and picked >= budget.refused_at:  # refused in a confirmation
                    picked = plateau(room_left([*rows, *pairs]))
                reserve[0] = 0.0
                top = counts[-1] if budget.refused_at is None else max(1, budget.refused_at - 1)
                target = min(step_target(picked, top, per_worker, base),
                             max(picked, knee(room_left([*rows, *pairs]))))
                picked, ups, stepped = step_up(picked, target, lambda n: measure(n, "the step up"), stop=stop)
                rows = [*rows, *pairs, *ups]
            except OSError as exc:  # the run's own phases meet the same error and report it as theirs
                why_not, rows = f"the probe failed: {exc}", []
                notes.append(f"I/O worker probe of the storage tier failed ({exc}): one worker per user instead")
    if not io_workers and (why_not or not rows):
        count, clamped = bounded(max(1, min(users, DEFAULT_MAX_WORKERS)), chunk_bytes, mem, False, notes, "auto:",
                                 ring=ring)
        how = f"one per user up to {DEFAULT_MAX_WORKERS} ({why_not or 'the probe was stopped'})"
    elif not io_workers:
        count = picked
        sigma = noise(rows)
        clamped = None
        if counts[-1] < PROBE_COUNTS[-1]:
            clamped = (f"the memory budget ({per_worker_text(chunk_bytes, ring)}) limited the probe to "
                       f"{counts[-1]} workers")
            log.warning("I/O workers: %s", clamped)
            notes.append(f"I/O workers: {clamped}")
        how = (f"probe of {', '.join(map(str, counts))} in two passes: the smallest count no larger one beats by "
               f"more than {1 / PROBE_FRACTION - 1:.0%} beyond the noise ({PROBE_Z:g} standard errors; one "
               f"figure's noise {'unknown' if sigma is None else f'{sigma:.0%}'}), in the rate of writing bytes "
               "and reading them back")
        if entry_bytes:
            how += (f", operations of the run's entry sizes {'/'.join(f'{b / (1 << 20):.0f}' for b in sizes)} MiB "
                    f"(at most {op_chunks} chunks)")
        confirmed = sorted({(int(r["workers"]), int(r["vs"])) for r in rows if r.get("confirm")})
        if confirmed:
            how += "; checked again in alternating pairs: " + ", ".join(
                f"{min(a, b)} vs {max(a, b)}" for a, b in sorted({(min(a, b), max(a, b)) for a, b in confirmed}))
        if stepped:
            how += f"; {stepped} (memory: {base / (1 << 20):.0f} MiB resident at the probe + "\
                   f"{per_worker_text(chunk_bytes, ring)})"
        if budget.cut:
            how += f"; the probe's {budget.seconds:.0f} s budget left out {budget.cut}"
        if budget.refused:
            how += f"; the tier refused the writes of {budget.refused}: that count and larger ones left out"
        if 0 < demand < count:
            count = demand
            how += f"; at most {demand}, one per user (a closed-loop user has one request in flight)"
    if limit_allocs > 0 and count > limit_allocs:
        count = limit_allocs
        how += f", at most --max-concurrent-allocs {limit_allocs}"
    return WorkerChoice(max(1, count), how, rows, clamped, cap, sizes if rows else ())


def provisional(io_workers: int, users: int, chunk_bytes: int, mem: MemoryLimit, strict: bool, ring: int = 0) -> int:
    """The most workers the run may end up with (what the RAM tiers' budget keeps room for before the
    probe runs): --io-workers bounded by memory (buffers and `ring` bytes of slot ring each), else the
    probe's largest count (or one per user)."""
    if io_workers:
        return bounded(io_workers, chunk_bytes, mem, strict, [], quiet=True, ring=ring)[0]
    return min(max(PROBE_COUNTS[-1], min(users, DEFAULT_MAX_WORKERS)), memory_cap(chunk_bytes, mem, ring))
