"""kv_cache.metrics.stats, the one statistics module: known quantiles, hand-computed CIs, numpy-linear
percentiles, and that the t-interval covers the true mean as often as it claims."""

import math
import statistics
from array import array

import numpy as np
import pytest

from kv_cache.metrics import stats
from kv_cache.metrics.stats import (
    CI,
    mean,
    mean_ci,
    median,
    normal_quantile,
    percentile,
    percentiles,
    ratio_ci,
    subwindow_rates,
    subwindow_values,
    t_cdf,
    t_quantile,
)

# ---------------------------------------------------------------------------------------------
# Point statistics
# ---------------------------------------------------------------------------------------------


def test_percentiles_are_numpy_linear():
    # linear interpolation between closest ranks: p95 of 1..4 = 3 + 0.85 x (4 - 3)
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert percentiles([1, 2, 3, 4], [0, 50, 100]) == [1.0, 2.5, 4.0]
    rng = np.random.default_rng(3)
    values = rng.exponential(size=1001)
    qs = [50, 95, 99, 99.9, 99.99]
    assert percentiles(values, qs) == [float(x) for x in np.percentile(values, qs)]
    # an int64 sample buffer (the recorder's) is read in place, same figures as the list
    ns = array("q", [5, 1, 9, 3])
    assert percentiles(ns, [50, 90]) == percentiles([5, 1, 9, 3], [50, 90])
    assert percentile(iter([1.0, 3.0]), 50) == 2.0  # any iterable
    for fn in (lambda v: percentile(v, 50), lambda v: percentiles(v, [50]), mean, median):
        with pytest.raises(ValueError):
            fn([])
    with pytest.raises(ValueError):
        percentile([[1.0, 2.0]], 50)


def test_mean_and_median():
    assert mean([1, 2, 3, 4]) == 2.5 and isinstance(mean(array("q", [1, 2])), float)
    for values in ([3.0, 1.0, 2.0], [0.1, 0.7, 0.2, 0.9], [1e9, 3.0, 7.25, 11.0, 2.0, 6.5]):
        assert median(values) == statistics.median(values)  # the scripts' medians did not move


# ---------------------------------------------------------------------------------------------
# Distributions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (4, 2.776),
        (9, 2.262),
        (10, 2.228),
        (29, 2.045),
        (30, 2.042),
        (60, 2.000),
        (120, 1.980),
    ],
)
def test_t_quantile_975_against_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_other_quantiles_and_the_normal_limit():
    assert t_quantile(0.995, 10) == pytest.approx(3.169, abs=5e-4)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)
    assert t_quantile(0.9995, 1) == pytest.approx(636.619, rel=1e-4)
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.995) == pytest.approx(2.575829, abs=1e-6)
    assert t_quantile(0.975, math.inf) == normal_quantile(0.975)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    assert t_quantile(0.5, 3) == 0.0
    assert normal_quantile(0.3) == pytest.approx(-normal_quantile(0.7), abs=1e-12)


def test_t_cdf_matches_closed_forms():
    for t in (-5.0, -1.3, 0.0, 0.7, 2.0, 40.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_cdf(1.959964, math.inf) == pytest.approx(0.975, abs=1e-7)
    assert t_cdf(t_quantile(0.9, 7.5), 7.5) == pytest.approx(0.9, abs=1e-10)
    with pytest.raises(ValueError):
        t_cdf(1.0, 0)
    # fractional df: monotone between its integer neighbours
    assert t_quantile(0.975, 3) < t_quantile(0.975, 2.5) < t_quantile(0.975, 2)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_quantile_rejects_bad_probabilities(bad):
    with pytest.raises(ValueError):
        t_quantile(bad, 5)
    with pytest.raises(ValueError):
        normal_quantile(bad)


def test_quantile_rejects_bad_df():
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)


# ---------------------------------------------------------------------------------------------
# mean_ci
# ---------------------------------------------------------------------------------------------


