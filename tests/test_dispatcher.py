"""The dispatcher's shell in virtual time: a fake clock (time moves only when the dispatcher
sleeps, to exactly the time it sleeps until) and a fake sender (``replayer.send.sender.Sender``) that
stamps each send on that clock. No server, no real waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from batches import TimeBatch
from eventlog import Finished, feed_of

from replayer.core import QUIET, PreparedRequest, RequestResult
from replayer.core.clock import Clock
from replayer.plan import Planner, SessionGate, Timeline, iter_schedule
from replayer.plan.planner import NEVER
from replayer.plan.schedule import ScheduleBatch
from replayer.send import Dispatcher
from replayer.send.sender import SendCancelled, lag_origin, result_for

MS = 1_000_000


class VirtualClock(Clock):
    """Trio's ``MockClock`` with autojump, for one sleeper: a sleep returns at once with the
    clock at its deadline, or earlier at the first timer (``at``: a response ending then) due
    before it, having fired that timer (the sleeper then looks again, as after any change); a
    deadline that never comes waits for a timer, or until cancelled. Once ``idle()`` holds (the
    dispatcher sent its schedule and only waits for responses), the timers fire in turn without
    a sleeper. Nothing depends on how fast the machine runs the loop."""

    def __init__(self) -> None:
        self.t = 0
        self._timers: list[tuple[int, asyncio.Future]] = []
        self._timer_added: asyncio.Event | None = None
        self.idle: Callable[[], bool] = lambda: False
        self._jumper: asyncio.Task | None = None

    def now_ns(self) -> int:
        return self.t

    def advance_to(self, t: int) -> None:
        self.t = max(self.t, t)

    async def at(self, t: int) -> None:
        """Wait until a sleeper moves the clock to ``t``."""
        fut = asyncio.get_running_loop().create_future()
        self._timers.append((t, fut))
        self._added().set()
        if self._jumper is None or self._jumper.done():
            self._jumper = asyncio.ensure_future(self._jump_when_idle())
        await fut

    async def _jump_when_idle(self) -> None:
        while self._pending():
            if self.idle():
                self._fire_first()
            await asyncio.sleep(0.001)  # (polls a state, not a time: any speed gives one order)

    def _pending(self) -> list[tuple[int, asyncio.Future]]:
        self._timers = [(t, f) for t, f in self._timers if not f.done()]
        return self._timers

    def _fire_first(self) -> None:
        self.advance_to(min(t for t, _ in self._timers))
        for t, f in self._timers:
            if t <= self.t:
                f.set_result(None)

    def _added(self) -> asyncio.Event:
        if self._timer_added is None:
            self._timer_added = asyncio.Event()
        return self._timer_added

    async def sleep_until(self, deadline_ns: int) -> None:
        while True:
            first = min((t for t, _ in self._pending()), default=None)
            if first is not None and first <= deadline_ns:
                self._fire_first()
                await asyncio.sleep(0)
                return
            if deadline_ns < NEVER // 2:
                self.advance_to(deadline_ns)
                await asyncio.sleep(0)
                return
            self._added().clear()
            await self._added().wait()

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.t + int(seconds * 1e9))


class FakeSender:
    """Stamps ``sent_ns`` = the clock's time at the send (a handed-over request: its due time,
    as a launcher writing it then would), ends at once with success. ``refuse``: rows whose
    hand-over is refused; ``crash``: a row whose send raises; ``block``: rows that never end;
    ``takes_ms``: rows whose response takes that long (the clock moves on when they end)."""

    def __init__(self, clock: VirtualClock, *, ahead_ns: int = 0, refuse=(), crash=None, block=(), takes_ms=None):
        self.clock, self.ahead_ns = clock, ahead_ns
        self.refuse, self.crash, self.block = set(refuse), crash, set(block)
        self.takes_ms = takes_ms or {}
        self.handed: list[tuple[int, int]] = []  # (row, time handed over)
        self.in_flight = self.peak = 0  # sends begun and not ended; the most at once
        self.expected: list[int] = []

    def send(self, req: PreparedRequest, due_ns: int):
        return self._go(req, due_ns, self.clock.now_ns())

    def send_queued(self, req: PreparedRequest, due_ns: int, wait_ns: int):
        return self._go(req, due_ns, self.clock.now_ns(), wait_ns)

    def hand_over(self, req: PreparedRequest, due_ns: int):
        if req.row in self.refuse:
            return None
        self.handed.append((req.row, self.clock.now_ns()))
        return self._go(req, due_ns, lag_origin(req, due_ns))

    def expect(self, n: int) -> None:
        self.expected.append(n)

    async def _go(self, req: PreparedRequest, due_ns: int, sent_ns: int, wait_ns: int | None = None) -> RequestResult:
        res = result_for(req, due_ns, 0)
        res.sent_ns = sent_ns
        if wait_ns is not None:  # (as LoopSender.send_queued: the lag counts from the slot's release)
            res.queue_wait_ms = wait_ns / 1e6
        res.dispatch_lag_ms = (sent_ns - lag_origin(req, due_ns) - (wait_ns or 0)) / 1e6
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self._going(req, res, sent_ns)
        finally:
            self.in_flight -= 1

    async def _going(self, req: PreparedRequest, res: RequestResult, sent_ns: int) -> RequestResult:
        try:
            await asyncio.sleep(0)
            if req.row == self.crash:
                raise RuntimeError("a bug in the sender")
            if req.row in self.block:
                await asyncio.get_running_loop().create_future()
            if req.row in self.takes_ms:
                # ends when the dispatcher, waiting, moves the clock there (not after real time: a
                # loaded machine's 10 ms could pass before it sends a row due meanwhile)
                await self.clock.at(sent_ns + self.takes_ms[req.row] * MS)
        except asyncio.CancelledError:
            res.outcome, res.error_kind = "cancelled", "cancelled"
            raise SendCancelled(res) from None
        res.outcome, res.end_ns = "success", self.clock.now_ns()
        return res


def _prepare(timeline: Timeline):
    def prepare(sb: ScheduleBatch, j: int) -> PreparedRequest:
        t = int(sb.trace_ns[j])
        return PreparedRequest(
            index=sb.first_index + j,
            row=int(sb.rows[j]),
            due_ns=timeline.due(t),
            body=b"{}",
            input_length=1,
            output_length=1,
            prompt_len=1,
            max_tokens=1,
            trace_ns=t,
        )

    return prepare


def _run(
    ts_ms: list[int],
    sender_kw: dict | None = None,
    *,
    speedup: float = 1.0,
    stop_at_ms: int | None = None,
    prepare=None,
    gate: SessionGate | None = None,
    clock: VirtualClock | None = None,
    max_concurrency: int | None = None,
    until_stop: bool = False,
    **plan_kw,
):
    """Replay ``ts_ms`` in virtual time; (results by row, dispatcher, sender, error raised by run)."""
    clock = clock or VirtualClock()
    timeline = Timeline(speedup)
    sender = FakeSender(clock, **(sender_kw or {}))
    results: list[RequestResult] = []
    feed = feed_of(
        iter_schedule(lambda: [TimeBatch(ts_ms)]),
        prepare or _prepare(timeline),
        lambda sb, j: RequestResult(row=int(sb.rows[j]), due_ns=timeline.due(int(sb.trace_ns[j]))),
    )
    d = Dispatcher(
        feed,
        Planner(timeline, gate=gate, ahead_ns=sender.ahead_ns, **plan_kw),
        sender,
        Finished(results.append),
        t0_ns=0,
        clock=clock,
        drain_timeout_s=0.05,
        max_concurrency=max_concurrency,
        until_stop=until_stop,
    )
    clock.idle = lambda: d.finished
    error: BaseException | None = None

    async def main():
        nonlocal error
        if stop_at_ms is not None:

            async def stopper():
                while clock.now_ns() < stop_at_ms * MS:
                    await asyncio.sleep(0)
                d.stop()

            watcher = asyncio.ensure_future(stopper())
        try:
            await asyncio.wait_for(d.run(), 30)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            error = e
        if stop_at_ms is not None:
            watcher.cancel()

    asyncio.run(main())
    by_row = {r.row: r for r in results}
    assert len(by_row) == len(results), "a result was delivered twice"
    return by_row, d, sender, error


def test_every_request_is_sent_exactly_at_its_due_time():
    ts = [0, 0, 3, 10, 10, 250, 1_000, 1_001]
    res, d, _, error = _run(ts, speedup=2.0)
    assert error is None and d.finished and d.in_flight == 0
    assert d.sent == len(ts) == len(res) and d.not_started == 0
    assert [res[i].sent_ns for i in range(len(ts))] == [round(t * MS / 2.0) for t in ts]
    assert all(r.dispatch_lag_ms == 0.0 and r.due_ns == r.sent_ns for r in res.values())


def test_requests_are_handed_over_ahead_and_a_refused_one_goes_at_its_due_time():
    ts = [100, 200, 300]
    res, d, sender, error = _run(ts, {"ahead_ns": 50 * MS, "refuse": {1}})
    assert error is None and d.sent == 3
    assert sender.handed == [(0, 50 * MS), (2, 250 * MS)]  # refused row 1 was retried, never taken
    assert d.fired_by_loop == 1 and res[1].sent_ns == 200 * MS
    assert [res[i].dispatch_lag_ms for i in range(3)] == [0.0, 0.0, 0.0]


def test_the_demand_for_connections_is_told_to_the_sender():
    _, _, sender, _ = _run([100, 100, 150, 900], connect_ahead_ns=100 * MS)
    # counted when the head enters the 100 ms horizon (at 0 ms: the two due at 100 ms), then
    # again after each send
    assert sender.expected[0] == 2 and max(sender.expected) == 2 and len(sender.expected) >= 3


def test_a_stop_drains_cancels_what_is_left_and_accounts_for_every_row():
    ts = list(range(0, 100, 10))
    res, d, _, error = _run(ts, {"block": {2}}, stop_at_ms=45)
    assert error is None and d.stopping
    assert len(res) == len(ts) == d.sent + d.not_started  # every scheduled row, once
    assert res[2].outcome == "cancelled" and d.cancelled == 1  # in flight past the drain timeout
    assert {res[i].outcome for i in (0, 1, 3, 4)} == {"success"}
    assert all(res[i].outcome == "not_started" for i in range(5, 10))


def test_a_crashed_send_stops_the_run_loudly_and_every_row_is_still_accounted():
    ts = list(range(0, 100, 10))
    res, d, _, error = _run(ts, {"crash": 3, "block": {2}})
    assert isinstance(error, ExceptionGroup)
    assert [type(e) for e in error.exceptions] == [RuntimeError]
    assert len(res) == len(ts) == d.sent + d.not_started
    assert (res[3].outcome, res[3].error_kind) == ("failed", "client") and "a bug" in res[3].error
    assert res[2].outcome == "cancelled"  # its sibling in flight was cancelled
    assert d.in_flight == 0


class BrokenClock(VirtualClock):
    """A clock whose every real wait raises (an injected clock with a bug)."""

    async def sleep_until(self, deadline_ns: int) -> None:
        if deadline_ns > self.t:
            raise RuntimeError("the clock broke")
        await super().sleep_until(deadline_ns)


def test_a_wait_that_raises_stops_the_run_instead_of_being_lost():
    # the wait runs as a task beside the wake-up event: its exception must leave ``run``, not
    # stay in a task nobody reads while the loop spins on a clock that never moves
    res, d, _, error = _run([0, 1_000, 2_000], clock=BrokenClock())
    assert isinstance(error, ExceptionGroup), error
    assert [str(e) for e in error.exceptions] == ["the clock broke"]
    assert len(res) == 3 == d.sent + d.not_started and d.not_started >= 1  # every row still accounted for


def test_a_session_turn_held_by_its_predecessor_goes_at_its_release():
    base = _prepare(Timeline(1.0))

    def prepare(sb, j):
        req = base(sb, j)
        req.key = req.dep = "s"  # one session: each turn waits for the one before
        return req

    # (two turns: the fake clock jumps to any later due time while a response is in flight)
    res, d, _, error = _run([0, 10], {"takes_ms": {0: 30}}, prepare=prepare, gate=SessionGate("wait"))
    assert error is None and d.sent == 2 and d.finished
    assert (res[0].sent_ns, res[0].session_wait_ms) == (0, 0.0)
    # turn 1 was due at 10 ms, its predecessor ended at 30 ms: sent then, the hold apart
    assert (res[1].due_ns, res[1].sent_ns, res[1].session_wait_ms, res[1].dispatch_lag_ms) == (
        10 * MS,
        30 * MS,
        20.0,
        0.0,
    )


@pytest.mark.parametrize("rows", [1, 300])
def test_a_run_cancelled_from_outside_records_in_flight_and_unsent_rows(rows):
    ts = [0] + [10_000] * (rows - 1)
    clock = VirtualClock()
    timeline = Timeline(1.0)
    sender = FakeSender(clock, block={0})
    results: list[RequestResult] = []
    feed = feed_of(
        iter_schedule(lambda: [TimeBatch(ts)]), _prepare(timeline), lambda sb, j: RequestResult(row=int(sb.rows[j]))
    )
    d = Dispatcher(feed, Planner(timeline), sender, Finished(results.append), t0_ns=0, clock=clock)

    async def main():
        task = asyncio.ensure_future(d.run())
        while d.sent == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(r.row for r in results) == list(range(rows))
    assert results[0].outcome == "cancelled" and d.cancelled == 1 and d.in_flight == 0


def test_a_pause_holds_every_request_and_a_resume_shifts_the_rest_by_the_pause():
    clock = VirtualClock()
    timeline = Timeline(1.0)
    sender = FakeSender(clock)
    results: list[RequestResult] = []
    feed = feed_of(
        iter_schedule(lambda: [TimeBatch([0, 100, 200])]),
        _prepare(timeline),
        lambda sb, j: RequestResult(row=int(sb.rows[j])),
    )
    d = Dispatcher(feed, Planner(timeline), sender, Finished(results.append), t0_ns=0, clock=clock)

    async def operator():
        while clock.now_ns() < 100 * MS:  # paused as the clock reaches row 1's due time, before it fires
            await asyncio.sleep(0)
        d.pause()
        for _ in range(100):  # nothing goes while paused, however long
            await asyncio.sleep(0)
        assert d.sent == 1
        clock.advance_to(1_000 * MS)  # 900 ms later
        d.resume()

    async def main():
        op = asyncio.ensure_future(operator())
        await asyncio.wait_for(d.run(), 30)
        await op

    asyncio.run(main())
    by_row = {r.row: r for r in results}
    assert [by_row[i].sent_ns for i in range(3)] == [0, 1_000 * MS, 1_100 * MS]
    assert all(r.dispatch_lag_ms == 0.0 for r in results)


def test_a_cap_queues_requests_in_due_order_and_records_the_wait_apart_from_the_lag():
    # cap 2: rows 0 and 1 take the slots at 0 ms and end at 100 ms; row 2 (due 0 ms) and row 3
    # (due 10 ms) wait for them, in due order, and go when they end. The wait is queue_wait_ms;
    # the lag counts from the slot's release (0 here). (The fake clock jumps to any due time
    # while responses are in flight, so the schedule ends before the slots free.)
    res, d, sender, error = _run([0, 0, 0, 10], {"takes_ms": {0: 100, 1: 100}}, max_concurrency=2)
    assert error is None and d.finished and d.sent == 4 and d.queued == 0
    assert sender.peak == 2 and d.queued_total == 2
    assert [res[i].sent_ns for i in range(4)] == [0, 0, 100 * MS, 100 * MS]
    assert [res[i].queue_wait_ms for i in range(4)] == [0.0, 0.0, 100.0, 90.0]
    assert [res[i].dispatch_lag_ms for i in range(4)] == [0.0] * 4
    for r in res.values():  # sent - due = queue wait + dispatch lag: the cap's wait is not lateness
        assert (r.sent_ns - r.due_ns) / 1e6 == r.queue_wait_ms + r.dispatch_lag_ms


def test_without_a_cap_nothing_waits_and_no_queue_wait_is_recorded():
    res, d, sender, error = _run([0, 0, 0, 10], {"takes_ms": {0: 100, 1: 100}})
    assert error is None and sender.peak >= 3 and d.queued_total == 0
    assert all(r.queue_wait_ms is None for r in res.values())
    assert all(r.sent_ns == r.due_ns for r in res.values())


def test_a_stop_records_the_requests_waiting_for_a_slot_as_not_started():
    res, d, _, error = _run([0, 0, 0, 0, 10], {"block": {0, 1}}, max_concurrency=2, stop_at_ms=5)
    assert error is None and d.stopping
    assert len(res) == 5 == d.sent + d.not_started and d.sent == 2 and d.queued == 0
    assert {res[0].outcome, res[1].outcome} == {"cancelled"}  # in flight past the drain timeout
    assert {res[i].outcome for i in (2, 3, 4)} == {"not_started"} and res[2].queue_wait_ms is None


def test_a_capped_dispatcher_refuses_a_planner_that_hands_over_ahead():
    timeline = Timeline(1.0)
    sender = FakeSender(VirtualClock(), ahead_ns=50 * MS)
    feed = feed_of(iter_schedule(lambda: [TimeBatch([0])]), _prepare(timeline), lambda sb, j: None)
    with pytest.raises(ValueError, match="due time"):
        Dispatcher(feed, Planner(timeline, ahead_ns=sender.ahead_ns), sender, QUIET, t0_ns=0, max_concurrency=2)


def test_a_session_turn_released_by_its_predecessor_takes_its_slot_without_queueing():
    base = _prepare(Timeline(1.0))

    def prepare(sb, j):
        req = base(sb, j)
        req.key = req.dep = "s"
        return req

    res, d, sender, error = _run(
        [0, 10], {"takes_ms": {0: 30}}, prepare=prepare, gate=SessionGate("wait"), max_concurrency=1
    )
    assert error is None and d.sent == 2 and sender.peak == 1
    assert d.queued_total == 0  # the turn went in its predecessor's slot, as it ended: no wait
    assert (res[1].sent_ns, res[1].session_wait_ms, res[1].queue_wait_ms, res[1].dispatch_lag_ms) == (
        30 * MS,
        20.0,
        0.0,
        0.0,
    )


def test_a_stop_of_a_schedule_without_end_records_only_what_was_due_by_then():
    # --loop forever: what is scheduled ends at the stop; the rest of the batch (of the pass) is
    # not recorded as not_started, so it is neither counted as scheduled nor plotted as due
    ts = list(range(0, 100, 10))
    res, d, _, error = _run(ts, {"block": {2}}, stop_at_ms=45, until_stop=True)
    assert error is None and d.stopping
    # the virtual clock jumps from 40 to 50 ms (the next due time): the stop comes at 50 ms
    assert sorted(res) == [0, 1, 2, 3, 4, 5]  # rows due after the stop (60 ms on): never due
    assert len(res) == d.sent + d.not_started
    assert res[2].outcome == "cancelled"
    assert max(r.due_ns for r in res.values()) <= 50 * MS
