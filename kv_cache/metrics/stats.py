"""Confidence intervals for the sessions-mode results (no scipy).

- Student-t quantiles computed from the t CDF (regularized incomplete beta function, continued fraction)
  by bisection: exact to ~1e-10 for any confidence level and any (also fractional) degrees of freedom;
  ``df = inf`` gives the normal quantile.
- ``mean_ci``: the t-interval ``mean +- t_{(1+c)/2, n-1} x s / sqrt(n)`` (s: sample standard deviation).
- Samples taken over one run are autocorrelated (a slow period makes several consecutive requests slow),
  so per-request values are not independent and a plain t-interval over them is too narrow. The standard
  remedy is **batch means**: split the measured window into k equal sub-windows, compute the statistic per
  sub-window, and put a t-interval on those k values (``subwindow_ci``, ``rate_ci``); with sub-windows
  long compared with the correlation time the k values are close to independent.
- ``ratio_ci``: ratio of two independent means (e.g. throughput with / without a tier), delta method on
  the log ratio with Welch-Satterthwaite degrees of freedom.
- ``bootstrap_percentile_ci``: percentile bootstrap of a percentile, seeded (i.i.d. values only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "CI",
    "batch_means",
    "bootstrap_percentile_ci",
    "mean_ci",
    "normal_quantile",
    "rate_ci",
    "ratio_ci",
    "subwindow_ci",
    "subwindow_values",
    "t_cdf",
    "t_quantile",
]


@dataclass(frozen=True)
class CI:
    """A point estimate with its confidence interval [low, high].

    ``n``: how many values the interval was computed from (sub-windows for batch means); ``method``: how
    (including why there is no interval, e.g. "n<2"); ``confidence``: the two-sided level.
    """

    estimate: float
    low: float
    high: float
    n: int
    method: str
    confidence: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: CI) -> bool:
        """True when the two intervals share at least one point."""
        return self.low <= other.high and other.low <= self.high

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``df = inf``: standard normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def _invert(cdf, p: float) -> float:
    """The x with cdf(x) = p, for a symmetric, increasing cdf (bisection, relative precision ~1e-13)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {p!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -_invert(cdf, 1.0 - p)
    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2.0
        if high > 1e300:  # pragma: no cover - p indistinguishable from 1
            return math.inf
    for _ in range(200):
        mid = (low + high) / 2.0
        if cdf(mid) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * high:
            break
    return (low + high) / 2.0


@functools.lru_cache(maxsize=4096)
def normal_quantile(p: float) -> float:
    """The standard normal quantile z_p (1.959964 for p = 0.975)."""
    return _invert(lambda x: 0.5 * math.erfc(-x / math.sqrt(2.0)), p)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The Student-t quantile t_{p, df} (12.706 for p = 0.975, df = 1; 2.045 for df = 29).

    ``df`` may be fractional (Welch); ``df = inf`` is the normal quantile.
    """
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(df):
        return normal_quantile(p)
    return _invert(lambda x: t_cdf(x, df), p)


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return confidence


# --------------------------------------------------------------------------------------------------
# Intervals
# --------------------------------------------------------------------------------------------------


def _values(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float)
    if arr.ndim != 1:
        raise ValueError("values must be a flat sequence of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite numbers")
    return arr


def _t_interval(arr: np.ndarray, confidence: float, method: str) -> CI:
    n = int(arr.size)
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, f"{method} (n<2: no values)", confidence)
    mean = float(arr.mean())
    if n < 2:
        return CI(mean, mean, mean, n, f"{method} (n<2: no interval)", confidence)
    se = float(arr.std(ddof=1)) / math.sqrt(n)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * se
    return CI(mean, mean - half, mean + half, n, method, confidence)


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> CI:
    """Mean with its t-interval: ``mean +- t_{(1+confidence)/2, n-1} x s / sqrt(n)``, s with ddof 1.

    n < 2: ``low = high = estimate`` (nan for no value) and the method says "n<2".
    """
    _check_confidence(confidence)
    return _t_interval(_values(values), confidence, "t-interval")


def _subwindow_groups(
    samples: Iterable[tuple[float, float]], window_start: float, window_end: float, k: int
) -> list[list[float]]:
    """The sample values per sub-window: sub-window j is [start + j w, start + (j+1) w), w = (end-start)/k,
    the last one closed at ``window_end``; samples outside [start, end] are ignored."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sub-windows) must be an integer >= 1, got {k!r}")
    if not window_end > window_start:
        raise ValueError(
            f"the window must have window_end > window_start, got [{window_start}, {window_end}]"
        )
    span = window_end - window_start
    groups: list[list[float]] = [[] for _ in range(k)]
    for t, value in samples:
        if t < window_start or t > window_end:
            continue
        j = min(k - 1, int((t - window_start) * k / span))
        groups[j].append(float(value))
    return groups


