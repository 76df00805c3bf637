"""The stall line: while requests are in flight and none ends, a log line every
``--stall-log-interval`` s naming how many wait and the oldest one's age, so that a hanging
target is not silent until the read timeout (600 s by default) fails its requests. Logged with
``--quiet`` too (which quiets the live view and progress lines, not the log); its record carries
``ALWAYS``, for a filter that would keep only the lines a quiet run must still show.

``StallCheck`` is the pure rule (tested without a loop); ``watch_stalls`` runs it on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("replayer")

__all__ = ["ALWAYS", "StallCheck", "watch_stalls"]

#: the record attribute marking a line a quiet run must still show
ALWAYS = "always_shown"


class StallCheck:
    """Whether ``interval_s`` has passed with requests in flight and none ending; the line to log."""

    def __init__(self, interval_s: float, read_timeout_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.read_timeout_s = read_timeout_s
        self._ended = -1
        self._since_s: float | None = None  # when the current stretch without an end began
        self._said_s: float | None = None

    def check(self, now_s: float, in_flight: int, ended: int, oldest_age_s: float | None) -> str | None:
        """The stall line due now (None: something ended since, nothing in flight, or not yet due)."""
        if ended != self._ended or in_flight == 0:
            self._ended, self._since_s, self._said_s = ended, now_s, None
            return None
        assert self._since_s is not None
        quiet_s = now_s - self._since_s
        if quiet_s < self.interval_s or (self._said_s is not None and now_s - self._said_s < self.interval_s):
            return None
        self._said_s = now_s
        oldest = f"; the oldest was due {oldest_age_s:.0f} s ago" if oldest_age_s is not None else ""
        timeout = (
            f" (--read-timeout {self.read_timeout_s:g} s fails a request silent that long)"
            if self.read_timeout_s
            else " (no --read-timeout)"
        )
        return f"no request has ended for {quiet_s:.0f} s: {in_flight} in flight{oldest}{timeout}"


async def watch_stalls(
    interval_s: float,
    in_flight: Callable[[], int],
    ended: Callable[[], int],
    oldest_age_s: Callable[[], float | None],
    read_timeout_s: float | None = None,
) -> None:
    """Log ``StallCheck``'s line whenever it is due (a task: cancel it to stop)."""
    check = StallCheck(interval_s, read_timeout_s)
    tick = min(1.0, interval_s / 4)
    while True:
        n = in_flight()
        line = check.check(time.monotonic(), n, ended(), oldest_age_s() if n else None)
        if line:
            log.warning(line, extra={ALWAYS: True})
        await asyncio.sleep(tick)
