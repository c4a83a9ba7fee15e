"""The one statistics module: point statistics and confidence intervals (numpy and stdlib, no scipy).

- Percentiles are numpy's linear interpolation (``numpy.percentile``'s default), the definition the
  MLPerf kv-cache tool reports with; every percentile of the tool goes through ``percentile(s)`` so the
  figures of both modes, the report and the helper scripts agree.
- Student-t quantiles come from the t CDF (regularized incomplete beta function, continued fraction)
  inverted by bisection: accurate to ~1e-10 for any confidence level and any (also fractional) degrees
  of freedom, where a normal approximation would be far too narrow for the handful of sub-windows a run
  has; ``df = inf`` gives the normal quantile (``statistics.NormalDist``).
- Samples taken over one run are autocorrelated (a slow period makes several consecutive requests slow),
  so a plain t-interval over per-request values is too narrow. Batch means fix that: split the measured
  window into k equal sub-windows, compute the statistic per sub-window (``subwindow_values``,
  ``subwindow_rates``) and put a t-interval (``mean_ci``) on those k values; with sub-windows long
  compared with the correlation time the k values are close to independent.
- ``batch_means_ci``: the t-interval of batch means, with their lag-1 autocorrelation checked: a positive
  r1 widens the interval by sqrt((1 + r1) / (1 - r1)) (the AR(1) variance factor of a mean) and says so.
- ``percentile_ci``: a percentile of pooled samples with a seeded bootstrap (percentile method) interval,
  which stays inside the range of the data (non-negative data, non-negative interval).
- ``nonnegative``: a non-negative quantity's interval clamped at 0, with a mark in its method.
- ``ratio_ci``: ratio of two independent means (e.g. throughput with / without a tier), delta method on
  the log ratio with Welch-Satterthwaite degrees of freedom.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "CI",
    "batch_means_ci",
    "lag1_autocorrelation",
    "mean",
    "mean_ci",
    "median",
    "nonnegative",
    "normal_quantile",
    "percentile",
    "percentile_ci",
    "percentiles",
    "ratio_ci",
    "subwindow_rates",
    "subwindow_values",
    "t_cdf",
    "t_quantile",
]

_NORMAL = NormalDist()


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
        """The fields as a JSON-ready dict: a non-finite number (no value, no interval) becomes None."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = None if isinstance(v, float) and not math.isfinite(v) else v
        return out


# --------------------------------------------------------------------------------------------------
# Point statistics
# --------------------------------------------------------------------------------------------------


