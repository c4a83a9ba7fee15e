"""Block bootstrap intervals that hold on autocorrelated samples (AR(1) coverage over many seeds)."""

import math

import numpy as np
import pytest

from kv_cache.metrics.block_bootstrap import (
    block_bootstrap_ci,
    block_length,
    correlation_time,
    paired_ratio_ci,
)
from kv_cache.metrics.stats import percentile_ci

Z90 = 1.2815515655446004  # standard normal 0.9 quantile


def ar1(phi: float, n: int, seeds: int, seed: int = 7) -> np.ndarray:
    """`seeds` stationary AR(1) series of length n (unit innovations), one per row, generated at once."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((seeds, n))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return x


def coverage(phi: float, q: float | None, n: int = 800, seeds: int = 200, resamples: int = 200) -> float:
    series = ar1(phi, n, seeds)
    sd = 1 / math.sqrt(1 - phi * phi)
    truth = 0.0 if q is None else Z90 * sd
    hits = 0
    for s, x in enumerate(series):
        ci = block_bootstrap_ci(x, q, resamples=resamples, seed=s)
        hits += ci.low <= truth <= ci.high
    return hits / seeds


@pytest.mark.parametrize("q", [None, 90])
def test_95_percent_intervals_cover_the_truth_on_ar1_at_phi_0_9(q):
    # 200 seeds: a true 95 % interval covers 190 +- 6; the plain bootstrap covers about half at phi 0.9
    assert coverage(0.9, q) >= 0.90


def test_the_plain_bootstrap_does_not_and_the_block_one_is_wider():
    x = ar1(0.9, 800, 1)[0]
    plain = percentile_ci(x, 90, resamples=200)
    block = block_bootstrap_ci(x, 90, resamples=200)
    assert block.high - block.low > 2 * (plain.high - plain.low)
    assert "circular block bootstrap" in block.method and "block" in block.method


def test_block_length_grows_with_the_correlation_and_is_about_one_when_independent():
    rows = ar1(0.0, 1000, 3)
    assert all(block_length(x) <= 3 for x in rows)
    b8, b95 = block_length(ar1(0.8, 1000, 1)[0], 90), block_length(ar1(0.95, 1000, 1)[0], 90)
    assert 5 < b8 < b95 <= 1000 // 3
    assert block_length([1.0, 2.0]) == 1


def test_correlation_time_of_ar1_is_about_1_plus_phi_over_1_minus_phi():
    tau = correlation_time(ar1(0.8, 20000, 1)[0])
    assert 6.0 < tau < 12.0  # (1 + 0.8) / (1 - 0.8) = 9
    assert correlation_time([3.0, 3.0, 3.0, 3.0]) == 1.0


def test_edge_cases_are_seeded_and_inside_the_data():
    assert math.isnan(block_bootstrap_ci([]).estimate)
    one = block_bootstrap_ci([2.0], 90)
    assert one.low == one.high == 2.0 and "n<2" in one.method
    x = ar1(0.5, 300, 1)[0]
    a, b = block_bootstrap_ci(x, 50, seed=3), block_bootstrap_ci(x, 50, seed=3)
    assert a == b and x.min() <= a.low <= a.estimate <= a.high <= x.max()
    with pytest.raises(ValueError):
        block_bootstrap_ci(x, 120)
    with pytest.raises(ValueError):
        block_bootstrap_ci([1.0, math.nan])


def test_paired_ratio_is_the_geometric_mean_with_a_t_interval_on_the_logs():
    ci = paired_ratio_ci([2.0, 4.0, 3.0], [1.0, 2.0, 1.0])
    logs = np.log([2.0, 2.0, 3.0])
    assert ci.estimate == pytest.approx(math.exp(logs.mean()))
    half = 4.302652729911275 * logs.std(ddof=1) / math.sqrt(3)  # t_{0.975, 2}
    assert ci.high == pytest.approx(ci.estimate * math.exp(half), rel=1e-6)
    assert ci.low == pytest.approx(ci.estimate * math.exp(-half), rel=1e-6)
    assert "n<2" in paired_ratio_ci([2.0], [1.0]).method
    assert "not a positive" in paired_ratio_ci([2.0, 0.0], [1.0, 1.0]).method
