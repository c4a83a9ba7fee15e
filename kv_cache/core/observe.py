"""How the driver tells the outside world what is happening, without knowing who listens.

At every 1-second tick the driver closes a time-series bucket and hands a `Tick` to each observer (a live
progress display, for instance). Observers live above the driver (render/progress.py); the driver only
knows this protocol, so the layering holds. An observer must be quick: it runs on the scheduler thread.

Under `--processes` the ranks' displays are the parent's: each rank sends its ticks there (`RankConsole`),
and `RankTicks` turns them into one tick per second of the common window, the total over the ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kv_cache.metrics.timeseries import merge_rows


@dataclass(frozen=True)
class Tick:
    """The run so far: elapsed and planned seconds, request counts, and the bucket just closed.

    `ranks`: when this tick is the total over several ranks (`total_tick`), each rank's own latest tick,
    by rank; empty for one rank's tick."""

    elapsed_s: float
    duration_s: float
    issued: int
    completed: int
    row: dict
    ranks: tuple[tuple[int, Tick], ...] = ()


class RunObserver(Protocol):
    def tick(self, tick: Tick) -> None: ...

    def done(self) -> None: ...


@runtime_checkable
class RankConsole(Protocol):
    """A rank whose console is another process's (a rank of `--processes`): its ticks and the sizes in
    force go to the parent, which shows one display and one banner for the run."""

    def observer(self) -> RunObserver | None:
        """Where this rank's ticks go (None: the parent shows no progress)."""

    def announce(self, sizes: Mapping[str, Mapping[str, Any]]) -> None:
        """The banner just printed and the tier sizes in force (TierSet.sizes), for the parent's banner."""


def total_tick(ticks: Mapping[int, Tick], bucket: Mapping[int, Tick]) -> Tick:
    """The total over the ranks: `ticks` is every rank's latest tick (their requests issued and done
    are summed), `bucket` the ticks of the second being shown (their rows summed as the merged time
    series sums them: requests, bytes, GiB/s from the summed bytes, gauges; a percentile is the highest
    rank's, an upper bound of the union's)."""
    shown = [bucket[r] for r in sorted(bucket)]
    return Tick(elapsed_s=max(t.elapsed_s for t in shown), duration_s=shown[0].duration_s,
                issued=sum(t.issued for t in ticks.values()), completed=sum(t.completed for t in ticks.values()),
                row=merge_rows([[t.row] for t in shown])[0], ranks=tuple(sorted(ticks.items())))


class RankTicks:
    """The ticks of `n` ranks (one window, opened by a barrier) as one tick per second for `display`.

    Second k is shown once every rank still running has sent its tick k or a later one; a rank that has
    ended (its window closed, or it was lost) is no longer waited for, and keeps its last counts in the
    totals. `display.done()` comes when every rank has ended."""

    def __init__(self, n: int, display: RunObserver) -> None:
        self.display = display
        self.running = set(range(n))
        self.latest: dict[int, Tick] = {}
        self._pending: dict[int, dict[int, Tick]] = {}  # second -> rank -> tick
        self._done = False

    def add(self, rank: int, tick: Tick) -> None:
        self._pending.setdefault(_second(tick), {})[rank] = tick
        self._show()

    def end(self, rank: int) -> None:
        """Rank `rank` sends no more ticks (it said so, or it ended)."""
        self.running.discard(rank)
        self._show()
        if not self.running and not self._done:
            self._done = True
            self.display.done()

    def _show(self) -> None:
        while self._pending:
            k = min(self._pending)
            later = {r for s, got in self._pending.items() if s > k for r in got}
            if not self.running <= set(self._pending[k]) | later:
                return
            bucket = self._pending.pop(k)
            self.latest.update(bucket)
            if not self._done:
                self.display.tick(total_tick(self.latest, bucket))


def _second(tick: Tick) -> int:
    """Which second of the window a tick closes (the last, partial bucket counts as one more)."""
    return max(1, int(tick.elapsed_s + 0.999))
