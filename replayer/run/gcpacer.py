"""Cyclic garbage collection at moments of the dispatcher's choosing.

CPython's automatic collector runs whenever allocations cross a threshold, so a 2-15 ms collection
can land just as a burst of requests is due. ``GcPacer`` disables the automatic collector for the
replay and collects the young generations when the dispatcher has slack before its next due
request (``idle``), and in any case at least every ``max_interval_s`` (so cyclic garbage stays
bounded on a trace with no slack). Objects that live for the whole run are frozen first
(``gc.freeze``): full collections then never scan them.
"""

from __future__ import annotations

import gc
import time


class GcPacer:
    """``start()`` freezes and disables; ``idle(slack_ns)`` may collect; ``stop()`` restores."""

    def __init__(
        self,
        *,
        min_slack_ns: int = 20_000_000,
        interval_s: float = 1.0,
        max_interval_s: float = 5.0,
        full_every: int = 30,
    ) -> None:
        self.min_slack_ns = min_slack_ns
        self.interval_s = interval_s
        self.max_interval_s = max_interval_s
        self.full_every = full_every
        self._last = time.monotonic()
        self._since_full = 0  # collections since the last full one
        self._was_enabled = gc.isenabled()
        self.collections = 0
        self.spent_ns = 0  # time spent in the collections made here
        self._cost_ns = {1: 1_000_000, 2: 20_000_000}  # last duration per generation (first guesses)

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        gc.disable()
        self._last = time.monotonic()

    def idle(self, slack_ns: int) -> None:
        """Called when nothing is due for ``slack_ns``; collects if it is time to.

        A collection runs only when the slack is at least twice what the last one of that
        generation took (a full collection of a large heap takes tens of milliseconds); when
        ``max_interval_s`` has passed without such slack, the young generations are collected
        anyway (cheap) and the full one waits for room, but at most ``full_every`` more
        collections: under steady load with no slack it is then forced."""
        since = time.monotonic() - self._last
        if since < self.interval_s:
            return
        gen = 2 if self._since_full >= self.full_every - 1 else 1
        if slack_ns < max(self.min_slack_ns, 2 * self._cost_ns[gen]):
            if since < self.max_interval_s:
                return
            if self._since_full < 2 * self.full_every:  # a full one may wait for room a while,
                gen = 1  # not for ever (cyclic garbage grows)
        t = time.perf_counter_ns()
        gc.collect(gen)
        self._cost_ns[gen] = took = time.perf_counter_ns() - t
        self.spent_ns += took
        self._since_full = 0 if gen == 2 else self._since_full + 1
        self.collections += 1
        self._last = time.monotonic()

    def stop(self) -> None:
        if self._was_enabled:
            gc.enable()
