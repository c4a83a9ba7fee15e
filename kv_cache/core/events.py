"""The scheduler core: a timer heap of events, a completion queue fed by executor threads, a dispatch table.

The owning thread alone touches the heap; executors (I/O workers, engine replicas) only append to the
completion queue, which wakes the owner. Handlers are small functions `(when_ns, payload) -> Stop | None`
looked up by event kind, so each can be tested with a fake clock and no threads.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[[int, Any], "Stop | None"]

SLICE_NS = 2_000_000  # run_due hands control back after about this long, however many events are due
CLOCK_EVERY = 32  # events dispatched between two looks at the clock (one costs ~50 ns)


@dataclass(frozen=True)
class Stop:
    """A handler's request to end the run; `at_ns` None = now."""

    reason: str
    at_ns: int | None = None


class EventLoop:
    def __init__(self, handlers: dict[str, Handler] | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.clock = clock
        self._heap: list[tuple[int, int, str, Any]] = []
        self._seq = itertools.count()
        self._done: deque = deque()
        self._cond = threading.Condition()
        self.alarm: str | None = None  # set by an executor: the run must stop (first reason kept)

    # -- timer heap (owner thread) --------------------------------------------------------------
    def push(self, when: int, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), kind, payload))

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def wait_next(self, limit: int) -> None:
        """Sleep until the next event, a completion or an alarm, never past `limit`."""
        nxt = self.next_time()
        self.wait(limit if nxt is None else min(nxt, limit))

    def remove(self, kind: str) -> list[Any]:
        """Take every queued event of `kind` off the heap; returns their payloads (the run is over)."""
        taken = [payload for _, _, k, payload in self._heap if k == kind]
        self._heap = [e for e in self._heap if e[2] != kind]
        heapq.heapify(self._heap)
        return taken

    def pending(self, kind: str) -> bool:
        return any(k == kind for _, _, k, _ in self._heap)

    def pop_due(self, now: int, horizon: int) -> tuple[int, str, Any] | None:
        """The earliest event due by `now`, unless it lies beyond `horizon` (it then stays queued)."""
        if not self._heap or self._heap[0][0] > now:
            return None
        when, _, kind, payload = heapq.heappop(self._heap)
        if when > horizon:
            heapq.heappush(self._heap, (when, 0, kind, payload))
            return None
        return when, kind, payload

    def dispatch(self, when: int, kind: str, payload: Any) -> Stop | None:
        return self.handlers[kind](when, payload)

    def run_due(self, now: int, horizon: int, slice_ns: int = SLICE_NS) -> Stop | None:
        """Dispatch the events due by `now` (also those the handlers schedule meanwhile, when due by `now`),
        for at most `slice_ns` of the clock: however many are due, the caller gets control back within about
        a slice, to take completions and look at the deadline (an open loop at a rate the handlers cannot
        keep up with used to keep this call dispatching arrivals forever)."""
        until = self.clock() + slice_ns
        n = 0
        while (event := self.pop_due(now, horizon)) is not None:
            stop = self.dispatch(*event)
            if stop is not None:
                return stop
            n += 1
            if n % CLOCK_EVERY == 0 and self.clock() >= until:
                break
        return None

    # -- completion queue (any thread) ----------------------------------------------------------
    def complete(self, item: Any) -> None:
        with self._cond:
            self._done.append(item)
            self._cond.notify()

    def raise_alarm(self, reason: str) -> None:
        with self._cond:
            if self.alarm is None:
                self.alarm = reason
            self._cond.notify()

    def take_completions(self) -> list:
        with self._cond:
            done = list(self._done)
            self._done.clear()
        return done

    def wait(self, until_ns: int) -> None:
        """Sleep until `until_ns`, a completion or an alarm, whichever comes first."""
        with self._cond:
            if not self._done and self.alarm is None:
                self._cond.wait(max(0.0, (until_ns - self.clock()) / 1e9))
