"""Read in batches while many streams are relayed: the proxy's event loop sleeps a fixed short
interval between its turns instead of waking for every streamed event.

Why: relaying one SSE event costs the proxy a read and a write, and on a virtual machine most of
that cost is the kernel waking processes: the upstream's write wakes the proxy, the proxy's write
wakes the client (a cross-CPU interrupt each time: ~20-40 us per write measured on the 2-core
host, against ~2 us for a write to a process that is already running). At ~12,000 events/s (W1:
~120 streams of one token per 10 ms) woken one by one, that is most of a core across the three
processes. Sleeping ``interval_s`` between turns (while at least ``POLL_MIN_IN_FLIGHT`` requests
are in flight) lets the events of that interval gather in the sockets: no process waits on them,
so the writes that put them there wake nobody, and one turn reads them all and writes them out
together (the client is woken once per batch). The price is latency: an event waits at most one
interval (plus the timer's lateness) before it is forwarded. The wait is a ``select`` on the
sockets requests arrive on (``wake_fds``: the listening socket and the clients'), so a new
request ends it at once: only the streamed events wait. With fewer requests in flight the loop
blocks and wakes on each event as usual.

Arrival stamps do not depend on it (the kernel stamps requests as they arrive: ``downstream``).
Off by default (``replayer record --poll-interval``): on the saturated shared 2-core host where it
was measured (W1, ``bench/bench_capture.py``), neither its CPU per request nor the latency it adds
differed clearly from waking per event (README, *The capture proxy's cost*).
"""

from __future__ import annotations

import asyncio
import ctypes
import select
import time
from collections.abc import Callable

#: poll only while at least this many requests are in flight (fewer: wake per event as usual)
POLL_MIN_IN_FLIGHT = 8
_PR_SET_TIMERSLACK = 29


def _tight_timer_slack(ns: int = 1000) -> None:
    """Let ``time.sleep`` wake within ~1 us of its deadline (Linux's default slack is 50 us)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Poller:
    """``kick()`` when the loop may have become busy; while ``busy()`` the loop waits
    ``interval_s`` (or until one of ``wake_fds`` is readable) after each of its turns (a callback
    that re-queues itself)."""

    def __init__(self, interval_s: float, busy: Callable[[], bool], wake_fds: set[int] | None = None) -> None:
        self.interval_s = interval_s
        self.busy = busy
        self.wake_fds = wake_fds if wake_fds is not None else set()
        self.running = False
        self.turns = 0
        self._slack_set = False

    def kick(self) -> None:
        if self.running or not self.busy():
            return
        if not self._slack_set:
            _tight_timer_slack()
            self._slack_set = True
        self.running = True
        asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        if not self.busy():
            self.running = False
            return
        self.turns += 1
        try:
            select.select(self.wake_fds, (), (), self.interval_s)
        except (ValueError, OSError):  # (a descriptor past select's limit of 1024)
            time.sleep(self.interval_s)
        asyncio.get_running_loop().call_soon(self._turn)