def batch_means(
    samples: Iterable[tuple[float, float]], window_start: float, window_end: float, k: int
) -> list[float]:
    """Per-sub-window means of ``(t_s, value)`` samples: the window is split into ``k`` equal sub-windows
    ([start + j w, start + (j+1) w), the last closed at ``window_end``); empty sub-windows are omitted;
    samples outside the window are ignored."""
    return [sum(g) / len(g) for g in _subwindow_groups(samples, window_start, window_end, k) if g]


def _statistic(statistic: str | float):
    """(function of a non-empty list, label) for 'mean', a percentile q in [0, 100] or 'pNN'."""
    if statistic == "mean":
        return (lambda g: float(np.mean(g))), "mean"
    q: Any = statistic
    if isinstance(q, str) and q.startswith("p"):
        try:
            q = float(q[1:])
        except ValueError:
            q = None
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 100.0:
        raise ValueError(f"statistic must be 'mean', a percentile in [0, 100] or 'pNN', got {statistic!r}")
    return (lambda g: float(np.percentile(g, q))), f"p{q:g}"


def subwindow_values(
    samples: Iterable[tuple[float, float]],
    window: tuple[float, float],
    k: int,
    statistic: str | float = "mean",
) -> list[float]:
    """The statistic ('mean', percentile q or 'pNN'; numpy linear percentiles) of each non-empty
    sub-window of ``window`` (see ``batch_means``)."""
    fn, _ = _statistic(statistic)
    return [fn(g) for g in _subwindow_groups(samples, window[0], window[1], k) if g]


def subwindow_ci(
    samples: Iterable[tuple[float, float]],
    window: tuple[float, float],
    k: int,
    statistic: str | float = "mean",
    confidence: float = 0.95,
) -> CI:
    """Batch-means interval of a statistic of ``(t_s, value)`` samples over ``window = (start, end)``.

    The statistic ('mean', a percentile q in [0, 100] or 'pNN') is computed in each of the ``k`` equal
    sub-windows (empty ones omitted) and the estimate is the MEAN of those per-sub-window values with their
    t-interval, so estimate and interval describe the same quantity (for a percentile this is the mean of
    the sub-window percentiles, not the percentile of the pooled samples).
    """
    _check_confidence(confidence)
    _, label = _statistic(statistic)
    values = subwindow_values(samples, window, k, statistic)
    method = f"{label}: batch means over {len(values)} of {k} sub-windows, t-interval"
    return _t_interval(np.asarray(values, dtype=float), confidence, method)


def rate_ci(
    event_times: Iterable[float],
    window: tuple[float, float],
    k: int,
    weights: Sequence[float] | None = None,
    confidence: float = 0.95,
) -> CI:
    """Events per second over ``window = (start, end)`` with its batch-means interval.

    Each of the ``k`` equal sub-windows gives ``events (or the sum of their weights, e.g. tokens) /
    sub-window seconds``; a sub-window with no event counts as rate 0 (unlike ``batch_means``); the
    estimate is the mean of the k rates, = total in the window / window length.
    """
    _check_confidence(confidence)
    times = list(event_times)
    if weights is None:
        pairs = [(t, 1.0) for t in times]
    else:
        weights = list(weights)
        if len(weights) != len(times):
            raise ValueError(f"weights ({len(weights)}) and event_times ({len(times)}) differ in length")
        pairs = list(zip(times, weights, strict=True))
    groups = _subwindow_groups(pairs, window[0], window[1], k)
    width = (window[1] - window[0]) / k
    rates = np.asarray([sum(g) / width for g in groups], dtype=float)
    return _t_interval(rates, confidence, f"rate: batch means over {k} sub-windows, t-interval")


