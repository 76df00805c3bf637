"""The building blocks of the replayer's metrics (``replayer.observe.metrics``): log-spaced bucket
layouts, ``histogram_quantile`` on one histogram, a histogram that takes many observations in one
call, per-request observations batched until a scrape, and the collectors computed at scrape time
(requests due, the results folder on disk). Registers nothing by itself."""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable

import numpy as np
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from replayer.core.clock import now_ns


def log_buckets(lo: float, hi: float, per_decade: int = 5) -> tuple[float, ...]:
    """Log-spaced bucket bounds from ``lo`` to at least ``hi``, ``per_decade`` per factor 10,
    rounded to 3 significant digits."""
    n = int(np.ceil(np.log10(hi / lo) * per_decade)) + 1
    return tuple(float(f"{lo * 10 ** (i / per_decade):.3g}") for i in range(n))


#: request latencies (TTFT, E2E): 1 ms .. ~17 min
LATENCY_BUCKETS = log_buckets(0.001, 1000.0)
#: per-token latencies (ITL, TPOT): 0.1 ms .. 10 s
TOKEN_LATENCY_BUCKETS = log_buckets(0.0001, 10.0)
#: dispatch lag is signed (early < 0 < late): mirrored log buckets, 10 us .. 100 s
_LAG = log_buckets(0.00001, 100.0, per_decade=3)
LAG_BUCKETS = tuple(-b for b in reversed(_LAG[:7])) + (0.0,) + _LAG
#: the replayer's own event-loop lag (sleep overshoot): 10 us .. 10 s
LOOP_LAG_BUCKETS = log_buckets(0.00001, 10.0, per_decade=3)


