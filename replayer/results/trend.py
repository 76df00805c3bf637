"""The statistics behind the verdicts (pure numpy over plain arrays, no I/O, no event loop).

- ``theil_sen``: the Theil-Sen slope (the median of the slopes between every pair of points)
  with Sen's distribution-free confidence interval (the ranks of the pairwise slopes given by
  the normal approximation of Kendall's S, corrected for ties), as ``scipy.stats.theilslopes``
  computes it. Why Theil-Sen: windows of a soak carry outliers (a GC pause, a burst of the
  trace); the median of pairwise slopes tolerates up to 29 % of them, where least squares
  follows one bad window; its interval needs no normality.
- ``ks_distance`` / ``ks_critical``: the two-sample Kolmogorov-Smirnov distance (the largest
  gap between two empirical CDFs) and its critical value at a significance level (the
  asymptotic ``c(alpha) * sqrt((n + m) / (n m))``).
- ``change_start``: where a trend started: the hinge (flat, then a straight line) that fits the
  points best in least squares, searched over every point.
- ``load_adjusted``: values with the part explained by the load they carried taken out, the load
  coefficients fitted jointly with time (so a load that grows over the run is not taken for
  drift, and does not absorb a drift either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class Slope:
    """A Theil-Sen fit: ``slope`` (units of y per unit of x), its confidence interval
    ``[low, high]`` at ``confidence``, and ``intercept`` (median of ``y - slope * x``)."""

    slope: float
    low: float
    high: float
    intercept: float
    confidence: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 (a trend at this confidence)."""
        return self.low > 0 or self.high < 0


def _tie_term(v: np.ndarray) -> float:
    """The ties' part of the variance of Kendall's S: sum of t (t - 1) (2t + 5) per tied group."""
    _, counts = np.unique(v, return_counts=True)
    t = counts[counts > 1].astype(np.float64)
    return float((t * (t - 1) * (2 * t + 5)).sum())


#: where a trend started is searched among at most this many points (evenly spaced)
MAX_KNOTS = 500
#: the points around each one that tell a lone spike from a trend (``despiked``)
SMOOTH = 5
#: more pairs of points than this and the slopes are those of this many pairs drawn at random
MAX_PAIRS = 1_000_000


def _pairs(n: int, max_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (i < j) of ``n`` points, or ``max_pairs`` of them drawn at random (seeded: the
    same points give the same slope) when there are more: the median and the interval's ranks of
    a uniform sample of the pairwise slopes estimate those of them all (randomized Theil-Sen)."""
    if n * (n - 1) // 2 <= max_pairs:
        return np.triu_indices(n, k=1)
    rng = np.random.default_rng(n)
    i = rng.integers(0, n, max_pairs)
    j = rng.integers(0, n - 1, max_pairs)
    j += j >= i  # (j uniform over the other points)
    return np.minimum(i, j), np.maximum(i, j)


def theil_sen(x: np.ndarray, y: np.ndarray, confidence: float = 0.95, max_pairs: int = MAX_PAIRS) -> Slope | None:
    """Theil-Sen slope of ``y`` over ``x`` with Sen's interval; None with fewer than 3 points or
    no two distinct ``x`` (NaN points are left out). Over ``max_pairs`` pairs: see ``_pairs``."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    n = x.size
    if n < 3:
        return None
    i, j = _pairs(n, max_pairs)
    dx = x[j] - x[i]
    ok = dx != 0
    if not ok.any():
        return None
    slopes = np.sort((y[j] - y[i])[ok] / dx[ok])
    med = float(np.median(slopes))
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    var_s = (n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y)) / 18.0
    sigma = math.sqrt(max(var_s, 0.0))
    nt = slopes.size
    every = n * (n - 1) / 2 * (nt / i.size)  # (the pairs with distinct x of all, estimated from the drawn)
    scale = nt / every  # (the ranks among all the slopes, as ranks among those drawn)
    upper = min(int(round((every + z * sigma) / 2.0 * scale)), nt - 1)
    lower = max(int(round((every - z * sigma) / 2.0 * scale)) - 1, 0)
    return Slope(
        slope=med,
        low=float(slopes[lower]),
        high=float(slopes[upper]),
        intercept=float(np.median(y - med * x)),
        confidence=confidence,
        n=n,
    )


def median_interval(r: np.ndarray, confidence: float = 0.95) -> Slope | None:
    """The median of the rates ``r`` with its distribution-free interval (the order statistics
    of the sign test: ranks ``(n -+ z sqrt(n)) / 2``), as a ``Slope`` (intercept 0); None with
    fewer than 3 values (NaN left out). For slopes measured one pair each, e.g. each window
    against the previous loop's at the same position."""
    r = np.sort(np.asarray(r, dtype=np.float64)[~np.isnan(np.asarray(r, dtype=np.float64))])
    n = r.size
    if n < 3:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    k = max(int(math.floor((n - z * math.sqrt(n)) / 2.0)), 0)
    return Slope(
        slope=float(np.median(r)),
        low=float(r[k]),
        high=float(r[min(n - 1 - k, n - 1)]),
        intercept=0.0,
        confidence=confidence,
        n=n,
    )


