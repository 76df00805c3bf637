"""Past saturation: a loop busy with stream reads does not set the send rate."""

from __future__ import annotations

import asyncio

import numpy as np

from replayer.clock import now_ns
from replayer.dispatcher import Dispatcher
from replayer.payload import PreparedRequest
from replayer.result import RequestResult
from replayer.schedule import Timeline, iter_schedule


class _Batch:
    def __init__(self, ts_ms: list[int]) -> None:
        self.timestamp_ns = np.array(ts_ms, dtype=np.int64) * 1_000_000
        self.row_offset = 0
        self.session_id = None

    def __len__(self) -> int:
        return len(self.timestamp_ns)


def _behind_on_a_saturated_loop(n: int) -> tuple[list[int], Dispatcher]:
    """``n`` requests, all overdue when the replay starts (anchored 1 s back), on a loop kept
    saturated by a callback that burns ~1 ms of CPU and reschedules itself (as a flood of stream
    reads would). Returns, per request in send order, the hog's turn count at its send."""
    timeline = Timeline(1.0)
    turns = [0]
    sends: list[int] = []

    def prepare(sb, j):
        t = int(sb.trace_ns[j])
        return PreparedRequest(index=j, row=j, due_ns=timeline.due(t), body=b"{}", input_length=16,
                               output_length=1, prompt_len=16, max_tokens=1, trace_ns=t)

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
        d = Dispatcher(iter_schedule(lambda: [_Batch(list(range(n)))]), prepare, send, lambda r: None,
                       t0_ns=now_ns() - 1_000_000_000, timeline=timeline,
                       unsent=lambda sb, j: RequestResult(row=int(sb.rows[j])))
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
    assert d.prepared_late == n   # every body was built after its due time: preparation was behind