def quantile_from_buckets(
    q: float,
    bounds: Iterable[float],
    cumulative: Iterable[float],
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> float | None:
    """Prometheus ``histogram_quantile`` on one histogram: ``bounds`` are the finite upper bounds
    (ascending), ``cumulative`` the cumulative counts for them followed by the +Inf count.
    Linear interpolation inside the bucket; the lowest bucket starts at 0 (or at its own bound
    if that is negative); a rank in the +Inf bucket returns the highest finite bound. ``None``
    when the histogram is empty. An estimate: ``lo`` / ``hi`` (the exact smallest and largest
    value observed) clamp it, so that it never lies outside what was observed (an interpolation
    inside a wide bucket can land above the maximum)."""
    v = _interpolate(q, list(bounds), list(cumulative))
    if v is None:
        return None
    if hi is not None and v > hi:
        v = hi
    if lo is not None and v < lo:
        v = lo
    return v


def _interpolate(q: float, b: list[float], c: list[float]) -> float | None:
    total = c[-1] if c else 0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = (0.0 if b and b[0] > 0 else (b[0] if b else 0.0)), 0.0
    for bound, count in zip(b, c):
        if count >= rank:
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return b[-1] if b else None


def _hist_state(h: Histogram | "BulkHistogram") -> tuple[list[float], list[float]]:
    """(finite bounds, cumulative counts incl. +Inf) of a label-less histogram, via collect()."""
    bounds: list[float] = []
    counts: list[float] = []
    inf = 0.0
    for fam in h.collect():
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                le = s.labels["le"]
                if le == "+Inf":
                    inf = s.value
                else:
                    bounds.append(float(le))
                    counts.append(s.value)
    return bounds, counts + [inf]


class BulkHistogram(Collector):
    """A label-less Prometheus histogram that takes many observations in one numpy call.

    Used for ITL, where a request yields hundreds of samples at once: ``observe_many`` costs one
    ``searchsorted`` instead of one locked ``observe`` per token. Exposed as a normal histogram.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # last = +Inf
        self._sum = 0.0
        self.min = math.inf  # the exact smallest and largest value observed (the quantiles' clamp)
        self.max = -math.inf
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: np.ndarray | list[float]) -> None:
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return
        idx = np.searchsorted(self._bounds, v, side="left")  # bucket i counts v <= bounds[i]
        add = np.bincount(idx, minlength=self._counts.size)
        known = v[~np.isnan(v)]
        lo, hi = (float(known.min()), float(known.max())) if known.size else (math.inf, -math.inf)
        with self._lock:
            self._counts += add
            self._sum += float(v.sum())
            self.min, self.max = min(self.min, lo), max(self.max, hi)

    def collect(self):
        with self._lock:
            cum = np.cumsum(self._counts)
            total = self._sum
        buckets = [(repr(float(b)), int(c)) for b, c in zip(self._bounds, cum[:-1])]
        buckets.append(("+Inf", int(cum[-1])))
        fam = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
        yield fam

    def describe(self):
        return [HistogramMetricFamily(self.name, self.documentation)]


class _DueCounter(Collector):
    """``replayer_requests_due_total``: schedule entries whose due time has passed, computed at
    scrape time from the schedule (one ``searchsorted``), so its rate is the trace's arrival rate
    at the replay's speed, independent of whether the replayer kept up."""

    NAME = "replayer_requests_due"
    DOC = "Scheduled requests whose due time has passed (the arrival curve the replay must follow)."

    def __init__(self, registry: CollectorRegistry, clock=now_ns) -> None:
        self._clock = clock
        self._due_ns = np.zeros(0, dtype=np.int64)
        self._t0_ns = 0
        self._base = 0
        registry.register(self)

    def track(self, due_ns: np.ndarray | None = None, t0_ns: int = 0, already_due: int = 0, count_due=None) -> None:
        self._due_ns = np.zeros(0, dtype=np.int64) if due_ns is None else np.asarray(due_ns, dtype=np.int64)
        self._t0_ns, self._base, self._count_due = int(t0_ns), int(already_due), count_due

    def value(self) -> int:
        if getattr(self, "_count_due", None) is not None:
            return int(self._count_due())
        due, t0, base = self._due_ns, self._t0_ns, self._base
        if due.size == 0:
            return base
        return base + int(np.searchsorted(due, self._clock() - t0, side="right"))

    def collect(self):
        yield CounterMetricFamily(self.NAME, self.DOC, value=self.value())

    def describe(self):
        return [CounterMetricFamily(self.NAME, self.DOC)]


class _ResultsDisk(Collector):
    """``replayer_results_bytes`` (the results folder's size) and
    ``replayer_results_oldest_timestamp_seconds`` (Unix time of the first request sent in the
    oldest results file kept there: retention moves it forward), as of the recorder's last flush; a value
    not known yet is left out, never 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # () -> (bytes, oldest Unix s), set by the run
        self.source: Callable[[], tuple[int | None, float | None]] = lambda: (None, None)
        registry.register(self)

    def collect(self):
        size, oldest = self.source()
        if size is not None:
            yield GaugeMetricFamily(
                "replayer_results_bytes",
                "Bytes of every file in the results folder (bounded by --retain-size).",
                value=size,
            )
        if oldest is not None:
            yield GaugeMetricFamily(
                "replayer_results_oldest_timestamp_seconds",
                "Unix time of the first request sent in the oldest results file kept (retention moves it on).",
                value=oldest,
            )

    def describe(self):
        return []


class _Flush(Collector):
    """Registered before every metric: a collect of the registry (a scrape, ``generate_latest``,
    ``get_sample_value``) first moves the per-request updates batched in plain numbers into the
    metric objects, so what it reads is up to date."""

    def __init__(self, flush) -> None:
        self._flush = flush

    def collect(self):
        self._flush()
        return iter(())

    def describe(self):
        return []


class _PendingHistogram:
    """Observations of one label-less ``Histogram`` kept in plain numbers until ``flush``: per
    bucket counts, and the running sum in observation order (so the flushed ``_sum`` is the very
    float ``observe`` would have summed). Only this class may observe its histogram."""

    __slots__ = ("h", "bounds", "counts", "total", "n", "min", "max")

    def __init__(self, h: Histogram) -> None:
        self.h = h
        self.bounds = list(h._upper_bounds)  # ends with +Inf  # noqa: SLF001
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.n = 0
        self.min = math.inf  # the exact smallest and largest value observed (never reset: the
        self.max = -math.inf  # histogram is cumulative too), the live quantiles' clamp

    def add(self, v: float) -> None:
        self.total += v
        if v == v:  # NaN lands in no bucket (as in Histogram.observe)
            self.counts[bisect_left(self.bounds, v)] += 1  # first bound >= v
            if v < self.min:
                self.min = v
            if v > self.max:
                self.max = v
        self.n += 1

    def flush(self) -> None:
        if not self.n:
            return
        buckets = self.h._buckets  # noqa: SLF001
        counts = self.counts
        for i, c in enumerate(counts):
            if c:
                buckets[i].inc(c)
                counts[i] = 0
        self.h._sum.set(self.total)  # noqa: SLF001
        self.n = 0
