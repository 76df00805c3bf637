"""The run's latest latencies, exactly: TTFT, ITL, TPOT and E2E quantiles of the successful
requests that ended in the last ``window_s`` seconds, as gauges.

``replayer_live_latency_seconds{metric, quantile}`` (metric: ttft, itl, tpot, e2e; quantile: 0.5,
0.9, 0.99) and ``replayer_live_latency_values{metric}`` (the values they come from) are computed at
each scrape with the summary's own rule (nearest rank, as ``replayer.core.stats.Stat``), exactly
(one ``np.partition`` of the window's values), so a panel can show the number the summary would give for that
window rather than a bucket interpolation. The window slides in ``slots`` steps; a quantile of a
window with no value is left out (unknown is not zero).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import chain

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from replayer.core.result import RequestResult

METRICS = ("ttft", "itl", "tpot", "e2e")
QUANTILES = (0.5, 0.9, 0.99)


class LiveWindow(Collector):
    """The sliding window (module docstring). ``on_result`` is a fan-out step (any thread)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        window_s: float = 60.0,
        slots: int = 6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self._slot_s, self._clock = float(window_s), float(window_s) / slots, clock
        self._lock = threading.Lock()
        self._scrape_lock = threading.Lock()
        # (slot number, {metric: values in ms; ITL: each request's own list}) oldest first: the
        # per-request step only appends (the lists are converted at the scrape)
        self._slots: deque[tuple[int, dict[str, list]]] = deque()
        # (slot number, metric) -> (values converted, as an array): a closed slot converts once
        self._arrays: dict[tuple[int, str], tuple[int, np.ndarray]] = {}
        if registry is not None:
            registry.register(self)

    def _current(self) -> dict[str, list]:
        n = int(self._clock() // self._slot_s)
        if not self._slots or self._slots[-1][0] != n:
            self._slots.append((n, {m: [] for m in METRICS}))
            keep = int(self.window_s // self._slot_s)
            while self._slots and self._slots[0][0] <= n - keep:
                self._slots.popleft()
        return self._slots[-1][1]

    def on_result(self, res: RequestResult) -> None:
        if res.outcome != "success":
            return
        with self._lock:
            cur = self._current()
            if res.ttft_ms is not None:
                cur["ttft"].append(res.ttft_ms)
            if res.e2e_ms is not None:
                cur["e2e"].append(res.e2e_ms)
            if res.tpot_ms is not None:
                cur["tpot"].append(res.tpot_ms)
            if res.itl_ms:
                cur["itl"].append(res.itl_ms)  # (the finished request's list: never changed again)

    def values(self) -> dict[str, np.ndarray]:
        """Each metric's values in the window now, in milliseconds."""
        with self._lock:
            self._current()  # drops the slots that left the window
            parts = {m: [(n, slot[m][:]) for n, slot in self._slots] for m in METRICS}
        out = {}
        with self._scrape_lock:  # (two scrapes at once share the converted arrays)
            for m, slots in parts.items():
                arrays = []
                for n, vals in slots:
                    have = self._arrays.get((n, m))
                    if have is None or have[0] != len(vals):
                        flat = list(chain.from_iterable(vals)) if m == "itl" else vals
                        have = (len(vals), np.asarray(flat, dtype=np.float64))
                        self._arrays[(n, m)] = have
                    arrays.append(have[1])
                out[m] = np.concatenate(arrays) if arrays else np.zeros(0)
            kept = {n for n, _ in parts[METRICS[0]]}  # (the slots that left the window: dropped)
            self._arrays = {k: v for k, v in self._arrays.items() if k[0] in kept}
        return out

    def collect(self):
        q = GaugeMetricFamily(
            "replayer_live_latency_seconds",
            f"Exact quantiles (the summary's method) of the last {self.window_s:g} s of successful requests.",
            labels=["metric", "percentile"],  # ("quantile" is a summary's label: promtool rejects it on a gauge)
        )
        n = GaugeMetricFamily(
            "replayer_live_latency_values",
            f"Values in the last {self.window_s:g} s behind replayer_live_latency_seconds.",
            labels=["metric"],
        )
        for m, v in self.values().items():
            n.add_metric([m], v.size)
            for x, value in zip(QUANTILES, nearest_rank(v, QUANTILES)):
                if value is not None:
                    q.add_metric([m, f"p{x * 100:g}"], value / 1e3)
        yield q
        yield n

    def describe(self):
        return []


def nearest_rank(v: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    """The nearest-rank quantiles ``qs`` of ``v`` (``Stat.percentile``'s exact rule), in one
    ``np.partition``; None each when ``v`` is empty."""
    n = v.size
    if not n:
        return [None] * len(qs)
    ranks = [min(n, max(1, math.ceil(q * n - 1e-9))) - 1 for q in qs]
    part = np.partition(v, sorted(set(ranks)))
    return [float(part[r]) for r in ranks]
