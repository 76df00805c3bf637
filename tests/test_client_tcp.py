"""TCP options of the client's connections, read back from the kernel on a real stream."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from faultserver import run_delay_ns

from replayer.build.payload import PayloadBuilder
from replayer.build.prompts import PromptBuilder
from replayer.core.clock import now_ns
from replayer.core.request import PreparedRequest
from replayer.http.client import Client
from replayer.sim import SimConfig, SimServer


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux only")
@pytest.mark.parametrize("delayed", [False, True], ids=["default", "delayed-ack"])
def test_delayed_ack_turns_quick_acks_off_for_the_response(delayed):
    # getsockopt(TCP_QUICKACK) is 1 unless the socket is in the kernel's delayed-ACK ("pingpong")
    # mode; it is read mid-stream, with the response's tokens arriving every 20 ms
    async def main():
        sim = SimServer(SimConfig(ttft_base_ms=2, itl_base_ms=20))
        url = await sim.start()
        try:
            async with Client(url, t0_ns=now_ns(), delayed_ack=delayed) as c:
                body = PayloadBuilder("m").body(PromptBuilder(block_size=16).prompt_json([1], 16), 10)
                req = PreparedRequest(
                    index=0, row=0, due_ns=0, body=body, input_length=16, output_length=10, prompt_len=16, max_tokens=10
                )
                before = run_delay_ns()  # the loop thread's run-queue wait (sim, client: one loop)
                task = asyncio.create_task(c.send(req, req.new_result(0)))
                await asyncio.sleep(0.1)
                (conn,) = [x for x in c.pool._all if x.ex is not None]
                with socket.socket(fileno=os.dup(conn.transport.get_extra_info("socket").fileno())) as s:
                    quick = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK)
                res = await task
                return quick, res, (run_delay_ns() - before) / 1e6
        finally:
            await sim.stop()

    quick, res, off_cpu_ms = asyncio.run(main())
    assert res.outcome == "success" and res.completion_tokens == 10 and len(res.itl_ms) == 9
    # the server sets TCP_NODELAY: no token waits for a delayed ACK (40 ms), however long the
    # machine kept the test's one thread off the CPU during the stream (0 on a quiet machine)
    assert max(res.itl_ms) < 35 + off_cpu_ms, (res.itl_ms, off_cpu_ms)
    assert quick == (0 if delayed else 1)


def test_idle_connections_beyond_the_spares_are_closed_once_unused_for_the_expiry():
    # a backlog opens a connection per request in flight; afterwards the pool must not keep them
    # all for the rest of a soak: those unused for idle_expiry_s go (the spares stay)
    async def main():
        sim = SimServer(SimConfig(ttft_base_ms=200, itl_base_ms=1))
        url = await sim.start()
        try:
            body = PayloadBuilder("m").body(PromptBuilder(block_size=16).prompt_json([1], 16), 2)

            def req(i):
                return PreparedRequest(
                    index=i, row=i, due_ns=0, body=body, input_length=16, output_length=2, prompt_len=16, max_tokens=2
                )

            async def backlog(c):
                res = await asyncio.gather(*(c.send(req(i), req(i).new_result(0)) for i in range(40)))
                assert all(r.outcome == "success" for r in res)
                return len(c.pool._idle)

            async with Client(url, t0_ns=now_ns()) as kept:  # the default expiry (60 s): nothing goes yet
                assert await backlog(kept) >= 40
                await kept.send(req(40), req(40).new_result(0))
                assert len(kept.pool._idle) >= 40 and kept.open_connections >= 40
            async with Client(url, t0_ns=now_ns(), idle_expiry_s=0.05) as c:
                assert await backlog(c) >= 40
                await asyncio.sleep(0.1)  # every connection now idle longer than the expiry
                res = await c.send(req(40), req(40).new_result(0))
                assert res.outcome == "success"
                assert len(c.pool._idle) == c.pool.spare_target == 8  # the spares stay, the just-used one among them
                assert c.open_connections == 8
                res = await c.send(req(41), req(41).new_result(0))  # the pool still serves
                assert res.outcome == "success" and res.completion_tokens == 2
        finally:
            await sim.stop()

    asyncio.run(main())
