"""Confidence intervals without scipy (kv_cache.metrics.stats): known quantiles, hand-computed CIs."""

import math

import pytest

from kv_cache.metrics.stats import (
    CI,
    batch_means,
    bootstrap_percentile_ci,
    mean_ci,
    normal_quantile,
    rate_ci,
    ratio_ci,
    subwindow_ci,
    subwindow_values,
    t_cdf,
    t_quantile,
)

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


def test_t_cdf_matches_closed_forms():
    for t in (-5.0, -1.3, 0.0, 0.7, 2.0, 40.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
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


# ---------------------------------------------------------------------------------------------
# Sub-windows
# ---------------------------------------------------------------------------------------------

SAMPLES = [(0.5, 1.0), (1.5, 3.0), (1.7, 5.0), (3.9, 7.0), (4.0, 9.0), (4.5, 100.0), (-0.1, 100.0)]


def test_batch_means_hand_computed():
    # window [0, 4], k = 4: [0,1) -> 1; [1,2) -> (3+5)/2; [2,3) empty (omitted); [3,4] -> (7+9)/2
    # (t = 4.0 closes the last sub-window; 4.5 and -0.1 are outside)
    assert batch_means(SAMPLES, 0.0, 4.0, 4) == [1.0, 4.0, 8.0]
    assert batch_means(SAMPLES, 0.0, 4.0, 1) == [5.0]
    assert batch_means([], 0.0, 4.0, 4) == []
    with pytest.raises(ValueError):
        batch_means(SAMPLES, 0.0, 4.0, 0)
    with pytest.raises(ValueError):
        batch_means(SAMPLES, 4.0, 4.0, 2)


def test_subwindow_ci_mean_hand_computed():
    # values 1, 4, 8: mean 13/3, s = sqrt(12.3333) = 3.511885, se = 2.027588, t(0.975, 2) = 4.302653
    ci = subwindow_ci(SAMPLES, (0.0, 4.0), 4)
    assert ci.estimate == pytest.approx(13 / 3)
    assert ci.half_width == pytest.approx(4.302653 * 2.027588, abs=1e-5)
    assert ci.n == 3 and ci.method == "mean: batch means over 3 of 4 sub-windows, t-interval"


def test_subwindow_ci_percentile():
    # p50 per sub-window (numpy linear): 1, 4, 8 (same as the means here); p100: 1, 5, 9
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4, 50) == [1.0, 4.0, 8.0]
    assert subwindow_values(SAMPLES, (0.0, 4.0), 4, "p100") == [1.0, 5.0, 9.0]
    ci = subwindow_ci(SAMPLES, (0.0, 4.0), 4, statistic="p100")
    assert ci.estimate == pytest.approx(5.0) and ci.method.startswith("p100: batch means")
    with pytest.raises(ValueError):
        subwindow_ci(SAMPLES, (0.0, 4.0), 4, statistic="median")
    with pytest.raises(ValueError):
        subwindow_ci(SAMPLES, (0.0, 4.0), 4, statistic=101)


def test_rate_ci_counts_empty_subwindows_as_zero():
    # events per second in [0,1), [1,2), [2,3), [3,4]: 1, 2, 0, 1 -> mean 1 = 4 events / 4 s
    # s = sqrt(2/3) = 0.8164966, se = 0.4082483, t(0.975, 3) = 3.182446
    ci = rate_ci([0.5, 1.5, 1.6, 3.9, 7.0], (0.0, 4.0), 4)
    assert ci.estimate == pytest.approx(1.0) and ci.n == 4
    assert ci.half_width == pytest.approx(3.182446 * 0.4082483, abs=1e-6)
    # weighted (e.g. tokens): 10, 20 + 30, 0, 40 tokens in 0.5 s sub-windows of [0, 2]
    w = rate_ci([0.1, 0.6, 0.7, 1.9], (0.0, 2.0), 4, weights=[10, 20, 30, 40])
    assert w.estimate == pytest.approx(100 / 2.0)
    with pytest.raises(ValueError):
        rate_ci([0.1], (0.0, 2.0), 4, weights=[1, 2])


# ---------------------------------------------------------------------------------------------
# Ratio and bootstrap
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


def test_bootstrap_is_seeded_and_sane():
    values = [float(x) for x in range(100)]
    a = bootstrap_percentile_ci(values, 90, seed=7)
    assert a == bootstrap_percentile_ci(values, 90, seed=7)
    assert a != bootstrap_percentile_ci(values, 90, seed=8)
    assert a.estimate == pytest.approx(89.1)  # numpy linear p90 of 0..99
    assert a.low <= a.estimate <= a.high and a.n == 100
    assert 80 <= a.low and a.high <= 99
    assert "seed 7" in a.method
    small = bootstrap_percentile_ci(values, 50, seed=1, n_boot=10)
    assert small.low <= small.high


def test_bootstrap_edge_cases():
    one = bootstrap_percentile_ci([3.0], 99, seed=0)
    assert (one.estimate, one.low, one.high) == (3.0, 3.0, 3.0) and "n<2" in one.method
    assert math.isnan(bootstrap_percentile_ci([], 50, seed=0).estimate)
    with pytest.raises(ValueError):
        bootstrap_percentile_ci([1.0, 2.0], 150, seed=0)
    with pytest.raises(ValueError):
        bootstrap_percentile_ci([1.0, 2.0], 50, seed=0, n_boot=0)
