"""Live progress of a run, fed by the driver's 1-second ticks (core/observe.py).

On a terminal: a rich live panel (elapsed and remaining time, requests, read/write GiB/s per tier in the
last second, p95 per tier and direction, cache occupancy). Elsewhere (a pipe, a log file): one plain line
every `every_s` seconds. Nothing at all with --log-level WARNING or quieter. Always on stderr, so stdout
keeps the report alone. Under `--processes` the parent shows the ranks' total (core/observe.py
`RankTicks`): the line counts the requests of every rank, sums their GiB/s, and ends with each rank's own
figures.
"""

from __future__ import annotations

import sys
from typing import TextIO

from kv_cache.core.observe import RunObserver, Tick
from kv_cache.storage.tiername import TierName

GIB = float(1 << 30)
TIER_ORDER = tuple(TierName)
QUIET_LEVELS = ("WARNING", "ERROR", "CRITICAL")


def _clock(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def tier_parts(row: dict, p95_label: str = "p95") -> list[str]:
    """'storage R 1.20 W 0.40 GiB/s (p95 R 3.1 W 8.2 ms)' for each tier that moved bytes in the bucket."""
    parts = []
    for tier in TIER_ORDER:
        r, w = row.get(f"{tier}_read_gibps"), row.get(f"{tier}_write_gibps")
        if r is None and w is None:
            continue
        p95 = " ".join(f"{d} {row[f'{tier}_{op}_p95_ms']:.1f}" for d, op in (("R", "read"), ("W", "write"))
                       if f"{tier}_{op}_p95_ms" in row)
        parts.append(f"{tier} R {r or 0:.2f} W {w or 0:.2f} GiB/s" + (f" ({p95_label} {p95} ms)" if p95 else ""))
    return parts


def occupancy(row: dict) -> str:
    used = [f"{t} {row[f'occupancy_{t}_bytes'] / GIB:.2f}" for t in TIER_ORDER
            if row.get(f"occupancy_{t}_bytes")]
    return f"used GiB: {' '.join(used)}" if used else ""


def progress_line(tick: Tick) -> str:
    """One plain progress line from a tick. A total over ranks says how many, marks its p95 as the
    highest rank's (a bucket's percentile of the union is not known), and ends with each rank's figures."""
    remaining = max(0.0, tick.duration_s - tick.elapsed_s)
    over = f" by {len(tick.ranks)} ranks" if tick.ranks else ""
    head = (f"[{_clock(tick.elapsed_s)} elapsed, {_clock(remaining)} left] {tick.completed} requests done{over}"
            f" ({tick.row.get('requests', 0)} in the last {tick.row.get('seconds', 0):.0f} s),"
            f" {tick.issued - tick.completed} in progress")
    rest = [*tier_parts(tick.row, "p95 of the slowest rank" if tick.ranks else "p95"), occupancy(tick.row),
            f"users {tick.row.get('active_users', 0)}"]
    if tick.ranks:
        rest.append("per rank: " + ", ".join(_rank_part(r, t) for r, t in tick.ranks))
    return " | ".join([head, *(p for p in rest if p)])


def _rank_part(rank: int, tick: Tick) -> str:
    """'rank 1 61 done (storage R 0.60 W 0.20 GiB/s)': a rank's requests done and its slowest tier's rates."""
    tier = next((t for t in reversed(TIER_ORDER)
                 if tick.row.get(f"{t}_read_gibps") is not None or tick.row.get(f"{t}_write_gibps") is not None), None)
    rates = (f" ({tier} R {tick.row.get(f'{tier}_read_gibps') or 0:.2f} W {tick.row.get(f'{tier}_write_gibps') or 0:.2f}"
             " GiB/s)" if tier else "")
    return f"rank {rank} {tick.completed} done{rates}"


class PlainProgress:
    """A line every `every_s` seconds of the run (away from a terminal)."""

    def __init__(self, stream: TextIO, every_s: float = 10.0) -> None:
        self.stream, self.every_s, self._next = stream, every_s, every_s

    def tick(self, tick: Tick) -> None:
        if tick.elapsed_s + 1e-6 >= self._next:
            self._next = tick.elapsed_s + self.every_s
            self.stream.write(progress_line(tick) + "\n")
            self.stream.flush()

    def done(self) -> None:
        pass


class LiveProgress:
    """A rich live panel redrawn at every tick (on a terminal): a bar for the window, then one line per part."""

    def __init__(self, stream: TextIO, duration_s: float) -> None:
        from rich.console import Console  # noqa: PLC0415  (only on a terminal)
        from rich.live import Live  # noqa: PLC0415
        from rich.progress import BarColumn, Progress, TextColumn  # noqa: PLC0415

        self._bar = Progress(TextColumn("measured window"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"))
        self._task = self._bar.add_task("", total=max(duration_s, 1e-9))
        self._live = Live(self._bar, console=Console(file=stream), refresh_per_second=2, transient=True)
        self._live.start()

    def tick(self, tick: Tick) -> None:
        from rich.console import Group  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        self._bar.update(self._task, completed=min(tick.elapsed_s, tick.duration_s))
        self._live.update(Group(self._bar, Text("\n".join(progress_line(tick).split(" | ")), overflow="fold")))

    def done(self) -> None:
        self._live.stop()


def make_progress(log_level: str, duration_s: float, stream: TextIO | None = None,
                  every_s: float | None = None) -> RunObserver | None:
    """The progress display for this run: live on a terminal, plain lines elsewhere, none when quiet.

    Plain lines come every `every_s` seconds: by default a tenth of the duration, between 1 and 10 s."""
    if log_level.upper() in QUIET_LEVELS:
        return None
    stream = stream or sys.stderr
    if stream.isatty():
        return LiveProgress(stream, duration_s)
    return PlainProgress(stream, every_s if every_s is not None else min(10.0, max(1.0, duration_s / 10)))
