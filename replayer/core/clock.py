"""The one monotonic clock, and waiting for absolute deadlines on it.

All measurement uses ``now_ns`` (``time.perf_counter_ns``: monotonic, ns resolution). The event
loop's own ``loop.time()`` has 1 ms resolution on uvloop, so it is never used to measure, and a
plain ``asyncio.sleep`` can wake up to ~1 ms late: ``sleep_until`` sleeps coarsely to just before
the deadline and then yields to the loop until the clock reaches it (wrk2 and vegeta keep
absolute deadlines the same way). The wall clock appears only as metadata (``Anchor.wall_s``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

now_ns = time.perf_counter_ns

#: below this much time left, stop sleeping on the loop's timer and yield until the deadline
SPIN_NS = 1_500_000
#: a --start-at further in the past than this is not kept (``Anchor.at``)
MAX_LATE_S = 1.0


@dataclass(frozen=True, slots=True)
class Anchor:
    """The run's time origin: ``t0_ns`` on ``now_ns``'s clock and the wall-clock time (Unix s) it
    corresponds to. Every due time is an offset from ``t0_ns``."""

    t0_ns: int
    wall_s: float
    late_s: float = 0.0  # how long ago the requested start time had passed (then not kept)

    @classmethod
    def at(cls, delay_s: float = 0.0, start_wall_s: float | None = None, max_late_s: float = MAX_LATE_S) -> "Anchor":
        """An anchor ``delay_s`` from now, or at wall-clock time ``start_wall_s`` when given
        (aligns processes on different machines). A start time up to ``max_late_s`` past is
        kept (the requests already due go at once, their lag recorded); one further past is not:
        the anchor is ``delay_s`` from now and ``late_s`` says by how much the start was missed
        (a shard that starts late replays from its own start, out of step with the others,
        rather than sending everything overdue in one burst)."""
        mono, wall = now_ns(), time.time()
        late_s = 0.0
        if start_wall_s is not None:
            if wall - start_wall_s > max_late_s:
                late_s = wall - start_wall_s
            else:
                delay_s = start_wall_s - wall
        d_ns = int(delay_s * 1e9)
        return cls(t0_ns=mono + d_ns, wall_s=wall + d_ns / 1e9, late_s=late_s)


async def sleep_until(deadline_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Return as soon as ``now_ns() >= deadline_ns`` (an absolute time on ``now_ns``'s clock).

    Sleeps on the loop's timer until ``spin_ns`` before the deadline, then yields with
    ``asyncio.sleep(0)`` (other tasks keep running) until the deadline has passed. Returns
    at once for a deadline in the past. Cancellation propagates.
    """
    while True:
        left = deadline_ns - now_ns()
        if left <= 0:
            return
        if left > spin_ns:
            await asyncio.sleep((left - spin_ns) / 1e9)
        else:
            await asyncio.sleep(0)


class Clock:
    """The clock the dispatcher reads and sleeps on: ``now_ns`` (ns on the one monotonic
    clock), ``sleep_until`` an absolute deadline (kept to the microsecond) and a coarse
    ``sleep``. Injected, so a test can run the open loop in virtual time."""

    def now_ns(self) -> int:
        return now_ns()

    async def sleep_until(self, deadline_ns: int) -> None:
        await sleep_until(deadline_ns)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


#: the real clock
MONOTONIC = Clock()