def test_mean_ci_hand_computed():
    # mean 3, s = sqrt(2.5), se = sqrt(2.5 / 5) = 0.7071068, t(0.975, 4) = 2.776445
    ci = mean_ci([1, 2, 3, 4, 5])
    assert ci.estimate == 3.0 and ci.n == 5 and ci.method == "t-interval" and ci.confidence == 0.95
    assert ci.low == pytest.approx(3 - 2.776445 * 0.7071068, abs=1e-6)
    assert ci.high == pytest.approx(3 + 2.776445 * 0.7071068, abs=1e-6)
    assert ci.half_width == pytest.approx(1.963243, abs=1e-6)
    # 90 %: t(0.95, 4) = 2.131847
    assert mean_ci([1, 2, 3, 4, 5], confidence=0.9).half_width == pytest.approx(
        2.131847 * 0.7071068, abs=1e-6
    )


def test_mean_ci_edge_cases():
    one = mean_ci([7.5])
    assert (one.estimate, one.low, one.high, one.n) == (7.5, 7.5, 7.5, 1) and "n<2" in one.method
    none = mean_ci([])
    assert none.n == 0 and math.isnan(none.estimate) and "n<2" in none.method
    flat = mean_ci([2.0, 2.0, 2.0])
    assert (flat.low, flat.high) == (2.0, 2.0)
    with pytest.raises(ValueError):
        mean_ci([1.0, math.nan])
    with pytest.raises(ValueError):
        mean_ci([1.0, 2.0], confidence=1.0)


def test_ci_helpers():
    a = CI(1.0, 0.5, 1.5, 5, "x")
    assert a.overlaps(CI(2.0, 1.5, 2.5, 5, "x"))
    assert not a.overlaps(CI(2.0, 1.6, 2.5, 5, "x"))
    assert a.to_dict() == {
        "estimate": 1.0,
        "low": 0.5,
        "high": 1.5,
        "n": 5,
        "method": "x",
        "confidence": 0.95,
    }
    # no value / no interval: JSON has no NaN, so those become None
    assert mean_ci([]).to_dict()["estimate"] is None
    assert CI(1.0, -math.inf, math.inf, 2, "x").to_dict()["low"] is None


@pytest.mark.parametrize("n", [2, 5, 30])
def test_t_interval_covers_the_true_mean_as_claimed(n):
    # 200 seeded draws of n normal values around a known mean: a 95 % interval must cover it about 95 %
    # of the time (>= 90 % leaves room for the binomial spread of 200 draws, sd 1.5 %); a normal
    # quantile instead of the t one would cover far less at n = 2 (about 70 %)
    rng = np.random.default_rng(20240601 + n)
    true_mean = 12.5
    covered = 0
    for _ in range(200):
        ci = mean_ci(rng.normal(true_mean, 3.0, size=n))
        covered += ci.low <= true_mean <= ci.high
    assert covered >= 180


def test_every_public_function_is_tested_here():
    tested = {
        "CI", "mean", "mean_ci", "median", "normal_quantile", "percentile", "percentiles", "ratio_ci",
        "subwindow_rates", "subwindow_values", "t_cdf", "t_quantile",
        "batch_means_ci", "lag1_autocorrelation", "nonnegative", "percentile_ci",
    }
    assert set(stats.__all__) == tested


# ---------------------------------------------------------------------------------------------
# Sub-windows
# ---------------------------------------------------------------------------------------------

SAMPLES = [(0.5, 1.0), (1.5, 3.0), (1.7, 5.0), (3.9, 7.0), (4.0, 9.0), (4.5, 100.0), (-0.1, 100.0)]


def test_subwindow_values_mean_hand_computed():
    # window [0, 4], k = 4: [0,1) -> 1; [1,2) -> (3+5)/2; [2,3) empty (omitted); [3,4] -> (7+9)/2
    # (t = 4.0 closes the last sub-window; 4.5 and -0.1 are outside)
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4) == [1.0, 4.0, 8.0]
    assert subwindow_values(SAMPLES, (0.0, 4.0), 1, "mean") == [5.0]
    assert subwindow_values([], (0.0, 4.0), 4) == []
    with pytest.raises(ValueError):
        subwindow_values(SAMPLES, (0.0, 4.0), 0)
    with pytest.raises(ValueError):
        subwindow_values(SAMPLES, (4.0, 4.0), 2)