def ratio_ci(a_values: Iterable[float], b_values: Iterable[float], confidence: float = 0.95) -> CI:
    """Ratio ``mean(a) / mean(b)`` of two independent samples, with a delta-method interval on the log::

        log R = log mean(a) - log mean(b)
        se^2  = va + vb,  va = s_a^2 / (n_a mean(a)^2),  vb = s_b^2 / (n_b mean(b)^2)
        df    = (va + vb)^2 / (va^2 / (n_a - 1) + vb^2 / (n_b - 1))      (Welch-Satterthwaite)
        [low, high] = exp(log R -+ t_{(1+c)/2, df} x se)

    The interval is asymmetric around R, as a ratio's should be. It needs both means > 0: otherwise the
    estimate is the plain ratio (nan if mean(b) is 0) with low = high = estimate and the method says why;
    n < 2 on either side likewise ("n<2").
    """
    _check_confidence(confidence)
    a, b = _values(a_values), _values(b_values)
    na, nb = int(a.size), int(b.size)
    n = min(na, nb)
    if na == 0 or nb == 0:
        return CI(math.nan, math.nan, math.nan, n, "ratio of means (n<2: no values)", confidence)
    ma, mb = float(a.mean()), float(b.mean())
    estimate = ma / mb if mb != 0 else math.nan
    if na < 2 or nb < 2:
        return CI(estimate, estimate, estimate, n, "ratio of means (n<2: no interval)", confidence)
    if not (ma > 0 and mb > 0):
        why = "ratio of means (no interval: the log-ratio interval needs both means > 0)"
        return CI(estimate, estimate, estimate, n, why, confidence)
    va = float(a.var(ddof=1)) / (na * ma * ma)
    vb = float(b.var(ddof=1)) / (nb * mb * mb)
    method = "ratio of means: delta method on the log ratio, Welch t-interval"
    if va + vb == 0:
        return CI(estimate, estimate, estimate, n, method + " (zero variance)", confidence)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    half = t_quantile((1.0 + confidence) / 2.0, df) * math.sqrt(va + vb)
    log_r = math.log(estimate)
    return CI(estimate, math.exp(log_r - half), math.exp(log_r + half), n, method, confidence)


def bootstrap_percentile_ci(
    values: Iterable[float], q: float, seed: int, n_boot: int = 1000, confidence: float = 0.95
) -> CI:
    """Percentile q (0..100, numpy linear) of ``values`` with a seeded percentile-bootstrap interval.

    ``n_boot`` resamples of size n with replacement (``numpy.random.default_rng(seed)``); the interval is
    the ((1-c)/2, (1+c)/2) quantiles of the resampled percentiles. Same inputs and seed -> same CI. Assumes
    independent values: for samples correlated in time use ``subwindow_ci``.
    """
    _check_confidence(confidence)
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be a percentile in [0, 100], got {q!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    arr = _values(values)
    n = int(arr.size)
    method = f"p{q:g}: percentile bootstrap, {n_boot} resamples, seed {seed}"
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, method + " (n<2: no values)", confidence)
    estimate = float(np.percentile(arr, q))
    if n < 2:
        return CI(estimate, estimate, estimate, n, method + " (n<2: no interval)", confidence)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    rows = max(1, 4_000_000 // n)  # bound the index matrix to ~32 MB
    for start in range(0, n_boot, rows):
        m = min(rows, n_boot - start)
        idx = rng.integers(0, n, size=(m, n))
        stats[start : start + m] = np.percentile(arr[idx], q, axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(stats, [100.0 * alpha, 100.0 * (1.0 - alpha)])
    return CI(estimate, float(low), float(high), n, method, confidence)
