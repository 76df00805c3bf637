"""The building blocks of the replayer's metrics (``replayer.observe.metrics``):
``histogram_quantile`` on one histogram, the flush before every collect, and the collectors
computed at scrape time (requests due, the results folder on disk). Registers nothing by itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from replayer.core.clock import now_ns


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