def test_batch_means_interval_hand_computed():
    # values 1, 4, 8: mean 13/3, s = sqrt(12.3333) = 3.511885, se = 2.027588, t(0.975, 2) = 4.302653
    ci = mean_ci(subwindow_values(SAMPLES, (0.0, 4.0), 4))
    assert ci.estimate == pytest.approx(13 / 3)
    assert ci.half_width == pytest.approx(4.302653 * 2.027588, abs=1e-5)
    assert ci.n == 3 and ci.method == "t-interval"


def test_subwindow_values_percentile():
    # p50 per sub-window (numpy linear): 1, 4, 8 (same as the means here); p100: 1, 5, 9
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4, 50) == [1.0, 4.0, 8.0]
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4, "p100") == [1.0, 5.0, 9.0]
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4, 99.9) == [1.0, pytest.approx(4.998), pytest.approx(8.998)]
    for bad in ("median", 101, "pxx", True):
        with pytest.raises(ValueError):
            subwindow_values(SAMPLES, (0.0, 4.0), 4, statistic=bad)


def test_subwindow_rates_count_empty_subwindows_as_zero():
    # events per second in [0,1), [1,2), [2,3), [3,4]: 1, 2, 0, 1 (7.0 is outside) -> mean 1 = 4 events / 4 s
    # s = sqrt(2/3) = 0.8164966, se = 0.4082483, t(0.975, 3) = 3.182446
    rates = subwindow_rates([(t, 1.0) for t in (0.5, 1.5, 1.6, 3.9, 7.0)], (0.0, 4.0), 4)
    assert rates == [1.0, 2.0, 0.0, 1.0]
    ci = mean_ci(rates)
    assert ci.estimate == pytest.approx(1.0) and ci.n == 4
    assert ci.half_width == pytest.approx(3.182446 * 0.4082483, abs=1e-6)
    # weighted (e.g. tokens): 10, 20 + 30, 0, 40 tokens in 0.5 s sub-windows of [0, 2]
    w = subwindow_rates([(0.1, 10), (0.6, 20), (0.7, 30), (1.9, 40)], (0.0, 2.0), 4)
    assert w == [20.0, 100.0, 0.0, 80.0] and sum(w) / 4 == 100 / 2.0
    assert subwindow_rates([], (0.0, 2.0), 2) == [0.0, 0.0]
    with pytest.raises(ValueError):
        subwindow_rates([], (0.0, 2.0), 0)


# ---------------------------------------------------------------------------------------------
# Ratio
# ---------------------------------------------------------------------------------------------


def test_ratio_ci_hand_computed():
    # a: mean 2, s^2 = 1, n 3 -> va = 1 / (3 x 4) = 0.0833333; b: mean 5 -> vb = 1 / (3 x 25) = 0.0133333
    # se = sqrt(0.0966667) = 0.3109126; Welch df = 0.0966667^2 / (0.0833333^2 / 2 + 0.0133333^2 / 2) = 2.624025
    ci = ratio_ci([1, 2, 3], [4, 5, 6])
    assert ci.estimate == pytest.approx(0.4)
    t = t_quantile(0.975, 2.624025)
    assert t_quantile(0.975, 3) < t < t_quantile(0.975, 2)
    assert ci.low == pytest.approx(0.4 * math.exp(-t * 0.3109126), rel=1e-5)
    assert ci.high == pytest.approx(0.4 * math.exp(t * 0.3109126), rel=1e-5)
    assert ci.low * ci.high == pytest.approx(0.4 * 0.4)  # symmetric on the log scale
    assert ci.n == 3 and "delta method" in ci.method


