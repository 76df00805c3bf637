"""``--max-concurrency``: a whole replay (``run_replay``) against a real aiohttp server on
127.0.0.1 that counts the requests it holds and holds each one until ``peak`` of them are in at
once, then ``HOLD_S`` more (so each round of requests is known: no timing guess). Every value
checked follows from the order of events and the server's own holds, never from the machine's
speed."""

from __future__ import annotations

import asyncio
import json

import orjson
import pyarrow.parquet as pq
from aiohttp import web
from eventlog import feed_of
from inprocess import replay_against

from replayer.core import QUIET

ROWS = 6
HOLD_S = 0.2  # each request held this long once its round is complete


def _server(peak: int, seen: dict):
    """aiohttp app: ``/v1/models`` and a streaming ``/v1/completions`` that holds each request
    until ``peak`` are in at once, then ``HOLD_S``; ``seen``: the most held at once, arrivals.
    A request leaves the count before its last byte is written, so the client cannot see it
    end while the server still counts it."""
    cond = asyncio.Condition()
    seen.update(now=0, most=0, arrivals=0)

    async def models(_req):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(req):
        body = await req.json()
        async with cond:
            seen["now"] += 1
            seen["arrivals"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            cond.notify_all()
            await asyncio.wait_for(cond.wait_for(lambda: seen["now"] >= peak or seen["most"] >= peak), 30)
        await asyncio.sleep(HOLD_S)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        n = body["max_tokens"]
        u = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": len(body["prompt"]) + n}
        seen["now"] -= 1
        ev = {"id": "c", "choices": [{"index": 0, "text": "ab" * n, "finish_reason": "length"}], "usage": u}
        await resp.write(b"data: " + orjson.dumps(ev) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _replay(tmp_path, *, peak: int, **settings) -> tuple[dict, list[dict], dict]:
    trace = tmp_path / "t.jsonl"  # every row due at once
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [i]}) + "\n"
            for i in range(ROWS)
        )
    )
    seen: dict = {}

    summary = replay_against(_server(peak, seen), trace, tmp_path / "r", **settings)
    rows = sorted(pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist(), key=lambda r: r["sent_ns"])
    return summary, rows, seen


def test_the_cap_holds_at_the_server_and_the_wait_is_recorded_in_due_order(tmp_path):
    summary, rows, seen = _replay(tmp_path, peak=2, max_concurrency=2)
    assert seen["arrivals"] == ROWS and seen["most"] == 2  # never more than the cap at the server
    assert all(r["outcome"] == "success" for r in rows)
    first, rounds = rows[0], [rows[0:2], rows[2:4], rows[4:6]]
    ends = sorted(r["end_ns"] for r in rows)
    for k, batch in enumerate(rounds):
        for r in batch:
            if k == 0:  # a slot was free
                assert r["queue_wait_ms"] == 0.0
                continue
            # the j-th request to wait took the j-th slot freed: sent after j requests ended
            j = rows.index(r) - 2
            assert r["sent_ns"] >= ends[j]
            # it joined the queue before the first request went out (all fired together), and
            # each round holds HOLD_S after the one before it ended
            assert r["queue_wait_ms"] >= (ends[j] - first["sent_ns"]) / 1e6 >= k * HOLD_S * 1e3
            # the lag is the replayer's own: from the slot's release (not after ends[j]), plus
            # what it was late before the queue (no more than the first request's lag)
            assert r["dispatch_lag_ms"] <= (r["sent_ns"] - ends[j]) / 1e6 + first["dispatch_lag_ms"] + 1e-6
    for r in rows:  # the latencies from the due time include the wait (the wrk2 view)
        since_due = (r["sent_ns"] - r["due_ns"]) / 1e6
        assert abs(since_due - (r["queue_wait_ms"] + r["dispatch_lag_ms"])) < 1e-6
        assert abs(r["e2el_from_due_ms"] - (r["e2e_ms"] + since_due)) < 1e-3
        assert r["e2el_from_due_ms"] >= r["queue_wait_ms"] + r["e2e_ms"] - 1e-3
    cap = summary["concurrency_cap"]
    assert cap["max_concurrency"] == 2 and cap["requests"] == ROWS and cap["waited"] == 4
    assert cap["waited_share"] == 4 / ROWS
    assert cap["queue_wait_ms"]["max"] == max(r["queue_wait_ms"] for r in rows)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["concurrency_cap"] == cap


def test_without_a_cap_every_request_goes_at_once_and_no_wait_is_recorded(tmp_path):
    summary, rows, seen = _replay(tmp_path, peak=ROWS)
    assert seen["arrivals"] == ROWS and seen["most"] == ROWS  # the open loop: all in flight at once
    assert all(r["queue_wait_ms"] is None for r in rows)
    assert "concurrency_cap" not in summary


def test_status_and_the_console_say_when_the_cap_is_the_bottleneck():
    from batches import TimeBatch
    from rich.console import Console
    from test_dispatcher import FakeSender, VirtualClock, _prepare

    from replayer.core import RequestResult
    from replayer.observe.console import cap_line
    from replayer.plan import Planner, Timeline, iter_schedule
    from replayer.run.live import RunState, status
    from replayer.send import Dispatcher

    clock, timeline = VirtualClock(), Timeline(1.0)
    feed = feed_of(
        iter_schedule(lambda: [TimeBatch([0, 0, 0])]), _prepare(timeline), lambda sb, j: RequestResult(row=0)
    )
    sender = FakeSender(clock, block={0, 1, 2})
    d = Dispatcher(feed, Planner(timeline), sender, QUIET, t0_ns=0, clock=clock, max_concurrency=2)

    def text(st: dict) -> str:
        c = Console(width=200, record=True)
        c.print(cap_line(st))
        return c.export_text()

    async def main():
        task = asyncio.ensure_future(d.run())
        while d.queued == 0:
            await asyncio.sleep(0)
        capped = status(RunState(state="running"), d)
        d.cancel_in_flight()
        await task
        return capped

    st = asyncio.run(main())
    assert (st["max_concurrency"], st["in_flight"], st["queued"], st["concurrency_capped"]) == (2, 2, 1, True)
    assert "the cap is the bottleneck" in text(st) and "1 due requests waiting" in text(st)
    assert "bottleneck" not in text({**st, "queued": 0})
    assert cap_line({"in_flight": 3}) is None  # no cap: no line
    uncapped = Dispatcher(feed, Planner(timeline), sender, QUIET, t0_ns=0, clock=clock)
    assert "max_concurrency" not in status(RunState(), uncapped)
