"""The verdicts' statistics (replayer.results.trend), pure: Theil-Sen and Sen's interval, the KS
distance, where a trend started, the load adjustment."""

import math

import numpy as np
import pytest

from replayer.results.trend import change_start, ks_critical, ks_distance, load_adjusted, theil_sen


def test_theil_sen_of_a_line_is_its_slope_and_its_interval_is_a_point():
    x = np.arange(10.0)
    fit = theil_sen(x, 3.0 * x + 2.0)
    assert fit is not None
    assert fit.slope == pytest.approx(3.0) and fit.intercept == pytest.approx(2.0)
    assert fit.low == pytest.approx(3.0) and fit.high == pytest.approx(3.0)


def test_theil_sen_by_hand_with_sens_interval():
    # 5 points: 10 pairwise slopes; var(S) = 5*4*15/18 = 16.67, sigma 4.08; at 90 % z = 1.645:
    # ranks round((10 -+ 6.72)/2) = 2 (minus 1: 0-based 1) and 8 of the sorted slopes
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    y = np.array([0.0, 1.0, 4.0, 3.0, 8.0])
    slopes = sorted((y[j] - y[i]) / (x[j] - x[i]) for i in range(5) for j in range(i + 1, 5))
    fit = theil_sen(x, y, confidence=0.90)
    assert fit is not None
    assert fit.slope == pytest.approx(float(np.median(slopes)))
    assert (fit.low, fit.high) == (pytest.approx(slopes[1]), pytest.approx(slopes[8]))


def test_theil_sen_ignores_an_outlier_that_bends_least_squares():
    x = np.arange(20.0)
    y = 0.5 * x
    y[3] = 500.0
    fit = theil_sen(x, y)
    assert fit is not None and fit.slope == pytest.approx(0.5)
    assert np.polyfit(x, y, 1)[0] < 0  # (least squares follows the outlier down)


def test_sens_interval_covers_the_true_slope_about_as_often_as_it_says():
    rng = np.random.default_rng(7)
    x = np.arange(30.0)
    covered = 0
    for _ in range(200):
        fit = theil_sen(x, 1.5 * x + rng.normal(0, 4, x.size), confidence=0.95)
        assert fit is not None
        covered += fit.low <= 1.5 <= fit.high
    assert 0.90 <= covered / 200 <= 0.995


def test_no_trend_in_noise_and_no_fit_without_points():
    rng = np.random.default_rng(3)
    fit = theil_sen(np.arange(40.0), rng.normal(10, 1, 40), confidence=0.99)
    assert fit is not None and not fit.excludes_zero
    assert theil_sen(np.array([1.0, 2.0]), np.array([1.0, 2.0])) is None
    assert theil_sen(np.ones(5), np.arange(5.0)) is None  # (no two distinct x)
    with_nan = theil_sen(np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.0, math.nan, 2.0, 3.0]))
    assert with_nan is not None and with_nan.n == 3 and with_nan.slope == pytest.approx(1.0)


def test_ks_distance():
    assert ks_distance(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])) == 0.0
    assert ks_distance(np.array([1.0, 2.0]), np.array([5.0, 6.0])) == 1.0
    # F_a jumps to 1/2 at 1, F_b stays 0 until 1.5: the gap is 1/2
    assert ks_distance(np.array([1.0, 2.0]), np.array([1.5, 2.0])) == pytest.approx(0.5)
    assert ks_distance(np.array([]), np.array([1.0])) is None
    # the critical value shrinks with the samples (1.95 * sqrt(2/n) at alpha 0.001)
    assert ks_critical(100, 100) == pytest.approx(math.sqrt(-math.log(0.0005) / 2) * math.sqrt(2 / 100))
    assert ks_critical(10_000, 10_000) < ks_critical(100, 100)


def test_change_start_finds_the_knee():
    t = np.arange(40.0)
    y = np.where(t < 25, 5.0, 5.0 + (t - 25) * 2)
    assert change_start(t, y) == 25
    assert change_start(t, 3.0 * t) == 0  # (a trend from the first point)
    long = np.arange(5000.0)  # (over MAX_KNOTS points: a start among 500 evenly spaced ones)
    assert abs(change_start(long, np.where(long < 3000, 1.0, long - 2999.0)) - 3000) <= 10


def test_one_outlying_window_does_not_move_where_a_trend_started():
    # a drift from the first window; the next-to-last window's p90 a stall raised far above the
    # line: fitted to the raw values, the best hinge is at the outlier (the start read as window 38)
    t = np.arange(40.0)
    y = 20.0 + 0.3 * t + np.where(np.arange(40) % 2 == 0, 0.5, -0.5)
    y[38] = 71.0
    assert change_start(t, y) <= 2
    knee = np.where(t < 25, 5.0, 5.0 + (t - 25) * 2)
    knee[10] = 60.0
    assert abs(change_start(t, knee) - 25) <= 1


def test_load_adjusted_takes_out_what_the_load_explains_and_keeps_the_drift():
    rng = np.random.default_rng(5)
    t = np.arange(60.0)
    load = rng.uniform(0, 10, t.size)
    y = 100 + 4.0 * load + 0.5 * t
    adjusted, coefs = load_adjusted(t, y, [load, np.full(t.size, 3.0)])
    assert coefs[0] == pytest.approx(4.0) and coefs[1] == 0.0  # (a constant load tells nothing)
    fit = theil_sen(t, adjusted)
    assert fit is not None and fit.slope == pytest.approx(0.5)


def test_many_points_fit_on_a_random_sample_of_pairs_close_to_all_of_them():
    rng = np.random.default_rng(11)
    x = np.arange(1500.0)
    y = 0.2 * x + rng.normal(0, 20, x.size)
    exact = theil_sen(x, y, 0.99)  # (1.1 M pairs: over the default 1 M, sampled too)
    every = theil_sen(x, y, 0.99, max_pairs=2_000_000)
    sampled = theil_sen(x, y, 0.99, max_pairs=50_000)
    assert exact is not None and every is not None and sampled is not None
    assert sampled.slope == pytest.approx(every.slope, rel=0.03)
    assert sampled.low == pytest.approx(every.low, rel=0.05) and sampled.high == pytest.approx(every.high, rel=0.05)
    assert exact.slope == pytest.approx(every.slope, rel=0.01)