def test_ratio_ci_edge_cases():
    assert "n<2" in ratio_ci([1.0], [1.0, 2.0]).method
    zero = ratio_ci([1.0, 2.0], [0.0, 0.0])
    assert math.isnan(zero.estimate) and "needs both means > 0" in zero.method
    negative = ratio_ci([-1.0, -2.0], [1.0, 2.0])
    assert negative.estimate == -1.0 and negative.low == negative.high == -1.0
    flat = ratio_ci([2.0, 2.0], [4.0, 4.0])
    assert (flat.estimate, flat.low, flat.high) == (0.5, 0.5, 0.5)
    assert math.isnan(ratio_ci([], [1.0]).estimate)


# ---------------------------------------------------------------------------------------------
# Batch means with the lag-1 check, pooled percentiles with a bootstrap interval, clamping
# ---------------------------------------------------------------------------------------------


def test_lag1_autocorrelation_known_values():
    assert stats.lag1_autocorrelation([1, 2, 3, 4, 5]) == pytest.approx(0.4)  # (sum of d_i d_i+1) / sum d^2
    assert stats.lag1_autocorrelation([1, -1, 1, -1]) == pytest.approx(-0.75)
    assert math.isnan(stats.lag1_autocorrelation([1, 2]))


def test_batch_means_ci_widens_for_positive_autocorrelation_and_says_so():
    trend = [1.0, 2.0, 3.0, 4.0, 5.0]  # r1 = 0.4: widened by sqrt(1.4 / 0.6)
    plain, wide = mean_ci(trend), stats.batch_means_ci(trend)
    assert wide.half_width == pytest.approx(plain.half_width * math.sqrt(1.4 / 0.6))
    assert "widened" in wide.method and "r1 = 0.40" in wide.method
    alternating = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0]
    assert stats.batch_means_ci(alternating).half_width == pytest.approx(mean_ci(alternating).half_width)


def test_batch_means_ci_covers_the_mean_of_an_autocorrelated_series():
    # AR(1) series (phi 0.6) around a known mean, cut into 10 batches: the 95 % interval covers the mean in
    # at least 90 % of 200 seeded series
    rng = np.random.default_rng(7)
    true_mean, covered = 5.0, 0
    for _ in range(200):
        e = rng.normal(0, 1, size=2000)
        x = np.empty(2000)
        x[0] = e[0]
        for i in range(1, 2000):
            x[i] = 0.6 * x[i - 1] + e[i]
        batches = (x + true_mean).reshape(10, 200).mean(axis=1)
        ci = stats.batch_means_ci(batches)
        covered += ci.low <= true_mean <= ci.high
    assert covered >= 180


def test_percentile_ci_bootstrap_covers_a_known_p90():
    # lognormal(mu, sigma): p90 = exp(mu + sigma z_0.9); 95 % bootstrap intervals over n = 200 pooled samples
    # cover it in at least 90 % of 200 seeds, and never reach below 0 (the data are positive)
    mu, sigma = 0.5, 0.8
    true_p90 = math.exp(mu + sigma * normal_quantile(0.9))
    covered = 0
    for seed in range(200):
        data = np.random.default_rng(1000 + seed).lognormal(mu, sigma, size=200)
        ci = stats.percentile_ci(data, 90, resamples=400, seed=seed)
        assert 0 < ci.low <= ci.estimate <= ci.high
        covered += ci.low <= true_p90 <= ci.high
    assert covered >= 180


def test_percentile_ci_is_seeded_and_pooled():
    data = [0.1 * i for i in range(50)]
    a, b = stats.percentile_ci(data, 90, seed=3), stats.percentile_ci(data, 90, seed=3)
    assert a == b and a.estimate == percentile(data, 90) and a.n == 50
    assert stats.percentile_ci([2.0], 90).low == 2.0 and "n<2" in stats.percentile_ci([2.0], 90).method
    with pytest.raises(ValueError):
        stats.percentile_ci(data, 101)


def test_nonnegative_clamps_and_marks():
    ci = mean_ci([1.0, 30.0, 0.5])
    assert ci.low < 0
    clamped = stats.nonnegative(ci)
    assert clamped.low == 0.0 and clamped.high == ci.high and stats.CLAMP_MARK in clamped.method
    fine = mean_ci([10.0, 11.0, 12.0])
    assert stats.nonnegative(fine) is fine
