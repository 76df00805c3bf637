"""The open loop: send every scheduled request at its due time, whether or not earlier ones
finished; account for every one of them.

The decisions (what fires, what is handed over ahead, how far to prepare, when to wake) are the
pure ``replayer.plan.planner.Planner``'s; this is its shell: it sleeps on an injected clock
(``replayer.core.clock.Clock``), prepares requests as the planner asks, and starts each send
(``replayer.send.sender.Sender``) as a task of one ``asyncio.TaskGroup`` (a send that crashes
stops the run loudly). Deadlines are absolute offsets from the anchor ``t0_ns``, recomputed at
every wait (relative sleeps drift: vLLM issue 21104); batches are read ahead in a thread, bodies
prepared in a lead window; a late request goes out at once and its lag is recorded. No cap by
default; ``max_concurrency`` caps the requests in flight (``replayer.send.slots``: then the capped
``_fire`` and done callback replace the plain ones). ``stop()`` stops issuing; in-flight requests
get ``drain_timeout_s``, then are cancelled; what the stop leaves unsent is ``not_started``
(``replayer.send.unsent``): ``sent + not_started`` = everything scheduled so far.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from replayer.core.background import first_of
from replayer.core.clock import MONOTONIC, SPIN_NS, Clock
from replayer.core.errors import ErrorKind, Outcome
from replayer.core.events import RequestEvents
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.plan.planner import PREPARE, Fire, Planner
from replayer.plan.schedule import ScheduleBatch, Timeline
from replayer.send.feed import BatchFeeder, Feed, Position
from replayer.send.sender import LOOP_WRITES, SendCancelled, Sender, Sending
from replayer.send.slots import Slots
from replayer.send.unsent import never_sent

log = logging.getLogger(__name__)

#: longest stretch of preparation between two yields to the loop (and, behind schedule, the
#: longest the overdue requests prepared in one go wait for the first of them to fire)
CATCH_UP_NS = 2_000_000


class Dispatcher:
    """Runs a schedule (``feed``) as ``planner`` decides, sending through ``sender``.

    ``events``: the run's event stream (``replayer.core.events``): ``sent`` as each send starts,
    ``finished`` with every result exactly once (a sent request's, and each never sent).
    ``t0_ns``: the run's anchor on ``clock``. ``on_idle(slack_ns)``: called before a wait (GC pacing).
    ``drain_timeout_s``: how long in-flight requests may take after ``stop``. ``shard``: written
    in the results of requests never sent. ``max_concurrency``: the most requests in flight at
    once (None: no cap, the open loop; see the module docstring). ``missed_before_ns``: a fleet shard that rejoins its
    fleet's schedule late: the rows due before this offset are recorded ``missed_while_down``, not
    sent (never a burst of what was due while it was down); the rest go at their due times.
    """

    def __init__(
        self,
        feed: Feed,
        planner: Planner,
        sender: Sender,
        events: RequestEvents,
        *,
        t0_ns: int,
        clock: Clock = MONOTONIC,
        on_idle: Callable[[int], None] | None = None,
        drain_timeout_s: float = 30.0,
        shard: int = 0,
        max_concurrency: int | None = None,
        until_stop: bool = False,
        missed_before_ns: int | None = None,
    ) -> None:
        self._feeder = BatchFeeder(feed.batches)
        self._prepare = feed.requests.prepare
        self._unsent = feed.requests.unsent
        self._plan = planner
        self._sender = sender
        self._events = events  # (its hooks are read at each call: the run attaches them once built)
        self.t0_ns = t0_ns
        self._clock = clock
        self._on_idle = on_idle
        self.drain_timeout_s = drain_timeout_s
        self.shard = shard
        self.until_stop = until_stop  # a schedule with no end: what is scheduled ends at the stop
        self._stopped_at_ns: int | None = None  # when ``stop`` was first called (since the anchor)
        self._missed_before_ns = missed_before_ns
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()  # timeline changed (pause/resume/speed-up), a turn released, or stop
        self._idle = asyncio.Event()
        self._idle.set()
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: dict[asyncio.Task[None], tuple[PreparedRequest, int, Sending]] = {}
        self._cur: ScheduleBatch | None = None
        self._j = 0
        self.position = Position()
        self.sent = 0
        self.not_started = 0
        self.missed_while_down = 0
        self.cancelled = 0
        self.finished = False  # the whole schedule was issued
        self.max_concurrency = max_concurrency
        self._slots = Slots(max_concurrency) if max_concurrency is not None else None
        self._ending = 0  # a request in flight whose response ended is releasing its session's turns
        self._on_done: Callable[[asyncio.Task[None]], None] = self._task_done
        if max_concurrency is not None:
            if planner.ahead_ns:
                raise ValueError("a capped dispatcher sends at the due time: the planner must not hand over ahead")
            self._fire = self._fire_capped  # type: ignore[method-assign]
            self._on_done = self._task_done_capped

    # -- control ------------------------------------------------------------------------------
    @property
    def timeline(self) -> Timeline:
        return self._plan.timeline

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def oldest_in_flight_s(self) -> float | None:
        """How long ago the oldest request in flight was due, in seconds (None: none in flight)."""
        for _, due_ns, _ in self._tasks.values():  # (insertion order: the first is the oldest)
            return max(0, self.now_rel() - due_ns) / 1e9
        return None

    @property
    def queued(self) -> int:
        """Requests due and waiting for a slot now (``--max-concurrency``; 0 without a cap)."""
        return len(self._slots) if self._slots is not None else 0

    @property
    def queued_total(self) -> int:
        """Requests that waited for a slot (``--max-concurrency``)."""
        return self._slots.queued_total if self._slots is not None else 0

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def prepared_late(self) -> int:
        """Requests whose body was built after their due time (preparation behind)."""
        return self._plan.prepared_late

    @property
    def fired_by_loop(self) -> int:
        """Requests meant for the sender's hand-over that went at their due time instead."""
        return self._plan.fired_late

    def stop(self) -> None:
        """Stop issuing requests; ``run`` then drains and returns."""
        if self._stopped_at_ns is None:
            self._stopped_at_ns = self.now_rel()
        self._stopping.set()
        self._changed.set()

    def cancel_in_flight(self) -> None:
        """Cancel every in-flight request now (second SIGTERM)."""
        self.stop()
        for t in list(self._tasks):
            t.cancel()

    def due_count(self) -> int:
        """Requests whose due time has passed: those sent plus prepared ones already overdue.
        Safe to call from another thread (the metrics exposition thread)."""
        return self.sent + self.queued + self._plan.overdue(self.now_rel())

    def now_rel(self) -> int:
        return self._clock.now_ns() - self.t0_ns

    def pause(self) -> None:
        self.timeline.pause(self.now_rel())
        self._changed.set()

    def resume(self) -> None:
        self.timeline.resume(self.now_rel())
        self._changed.set()

    def set_speedup(self, speedup: float) -> None:
        self.timeline.set_speedup(speedup, self.now_rel())
        self._changed.set()

    # -- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Send the whole schedule (or until ``stop``), then drain and account. A send that
        raises (a bug: senders return failures as values) cancels the others and leaves here
        in an ``ExceptionGroup``; the requests never sent are recorded first."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                try:
                    await self._issue()
                    await self._drain()
                except BaseException:  # cancelled, or a send crashed: what is left is not sent
                    self._stopping.set()
                    raise
        finally:
            self._tg = None
            self._record_unsent()
            self._feeder.close()

    async def _issue(self) -> None:  # noqa: C901, PLR0912, PLR0915
        plan, clock, sender = self._plan, self._clock, self._sender
        stopping = self._stopping
        while not stopping.is_set():
            # 1. fire everything due, then let those tasks write their requests before any
            #    preparation work (on Python 3.11 a new task only starts at the next yield)
            fires = plan.due(self.now_rel())
            if fires:
                while fires:
                    for f in fires:
                        self._fire(f)
                    fires = plan.due(self.now_rel())
                await asyncio.sleep(0)
                continue
            # 1b. hand the requests due soon to a sender that writes ahead of the due time
            if plan.ahead_ns:
                now = self.now_rel()
                handed = False
                while (h := plan.hand_over(now)) is not None:
                    sending = sender.hand_over(h.req, h.due_ns)
                    if sending is None or sending is LOOP_WRITES:
                        plan.not_taken(now, again=sending is None)
                        break
                    plan.taken()
                    self._start(h.req, h.due_ns, sending)
                    handed = True
                if handed:
                    await asyncio.sleep(0)
                    continue
            # 2. prepare ahead, but never past the next due time. Behind schedule (the next
            #    request is overdue already), the requests overdue too are prepared first, for up
            #    to CATCH_UP_NS, and then fire together: one request per turn of the loop would
            #    let a loop saturated with stream reads set the send rate (each turn runs every
            #    ready read first), where independent clients' timers all fire in one turn
            t_yield = clock.now_ns() + CATCH_UP_NS
            catching_up = False
            while not plan.exhausted:
                if plan.must_act(self.now_rel()):
                    if not plan.head_overdue(self.now_rel()) or clock.now_ns() > t_yield:
                        break
                    catching_up = True
                if (self._cur is None or self._j >= len(self._cur)) and not await self._next_batch():
                    plan.exhausted = True
                    break
                sb, j = self._cur, self._j
                trace_ns = int(sb.trace_ns[j])  # type: ignore[union-attr]
                if self._missed_before_ns is not None:
                    if self.timeline.due(trace_ns) < self._missed_before_ns:
                        self._missed(sb, j)  # type: ignore[arg-type]
                        continue
                    self._missed_before_ns = None  # (in due order: the rest is on time)
                if plan.next_item(trace_ns, self.now_rel(), catching_up) is not PREPARE:
                    break
                req = self._prepare(sb, j)  # type: ignore[arg-type]
                plan.add(req, trace_ns, self.now_rel())
                self._j += 1
                if clock.now_ns() > t_yield:  # let streams progress during a long preparation burst
                    if catching_up:
                        break
                    await asyncio.sleep(0)
                    t_yield = clock.now_ns() + CATCH_UP_NS
            # connections for the requests due soon (counted again at most every millisecond)
            n = plan.demand(self.now_rel())
            if n is not None:
                sender.expect(n)
            if plan.finished:
                self.finished = True
                return
            cur = self._cur
            nxt = int(cur.trace_ns[self._j]) if cur is not None and self._j < len(cur) else None
            wake = plan.wake(self.now_rel(), nxt)
            if wake is None:  # the next batch is to be read
                continue
            left = wake.at_ns - self.now_rel()
            if self._on_idle is not None and left > 0:
                self._on_idle(left)
                left = wake.at_ns - self.now_rel()
            if left > 2 * SPIN_NS:
                self._changed.clear()
                await first_of(clock.sleep_until(self.t0_ns + wake.at_ns), self._changed.wait())
            elif left > 0:
                # a hand-over only has to happen before the due time: no spinning for it
                await (clock.sleep_until(self.t0_ns + wake.at_ns) if wake.precise else clock.sleep(left / 1e9))
            else:
                await asyncio.sleep(0)

    async def _next_batch(self) -> bool:
        """Read the next schedule batch (False: the schedule ended)."""
        while self._cur is None or self._j >= len(self._cur):
            self._cur = await self._feeder.next()
            self._j = 0
            if self._cur is None:
                return False
        return True

    def _fire(self, f: Fire) -> None:
        if self._plan.broken(f.req):
            self._not_sent_for_dependency(f)
            return
        self._start(f.req, f.due_ns, self._sender.send(f.req, f.due_ns))

    def _not_sent_for_dependency(self, f: Fire) -> None:
        """A turn whose predecessor failed: recorded cancelled (kind ``dependency``), never sent;
        it ends at once, so its own dependents are not sent either."""
        res = f.req.new_result(self.shard, due_ns=f.due_ns, sent=False)
        res.outcome, res.error_kind = Outcome.CANCELLED.value, ErrorKind.DEPENDENCY.value
        res.error = "not sent: an earlier turn of its session (or its parent request) failed"
        self.cancelled += 1
        self._deliver(res)
        self._plan.failed(f.req)
        self._ended(f.req, self.stopping)

    def _fire_capped(self, f: Fire) -> None:
        """``_fire`` under ``--max-concurrency``: at once when a slot is free and nobody waits,
        else into the queue (``_task_done_capped`` starts it when a slot frees)."""
        if self._plan.broken(f.req):
            self._not_sent_for_dependency(f)
            return
        slots = self._slots
        assert slots is not None
        if slots.free(len(self._tasks) - self._ending):
            self._start(f.req, f.due_ns, self._sender.send_queued(f.req, f.due_ns, 0))
        else:
            slots.wait(f.req, f.due_ns, self.now_rel())

    def _task_done_capped(self, task: asyncio.Task[None]) -> None:
        """A slot freed: the request waiting longest takes it (before the finished task leaves
        the books, so the dispatcher is never idle while requests wait); none after a stop."""
        assert self._slots is not None
        queue = self._slots.queue
        if queue and not self._stopping.is_set():
            req, due_ns, since = queue.popleft()
            self._start(req, due_ns, self._sender.send_queued(req, due_ns, self.now_rel() - since))
        self._task_done(task)

    def _start(self, req: PreparedRequest, due_ns: int, sending: Sending) -> None:
        task = self._tg.create_task(self._one(req, sending))  # type: ignore[union-attr]
        self._tasks[task] = (req, due_ns, sending)
        self._idle.clear()
        task.add_done_callback(self._on_done)
        self.sent += 1
        p = self.position
        p.index, p.loop, p.row = req.index + 1, req.loop, req.row + 1
        self._events.sent(req)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        req, due_ns, sending = self._tasks.pop(task)
        if not self._tasks:
            self._idle.set()
        if task.cancelled() and inspect.getcoroutinestate(sending) == inspect.CORO_CREATED:
            sending.close()  # cancelled before its first step: the sender never began
            self.cancelled += 1
            res = req.new_result(self.shard, due_ns=due_ns)
            res.outcome, res.error_kind = Outcome.CANCELLED.value, ErrorKind.CANCELLED.value
            self._deliver(res)
            self._ended(req, stopping=True)

    async def _one(self, req: PreparedRequest, sending: Sending) -> None:
        try:
            res = await sending
        except SendCancelled as c:
            self.cancelled += 1
            self._deliver(c.result)
            self._ended(req, stopping=True)  # nothing more is released at shutdown
            raise
        except Exception as e:  # a bug in the sender: recorded, then it stops the run (TaskGroup)
            self._stopping.set()
            res = req.new_result(self.shard, due_ns=self._tasks[asyncio.current_task()][1])  # type: ignore[index]
            res.outcome, res.error_kind = Outcome.FAILED.value, ErrorKind.CLIENT.value
            res.error = f"{type(e).__name__}: {e}"[:500]
            self._deliver(res)
            self._ended(req, stopping=True)
            raise
        if res.outcome == Outcome.FAILED.value:
            self._plan.failed(req)  # (before its turns are released: they are not sent)
        self._ended(req, self.stopping)
        self._deliver(res)

    def _ended(self, req: PreparedRequest, stopping: bool) -> None:
        """A session turn (or parent) ended: start the turns it releases now; the planner keeps
        later ones (and, while stopping, all of them: recorded as not started)."""
        if req.key is None:
            return
        self._ending += 1  # (its slot is as good as free: a turn it releases may take it)
        try:
            for f in self._plan.ended(req, self.now_rel(), stopping):
                self._fire(f)
        finally:
            self._ending -= 1
        self._changed.set()  # the issuing loop re-plans (it may be waiting for these)

    def _deliver(self, res: RequestResult) -> None:
        try:
            self._events.finished(res)
        except Exception:  # a broken subscriber must not lose the replay
            log.exception("a subscriber of the finished event failed for row %d", res.row)

    async def _drain(self) -> None:
        """Normal end: wait for every in-flight request. After ``stop()`` (also one arriving during
        that wait): wait at most ``drain_timeout_s``, then cancel what is left (the task group
        waits for them)."""
        if not self.stopping:
            await first_of(self._idle.wait(), self._stopping.wait())
        if not self._tasks:
            return
        log.info("draining %d in-flight requests (timeout %.1f s)", len(self._tasks), self.drain_timeout_s)
        try:
            await asyncio.wait_for(self._idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            pending = list(self._tasks)
            log.warning("drain timeout: cancelling %d in-flight requests", len(pending))
            for t in pending:
                t.cancel()

    def _missed(self, sb: ScheduleBatch, j: int) -> None:
        self.missed_while_down += 1
        res = self._unsent(sb, j)
        res.outcome = Outcome.MISSED_WHILE_DOWN.value
        self._j += 1
        self._deliver(res)

    def _record_unsent(self) -> None:
        """At a stop: what it leaves unsent recorded as ``not_started`` (``unsent.never_sent``)."""
        if not self.stopping:
            return
        until = None
        if self.until_stop:
            until = self._stopped_at_ns if self._stopped_at_ns is not None else self.now_rel()
        slots = self._slots
        waiting = ((req, due_ns) for req, due_ns, _ in slots.queue) if slots is not None else ()
        rest = (self._cur, self._j) if self._cur is not None else None
        held = self._plan.take_held()
        for res in never_sent(
            waiting, held, rest, timeline=self.timeline, until_ns=until, shard=self.shard, unsent=self._unsent
        ):
            self.not_started += 1
            self._deliver(res)
        if slots is not None:
            slots.queue.clear()
        if self._cur is not None:
            self._j = len(self._cur)
