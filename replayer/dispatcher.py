"""The open loop: send every scheduled request at its due time, whether or not earlier ones
finished; account for every one of them.

Deadlines are absolute offsets from the anchor ``t0_ns``, recomputed at every wait (never a chain
of relative sleeps, which drifts: vLLM issue 21104). Bodies are prepared in a lead window before
their due time, so nothing heavy runs when a request is due. A late request goes out at once and
its lag is recorded. There is no concurrency cap: a cap would turn the open loop into a closed
one and hide lateness.

Shutdown: ``stop()`` stops issuing; in-flight requests get ``drain_timeout_s`` to finish, then
are cancelled (recorded as ``cancelled``); unsent ones are recorded as ``not_started``. So
``sent + not_started == scheduled`` and every sent request ends as success, failed or cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .clock import SPIN_NS, now_ns, sleep_until
from .errors import ErrorKind, Outcome
from .payload import PreparedRequest
from .result import RequestResult
from .schedule import Schedule

log = logging.getLogger(__name__)


class Observer:
    """Hooks for live accounting (metrics, status). All no-ops here."""

    def on_sent(self, req: PreparedRequest) -> None: ...
    def on_result(self, res: RequestResult) -> None: ...


@dataclass
class DispatchStats:
    scheduled: int = 0
    sent: int = 0
    not_started: int = 0
    cancelled: int = 0
    max_lag_ns: int = 0


class Dispatcher:
    """Runs one schedule.

    ``prepare(i)`` builds the i-th scheduled request (pure, may take ~0.5 ms);
    ``send(req, res)`` is the client's coroutine; ``sink(res)`` receives every result exactly once
    (also for cancelled and not-started requests). ``lead_ns``: how far ahead bodies are built.
    """

    def __init__(self, schedule: Schedule, prepare: Callable[[int], PreparedRequest],
                 send: Callable[[PreparedRequest, RequestResult], "asyncio.Future | object"],
                 sink: Callable[[RequestResult], None], *, t0_ns: int, observer: Observer | None = None,
                 lead_ns: int = 500_000_000, drain_timeout_s: float = 30.0,
                 make_result: Callable[[PreparedRequest], RequestResult] | None = None,
                 unsent_result: Callable[[int], RequestResult] | None = None) -> None:
        self.schedule = schedule
        self._prepare = prepare
        self._send = send
        self._sink = sink
        self.t0_ns = t0_ns
        self.obs = observer or Observer()
        self.lead_ns = lead_ns
        self.drain_timeout_s = drain_timeout_s
        self._make_result = make_result or _default_result
        self._unsent_result = unsent_result or (
            lambda i: RequestResult(row=int(schedule.rows[i]), due_ns=int(schedule.due_ns[i])))
        self._stopping = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task] = set()
        self.stats = DispatchStats(scheduled=len(schedule))
        self.next_index = 0  # first schedule index not yet sent

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def stop(self) -> None:
        """Stop issuing requests; ``run`` then drains and returns."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> DispatchStats:
        """Send the whole schedule (or until ``stop``), then drain. Returns the accounting."""
        try:
            await self._issue()
        finally:
            await self._drain()
            self._record_not_started()
        return self.stats

    async def _issue(self) -> None:
        due = self.schedule.due_ns
        n = len(self.schedule)
        t0 = self.t0_ns
        pending: deque[PreparedRequest] = deque()
        i_prep = 0
        stopping = self._stopping
        while self.next_index < n and not stopping.is_set():
            now = now_ns() - t0
            # 1. fire everything due
            while pending and pending[0].due_ns <= now:
                self._fire(pending.popleft(), now)
                now = now_ns() - t0
            # 2. prepare ahead, but never past the next due time
            horizon = now + self.lead_ns
            t_yield = now_ns() + 2_000_000
            while i_prep < n and due[i_prep] <= horizon:
                if pending and pending[0].due_ns - (now_ns() - t0) <= SPIN_NS:
                    break
                pending.append(self._prepare(i_prep))
                i_prep += 1
                if now_ns() > t_yield:  # let streams progress during a long preparation burst
                    await asyncio.sleep(0)
                    t_yield = now_ns() + 2_000_000
            if pending:
                wake = pending[0].due_ns
            elif i_prep < n:
                wake = int(due[i_prep]) - self.lead_ns
            else:
                break
            if wake > now_ns() - t0:
                if wake - (now_ns() - t0) > 2 * SPIN_NS:
                    await _first(sleep_until(t0 + wake), stopping.wait())
                else:  # short waits: no extra tasks, a stop is seen within ~1.5 ms anyway
                    await sleep_until(t0 + wake)
            else:
                await asyncio.sleep(0)

    def _fire(self, req: PreparedRequest, now_rel: int) -> None:
        res = self._make_result(req)
        lag = now_rel - req.due_ns
        if lag > self.stats.max_lag_ns:
            self.stats.max_lag_ns = lag
        task = asyncio.get_running_loop().create_task(self._one(req, res))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._task_done)
        self.stats.sent += 1
        self.next_index = req.index + 1
        self.obs.on_sent(req)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _one(self, req: PreparedRequest, res: RequestResult) -> None:
        try:
            await self._send(req, res)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            if res.outcome == Outcome.NOT_STARTED.value:  # cancelled before the client began
                res.outcome, res.error_kind = Outcome.CANCELLED.value, ErrorKind.CANCELLED.value
            self._deliver(res)
            raise
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

    def cancel_in_flight(self) -> None:
        """Cancel every in-flight request now (second SIGTERM)."""
        self._stopping.set()
        for t in list(self._tasks):
            t.cancel()

    def _record_not_started(self) -> None:
        sched = self.schedule
        for i in range(self.next_index, len(sched)):
            res = self._unsent_result(i)
            self.stats.not_started += 1
            self._deliver(res)


async def _first(*coros) -> None:
    """Wait until the first of ``coros`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def _default_result(req: PreparedRequest) -> RequestResult:
    return RequestResult(row=req.row, loop=req.loop, input_length=req.input_length,
                         output_length=req.output_length, prompt_len_sent=req.prompt_len,
                         max_tokens=req.max_tokens, due_ns=req.due_ns)
