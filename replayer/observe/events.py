"""What happened when in a run: start, warm-up end, each new loop, pause, resume, speed-up change,
a target restart seen in its counters, stop.

``RunEvents.record`` keeps each event with its wall time (``time_s``, Unix seconds) and its time
in the run (``t_s``, seconds after the run's anchor once known) for ``summary.json``'s
``events``, and exports two series per event kind (a closed set, ``EVENTS``):
``replayer_run_events_total{event}`` (every kind from the start, at 0) and
``replayer_run_event_timestamp_seconds{event}`` (the Unix time of its last occurrence, once it
happened). The dashboard's annotations read the timestamps (Grafana's "use value as timestamp"),
so each event is drawn at its own time, not at the next scrape's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from replayer.core.result import RequestResult

log = logging.getLogger(__name__)

#: the kinds of event, in the order a run meets them
EVENTS = ("start", "warmup_end", "loop", "pause", "resume", "speedup", "target_restart", "stop")


class RunEvents(Collector):
    """The run's events (module docstring); ``record`` may be called from any thread."""

    def __init__(self, registry: CollectorRegistry | None, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self._counts = dict.fromkeys(EVENTS, 0)
        self._last: dict[str, float] = {}
        self.anchor_wall_s: float | None = None  # the run's anchor (Unix s), for t_s
        if registry is not None:
            registry.register(self)

    def record(self, event: str, **detail: Any) -> dict[str, Any]:
        """Event ``event`` (one of ``EVENTS``) happened now; ``detail`` goes into its record."""
        if event not in self._counts:
            raise ValueError(f"unknown run event {event!r} (one of {', '.join(EVENTS)})")
        now = self._clock()
        rec: dict[str, Any] = {"event": event, "time_s": round(now, 6)}
        if self.anchor_wall_s is not None:
            rec["t_s"] = round(now - self.anchor_wall_s, 3)
        rec.update(detail)
        with self._lock:
            self.records.append(rec)
            self._counts[event] += 1
            self._last[event] = now
        return rec

    def as_list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self.records]

    def collect(self):
        with self._lock:
            counts, last = dict(self._counts), dict(self._last)
        total = CounterMetricFamily(
            "replayer_run_events",
            "Events of the run (start, warm-up end, loop, pause, ...), by kind.",
            labels=["event"],
        )
        for event in EVENTS:
            total.add_metric([event], counts[event])
        yield total
        stamp = GaugeMetricFamily(
            "replayer_run_event_timestamp_seconds",
            "Unix time of the last event of each kind (the dashboard's annotations).",
            labels=["event"],
        )
        for event in EVENTS:
            if event in last:
                stamp.add_metric([event], last[event])
        yield stamp

    def describe(self):
        return []

    # -- sources ------------------------------------------------------------------------------
    def after_warmup(self, then: Callable[[RequestResult], None]) -> Callable[[RequestResult], None]:
        """The client's ``on_dispatched`` hook ``then`` (behind the warm-up marker) with the
        warm-up's end recorded at the first request sent that is not warm-up."""
        seen = False

        def on_dispatched(res: RequestResult) -> None:
            nonlocal seen
            if not seen and not res.warmup:
                seen = True
                self.record("warmup_end")
            then(res)

        return on_dispatched

    def control(self, control: Any) -> EventedControl | None:
        """``control`` (the run's ``RunControl``, None before the replay runs) with its changes recorded."""
        return None if control is None else EventedControl(control, self, lambda: control.d.timeline.paused)

    def on_target_restart(self, url: str) -> None:
        """A target's counters went back between two scrapes (``TargetScraper.on_restart``)."""
        self.record("target_restart", target=url)


class EventedControl:
    """The admin server's ``Controller`` over ``control`` (the run's ``RunControl``), recording
    each pause, resume and speed-up change that changes something."""

    def __init__(self, control: Any, events: RunEvents, paused: Callable[[], bool]) -> None:
        self._c, self._events, self._paused = control, events, paused

    def pause(self) -> None:
        was = self._paused()
        self._c.pause()
        if not was:
            self._events.record("pause")

    def resume(self) -> None:
        was = self._paused()
        self._c.resume()
        if was:
            self._events.record("resume")

    def set_speedup(self, speedup: float) -> None:
        self._c.set_speedup(speedup)
        self._events.record("speedup", speedup=speedup)

    def stop(self) -> None:
        self._c.stop()
