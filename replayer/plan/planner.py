"""The open loop's decisions, without a clock or an event loop: which prepared requests fire
now, which go to a sender that writes ahead of the due time, how far ahead to prepare, and when
to wake up next.

``Planner`` holds the prepared queue (requests in due order with their trace times), the
requests a session turn's predecessor released for later (a heap by release time), the session
gate and the ``Timeline``. Every method takes the current time (``now_ns``: ns after the run's
anchor) as an argument and does no I/O, so the dispatcher's whole policy is tested with tables
in virtual time (tests/test_planner.py). The dispatcher (``replayer.send.dispatcher``) reads the
clock, sleeps until ``wake``, starts the sends the planner hands out and feeds it what it
prepared and what ended.

Due times are computed from the trace time when a request fires (``Fire.due_ns``): the
timeline may have changed since the request was prepared (pause, resume, speed-up). A session
turn held back by its predecessor keeps that due time; its release time is recorded on the
request (``PreparedRequest.release_ns``), and its dispatch lag counts from it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from replayer.core.clock import SPIN_NS
from replayer.core.request import PreparedRequest
from replayer.plan.schedule import Timeline
from replayer.plan.sessions import SessionGate

#: after a hand-over found no way to write ahead (no idle connection), try again this much
#: later (until the due time)
RETRY_HAND_OVER_NS = 2_000_000
#: a wake time that never comes: only a change (timeline, stop, a released turn) wakes the loop
NEVER = 2**62


class Fire(NamedTuple):
    """A request to send now: ``due_ns`` is the timeline's due time at this moment."""

    req: PreparedRequest
    due_ns: int


@dataclass(frozen=True, slots=True)
class Wake:
    """When the dispatcher should next act: ``at_ns`` (ns after the anchor); ``precise``: a due
    time, kept to the microsecond (else a hand-over or its retry, which only has to happen before
    the due time: no spinning for it)."""

    at_ns: int
    precise: bool = True


#: ``Planner.next_item``'s answers for the next schedule item not yet prepared
PREPARE, LATER, END = "prepare", "later", "end"


