"""How the driver tells the outside world what is happening, without knowing who listens.

At every 1-second tick the driver closes a time-series bucket and hands a `Tick` to each observer (a live
progress display, for instance). Observers live above the driver (render/progress.py); the driver only
knows this protocol, so the layering holds. An observer must be quick: it runs on the scheduler thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Tick:
    """The run so far: elapsed and planned seconds, request counts, and the bucket just closed."""

    elapsed_s: float
    duration_s: float
    issued: int
    completed: int
    row: dict


class RunObserver(Protocol):
    def tick(self, tick: Tick) -> None: ...

    def done(self) -> None: ...
