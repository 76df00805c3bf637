"""The fidelity verdict's inter-arrival gaps as histograms: bounded in size and mergeable, so the
gaps of results files retention removed (``fidelitydigest``) join those of the files kept.

**The grid.** A gap is compared on the 1 ms grid (``GAP_RESOLUTION_MS``: traces stamp in ms)
up to ``GAP_LINEAR_MS``, and on a grid of relative steps of ``GAP_RELATIVE_STEP`` above it (a
30 s gap is not told from one 1 % longer: a sender's jitter of a few ms on it is no different
workload). A histogram of gap codes on this grid holds at most ``GAP_LINEAR_MS`` + ~100 codes per
decade of gaps above, whatever the number of gaps; the quantiles (numpy's linear interpolation
between ranks) and the two-sample Kolmogorov-Smirnov distance computed from two histograms are
those of the gaps themselves on the grid, exactly.

**The stream.** ``GapStream`` folds one run's sorted times (due or sent) file by file: the gaps
between times before a watermark go into the histogram; the times after it stay pending, to be
sorted with the next file's (a request in flight when a file rolled is recorded in a later file,
though it was sent before that file's last send). A time that arrives below what was already
folded (a request in flight longer than the watermark allowed for) is left out and counted
(``late``): the comparison is then approximate, and says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: inter-arrival gaps are compared on this grid, ms
GAP_RESOLUTION_MS = 1.0
#: gaps from this many ms up are compared on the relative grid
GAP_LINEAR_MS = 1024
#: the relative grid's step above ``GAP_LINEAR_MS``: a gap is snapped up to within this of it
GAP_RELATIVE_STEP = 0.01
#: a stream keeps at most this many times pending (beyond: the oldest are folded anyway)
PENDING_LIMIT = 20_000

_LOG_STEP = math.log1p(GAP_RELATIVE_STEP)

Hist = tuple[np.ndarray, np.ndarray]  # (sorted unique gap codes, their counts), both int64


def gap_codes(diff_ns: np.ndarray) -> np.ndarray:
    """The grid's code of each gap (ns, >= 0): its ms rounded below ``GAP_LINEAR_MS``, else
    ``GAP_LINEAR_MS`` plus the number of relative steps above it (rounded up)."""
    ms = np.asarray(diff_ns, dtype=np.float64) / 1e6
    lin = np.round(ms / GAP_RESOLUTION_MS)
    codes = lin.astype(np.int64)
    big = lin >= GAP_LINEAR_MS
    if big.any():
        steps = np.ceil(np.log(ms[big] / (GAP_LINEAR_MS * GAP_RESOLUTION_MS)) / _LOG_STEP)
        codes[big] = GAP_LINEAR_MS + np.maximum(steps, 0).astype(np.int64)
    return codes


def gap_values(codes: np.ndarray) -> np.ndarray:
    """The gap (ms) each grid code stands for (``gap_codes``' inverse on the grid)."""
    codes = np.asarray(codes, dtype=np.int64)
    v = codes.astype(np.float64) * GAP_RESOLUTION_MS
    big = codes >= GAP_LINEAR_MS
    if big.any():
        v[big] = GAP_LINEAR_MS * GAP_RESOLUTION_MS * np.exp((codes[big] - GAP_LINEAR_MS) * _LOG_STEP)
    return v


def empty_hist() -> Hist:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def hist_of(times_ns: np.ndarray) -> Hist:
    """The histogram of the gaps between consecutive ``times_ns`` (sorted)."""
    if len(times_ns) < 2:
        return empty_hist()
    u, c = np.unique(gap_codes(np.diff(times_ns)), return_counts=True)
    return u.astype(np.int64), c.astype(np.int64)


def hist_add(*hists: Hist) -> Hist:
    """The histograms summed."""
    codes = np.concatenate([h[0] for h in hists]) if hists else np.zeros(0, np.int64)
    if not codes.size:
        return empty_hist()
    counts = np.concatenate([h[1] for h in hists])
    u, inv = np.unique(codes, return_inverse=True)
    return u.astype(np.int64), np.bincount(inv, weights=counts, minlength=u.size).astype(np.int64)


def hist_to_json(h: Hist) -> list[list[int]]:
    return [h[0].tolist(), h[1].tolist()]


def hist_from_json(d: Any) -> Hist:
    if not d:
        return empty_hist()
    return np.asarray(d[0], dtype=np.int64), np.asarray(d[1], dtype=np.int64)


def hist_percentile(h: Hist, q: float) -> float:
    """``np.percentile`` (linear interpolation between ranks) of the gaps (ms) ``h`` counts."""
    codes, counts = h
    n = int(counts.sum())
    cum = np.cumsum(counts)
    pos = q / 100 * (n - 1)  # (as numpy computes it)
    lo = math.floor(pos)
    at = gap_values(codes[np.searchsorted(cum, [lo, min(lo + 1, n - 1)], side="right")])
    return float(at[0] + (pos - lo) * (at[1] - at[0]))


def hist_ks(a: Hist, b: Hist) -> float | None:
    """The two-sample Kolmogorov-Smirnov distance of the gaps ``a`` and ``b`` count (None when
    either is empty): max over the codes of |F_a - F_b|, the sup of the step functions."""
    if not a[1].sum() or not b[1].sum():
        return None
    keys = np.union1d(a[0], b[0])

    def cdf(h: Hist) -> np.ndarray:
        cum = np.cumsum(h[1])
        idx = np.searchsorted(h[0], keys, side="right")
        return np.where(idx > 0, cum[np.maximum(idx - 1, 0)], 0) / cum[-1]

    return float(np.abs(cdf(a) - cdf(b)).max())


class GapStream:
    """One stream of times (absolute ns) folded into a gap histogram file by file (module
    docstring): ``last`` (the last time folded), ``pending`` (sorted times after it), ``hist``,
    ``late`` (times left out: below ``last`` when they came) and ``n`` (times taken)."""

    def __init__(self, d: dict[str, Any] | None = None) -> None:
        d = d or {}
        self.last: int | None = d.get("last")
        first = self.last or 0
        self.pending = first + np.cumsum(np.asarray(d.get("pending", []), dtype=np.int64))
        self.hist = hist_from_json(d.get("hist"))
        self.late = int(d.get("late", 0))
        self.n = int(d.get("n", 0))

    def _take(self, times: np.ndarray) -> np.ndarray:
        """``times`` (int64 ns) sorted with the pending ones, those below ``last`` left out."""
        times = np.asarray(times, dtype=np.int64)
        if self.last is not None:
            ok = times >= self.last
            self.late += int(times.size - ok.sum())
            times = times[ok]
        self.n += int(times.size)
        return np.sort(np.concatenate([self.pending, times]))

    def _fold(self, seq: np.ndarray) -> None:
        """The gaps of ``seq`` (sorted, after ``last``) into the histogram, from ``last`` on."""
        if not seq.size:
            return
        head = seq if self.last is None else np.concatenate([[self.last], seq])
        self.hist = hist_add(self.hist, hist_of(head))
        self.last = int(seq[-1])

    def fold(self, times: np.ndarray, watermark: int) -> None:
        """Take ``times``; fold every time below ``watermark`` (and the oldest beyond
        ``PENDING_LIMIT`` pending), keep the others pending."""
        seq = self._take(times)
        cut = max(int(np.searchsorted(seq, watermark, side="left")), seq.size - PENDING_LIMIT)
        self._fold(seq[:cut])
        self.pending = seq[cut:]

    def finish(self, times: np.ndarray) -> Hist:
        """The histogram of every gap: the folded ones, and those of the pending times with
        ``times`` (the files kept; ``late`` and ``n`` count them too). The end of the stream:
        nothing is pending after it."""
        self._fold(self._take(times))
        self.pending = np.zeros(0, np.int64)
        return self.hist

    def to_json(self) -> dict[str, Any]:
        first = self.last or 0
        deltas = np.diff(np.concatenate([[first], self.pending])) if self.pending.size else np.zeros(0, np.int64)
        return {
            "last": self.last,
            "pending": deltas.tolist(),
            "hist": hist_to_json(self.hist),
            "late": self.late,
            "n": self.n,
        }


__all__ = [
    "GAP_LINEAR_MS",
    "GAP_RELATIVE_STEP",
    "GAP_RESOLUTION_MS",
    "GapStream",
    "Hist",
    "empty_hist",
    "gap_codes",
    "gap_values",
    "hist_add",
    "hist_ks",
    "hist_of",
    "hist_percentile",
]