class Planner:
    """The dispatcher's policy over the prepared queue.

    ``lead_ns``: bodies are prepared up to this far ahead of their due time. ``duration_ns``:
    no request due at or after this offset is prepared (None: no limit). ``rebase_first``: the
    first request is due at the timeline's ``wall0_ns`` whatever its trace time (a resumed run).
    ``ahead_ns``: a request outside sessions is handed to the sender this long before its due
    time (0: every request is sent at its due time). ``connect_ahead_ns``: count the requests due
    within this horizon for the sender to open connections ahead (None: no counting).
    """

    def __init__(
        self,
        timeline: Timeline,
        *,
        gate: SessionGate | None = None,
        lead_ns: int = 500_000_000,
        duration_ns: int | None = None,
        rebase_first: bool = False,
        ahead_ns: int = 0,
        connect_ahead_ns: int | None = None,
    ) -> None:
        self.timeline = timeline
        self.gate = gate
        self.lead_ns = lead_ns
        self.duration_ns = duration_ns
        self._rebase = rebase_first
        self.ahead_ns = ahead_ns
        self.connect_ahead_ns = connect_ahead_ns
        self._next_count_ns = -NEVER
        self.pending: deque[tuple[PreparedRequest, int]] = deque()  # (request, trace_ns), in due order
        self._delayed: list[tuple[int, int, PreparedRequest]] = []  # heap of (release_ns, seq, request)
        self._seq = 0
        # the head that could not be handed over: tried again from _retry_ns until its due time
        self._not_taken: PreparedRequest | None = None
        self._retry_ns = 0
        self.exhausted = False  # the schedule has no more item to prepare (its end, or duration_ns)
        self.prepared_late = 0  # requests whose body was built after their due time (preparation behind)
        self.fired_late = 0  # requests meant to be handed over ahead that fired at their due time

    # -- what fires now ---------------------------------------------------------------------
    def due(self, now_ns: int) -> list[Fire]:
        """Requests to send now: the prepared ones due by ``now_ns`` (those the session gate
        lets go at once) and the released turns whose release time has come (not while paused).
        A turn that must wait is kept by the gate (``ended`` releases it) or by the planner
        until its release time."""
        out: list[Fire] = []
        tl, pending = self.timeline, self.pending
        while pending and tl.due(pending[0][1]) <= now_ns:
            self._admit(pending.popleft()[0], now_ns, out)
        delayed = self._delayed
        if not tl.paused:
            while delayed and delayed[0][0] <= now_ns:
                req = heapq.heappop(delayed)[2]
                out.append(Fire(req, tl.due(req.trace_ns)))
        return out

    def _admit(self, req: PreparedRequest, now_ns: int, out: list[Fire]) -> None:
        due = self.timeline.due(req.trace_ns)
        gate = self.gate
        if gate is None or req.dep is None and req.key is None:
            self.fired_late += self.ahead(req)
            out.append(Fire(req, due))
            return
        release = gate.admit(req, due)
        if release is None:  # waits for its predecessor (ended() releases it)
            return
        gate.started(req)
        self._release_at(req, due, release, now_ns, out)

    def _release_at(self, req: PreparedRequest, due: int, release: int, now_ns: int, out: list[Fire]) -> None:
        if release > due:
            req.release_ns = release
        if release <= now_ns:
            out.append(Fire(req, due))
        else:
            self._seq += 1
            heapq.heappush(self._delayed, (release, self._seq, req))

    def ended(self, req: PreparedRequest, now_ns: int, stopping: bool = False) -> list[Fire]:
        """``req`` (a session turn or parent: ``key`` set) ended at ``now_ns``: the turns it
        releases whose release time has come fire now (returned); later ones wait in the
        planner. While ``stopping`` nothing fires: the released turns are kept (and recorded
        as not started)."""
        if req.key is None or self.gate is None:
            return []
        out: list[Fire] = []
        tl = self.timeline
        for nxt, release in self.gate.finished(req, now_ns):
            due = tl.due(nxt.trace_ns)  # type: ignore[attr-defined]
            if stopping:
                self._seq += 1
                heapq.heappush(self._delayed, (max(due, release), self._seq, nxt))  # type: ignore[misc]
            else:
                self._release_at(nxt, due, max(due, release), now_ns, out)  # type: ignore[arg-type]
        return out

    def failed(self, req: PreparedRequest) -> None:
        """``req`` failed: the turns that depend on it are not sent (``SessionGate.failed``)."""
        if self.gate is not None:
            self.gate.failed(req)

    def broken(self, req: PreparedRequest) -> bool:
        """Whether ``req`` depends on a failed request (``SessionGate.broken``)."""
        return self.gate is not None and self.gate.broken(req)

    # -- hand-over ahead of the due time ------------------------------------------------------
    def ahead(self, req: PreparedRequest) -> bool:
        """Whether ``req`` is handed to the sender ahead of its due time: a sender writes ahead,
        and it is outside sessions (a turn waits for the gate at its due time)."""
        return self.ahead_ns > 0 and req.dep is None and req.key is None

    def hand_over(self, now_ns: int) -> Fire | None:
        """The head of the queue when it is to be handed over now (within ``ahead_ns`` of its
        due time, and not waiting to retry a hand-over), else None. The caller then calls
        ``taken`` or ``not_taken``."""
        pending, tl = self.pending, self.timeline
        if not pending or tl.paused:
            return None
        req, trace_ns = pending[0]
        if not self.ahead(req) or req is self._not_taken and now_ns < self._retry_ns:
            return None
        due = tl.due(trace_ns)
        return Fire(req, due) if due - now_ns <= self.ahead_ns else None

    def taken(self) -> None:
        """The head was handed over."""
        self.pending.popleft()

    def not_taken(self, now_ns: int, again: bool = True) -> None:
        """The sender could not take the head now: try again ``RETRY_HAND_OVER_NS`` later
        (``again``; else never: the sender will not take it), and at its due time it fires as
        any request."""
        self._not_taken = self.pending[0][0]
        self._retry_ns = now_ns + RETRY_HAND_OVER_NS if again else NEVER

    def _critical(self, item: tuple[PreparedRequest, int]) -> int:
        """When the planner must act on ``item``: its hand-over time (or the next try of a
        hand-over that failed), or its due time."""
        req, due = item[0], self.timeline.due(item[1])
        if not self.ahead(req):
            return due
        if req is self._not_taken:
            return min(due, self._retry_ns)
        return due - self.ahead_ns

    # -- preparation ---------------------------------------------------------------------------
    def must_act(self, now_ns: int) -> bool:
        """Whether preparation must stop for the head of the queue now: its due time is within
        ``SPIN_NS``, or for a hand-over, its hand-over time (or the next try of one) has come.
        Preparation runs ahead through the lead window between hand-overs even when one is due
        every millisecond; stopping ``SPIN_NS`` before each hand-over time and sleeping until it
        kept the prepared queue ~50 ms deep at such rates, and a stall of the loop then made
        requests late."""
        if not self.pending:
            return False
        head = self.pending[0]
        if not self.ahead(head[0]):
            return self.timeline.due(head[1]) - now_ns <= SPIN_NS
        return self._critical(head) <= now_ns

    def head_overdue(self, now_ns: int) -> bool:
        """Whether the head of the queue is due already (behind schedule)."""
        return bool(self.pending) and self.timeline.due(self.pending[0][1]) <= now_ns

    def next_item(self, trace_ns: int, now_ns: int, catching_up: bool = False) -> str:
        """What to do with the next schedule item (trace time ``trace_ns``): ``PREPARE`` it now,
        prepare it ``LATER`` (beyond the lead window; behind schedule, ``catching_up``: not due
        yet), or ``END`` (due at or after ``duration_ns``: the schedule ends here)."""
        tl = self.timeline
        if self._rebase:
            tl.trace0_ns, self._rebase = trace_ns, False
        due = tl.due(trace_ns)
        if self.duration_ns is not None and due >= self.duration_ns and not tl.paused:
            self.exhausted = True
            return END
        if due > now_ns + (0 if catching_up else self.lead_ns):
            return LATER
        return PREPARE

    def add(self, req: PreparedRequest, trace_ns: int, now_ns: int) -> None:
        """A request prepared at ``now_ns`` joins the queue."""
        self.pending.append((req, trace_ns))
        self.prepared_late += self.timeline.due(trace_ns) <= now_ns

    # -- connections ahead ---------------------------------------------------------------------
    def demand(self, now_ns: int, cap: int = 256) -> int | None:
        """How many prepared requests are due within ``connect_ahead_ns`` (at most ``cap``), when
        it is time to count them again (at most every millisecond); else None."""
        if self.connect_ahead_ns is None or not self.pending or now_ns < self._next_count_ns:
            return None
        self._next_count_ns = now_ns + 1_000_000
        horizon = now_ns + self.connect_ahead_ns
        due = self.timeline.due
        n = 0
        for _, trace_ns in self.pending:
            if n >= cap or due(trace_ns) > horizon:
                break
            n += 1
        return n

    # -- waiting ---------------------------------------------------------------------------------
    def wake(self, now_ns: int, next_trace_ns: int | None) -> Wake | None:
        """When to act next, given the trace time of the next item not prepared yet (None when
        none is known now). None: act again at once (the next batch is to be read); a ``Wake``
        at ``NEVER``: only a change can bring work (turns waiting for their predecessors)."""
        tl = self.timeline
        if self.pending:
            head_due = tl.due(self.pending[0][1])
            at = self._critical(self.pending[0])
            wake = Wake(at, at == head_due)
            if self.connect_ahead_ns is not None:  # wake up to count a request entering the horizon
                counted = head_due - self.connect_ahead_ns
                if now_ns < counted < at:
                    wake = Wake(counted, wake.precise)
        elif not self.exhausted and next_trace_ns is not None:
            wake = Wake(tl.due(next_trace_ns) - self.lead_ns)
        elif self.exhausted:
            wake = Wake(NEVER)
        else:
            return None
        if self._delayed and not tl.paused and self._delayed[0][0] < wake.at_ns:
            wake = Wake(self._delayed[0][0])
        return wake

    @property
    def finished(self) -> bool:
        """The whole schedule was prepared and fired: nothing pending, delayed or waiting."""
        return (
            self.exhausted
            and not self.pending
            and not self._delayed
            and not (self.gate is not None and self.gate.waiting)
        )

    # -- accounting ------------------------------------------------------------------------------
    def overdue(self, now_ns: int) -> int:
        """Prepared requests whose due time has passed (they fire at the next turn). Safe to call
        from another thread (it iterates a copy)."""
        due = self.timeline.due
        return sum(1 for _, t in list(self.pending) if due(t) <= now_ns)

    def take_held(self) -> list[PreparedRequest]:
        """Remove and return every request prepared and not fired (at shutdown: not started)."""
        held = [r for r, _ in self.pending] + [r for _, _, r in sorted(self._delayed, key=lambda d: d[:2])]
        if self.gate is not None:
            held += self.gate.take_waiting()
        self.pending.clear()
        self._delayed.clear()
        return held
