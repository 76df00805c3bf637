"""TCP options of the client's connections, read back from the kernel on a real stream."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from replayer.client import Client
from replayer.clock import now_ns
from replayer.payload import PayloadBuilder, PreparedRequest
from replayer.prompts import PromptBuilder
from replayer.sim import SimConfig, SimServer

from faultserver import run_delay_ns


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
                req = PreparedRequest(index=0, row=0, due_ns=0, body=body, input_length=16, output_length=10,
                                      prompt_len=16, max_tokens=10)
                before = run_delay_ns()  # the loop thread's run-queue wait (sim, client: one loop)
                task = asyncio.create_task(c.send(req, req.new_result(0)))
                await asyncio.sleep(0.1)
                (conn,) = [x for x in c._all if x.ex is not None]
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
