"""The launcher thread writes due requests at their due time; the loop keeps the responses."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from replayer.client import Client
from replayer.clock import Anchor, now_ns
from replayer.dispatcher import Dispatcher
from replayer.launcher import Launcher
from replayer.payload import PayloadBuilder, PreparedRequest
from replayer.prompts import PromptBuilder
from replayer.result import RequestResult
from replayer.schedule import Timeline, iter_schedule
from replayer.sim import SimConfig, SimServer

PROMPTS = PromptBuilder(seed=0, block_size=16)


def test_calls_come_in_time_order_and_never_early():
    launcher = Launcher(priority="default")
    launcher.start()
    calls: list[tuple[int, int]] = []
    done = threading.Event()
    t0 = now_ns() + 20_000_000
    ats = [t0 + k * 3_000_000 for k in (5, 0, 3, 1, 4, 2)]  # submitted out of order
    def call(at: int) -> None:
        calls.append((at, now_ns()))
        if len(calls) == 6:
            done.set()

    for at in ats:
        launcher.submit(at, lambda at=at: call(at))
    assert done.wait(5)
    launcher.stop()
    assert [a for a, _ in calls] == sorted(ats)
    assert all(called >= at for at, called in calls)
    assert launcher.launched == 6 and launcher.pending() == 0


def test_a_burst_due_at_one_instant_starts_every_launch_before_any_follow_up():
    launcher = Launcher(priority="default")
    launcher.start()
    calls: list[tuple[str, int, int]] = []
    done = threading.Event()
    at = now_ns() + 20_000_000
    later = at + 30_000_000

    def launch(i: int, due: int):
        calls.append(("head", i, now_ns() - due))

        def follow() -> None:
            calls.append(("body", i, now_ns() - due))
            if len(calls) == 2 * 6:
                done.set()
        return follow

    for i in range(5):
        launcher.submit(at, lambda i=i: launch(i, at))
    launcher.submit(later, lambda: launch(5, later))  # not due with the burst: its own turn
    assert done.wait(5)
    launcher.stop()
    assert [c[:2] for c in calls] == ([("head", i) for i in range(5)] + [("body", i) for i in range(5)]
                                      + [("head", 5), ("body", 5)])
    assert all(lag >= 0 for _, _, lag in calls)
    assert launcher.launched == 6


class _Batch:
    def __init__(self, ts_ms: list[int]) -> None:
        self.timestamp_ns = np.array(ts_ms, dtype=np.int64) * 1_000_000
        self.row_offset = 0
        self.session_id = None

    def __len__(self) -> int:
        return len(self.timestamp_ns)


def _replay_through_the_launcher(ts: list[int], *, warm: int, expect: bool = True, start_s: float = 0.2):
    """Replay ``ts`` (ms) against the simulator with the launcher; (results, launched count)."""
    payload = PayloadBuilder("m")
    timeline = Timeline(1.0)

    def prepare(sb, j):
        i = int(sb.rows[j])
        return PreparedRequest(index=j, row=i, due_ns=timeline.due(int(sb.trace_ns[j])),
                               body=payload.body(PROMPTS.prompt_json([i], 16), 4), input_length=16,
                               output_length=4, prompt_len=16, max_tokens=4, trace_ns=int(sb.trace_ns[j]))

    async def main():
        sim = SimServer(SimConfig(ttft_base_ms=2, itl_base_ms=1))
        url = await sim.start()
        launcher = Launcher(priority="default")
        try:
            async with Client(url, t0_ns=now_ns()) as c:
                await c.warm_up(warm)
                anchor = Anchor.at(start_s)
                c.t0_ns = anchor.t0_ns
                results: list[RequestResult] = []
                d = Dispatcher(iter_schedule(lambda: [_Batch(ts)]), prepare, c.send, results.append,
                               t0_ns=anchor.t0_ns, timeline=timeline,
                               unsent=lambda sb, j: RequestResult(row=int(sb.rows[j])),
                               reserve=c.reserve, launcher=launcher, write=c.write_reserved,
                               expect=c.expect if expect else None)
                launcher.start()
                await asyncio.wait_for(d.run(), 20)
                return results, launcher.launched
        finally:
            launcher.stop()
            await sim.stop()

    return asyncio.run(main())


def test_a_replay_through_the_launcher_sends_every_request_on_its_due_time():
    ts = [0, 0, 0, 15, 30, 30, 45, 60, 75, 90]
    results, launched = _replay_through_the_launcher(ts, warm=8)
    assert len(results) == len(ts) and all(r.outcome == "success" for r in results)
    assert launched == len(ts)                          # every write went through the thread
    assert all(r.sent_ns >= r.due_ns for r in results)  # never early
    assert all(r.completion_tokens == 4 and r.ttft_ms > 0 for r in results)


def test_a_reserved_request_whose_connection_closed_fails_as_a_disconnect():
    async def main():
        sim = SimServer(SimConfig())
        url = await sim.start()
        try:
            async with Client(url, t0_ns=now_ns()) as c:
                await c.warm_up(1)
                body = PayloadBuilder("m").body(PROMPTS.prompt_json([1], 16), 2)
                req = PreparedRequest(index=0, row=0, due_ns=0, body=body, input_length=16, output_length=2,
                                      prompt_len=16, max_tokens=2)
                res = req.new_result(0)
                reserved = c.reserve(req, res)
                assert reserved is not None
                reserved[0]._abort()                     # the socket goes away before the write
                c.write_reserved(req, res, reserved)
                return await asyncio.wait_for(c.send(req, res, reserved), 5)
        finally:
            await sim.stop()

    res = asyncio.run(main())
    assert (res.outcome, res.error_kind) == ("failed", "disconnect")  # recorded, no hang, no crash
    assert res.error


def test_connections_for_a_burst_larger_than_the_pool_are_opened_ahead():
    # one warm connection, then 24 requests due at one instant: the dispatcher counts the demand
    # ahead (Client.expect), so every request finds a connection at its hand-over and goes
    # through the launcher (connect_ms 0: no handshake at the due time)
    ts = [300] * 24
    results, launched = _replay_through_the_launcher(ts, warm=1)
    assert len(results) == 24 and all(r.outcome == "success" for r in results)
    assert launched == 24 and all(r.connect_ms == 0.0 for r in results)
    # without the demand count most of the burst waits for connections opened at its due time
    results, launched = _replay_through_the_launcher(ts, warm=1, expect=False)
    assert all(r.outcome == "success" for r in results) and launched < 24
