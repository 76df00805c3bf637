"""The open loop: send every scheduled request at its due time, whether or not earlier ones
finished; account for every one of them.

Deadlines are absolute offsets from the anchor ``t0_ns`` (``schedule.Timeline``), recomputed at
every wait (never a chain of relative sleeps, which drifts: vLLM issue 21104). Trace batches are
read ahead in a worker thread; bodies are prepared in a lead window before their due time, so
nothing heavy runs when a request is due. A late request goes out at once and its lag is
recorded. There is no concurrency cap: a cap would turn the open loop into a closed one and hide
lateness.

Shutdown: ``stop()`` stops issuing; in-flight requests get ``drain_timeout_s`` to finish, then
are cancelled (recorded as ``cancelled``). Requests already prepared, and the rest of the
current trace batch, are recorded as ``not_started``. So ``sent + not_started`` = everything
scheduled so far, and every sent request ends as success, failed or cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from .clock import SPIN_NS, now_ns, sleep_until
from .errors import ErrorKind, Outcome
from .payload import PreparedRequest
from .result import RequestResult
from .schedule import ScheduleBatch, Timeline
from .sessions import SessionGate

log = logging.getLogger(__name__)

#: after a hand-over found no idle connection, try again this much later (until the due time)
RETRY_LAUNCH_NS = 2_000_000
#: longest stretch of preparation between two yields to the loop (and, behind schedule, the
#: longest the overdue requests prepared in one go wait for the first of them to fire)
CATCH_UP_NS = 2_000_000


class Observer:
    """Hooks for live accounting (metrics, status). All no-ops here."""

    def on_sent(self, req: PreparedRequest) -> None: ...
    def on_result(self, res: RequestResult) -> None: ...


@dataclass
class Position:
    """Where the replay is: the next request to send (for status and resume checkpoints)."""

    index: int = 0   # schedule position
    loop: int = 0
    row: int = 0     # global trace row
    trace_ns: int = 0


class BatchFeeder:
    """Runs a synchronous schedule iterator in one worker thread, one batch ahead, so Parquet
    reads and batch preparation never run on the event loop."""

    def __init__(self, batches: Iterator[ScheduleBatch]) -> None:
        self._it = batches
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace-reader")
        self._next: asyncio.Future | None = None

    def _fetch(self) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._pool, next, self._it, None)

    async def next(self) -> ScheduleBatch | None:
        fut = self._next or self._fetch()
        batch = await fut
        self._next = self._fetch() if batch is not None else None
        return batch

    def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


class Dispatcher:
    """Runs a schedule against ``send``.

    ``prepare(sb, j)`` builds the request for item j of schedule batch ``sb`` (pure, may take
    ~0.5 ms); ``send(req, res)`` is the client's coroutine; ``sink(res)`` receives every result
    exactly once; ``unsent(sb, j)`` builds the result of an item never sent. ``timeline`` maps
    trace time to due time (shared with the control API). ``duration_ns``: stop issuing requests
    due at or after this offset. ``lead_ns``: how far ahead bodies are built. ``gate``: holds a
    turn back until its predecessor ended (``replayer.sessions``; None = no sessions).
    ``reserve``/``launch``: requests outside sessions are handed to the launcher process
    ``launch_ahead_ns`` before their due time (``Client.reserve``/``Client.launch``), which writes
    them on time even while the loop is busy with a burst of stream reads.
    ``expect(n)``: told how many requests are due within ``connect_ahead_ns`` (when a request
    enters that horizon, and at most every millisecond; ``Client.expect`` opens connections for
    them ahead of time).
    """

    def __init__(self, batches: Iterator[ScheduleBatch],
                 prepare: Callable[[ScheduleBatch, int], PreparedRequest],
                 send: Callable[[PreparedRequest, RequestResult], Awaitable[object]],
                 sink: Callable[[RequestResult], None], *, t0_ns: int, timeline: Timeline,
                 unsent: Callable[[ScheduleBatch, int], RequestResult],
                 observer: Observer | None = None, lead_ns: int = 500_000_000,
                 drain_timeout_s: float = 30.0, duration_ns: int | None = None,
                 rebase_first: bool = False, on_idle: Callable[[int], None] | None = None,
                 shard: int = 0, gate: SessionGate | None = None,
                 reserve: Callable[[PreparedRequest, RequestResult], object] | None = None,
                 launch: Callable[..., None] | None = None,
                 launch_ahead_ns: int = 50_000_000, expect: Callable[[int], None] | None = None,
                 connect_ahead_ns: int = 100_000_000) -> None:
        self._feeder = BatchFeeder(batches)
        self._prepare = prepare
        self._send = send
        self._sink = sink
        self._unsent = unsent
        self.t0_ns = t0_ns
        self.timeline = timeline
        self.obs = observer or Observer()
        self.lead_ns = lead_ns
        self.drain_timeout_s = drain_timeout_s
        self.duration_ns = duration_ns
        self._rebase = rebase_first  # resume: the first request is due at wall0, not at its trace time
        self._on_idle = on_idle      # called with the slack (ns) before a wait (GC pacing)
        self.shard = shard
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()   # timeline changed (pause/resume/speed-up) or stop
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task] = set()
        self._pending: deque[tuple[PreparedRequest, int]] = deque()  # (request, trace_ns)
        self._gate = gate
        # hand-over to the launcher process (replayer.launcher): reserve(req, res) binds a
        # request to a connection (None: not possible now), launch(at_ns, req, res, handle) queues
        # its write for the due time, send(req, res, handle) then only waits for the response
        self._reserve = reserve if launch is not None else None
        self._launch = launch
        self.launch_ahead_ns = launch_ahead_ns
        self._expect = expect
        self.connect_ahead_ns = connect_ahead_ns
        self._next_expect = 0
        # the head that could not be handed over (no idle connection yet): tried again from
        # _retry_launch_ns (relative) until its due time, then written by the loop
        self._no_launch: PreparedRequest | None = None
        self._retry_launch_ns = 0
        self._delayed: list[tuple[int, int, PreparedRequest]] = []  # heap of (release_ns, seq, request)
        self._seq = 0
        self._cur: ScheduleBatch | None = None
        self._j = 0
        self.position = Position()
        self.sent = 0
        self.prepared_late = 0  # requests whose body was built after their due time (preparation behind)
        self.fired_by_loop = 0  # requests written by the loop although a launcher runs (no hand-over in time)
        self.not_started = 0
        self.cancelled = 0
        self.finished = False  # the whole schedule was issued

    # -- control ------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop issuing requests; ``run`` then drains and returns."""
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
        now = self.now_rel()
        due = self.timeline.due
        return self.sent + sum(1 for _, tns in list(self._pending) if due(tns) <= now)

    def now_rel(self) -> int:
        return now_ns() - self.t0_ns

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
        """Send the whole schedule (or until ``stop``), then drain and account."""
        try:
            await self._issue()
        finally:
            await self._drain()
            self._record_unsent()
            self._feeder.close()

    async def _next_item(self) -> tuple[ScheduleBatch, int] | None:
        while self._cur is None or self._j >= len(self._cur):
            self._cur = await self._feeder.next()
            self._j = 0
            if self._cur is None:
                return None
        return self._cur, self._j

    async def _issue(self) -> None:
        tl = self.timeline
        pending = self._pending
        stopping = self._stopping
        exhausted = False
        while not stopping.is_set():
            now = self.now_rel()
            # 1. fire everything due, then let those tasks write their requests before any
            #    preparation work (on Python 3.11 a new task only starts at the next yield)
            delayed = self._delayed
            if (pending and tl.due(pending[0][1]) <= now) or (delayed and delayed[0][0] <= now and not tl.paused):
                while pending and tl.due(pending[0][1]) <= now:
                    self._admit(pending.popleft()[0], now)
                    now = self.now_rel()
                while delayed and delayed[0][0] <= now and not tl.paused:
                    self._fire(heapq.heappop(delayed)[2], now)
                await asyncio.sleep(0)
                continue
            # 1b. hand the requests due soon to the launcher
            if self._reserve is not None and pending and not tl.paused:
                handed = False
                while pending and self._launchable(pending[0][0]) \
                        and tl.due(pending[0][1]) - now <= self.launch_ahead_ns:
                    if not self._hand_over(pending[0][0]):
                        self._no_launch = pending[0][0]
                        self._retry_launch_ns = now + RETRY_LAUNCH_NS
                        break
                    pending.popleft()
                    handed = True
                if handed:
                    await asyncio.sleep(0)
                    continue
            # 2. prepare ahead, but never past the next due time. Behind schedule (the next
            #    request is overdue already), the requests overdue too are prepared first, for up
            #    to CATCH_UP_NS, and then fire together: one request per turn of the loop would
            #    let a loop saturated with stream reads set the send rate (each turn runs every
            #    ready read first), where independent clients' timers all fire in one turn
            t_yield = now_ns() + CATCH_UP_NS
            catching_up = False
            while not exhausted:
                if pending and self._must_act(pending[0]):
                    if tl.due(pending[0][1]) > self.now_rel() or now_ns() > t_yield:
                        break
                    catching_up = True
                item = self._cur, self._j
                if self._cur is None or self._j >= len(self._cur):
                    nxt = await self._next_item()
                    if nxt is None:
                        exhausted = True
                        break
                    item = nxt
                sb, j = item
                trace_ns = int(sb.trace_ns[j])
                if self._rebase:
                    tl.trace0_ns, self._rebase = trace_ns, False
                due = tl.due(trace_ns)
                if self.duration_ns is not None and due >= self.duration_ns and not tl.paused:
                    exhausted = True
                    break
                if due > self.now_rel() + (0 if catching_up else self.lead_ns):
                    break
                pending.append((self._prepare(sb, j), trace_ns))
                self.prepared_late += due <= self.now_rel()
                self._j += 1
                if now_ns() > t_yield:  # let streams progress during a long preparation burst
                    if catching_up:
                        break
                    await asyncio.sleep(0)
                    t_yield = now_ns() + CATCH_UP_NS
            # connections for the requests due within connect_ahead_ns (counted again at most
            # every millisecond)
            if self._expect is not None and pending and now_ns() >= self._next_expect:
                self._next_expect = now_ns() + 1_000_000
                self._expect(self._demand())
            precise = True
            if pending:
                wake = self._critical(pending[0])
                # a due time is kept to the microsecond; a hand-over (or its retry) need not be
                precise = wake == tl.due(pending[0][1])
                if self._expect is not None:  # wake up to count a request entering the horizon
                    counted = tl.due(pending[0][1]) - self.connect_ahead_ns
                    if self.now_rel() < counted < wake:
                        wake = counted
            elif not exhausted and self._cur is not None and self._j < len(self._cur):
                wake = tl.due(int(self._cur.trace_ns[self._j])) - self.lead_ns
            elif exhausted and not self._delayed and not (self._gate and self._gate.waiting):
                self.finished = True
                return
            elif exhausted:
                wake = 2**62  # turns wait for their predecessors: woken by _changed
            else:
                continue
            if self._delayed and not tl.paused and self._delayed[0][0] < wake:
                wake, precise = self._delayed[0][0], True
            left = wake - self.now_rel()
            if self._on_idle is not None and left > 0:
                self._on_idle(left)
                left = wake - self.now_rel()
            if left > 2 * SPIN_NS:
                self._changed.clear()
                await _first(sleep_until(self.t0_ns + wake), self._changed.wait())
            elif left > 0:
                # a hand-over only has to happen before the due time: no spinning for it
                await (sleep_until(self.t0_ns + wake) if precise else asyncio.sleep(left / 1e9))
            else:
                await asyncio.sleep(0)

    def _demand(self, cap: int = 256) -> int:
        """How many prepared requests are due within ``connect_ahead_ns`` (at most ``cap``)."""
        horizon = self.now_rel() + self.connect_ahead_ns
        due = self.timeline.due
        n = 0
        for _, trace_ns in self._pending:
            if n >= cap or due(trace_ns) > horizon:
                break
            n += 1
        return n

    def _via_launcher(self, req: PreparedRequest) -> bool:
        """``req`` goes to the launcher (a launcher runs, and it is outside sessions)."""
        return self._reserve is not None and req.dep is None and req.key is None

    def _launchable(self, req: PreparedRequest) -> bool:
        return self._via_launcher(req) and (req is not self._no_launch or self.now_rel() >= self._retry_launch_ns)

    def _critical(self, item: tuple[PreparedRequest, int]) -> int:
        """When the dispatcher must act on ``item``: its hand-over time (or the next try of a
        hand-over that found no connection), or its due time."""
        req, due = item[0], self.timeline.due(item[1])
        if not self._via_launcher(req):
            return due
        if req is self._no_launch:
            return min(due, self._retry_launch_ns)
        return due - self.launch_ahead_ns

    def _must_act(self, item: tuple[PreparedRequest, int]) -> bool:
        """Whether preparation must stop for ``item`` now: its due time is within ``SPIN_NS``, or
        for a hand-over, its hand-over time (or the next try of one) has come. Preparation runs
        ahead through the lead window between hand-overs even when one is due every millisecond;
        stopping ``SPIN_NS`` before each hand-over time and sleeping until it kept the prepared
        queue ~50 ms deep at such rates, and a stall of the loop then made requests late."""
        now = self.now_rel()
        if not self._via_launcher(item[0]):
            return self.timeline.due(item[1]) - now <= SPIN_NS
        return self._critical(item) <= now

    def _hand_over(self, req: PreparedRequest) -> bool:
        """Bind ``req`` to a connection and give its write to the launcher; False if it cannot."""
        res = req.new_result(self.shard)
        req.due_ns = res.due_ns = self.timeline.due(req.trace_ns)
        reserved = self._reserve(req, res)  # type: ignore[misc]
        if reserved is None:
            return False
        self._launch(self.t0_ns + req.due_ns, req, res, reserved)  # type: ignore[misc]
        self._start_task(req, res, reserved)
        return True

    def _admit(self, req: PreparedRequest, now_rel: int) -> None:
        """A due request: fire it, or let the session gate hold it back."""
        gate = self._gate
        if gate is None or req.dep is None and req.key is None:
            self._fire(req, now_rel)
            return
        due = self.timeline.due(req.trace_ns)
        release = gate.admit(req, due)
        if release is None:  # waits for its predecessor (finished() releases it)
            return
        gate.started(req)
        self._schedule_release(req, due, release, now_rel)

    def _schedule_release(self, req: PreparedRequest, due: int, release: int, now_rel: int) -> None:
        if release > due:
            req.release_ns = release
        if release <= now_rel:
            self._fire(req, now_rel)
        else:
            self._seq += 1
            heapq.heappush(self._delayed, (release, self._seq, req))
            self._changed.set()  # the issuing loop may sleep past this release: wake it

    def _released(self, req: PreparedRequest) -> None:
        """``req`` ended: fire (or schedule) the turns waiting on it."""
        now = self.now_rel()
        for nxt, release in self._gate.finished(req, now):  # type: ignore[union-attr]
            due = self.timeline.due(nxt.trace_ns)
            if self.stopping:
                self._seq += 1
                heapq.heappush(self._delayed, (max(due, release), self._seq, nxt))  # recorded not_started
            else:
                self._schedule_release(nxt, due, max(due, release), now)
            self._changed.set()  # the issuing loop re-plans (it may be waiting for these)

    def _fire(self, req: PreparedRequest, now_rel: int) -> None:
        res = req.new_result(self.shard)
        # the due time is fixed when the request fires (the timeline may change later); a turn
        # held back by its session is due (for dispatch lag) at its release
        req.due_ns = res.due_ns = self.timeline.due(req.trace_ns)
        if req.dep is not None and self._gate is not None:
            if req.release_ns is not None and req.release_ns > req.due_ns:
                res.session_wait_ms = (req.release_ns - req.due_ns) / 1e6
                req.due_ns = req.release_ns
            else:
                res.session_wait_ms = 0.0
        if self._via_launcher(req):
            self.fired_by_loop += 1
        self._start_task(req, res, None)

    def _start_task(self, req: PreparedRequest, res: RequestResult, reserved: object) -> None:
        task = asyncio.get_running_loop().create_task(self._one(req, res, reserved))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._task_done)
        self.sent += 1
        p = self.position
        p.index, p.loop, p.row = req.index + 1, req.loop, req.row + 1
        self.obs.on_sent(req)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _one(self, req: PreparedRequest, res: RequestResult, reserved: object = None) -> None:
        try:
            if reserved is None:
                await self._send(req, res)
            else:
                await self._send(req, res, reserved)
        except asyncio.CancelledError:
            self.cancelled += 1
            if res.outcome == Outcome.NOT_STARTED.value:  # cancelled before the client began
                res.outcome, res.error_kind = Outcome.CANCELLED.value, ErrorKind.CANCELLED.value
            self._deliver(res)
            if req.key is not None and self._gate is not None:
                self._gate.finished(req, self.now_rel())  # nothing more is released at shutdown
            raise
        if req.key is not None and self._gate is not None:
            self._released(req)
        self._deliver(res)

    def _deliver(self, res: RequestResult) -> None:
        try:
            self._sink(res)
            self.obs.on_result(res)
        except Exception:  # a broken sink must not lose the replay
            log.exception("result sink failed for row %d", res.row)

    async def _drain(self) -> None:
        """Normal end: wait for every in-flight request. After ``stop()`` (also one arriving during
        that wait): wait at most ``drain_timeout_s``, then cancel what is left."""
        if not self.stopping:
            await _first(self._idle.wait(), self._stopping.wait())
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
            await asyncio.gather(*pending, return_exceptions=True)

    def _record_unsent(self) -> None:
        if not self.stopping:
            return
        held = [r for r, _ in self._pending] + [r for _, _, r in sorted(self._delayed)]
        if self._gate is not None:
            held += self._gate.take_waiting()
        for req in held:
            self.not_started += 1
            res = req.new_result(self.shard, due_ns=self.timeline.due(req.trace_ns))
            res.prompt_len_sent = res.max_tokens = 0  # nothing was sent
            res.expected_prefix_hit_tokens = None
            self._deliver(res)
        self._pending.clear()
        self._delayed.clear()
        if self._cur is not None:
            for j in range(self._j, len(self._cur)):
                self.not_started += 1
                self._deliver(self._unsent(self._cur, j))
            self._j = len(self._cur)


async def _first(*aws: Awaitable[object]) -> None:
    """Wait until the first of ``aws`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
