"""Writes due requests at their due time from a thread of their own.

Why: the event loop handles the response streams. Under load a server's token tick makes ~100
connections readable at once, and the loop spends a few milliseconds on that burst; a request due
during it would wait for the burst to end (dispatch error p99 ~4 ms on issue 7's workload). Here
the dispatcher hands each request over ``launch_ahead_ns`` (50 ms) before its due time, already
bound to an idle keep-alive connection with its bytes built (``Client.reserve``; connections for
the requests due soon are opened ahead, ``Client.expect``); this thread sleeps to the due time (a
timed condition wait to ``spin_ns`` before it, then a short spin) and writes the request with
non-blocking writes on the connection's socket (``Client.write_reserved``): first the head of
every request due by then, then their bodies, so a burst due at one instant starts together as
independent clients would (a 12k-token body takes ~50 us to write on loopback). uvloop runs the
loop with the GIL released and takes it per callback, and the interpreter's switch interval is
lowered (``switch_interval_s``) so this thread gets the GIL within a fraction of a millisecond.
The thread runs at real-time priority where the OS permits (``_raise_priority``). The loop
thread still reads and measures every response; only the write moves.

Measured on issue 7's workload (bench/fidelity W1, 2 cores shared with the server): dispatch
error p50 0.09-0.26 ms, p99 0.76-2.3 ms (the higher values on runs where the server's own pacing
p99 was near 2 ms), max 1-3.6 ms; p99 2.5-4.2 ms, max 4-16 ms without (``--no-launcher``). The
stress slice at 160x (470 requests/s): p99 1.0-2.7 ms.

Plain HTTP only (TLS bytes must go through the transport's SSL object): ``Client.reserve``
returns None for ``https`` targets, and for any request without an idle connection; those are
written by the loop as before.
"""

from __future__ import annotations

import heapq
import logging
import os
import sys
import threading
from collections.abc import Callable

from .clock import now_ns

log = logging.getLogger(__name__)

#: a launch: called at its due time, it may return a follow-up to call after the burst's launches
Launch = Callable[[], "Callable[[], None] | None"]


class Launcher:
    """One daemon thread that calls ``fn()`` at absolute times on ``clock.now_ns``.

    ``submit(at_ns, fn)`` from any thread; calls happen in time order, never before ``at_ns``.
    ``fn`` may return a follow-up callable: it runs once every item due by then has been called
    (so the writes of a burst due at one instant all start before any finishes; see
    ``Client.write_reserved``).
    ``stop()`` ends the thread; items not yet called are dropped (the dispatcher hands over only
    requests due within 50 ms and drains them before the daemon stops this).
    ``launched`` counts calls; ``lateness_ns`` is the last call's lateness. ``priority``:
    ``fifo`` (real-time where permitted, else nice -10), ``nice`` or ``default``; the one obtained
    is in ``self.priority`` once the thread runs."""

    def __init__(self, *, spin_ns: int = 150_000, switch_interval_s: float = 0.0002,
                 priority: str = "fifo") -> None:
        self._policy = priority
        self.priority = "default"
        self._heap: list[tuple[int, int, Launch]] = []
        self._seq = 0
        self._cv = threading.Condition()
        self._stopped = False
        self._spin_ns = spin_ns
        self._switch = switch_interval_s
        self._old_switch = sys.getswitchinterval()
        self._thread = threading.Thread(target=self._run, name="replayer-launcher", daemon=True)
        self.launched = 0
        self.lateness_ns = 0

    def start(self) -> None:
        sys.setswitchinterval(self._switch)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread.ident is not None:  # started
            self._thread.join(5)
            sys.setswitchinterval(self._old_switch)

    def submit(self, at_ns: int, fn: Launch) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (at_ns, self._seq, fn))
            if self._heap[0][1] == self._seq:
                self._cv.notify()

    def _raise_priority(self) -> None:
        """Where the OS permits it (root or CAP_SYS_NICE), run this thread at a higher priority
        than the loop thread, so the scheduler wakes it on time on a busy machine: real-time
        SCHED_FIFO priority 1 (it sleeps between writes and spins at most ``spin_ns``), else
        nice -10, else unchanged (``priority`` says which)."""
        tid = threading.get_native_id()
        order = {"fifo": ("fifo", "nice"), "nice": ("nice",)}.get(self._policy, ())
        for policy in order:
            try:
                if policy == "fifo":  # real-time: preempts ordinary threads at once on wake-up
                    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
                else:
                    os.setpriority(os.PRIO_PROCESS, tid, -10)
            except (AttributeError, OSError):
                continue
            self.priority = policy
            return

    def pending(self) -> int:
        return len(self._heap)

    def next_at(self) -> int | None:
        """The time (``now_ns`` clock) of the next call, or None when none is waiting."""
        heap = self._heap
        return heap[0][0] if heap else None

    def _run(self) -> None:
        self._raise_priority()
        heap, cv, spin = self._heap, self._cv, self._spin_ns
        while True:
            with cv:
                while not self._stopped and not heap:
                    cv.wait()
                if self._stopped:
                    return
                at = heap[0][0]
                left = at - now_ns()
                if left > spin:
                    cv.wait((left - spin) / 1e9)  # woken early by a sooner item or stop
                    continue
                _, _, fn = heapq.heappop(heap)
            while now_ns() < at:  # the last ~0.15 ms: spin (time.sleep overshoots by ~60 us)
                pass
            self.lateness_ns = now_ns() - at
            rest: list[Callable[[], None]] = []
            while True:
                follow = _call(fn)
                self.launched += 1
                if follow is not None:
                    rest.append(follow)
                # every item due by now starts before any rest goes: a burst's heads go first
                with cv:
                    if not heap or heap[0][0] > now_ns() or self._stopped:
                        break
                    fn = heapq.heappop(heap)[2]
            for follow in rest:
                _call(follow)


def _call(fn: Callable[[], object]) -> object:
    """``fn()``, or None when it raised (logged: a bug must not kill the thread; the launches
    record their own failures)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        log.exception("launcher: write failed")
        return None