def ks_distance(a: np.ndarray, b: np.ndarray) -> float | None:
    """The two-sample Kolmogorov-Smirnov distance: max over v of |F_a(v) - F_b(v)| (0 = the same
    distribution, 1 = disjoint); None when either sample is empty."""
    a = np.sort(np.asarray(a, dtype=np.float64))
    b = np.sort(np.asarray(b, dtype=np.float64))
    if not a.size or not b.size:
        return None
    v = np.concatenate([a, b])
    fa = np.searchsorted(a, v, side="right") / a.size
    fb = np.searchsorted(b, v, side="right") / b.size
    return float(np.abs(fa - fb).max())


def ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    """The distance above which two samples of ``n`` and ``m`` values differ at significance
    ``alpha`` (asymptotic: ``sqrt(-ln(alpha / 2) / 2) * sqrt((n + m) / (n m))``)."""
    if n < 1 or m < 1:
        return 1.0
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def change_start(x: np.ndarray, y: np.ndarray) -> int:
    """Index of the point where a trend started: the ``k`` whose hinge ``a + b * max(0, x -
    x[k])`` fits ``y`` with the least squared error (0: the trend runs from the first point).
    ``x`` sorted ascending; NaN values of ``y`` are left out of the fit. The fit is to ``y``
    without its lone spikes (``despiked``), so one outlying window (a p90 a stall raised) cannot
    pull the start to itself. Over ``MAX_KNOTS`` points, the start is one of ``MAX_KNOTS`` evenly
    spaced ones (a month of 5-minute windows: 1 in 17)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = ~np.isnan(y)
    idx = np.flatnonzero(keep)
    if idx.size < 3:
        return 0
    xs, ys = x[keep], despiked(y[keep])
    # candidate knots: every point, or ``MAX_KNOTS`` evenly spaced ones (memory: knots x points)
    knots = np.unique(np.linspace(0, xs.size - 2, min(xs.size - 1, MAX_KNOTS)).astype(np.int64))
    h = np.maximum(0.0, xs[None, :] - xs[knots, None])  # row k: the hinge at knot k
    hc = h - h.mean(axis=1, keepdims=True)
    yc = ys - ys.mean()
    shh = (hc * hc).sum(axis=1)
    shy = hc @ yc
    explained = np.where(shh > 0, shy * shy / np.where(shh > 0, shh, 1.0), 0.0)
    return int(idx[knots[int(np.argmax(explained))]])


def despiked(y: np.ndarray, width: int = SMOOTH, k: float = 3.0) -> np.ndarray:
    """``y`` with its lone outliers replaced by their neighbourhood's median (a Hampel filter):
    a point further than ``k`` robust deviations (1.4826 x the median absolute deviation) from
    the median of the ``width`` points around it (at the ends: the first or last ``width``). A
    trend, a knee or a step keeps every point; a spike of one window does not."""
    n = y.size
    if n < width:
        return y
    half = width // 2
    windows = np.lib.stride_tricks.sliding_window_view(y, width)  # (n - width + 1, width)
    where = np.clip(np.arange(n) - half, 0, n - width)  # each point's window, full at the ends
    med = np.median(windows, axis=1)
    mad = np.median(np.abs(windows - med[:, None]), axis=1)
    m, sigma = med[where], 1.4826 * mad[where]
    out = y.copy()
    spikes = np.abs(y - m) > k * sigma
    out[spikes] = m[spikes]
    return out


def load_adjusted(t: np.ndarray, y: np.ndarray, loads: list[np.ndarray]) -> tuple[np.ndarray, list[float]]:
    """``y`` with the part the ``loads`` explain taken out: least squares of ``y`` on an
    intercept, ``t`` and each load (centred), then ``y - sum(b_i * (load_i - mean))``; returns
    the adjusted values and the load coefficients (0 for a load that does not vary: nothing to
    tell apart). NaN points are left out of the fit and stay NaN."""
    t = np.asarray(t, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    cols = [np.asarray(v, dtype=np.float64) for v in loads]
    keep = ~np.isnan(y) & ~np.isnan(t)
    for c in cols:
        keep &= ~np.isnan(c)
    coefs = [0.0] * len(cols)
    if keep.sum() < len(cols) + 3:
        return y.copy(), coefs
    varying = [i for i, c in enumerate(cols) if np.std(c[keep]) > 1e-12 * max(1.0, abs(float(np.mean(c[keep]))))]
    centred = {i: cols[i] - float(np.mean(cols[i][keep])) for i in varying}
    design = np.column_stack([np.ones(int(keep.sum())), t[keep], *(centred[i][keep] for i in varying)])
    beta, *_ = np.linalg.lstsq(design, y[keep], rcond=None)
    out = y.copy()
    for k, i in enumerate(varying):
        coefs[i] = float(beta[2 + k])
        out = out - coefs[i] * np.nan_to_num(centred[i])
    return out, coefs


__all__ = ["Slope", "change_start", "ks_critical", "ks_distance", "load_adjusted", "median_interval", "theil_sen"]
