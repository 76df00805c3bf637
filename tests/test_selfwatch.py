"""The "replayer is the bottleneck" warning: it names what is saturated."""

from __future__ import annotations

import asyncio
import logging
import time

from batches import TimeBatch
from eventlog import feed_of
from prometheus_client import CollectorRegistry
from senders import CallSender

import replayer.observe.selfwatch as selfwatch
from replayer.core import QUIET, PreparedRequest, RequestResult, now_ns
from replayer.observe import ReplayerMetrics
from replayer.observe.looplag import EventLoopLagMonitor
from replayer.observe.selfwatch import Reading, network_bound, saturated
from replayer.plan import Planner, Timeline, iter_schedule
from replayer.run.live import RunState, watch_self as _watch_self
from replayer.send import Dispatcher


def test_each_saturated_part_is_named_with_its_numbers():
    idle = Reading(wall_s=10.0, cpu_s=1.0, sent=100)
    assert saturated(idle, Reading(wall_s=11.0, cpu_s=1.2, sent=200), loop_lag_ms=3) == []
    busy = Reading(wall_s=11.0, cpu_s=1.97, sent=300, prepared_late=40, fired_by_loop=25, gc_s=0.1, launcher_late_ms=80)
    parts = saturated(idle, busy, loop_lag_ms=120)
    assert parts == [
        "CPU (97% of a core)",
        "event loop (stalled up to 120 ms: stream reads and callbacks)",
        "request preparation (40 of 200 requests sent had their body built after their due time)",
        "hand-over to the launcher process (25 of 200 requests written by the event loop at or after their due time)",
        "launcher process (wrote up to 80 ms past a due time)",
        "garbage collection (100 ms in 1.0 s)",
    ]


def test_the_network_send_is_named_when_requests_waited_for_the_socket_to_take_their_bytes():
    prev = Reading(wall_s=10.0, cpu_s=1.0, sent=100, send_waited=4)
    # short waits are a socket buffer filling and emptying, not a link that falls behind
    assert saturated(prev, Reading(wall_s=11.0, cpu_s=1.1, sent=110, send_waited=9, send_wait_max_ms=20), 3) == []
    parts = saturated(prev, Reading(wall_s=11.0, cpu_s=1.1, sent=110, send_waited=10, send_wait_max_ms=840), 3)
    assert parts == [
        "network send (6 requests waited up to 840 ms for the socket to take their bytes, 10 sent in 1.0 s: "
        "the link to the target is slower than the requests' bytes)"
    ]
    one = saturated(prev, Reading(wall_s=11.0, sent=100, send_waited=5, send_wait_max_ms=60), 3)
    assert one == [
        "network send (1 request waited up to 60 ms for the socket to take its bytes, 0 sent in 1.0 s: "
        "the link to the target is slower than the requests' bytes)"
    ]
    # the link alone is the bottleneck only when nothing else is named
    assert network_bound(parts)
    assert not network_bound([]) and not network_bound(["CPU (97% of a core)", *parts])


def test_a_replay_behind_because_of_the_link_is_told_so_not_to_add_workers():
    readings = iter(
        [Reading(wall_s=0.0), Reading(wall_s=0.05, sent=5, send_waited=3, send_wait_max_ms=900)]
        + [Reading(wall_s=0.05 * k, sent=5, send_waited=3) for k in range(2, 100)]
    )
    state = RunState()
    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    async def main():
        handler = Said(logging.INFO)
        logging.getLogger("replayer").addHandler(handler)
        state.watch_max_lag_ms = 900.0  # a request dispatched 900 ms late in the first interval
        task = asyncio.ensure_future(
            _watch_self(state, ReplayerMetrics(CollectorRegistry()), every_s=0.05, probe=lambda: next(readings))
        )
        try:
            for _ in range(1000):  # (10 s at most)
                if said:
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            logging.getLogger("replayer").removeHandler(handler)

    asyncio.run(main())
    assert "saturated: network send (3 requests waited up to 900 ms" in said[0]
    assert "the link to the target is the bottleneck, not the replayer's resources" in said[0]
    assert "--workers" not in said[0]


def test_a_replayer_starved_of_its_loop_says_so_while_behind_and_names_the_parts():
    # an artificially starved loop: a callback blocks it for 60 ms a turn (stream reads piling up),
    # with 200 requests due 5 ms apart: each turn finds a dozen overdue, built late, sent late. The
    # self-watch (a check every 0.2 s) warns while the run is still behind, naming the event loop
    # and the preparation, and says it again only when the parts saturated change
    timeline = Timeline(1.0)
    state = RunState()
    said: list[tuple[str, int]] = []  # (message, requests sent when it was logged)
    n = 200

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

    async def main():
        loop = asyncio.get_running_loop()
        metrics = ReplayerMetrics(CollectorRegistry())
        t0 = now_ns() + 100_000_000
        done = asyncio.Event()

        async def send(req, res):
            res.outcome = "success"
            state.watch_max_lag_ms = max(state.watch_max_lag_ms, (now_ns() - t0 - req.due_ns) / 1e6)

        def hog():
            time.sleep(0.06)
            if not done.is_set():
                loop.call_soon(hog)

        d = Dispatcher(
            feed_of(
                iter_schedule(lambda: [TimeBatch([5 * i for i in range(n)])]),
                prepare,
                lambda sb, j: RequestResult(row=int(sb.rows[j])),
            ),
            Planner(timeline),
            CallSender(send),
            QUIET,
            t0_ns=t0,
        )

        class Said(logging.Handler):
            def emit(self, record):
                said.append((record.getMessage(), d.sent))

        handler = Said(logging.INFO)
        logging.getLogger("replayer").addHandler(handler)
        tasks = [
            asyncio.ensure_future(EventLoopLagMonitor(metrics, interval_s=0.01).run()),
            asyncio.ensure_future(
                _watch_self(state, metrics, every_s=0.2, probe=lambda: selfwatch.read(d), repeat_s=3600)
            ),
        ]
        loop.call_soon(hog)
        try:
            await asyncio.wait_for(d.run(), 120)
        finally:
            done.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            logging.getLogger("replayer").removeHandler(handler)
        return d

    d = asyncio.run(main())
    assert d.sent == n and d.prepared_late > 0
    behind = [(m, sent) for m, sent in said if "behind schedule" in m]
    assert behind, said
    first, sent_then = behind[0]
    assert sent_then < n  # while the run was still going
    assert "saturated: " in first and "event loop (stalled up to" in first
    assert "request preparation (" in first and "built after their due time" in first
    parts = [m.split("saturated: ")[1].split("; its own")[0] for m, _ in behind]
    names = [[p.split(" (")[0] for p in x.split("; ")] for x in parts]
    assert all(a != b for a, b in zip(names, names[1:]))  # repeated only when the list changes
