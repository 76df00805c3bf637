"""TCP options of the client's connections, read back from the kernel on a real stream, and when
the kernel has taken a request's bytes (its dispatch)."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from aiohttp import web
from faultserver import run_delay_ns

from replayer.core import PreparedRequest, Quiet, RequestResult, now_ns
from replayer.http import Client
from replayer.http.launcher import Launcher
from replayer.payload import PayloadBuilder, PromptBuilder
from replayer.sim import SimConfig, SimServer


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux only")
@pytest.mark.parametrize("delayed", [False, True], ids=["default", "delayed-ack"])
def test_delayed_ack_turns_quick_acks_off_for_the_response(delayed):
    # getsockopt(TCP_QUICKACK) is 1 unless the socket is in the kernel's delayed-ACK ("pingpong")
    # mode; it is read mid-stream, with the response's tokens arriving every 20 ms
    async def main():
        sim = SimServer(SimConfig(model="m", ttft_base_ms=2, itl_base_ms=20))
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
        sim = SimServer(SimConfig(model="m", ttft_base_ms=200, itl_base_ms=1))
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

            # 40 at once open 40 connections, fewer where a loaded machine sends the last ones after
            # the first ended (they reuse those): what matters is more than the spares
            async with Client(url, t0_ns=now_ns()) as kept:  # the default expiry (60 s): nothing goes yet
                opened = await backlog(kept)
                assert opened > kept.pool.spare_target
                await kept.send(req(40), req(40).new_result(0))
                assert len(kept.pool._idle) >= opened and kept.open_connections >= opened
            async with Client(url, t0_ns=now_ns(), idle_expiry_s=0.05) as c:
                assert await backlog(c) > c.pool.spare_target
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


_ANSWER = {
    "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def _kernel_holds_at_most() -> int:
    """A bound on the request bytes the kernel can take before the server reads any: the client
    socket's send buffer (at most ``tcp_wmem``'s maximum, the buffer grown by Linux) and a
    generous allowance for a segment the kernel takes beyond it and for the server's small
    receive buffer and aiohttp's read buffer."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        wmem_max = int(f.read().split()[2])
    return wmem_max + (4 << 20)


@pytest.mark.skipif(not os.path.exists("/proc/sys/net/ipv4/tcp_wmem"), reason="reads Linux's tcp_wmem")
@pytest.mark.parametrize("writer", ["loop", "launcher"])
def test_a_request_the_socket_cannot_take_whole_is_dispatched_when_its_last_byte_is(writer):
    """A server that reads a request's body only 0.5 s after its headers arrived (an aiohttp
    handler that sleeps first: the server's kernel and aiohttp buffer a little, then the client's
    socket stops taking bytes, as on a link slower than the bytes). The body is larger than
    what the kernels can hold, so its last byte cannot be handed to the client's kernel before
    the handler reads: the request's dispatch (its dispatch lag) is at least 0.5 s after its
    first byte (``sent_ns``), and the wait is ``send_wait_ms`` and the client's self-watch
    count, whether the event loop or the launcher process wrote the request. A small request
    the socket takes whole keeps the stamp just before its write: dispatch lag = sent - due,
    ``send_wait_ms`` 0."""
    hold_s = 0.5

    async def handler(request: web.Request) -> web.Response:
        if request.content_length > 1000:
            await asyncio.sleep(hold_s)
        await request.read()
        return web.json_response(_ANSWER)

    async def main():
        app = web.Application(client_max_size=1 << 40)
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # (accepted sockets inherit it)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        launcher = Launcher(priority="default") if writer == "launcher" else None
        try:
            dispatched = []

            class Dispatched(Quiet):  # the event stream the client tells each dispatch
                def dispatched(self, res: RequestResult) -> None:
                    dispatched.append((res.row, now_ns() - c.t0_ns))

            async with Client(url, t0_ns=now_ns(), events=Dispatched()) as c:
                if launcher is not None:
                    launcher.start()
                    await launcher.ready()
                    c.use_launcher(launcher)
                await c.warm_up(2)

                async def send(row: int, size: int):
                    body = b'{"model":"m","prompt":"' + b"x" * size + b'","max_tokens":1}'
                    due = now_ns() - c.t0_ns + 30_000_000
                    req = PreparedRequest(
                        index=row, row=row, due_ns=due, body=body, input_length=1, output_length=1, prompt_len=1,
                        max_tokens=1,
                    )  # fmt: skip
                    res = req.new_result(0)
                    reserved = c.reserve(req, res) if launcher is not None else None
                    if reserved is not None:
                        c.launch(c.t0_ns + due, req, res, reserved)
                    else:
                        await asyncio.sleep(0.03)
                    return await asyncio.wait_for(c.send(req, res, reserved), 60), reserved is not None

                small, small_launched = await send(0, 100)
                big, big_launched = await send(1, 2 * _kernel_holds_at_most())
                return small, big, small_launched and big_launched, dispatched, c.send_waited, c.take_send_wait_max_ms()
        finally:
            if launcher is not None:
                launcher.stop()
            await runner.cleanup()

    small, big, launched, dispatched, waited, wait_max_ms = asyncio.run(main())
    assert small.outcome == big.outcome == "success", (small.error, big.error)
    assert launched == (writer == "launcher")  # (each request went the way the case says)
    # the socket took the small request whole: its dispatch is its send, as before
    assert small.send_wait_ms == 0.0
    assert small.dispatch_lag_ms == (small.sent_ns - small.due_ns) / 1e6
    # the big one: dispatched when its last byte was handed to the kernel, after the server's hold
    assert big.send_wait_ms >= hold_s * 1e3, big.send_wait_ms
    assert big.dispatch_lag_ms == pytest.approx((big.sent_ns - big.due_ns) / 1e6 + big.send_wait_ms, abs=1e-3)
    assert [row for row, _ in dispatched] == [0, 1]  # dispatched once each, the big one at its dispatch
    assert dispatched[1][1] >= big.sent_ns + hold_s * 1e9
    assert waited == 1 and wait_max_ms == big.send_wait_ms  # the self-watch's counts
