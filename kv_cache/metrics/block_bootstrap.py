"""Intervals that hold on correlated samples: the circular block bootstrap, its block length chosen from
the data, and ratios of paired replications (numpy only).

Turns measured in one closed-loop run are not independent: a queue that built up keeps the next turns
slow, so consecutive TTFTs are correlated (an AR(1) coefficient near 1 in a saturated loop). Resampling
turns one by one (the plain bootstrap) then gives intervals far too narrow. The circular block bootstrap
(Politis & Romano 1992) resamples blocks of ``b`` consecutive values (in the order they were measured,
wrapping at the end), so the correlation inside a block survives:

- ``block_length``: b from the data, by the Politis-White (2004) rule with the Patton-Politis-White
  (2009) correction for the circular bootstrap: ``b = (2 G^2 / D)^(1/3) n^(1/3)``, with
  ``G = sum_k lambda(k/M) |k| R(k)``, ``D = 4/3 g(0)^2``, ``g(0) = sum_k lambda(k/M) R(k)``, R the
  sample autocovariance, lambda the flat-top lag window and M = 2 m, m the smallest lag after which
  ``max(5, sqrt(log10 n))`` autocorrelations in a row are within ``2 sqrt(log10 n / n)`` of 0. For a
  percentile the rule runs on the indicator series ``1{x <= the percentile}``, whose correlation is what
  the percentile's variance depends on; b is the larger of that and the values' own. b is kept in
  [1, n / 3].
- ``block_bootstrap_ci``: mean or percentile q of the values with a circular block bootstrap interval.
  The interval is the normal interval on the bootstrap standard error, with that variance corrected for
  the blocks' known downward bias on an AR(1)-like series (the variance of a mean of blocks of b misses
  the correlation across block ends: the factor is ``1 / (1 - tau / b)``, tau the integrated correlation
  time from the same flat-top estimate, when b > 2 tau; 2, its value at b = 2 tau, for shorter blocks),
  and the interval is then the
  t-interval with ``n / b - 1`` degrees of freedom (the number of independent blocks): few blocks, wider.
- ``paired_ratio_ci``: the ratio of two quantities measured in K paired replications (replication k of
  both uses the same seed, so the same sessions): the geometric mean of the K ratios with a t-interval on
  their logs, the spread between replications being the only variance source that is honest about
  everything a run does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from kv_cache.metrics.stats import CI, t_quantile

__all__ = ["block_bootstrap_ci", "block_length", "correlation_time", "paired_ratio_ci"]

BOOTSTRAP_CELLS = 4_000_000  # resampled values held at once (memory bound of one chunk)


def _autocov(x: np.ndarray, max_lag: int) -> np.ndarray:
    """Sample autocovariances R(0..max_lag) (divisor n), by FFT."""
    n = x.size
    d = x - x.mean()
    f = np.fft.rfft(d, 2 * n)
    acov = np.fft.irfft(f * np.conj(f))[: max_lag + 1] / n
    return acov


def _flat_top(t: np.ndarray) -> np.ndarray:
    """The flat-top lag window: 1 for |t| <= 1/2, 2 (1 - |t|) up to 1, 0 beyond."""
    a = np.abs(t)
    return np.where(a <= 0.5, 1.0, np.where(a <= 1.0, 2.0 * (1.0 - a), 0.0))


def _bandwidth(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(autocovariances up to M, M): the Politis-White lag cut-off M = 2 m (see the module docstring)."""
    n = x.size
    kn = max(5, int(math.ceil(math.sqrt(math.log10(max(n, 10))))))
    max_lag = min(n - 1, max(kn + 1, int(math.ceil(math.sqrt(n))) + kn, n // 3))
    acov = _autocov(x, max_lag)
    if acov[0] <= 0:
        return acov[:1], 0
    rho = acov / acov[0]
    bound = 2.0 * math.sqrt(math.log10(max(n, 10)) / n)
    small = np.abs(rho[1:]) < bound  # small[k-1]: lag k insignificant
    m = max_lag - kn
    for k in range(0, max_lag - kn + 1):
        if np.all(small[k:k + kn]):
            m = k
            break
    big_m = min(2 * max(m, 1), max_lag)
    return acov[: big_m + 1], big_m


def _flat_top_sums(x: np.ndarray) -> tuple[float, float]:
    """(g(0), G) of the Politis-White rule (sums over lags -M..M, symmetric)."""
    acov, big_m = _bandwidth(x)
    if big_m == 0:
        return float(acov[0]), 0.0
    k = np.arange(1, big_m + 1)
    w = _flat_top(k / big_m)
    g0 = float(acov[0] + 2.0 * np.sum(w * acov[1:]))
    big_g = float(2.0 * np.sum(w * k * acov[1:]))
    return g0, big_g


def correlation_time(values: Iterable[float] | np.ndarray) -> float:
    """Integrated correlation time ``tau = g(0) / R(0)`` (1 for independent values, (1+phi)/(1-phi) for
    AR(1)): how many values carry the information of one independent value."""
    x = np.asarray(values, dtype=float)
    if x.size < 3:
        return 1.0
    acov0 = float(np.var(x))
    if acov0 <= 0:
        return 1.0
    g0, _ = _flat_top_sums(x)
    return max(1.0, g0 / acov0)


def _rule(x: np.ndarray) -> float:
    n = x.size
    g0, big_g = _flat_top_sums(x)
    if g0 <= 0 or big_g == 0:
        return 1.0
    d = 4.0 / 3.0 * g0 * g0
    return (2.0 * big_g * big_g / d) ** (1.0 / 3.0) * n ** (1.0 / 3.0)


def block_length(values: Iterable[float] | np.ndarray, q: float | None = None) -> int:
    """The circular block bootstrap's block length for the mean (q None) or percentile q of ``values`` in
    measurement order (Politis-White rule; see the module docstring), in [1, n / 3]."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 6:
        return 1
    b = _rule(x)
    if q is not None:
        ind = (x <= np.percentile(x, q)).astype(float)
        b = max(b, _rule(ind))
    return int(min(max(1, math.ceil(b)), max(1, n // 3)))


def _resample_stat(x: np.ndarray, b: int, q: float | None, resamples: int, rng: np.random.Generator) -> np.ndarray:
    n = x.size
    nb = -(-n // b)
    offsets = np.arange(b)
    rows = max(1, BOOTSTRAP_CELLS // (nb * b))
    out: list[np.ndarray] = []
    left = resamples
    while left > 0:
        m = min(rows, left)
        starts = rng.integers(0, n, size=(m, nb))
        idx = ((starts[:, :, None] + offsets) % n).reshape(m, nb * b)[:, :n]
        sample = x[idx]
        out.append(sample.mean(axis=1) if q is None else np.percentile(sample, q, axis=1))
        left -= m
    return np.concatenate(out)


def block_bootstrap_ci(values: Iterable[float] | np.ndarray, q: float | None = None, confidence: float = 0.95,
                       resamples: int = 1000, seed: int = 0, block: int | None = None) -> CI:
    """Mean (q None) or percentile q in [0, 100] of ``values`` (in measurement order) with a circular block
    bootstrap interval (block length from ``block_length`` unless given; see the module docstring).
    n < 2: no interval. Deterministic for a given seed. The interval stays inside the data's range."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if q is not None and (isinstance(q, bool) or not 0.0 <= float(q) <= 100.0):
        raise ValueError(f"q must be a percentile in [0, 100], got {q!r}")
    if resamples < 10:
        raise ValueError(f"resamples must be >= 10, got {resamples}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a flat sequence of finite numbers")
    n = int(x.size)
    what = "mean" if q is None else f"p{q:g}"
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, f"{what} (no values)", confidence)
    est = float(x.mean()) if q is None else float(np.percentile(x, q))
    if n < 2:
        return CI(est, est, est, n, f"{what} (n<2: no interval)", confidence)
    b = block if block is not None else block_length(x, q)
    b = int(min(max(1, b), n))
    boot = _resample_stat(x, b, q, resamples, np.random.default_rng(seed))
    var = float(np.var(boot, ddof=1))
    tau = correlation_time(x) if b > 1 else 1.0
    factor = 1.0 / (1.0 - tau / b) if b > 2 * tau else 1.0
    if b <= 2 * tau and b > 1:
        factor = 2.0  # blocks barely longer than the correlation time: the bias bound at b = 2 tau
    df = max(1.0, n / b - 1.0)
    half = t_quantile((1.0 + confidence) / 2.0, df) * math.sqrt(var * factor)
    lo, hi = max(float(x.min()), est - half), min(float(x.max()), est + half)
    method = (f"{what}, circular block bootstrap ({resamples} resamples, block {b} of n = {n}, "
              f"correlation time {tau:.1f}), t-interval on its standard error, {df:.0f} df")
    return CI(est, min(lo, est), max(hi, est), n, method, confidence)


def paired_ratio_ci(a_values: Iterable[float], b_values: Iterable[float], confidence: float = 0.95) -> CI:
    """Ratio of a to b over K paired replications: the geometric mean of a_k / b_k with a t-interval
    (K - 1 df) on the logs. Needs every value > 0 and K >= 2 for an interval; else the method says why."""
    a = np.asarray(list(a_values), dtype=float)
    b = np.asarray(list(b_values), dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("paired values must be two flat sequences of the same length")
    k = int(a.size)
    if k == 0:
        return CI(math.nan, math.nan, math.nan, 0, "paired ratio (no values)", confidence)
    if not (np.all(a > 0) and np.all(b > 0) and np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        est = float(a.mean() / b.mean()) if b.mean() else math.nan
        return CI(est, est, est, k, "paired ratio (no interval: a value is not a positive number)", confidence)
    logs = np.log(a / b)
    est = float(math.exp(logs.mean()))
    if k < 2:
        return CI(est, est, est, k, "paired ratio (n<2: no interval)", confidence)
    half = t_quantile((1.0 + confidence) / 2.0, k - 1) * float(logs.std(ddof=1)) / math.sqrt(k)
    return CI(est, est * math.exp(-half), est * math.exp(half), k,
              "paired replications: geometric mean of the ratios, t-interval on their logs", confidence)
