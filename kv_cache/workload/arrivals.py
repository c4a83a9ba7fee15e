"""Poisson arrivals: the one generator behind every open loop (synthetic users and re-timed traces).

Its stream is `random.Random("kv-cache-arrivals:<seed>")`; the synthetic open loop draws which user
arrives from the same stream, between gaps, so a seed always offers the same arrivals.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class PoissonArrivals:
    def __init__(self, rate: float, seed: int) -> None:
        if rate <= 0:
            raise ValueError(f"arrival rate must be > 0, got {rate}")
        self.rate = rate
        self.rng = random.Random(f"kv-cache-arrivals:{seed}")
        self._counts = np.random.default_rng([0x6B76, seed & 0xFFFFFFFF])  # skip(): its own stream

    def skip(self, seconds: float) -> int:
        """How many arrivals of the process fall in `seconds` (a Poisson count of mean rate x seconds):
        those a generator that fell behind its clock by that long did not offer. Drawn from a stream of
        its own, so the gaps and picks a seed gives stay the same."""
        mean = self.rate * max(0.0, seconds)
        if mean <= 0:
            return 0
        return int(self._counts.poisson(mean)) if mean < 1e15 else round(mean)

    def gap_s(self) -> float:
        """Seconds to the next arrival (exponential with mean 1/rate)."""
        return self.rng.expovariate(self.rate)

    def pick(self, n: int) -> int:
        """Which of `n` users the arrival belongs to (uniform)."""
        return self.rng.randrange(n)

    def retime(self, rows: Iterable[tuple[float, T]]) -> Iterator[tuple[float, T]]:
        """The rows' payloads in order, their recorded times replaced by Poisson arrival times."""
        t = 0.0
        for _, item in rows:
            t += self.gap_s()
            yield t, item
