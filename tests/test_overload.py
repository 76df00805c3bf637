"""Past saturation: a loop busy with stream reads does not set the send rate."""

from __future__ import annotations

import asyncio

from batches import TimeBatch
from eventlog import feed_of
from senders import CallSender

from replayer.core import QUIET, PreparedRequest, RequestResult, now_ns
from replayer.plan import Planner, Timeline, iter_schedule
from replayer.send import Dispatcher


def _behind_on_a_saturated_loop(n: int) -> tuple[list[int], Dispatcher]:
    """``n`` requests, all overdue when the replay starts (anchored 1 s back), on a loop kept
    saturated by a callback that burns ~1 ms of CPU and reschedules itself (as a flood of stream
    reads would). Returns, per request in send order, the hog's turn count at its send."""
    timeline = Timeline(1.0)
    turns = [0]
    sends: list[int] = []

    def prepare(sb, j):
        t = int(sb.trace_ns[j])
        return PreparedRequest(
            index=j,
            row=j,
            due_ns=timeline.due(t),
            body=b"{}",
            input_length=16,
            output_length=1,
            prompt_len=16,
            max_tokens=1,
            trace_ns=t,
        )

    async def send(req, res):
        sends.append(turns[0])
        res.outcome = "success"

    async def main():
        loop = asyncio.get_running_loop()
        stop = False

        def hog():
            end = now_ns() + 1_000_000
            while now_ns() < end:
                pass
            turns[0] += 1
            if not stop:
                loop.call_soon(hog)

        loop.call_soon(hog)
        d = Dispatcher(
            feed_of(
                iter_schedule(lambda: [TimeBatch(list(range(n)))]),
                prepare,
                lambda sb, j: RequestResult(row=int(sb.rows[j])),
            ),
            Planner(timeline),
            CallSender(send),
            QUIET,
            t0_ns=now_ns() - 1_000_000_000,
        )
        try:
            await asyncio.wait_for(d.run(), 120)
        finally:
            stop = True
        return d

    d = asyncio.run(main())
    return sends, d


def test_overdue_requests_go_out_together_not_one_per_turn_of_a_busy_loop():
    n = 200
    sends, d = _behind_on_a_saturated_loop(n)
    assert len(sends) == n == d.sent
    # one request per turn before (~n turns of the hog between the first and the last send);
    # prepared together they fire in a few turns (2 ms of preparation a go, tiny bodies here)
    assert sends[-1] - sends[0] < n / 4, (sends[0], sends[-1])
    assert d.prepared_late == n  # every body was built after its due time: preparation was behind


def test_preparation_runs_through_the_lead_window_when_a_hand_over_is_due_every_millisecond():
    # 2,000 requests 1 ms apart, each handed to a (fake) launcher 50 ms ahead: bodies are built up
    # to the lead window (500 ms) ahead, not just in time for each hand-over, so a stall of the
    # loop finds a deep queue of prepared requests rather than an empty one
    timeline = Timeline(1.0)
    lead_ms: list[float] = []
    t0 = [0]

    def prepare(sb, j):
        t = int(sb.trace_ns[j])
        lead_ms.append((timeline.due(t) - (now_ns() - t0[0])) / 1e6)
        return PreparedRequest(
            index=j,
            row=j,
            due_ns=timeline.due(t),
            body=b"{}",
            input_length=16,
            output_length=1,
            prompt_len=16,
            max_tokens=1,
            trace_ns=t,
        )

    launched = []

    async def send(req, res, reserved=None):
        res.outcome = "success"

    async def main():
        t0[0] = now_ns() + 100_000_000
        sender = CallSender(send, ahead_ns=50_000_000, hand_over=lambda req, res, at: launched.append(at) or object())
        d = Dispatcher(
            feed_of(
                iter_schedule(lambda: [TimeBatch(list(range(2000)))]),
                prepare,
                lambda sb, j: RequestResult(row=int(sb.rows[j])),
            ),
            Planner(timeline, ahead_ns=sender.ahead_ns),
            sender,
            QUIET,
            t0_ns=t0[0],
        )
        await asyncio.wait_for(d.run(), 120)
        return d

    d = asyncio.run(main())
    # (a request the stalled process reached only after its due time is written by the loop)
    assert d.sent == 2000 == len(launched) + d.fired_by_loop
    lead_ms.sort()
    # before: ~50 ms (each body built just before its hand-over); the lead window is 500 ms
    assert lead_ms[len(lead_ms) // 2] > 250, lead_ms[::200]
