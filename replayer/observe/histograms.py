"""The replayer's latency histograms: bucket layouts and a histogram fed in batches.

Bucket layouts. Prometheus reads a quantile from a classic histogram by linear interpolation
inside the bucket that holds the rank, so its error is bounded by that bucket's width. The
run's exact quantiles (the summary's nearest-rank percentiles) lie in the same bucket, so a
layout whose buckets grow by a factor ``f`` keeps ``histogram_quantile`` within ``f - 1`` of
the summary there. The request latencies (TTFT, E2E) and the per-token ones (ITL, TPOT) get
``FINE_PER_DECADE`` buckets per decade (factor 1.029: within 2.9 %) over the range where LLM
serving puts them, and the usual 5 per decade outside it (values there are still counted, only
less finely). Native histograms would need the protobuf exposition, which prometheus_client
does not write (it has an experimental ``NativeHistogram`` sample, exposed only in the
OpenMetrics 2.0 text that Prometheus 2.x does not read), so these are classic buckets.

``BatchedHistogram`` is a label-less histogram kept in plain numbers and exposed through
prometheus_client's public collector API (``HistogramMetricFamily``): ``add`` takes one value
(a ``bisect``), ``observe_many`` a numpy batch (one ``searchsorted``, for ITL's hundreds of
samples per request). Its owner serialises ``add``/``observe_many`` with ``collect`` through the
lock it hands in, so a scrape reads whole requests.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from contextlib import AbstractContextManager

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: buckets per decade inside a latency's fine range (factor 10 ** (1 / 80) = 1.0292)
FINE_PER_DECADE = 80


def log_buckets(lo: float, hi: float, per_decade: int = 5) -> tuple[float, ...]:
    """Log-spaced bucket bounds from ``lo`` to at least ``hi``, ``per_decade`` per factor 10,
    rounded to 3 significant digits (4 when ``per_decade`` > 20, so that neighbours differ)."""
    n = int(np.ceil(np.log10(hi / lo) * per_decade - 1e-9)) + 1
    digits = 4 if per_decade > 20 else 3
    return tuple(sorted({float(f"{lo * 10 ** (i / per_decade):.{digits}g}") for i in range(n)}))


def fine_buckets(
    lo: float, hi: float, fine_lo: float, fine_hi: float, per_decade: int = FINE_PER_DECADE
) -> tuple[float, ...]:
    """Bounds from ``lo`` to ``hi``: 5 per decade, and ``per_decade`` between ``fine_lo`` and
    ``fine_hi`` (the range where the workload's quantiles are read)."""
    coarse = [b for b in log_buckets(lo, hi) if b < fine_lo or b > fine_hi]
    return tuple(sorted(set(coarse) | set(log_buckets(fine_lo, fine_hi, per_decade))))


#: request latencies (TTFT, E2E): 1 ms .. ~17 min, fine from 5 ms to 120 s
LATENCY_BUCKETS = fine_buckets(0.001, 1000.0, 0.005, 120.0)
#: per-token latencies (ITL, TPOT): 0.1 ms .. 10 s, fine from 1 ms to 1 s
TOKEN_LATENCY_BUCKETS = fine_buckets(0.0001, 10.0, 0.001, 1.0)
#: latencies read less finely (from the due time, session waits, client overhead): 5 per decade
COARSE_LATENCY_BUCKETS = log_buckets(0.001, 1000.0)
COARSE_TOKEN_BUCKETS = log_buckets(0.0001, 10.0)
#: dispatch lag is signed (early < 0 < late): mirrored log buckets, 10 us .. 100 s
_LAG = log_buckets(0.00001, 100.0, per_decade=3)
LAG_BUCKETS = tuple(-b for b in reversed(_LAG[:7])) + (0.0,) + _LAG
#: the replayer's own event-loop lag (sleep overshoot): 10 us .. 10 s
LOOP_LAG_BUCKETS = log_buckets(0.00001, 10.0, per_decade=3)


class BatchedHistogram(Collector):
    """A label-less histogram in plain numbers (module docstring). ``min``/``max`` are the exact
    smallest and largest values observed (the live quantiles' clamp)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: tuple[float, ...],
        registry: CollectorRegistry | None,
        lock: AbstractContextManager | None = None,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = [float(b) for b in buckets]  # finite upper bounds, ascending
        self._np_bounds = np.asarray(self.bounds, dtype=np.float64)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket (not cumulative); last = +Inf
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._lock = lock if lock is not None else threading.Lock()
        if registry is not None:
            registry.register(self)

    def add(self, v: float) -> None:
        """One observation (the caller holds the lock). NaN lands in no bucket (it adds to the sum)."""
        self.total += v
        if v == v:
            self.counts[bisect_left(self.bounds, v)] += 1  # first bound >= v
            if v < self.min:
                self.min = v
            if v > self.max:
                self.max = v

    def observe_many(self, values: np.ndarray | list[float]) -> None:
        """A batch of observations, under the lock."""
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return
        idx = np.searchsorted(self._np_bounds, v, side="left")  # bucket i counts v <= bounds[i]
        add = np.bincount(idx, minlength=len(self.counts))
        known = v[~np.isnan(v)]
        with self._lock:
            counts = self.counts
            for i in np.flatnonzero(add):
                counts[i] += int(add[i])
            self.total += float(v.sum())
            if known.size:
                self.min, self.max = min(self.min, float(known.min())), max(self.max, float(known.max()))

    def cumulative(self) -> tuple[list[float], list[int]]:
        """(finite bounds, cumulative counts for them followed by the +Inf count)."""
        with self._lock:
            counts = list(self.counts)
        cum, run = [], 0
        for c in counts:
            run += c
            cum.append(run)
        return self.bounds, cum

    def collect(self):
        bounds, cum = self.cumulative()
        with self._lock:
            total = self.total
        buckets = [(floatToGoString(b), c) for b, c in zip(bounds, cum[:-1])]
        buckets.append(("+Inf", cum[-1]))
        fam = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
        if bounds and bounds[0] < 0:  # negative buckets: a count and no sum (as Histogram exposes it)
            fam.add_sample(self.name + "_count", {}, cum[-1])
        yield fam

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation)]