def _array(values: Iterable[float] | np.ndarray) -> np.ndarray:
    """A 1-D numpy view of ``values`` (no copy for an ndarray or an ``array.array`` buffer)."""
    arr = np.asarray(values) if hasattr(values, "__len__") else np.fromiter(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError("values must be a flat sequence of numbers")
    if arr.size == 0:
        raise ValueError("no values")
    return arr


def percentiles(values: Iterable[float] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """The percentiles ``qs`` (each in [0, 100]) of ``values``, numpy linear interpolation."""
    return [float(v) for v in np.percentile(_array(values), list(qs))]


def percentile(values: Iterable[float] | np.ndarray, q: float) -> float:
    """Percentile ``q`` in [0, 100] of ``values``, numpy linear interpolation."""
    return float(np.percentile(_array(values), q))


def mean(values: Iterable[float] | np.ndarray) -> float:
    return float(_array(values).mean())


def median(values: Iterable[float] | np.ndarray) -> float:
    """The middle value, or the mean of the two middle values (as ``statistics.median``)."""
    return float(np.median(_array(values)))


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


def _check_probability(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {p!r}")
    return p


def _check_df(df: float) -> float:
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    return df


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``df = inf``: standard normal)."""
    if math.isinf(_check_df(df)):
        return _NORMAL.cdf(t)
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def _invert(cdf: Callable[[float], float], p: float) -> float:
    """The x with cdf(x) = p, for a symmetric, increasing cdf (bisection, relative precision ~1e-13)."""
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


def normal_quantile(p: float) -> float:
    """The standard normal quantile z_p (1.959964 for p = 0.975)."""
    return _NORMAL.inv_cdf(_check_probability(p))


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The Student-t quantile t_{p, df} (12.706 for p = 0.975, df = 1; 2.045 for df = 29).

    ``df`` may be fractional (Welch); ``df = inf`` is the normal quantile.
    """
    _check_probability(p)
    if math.isinf(_check_df(df)):
        return normal_quantile(p)
    return _invert(lambda x: t_cdf(x, df), p)


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return confidence


# --------------------------------------------------------------------------------------------------
# Intervals
# --------------------------------------------------------------------------------------------------


def _finite(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float)
    if arr.ndim != 1:
        raise ValueError("values must be a flat sequence of numbers")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite numbers")
    return arr


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> CI:
    """Mean with its t-interval: ``mean +- t_{(1+confidence)/2, n-1} x s / sqrt(n)``, s with ddof 1.

    n < 2: ``low = high = estimate`` (nan for no value) and the method says "n<2".
    """
    _check_confidence(confidence)
    arr = _finite(values)
    n = int(arr.size)
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, "t-interval (n<2: no values)", confidence)
    m = float(arr.mean())
    if n < 2:
        return CI(m, m, m, n, "t-interval (n<2: no interval)", confidence)
    se = float(arr.std(ddof=1)) / math.sqrt(n)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * se
    return CI(m, m - half, m + half, n, "t-interval", confidence)


def _subwindow_groups(
    samples: Iterable[tuple[float, float]], window: tuple[float, float], k: int
) -> list[list[float]]:
    """The sample values per sub-window: sub-window j is [start + j w, start + (j+1) w), w = (end-start)/k,
    the last one closed at the window's end; samples outside the window are ignored."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sub-windows) must be an integer >= 1, got {k!r}")
    start, end = window
    if not end > start:
        raise ValueError(f"the window must have end > start, got [{start}, {end}]")
    span = end - start
    groups: list[list[float]] = [[] for _ in range(k)]
    for t, value in samples:
        if start <= t <= end:
            groups[min(k - 1, int((t - start) * k / span))].append(float(value))
    return groups


def _statistic(statistic: str | float) -> Callable[[list[float]], float]:
    """The function of a non-empty list for 'mean', a percentile q in [0, 100] or 'pNN'."""
    if statistic == "mean":
        return mean
    q: Any = statistic
    if isinstance(q, str) and q.startswith("p"):
        try:
            q = float(q[1:])
        except ValueError:
            q = None
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 <= q <= 100.0:
        raise ValueError(f"statistic must be 'mean', a percentile in [0, 100] or 'pNN', got {statistic!r}")
    return lambda g: percentile(g, q)


def subwindow_values(
    samples: Iterable[tuple[float, float]],
    window: tuple[float, float],
    k: int,
    statistic: str | float = "mean",
) -> list[float]:
    """Batch means: the statistic ('mean', percentile q or 'pNN') of the ``(t, value)`` samples of each
    non-empty sub-window of ``window = (start, end)`` cut into ``k`` equal sub-windows (an empty
    sub-window has no statistic and is omitted)."""
    fn = _statistic(statistic)
    return [fn(g) for g in _subwindow_groups(samples, window, k) if g]


def subwindow_rates(
    samples: Iterable[tuple[float, float]], window: tuple[float, float], k: int
) -> list[float]:
    """Per-second rate in each of the ``k`` equal sub-windows of ``window``: the sum of the values of the
    ``(t, value)`` samples in it (value 1 per event, or e.g. tokens) / the sub-window's length.

    All k rates are returned: a sub-window without an event is a real rate of 0 (unlike
    ``subwindow_values``), so their mean is the window's total / its length."""
    groups = _subwindow_groups(samples, window, k)
    width = (window[1] - window[0]) / k
    return [sum(g) / width for g in groups]


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
    a, b = _finite(a_values), _finite(b_values)
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


CLAMP_MARK = "low clamped at 0 (non-negative quantity)"


def nonnegative(ci: CI) -> CI:
    """``ci`` with a negative lower bound raised to 0 and the method marked (a rate or a time cannot be
    negative; a t-interval on few, spread values can reach below 0)."""
    if not ci.low < 0:
        return ci
    return CI(ci.estimate, 0.0, ci.high, ci.n, f"{ci.method}; {CLAMP_MARK}", ci.confidence)


def lag1_autocorrelation(values: Iterable[float]) -> float:
    """Lag-1 autocorrelation ``sum (x_i - m)(x_{i+1} - m) / sum (x_i - m)^2`` (nan for n < 3 or no spread)."""
    arr = _finite(values)
    if arr.size < 3:
        return math.nan
    d = arr - arr.mean()
    denom = float(d @ d)
    return float(d[:-1] @ d[1:]) / denom if denom > 0 else math.nan


MAX_R1 = 0.9  # a larger estimated r1 from a handful of batches widens by at most sqrt(19) = 4.4


def batch_means_ci(values: Iterable[float], confidence: float = 0.95) -> CI:
    """t-interval (``mean_ci``) of batch means, widened by sqrt((1 + r1) / (1 - r1)) when their lag-1
    autocorrelation r1 is positive (batches too short for the correlation time); the method gives r1."""
    arr = _finite(values)
    ci = mean_ci(arr, confidence)
    r1 = lag1_autocorrelation(arr)
    if not math.isfinite(r1):
        return CI(ci.estimate, ci.low, ci.high, ci.n, f"batch means, {ci.method} (lag-1 autocorrelation: n/a)",
                  confidence)
    if r1 <= 0:
        return CI(ci.estimate, ci.low, ci.high, ci.n, f"batch means, {ci.method} (lag-1 r1 = {r1:.2f})",
                  confidence)
    factor = math.sqrt((1 + min(r1, MAX_R1)) / (1 - min(r1, MAX_R1)))
    half = (ci.high - ci.low) / 2 * factor
    return CI(ci.estimate, ci.estimate - half, ci.estimate + half, ci.n,
              f"batch means, {ci.method} widened x{factor:.2f} for lag-1 r1 = {r1:.2f}", confidence)


BOOTSTRAP_CELLS = 4_000_000  # resampled values held at once (memory bound of one chunk)


def percentile_ci(values: Iterable[float], q: float, confidence: float = 0.95, resamples: int = 1000,
                  seed: int = 0) -> CI:
    """Percentile ``q`` of the pooled ``values`` with a bootstrap percentile interval: ``resamples`` seeded
    resamples with replacement, the (1-c)/2 and (1+c)/2 quantiles of their percentile q. n < 2: no
    interval. Deterministic for a given seed."""
    _check_confidence(confidence)
    if isinstance(q, bool) or not 0.0 <= float(q) <= 100.0:
        raise ValueError(f"q must be a percentile in [0, 100], got {q!r}")
    if resamples < 10:
        raise ValueError(f"resamples must be >= 10, got {resamples}")
    arr = _finite(values)
    n = int(arr.size)
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0, "pooled percentile (no values)", confidence)
    est = float(np.percentile(arr, q))
    if n < 2:
        return CI(est, est, est, n, "pooled percentile (n<2: no interval)", confidence)
    rng = np.random.default_rng(seed)
    rows = max(1, BOOTSTRAP_CELLS // n)
    stats_: list[np.ndarray] = []
    left = resamples
    while left > 0:
        m = min(rows, left)
        stats_.append(np.percentile(arr[rng.integers(0, n, size=(m, n))], q, axis=1))
        left -= m
    boot = np.concatenate(stats_)
    lo, hi = np.percentile(boot, [50 * (1 - confidence), 50 * (1 + confidence)])
    return CI(est, float(min(lo, est)), float(max(hi, est)), n,
              f"pooled percentile, bootstrap percentile interval ({resamples} resamples)", confidence)
