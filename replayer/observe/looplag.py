"""The replayer's own event-loop lag: how late each short sleep wakes (``EventLoopLagMonitor``),
into ``replayer_event_loop_lag_seconds`` and its windowed max (``replayer.observe.metrics``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol


class LagSink(Protocol):
    """What the monitor writes to (``replayer.observe.metrics.ReplayerMetrics``)."""

    loop_lag_max: Any  # a Gauge

    def on_event_loop_lag(self, lag_s: float) -> None: ...


class EventLoopLagMonitor:
    """Measures the replayer's own event-loop lag: sleeps ``interval_s`` again and again and
    records how late each wake-up is (``time.perf_counter_ns``), into
    ``replayer_event_loop_lag_seconds`` and the windowed max ``replayer_event_loop_lag_max_seconds``.

    Run ``await monitor.run()`` as a task; cancel it to stop. ``max_lag_s`` is the largest
    overshoot seen since start.
    """

    def __init__(self, metrics: LagSink, *, interval_s: float = 0.05, window_s: float = 10.0) -> None:
        if interval_s <= 0 or window_s <= 0:
            raise ValueError("interval_s and window_s must be > 0")
        self.metrics = metrics
        self.interval_s = interval_s
        self.window_s = window_s
        self.max_lag_s = 0.0
        self.samples = 0

    async def run(self) -> None:
        interval_ns = int(self.interval_s * 1e9)
        window_ns = int(self.window_s * 1e9)
        window_start = time.perf_counter_ns()
        prev_max = cur_max = 0.0
        while True:
            t0 = time.perf_counter_ns()
            await asyncio.sleep(self.interval_s)
            t1 = time.perf_counter_ns()
            lag = max(0, t1 - t0 - interval_ns) / 1e9
            self.samples += 1
            self.metrics.on_event_loop_lag(lag)
            if lag > self.max_lag_s:
                self.max_lag_s = lag
            if t1 - window_start >= window_ns:
                prev_max, cur_max, window_start = cur_max, 0.0, t1
            cur_max = max(cur_max, lag)
            self.metrics.loop_lag_max.set(max(prev_max, cur_max))
