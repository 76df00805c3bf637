"""A real aiohttp HTTP server on 127.0.0.1 that plays byte transcripts, with fault knobs (tests only).

A **transcript** is ``[(ms, bytes), ...]``: item ``(ms, b)`` is written as ONE transport write
(``StreamResponse.write``, which also drains) at ``t0 + ms``, where ``t0`` is the moment the
request body was fully received (``time.perf_counter_ns``, the same clock as
``replayer.core.clock.now_ns``). This is the convention of ``shared/cases/client-faults.md``
("t = 0 is the moment the last byte of the request is written"). Deadlines are absolute offsets
from ``t0`` (never chained sleeps), so a late write does not delay the next one's deadline.

Instead of bytes an item may carry one of the markers:

* ``ABORT``: abort the TCP connection at that time (RST, no terminating chunk: the client sees a
  mid-stream disconnect);
* ``HANG``: stop writing and keep the connection open until the client goes away or the server
  stops (a stall longer than any read timeout).

A stall of N s is simply a gap of N*1000 ms between two items.

What to play for a request is a ``Plan`` (status, content type, delay before headers, transcript
or whole body). ``FaultServer(plan)`` takes one ``Plan`` (used for every request), a list of plans
(a queue: the k-th request received gets the k-th plan; the last one repeats), or a callable
``f(request_json) -> Plan`` (``request_json`` is the parsed JSON body, ``None`` if not JSON).

Observations: ``received`` (one ``Received`` per request: raw body, parsed JSON, ``t0_ns``),
``active``/``peak_active`` (requests inside the handler, i.e. concurrent HTTP/1.1 connections with
a request in flight), ``peak_connections`` (open TCP connections seen by the server). Each
``Received`` also records when every write was actually made (``write_start_ns``,
``wrote_ms(ms)``): under load the server writes late, so a test compares the client's
measurements with what the server actually did, not with the transcript's planned ms; and
``run_delays``, samples of the server loop thread's run-queue wait (``run_delay_ns()``: time the
machine kept the thread off the CPU while it was ready), the client's too when it shares the loop.

Three ways to run it:

* ``async with FaultServer(plan) as srv:`` in the test's own loop (simplest; server and client
  share one loop, fine for a few requests);
* ``with ThreadedFaultServer(plan) as srv:`` from sync code: a daemon thread with its own loop;
* ``with ProcessFaultServer(plan) as srv:`` in a child process (uvloop) with its own core, like a
  real target: use it for load (B24: 300 streams), where a server sharing the client's loop or
  GIL would add its own queueing to the client's measurements. The plan must be picklable (a
  ``Plan``, a list, or a module-level function); the observations (``received``, ``peak_active``,
  ``peak_connections``) are copied back when the block exits.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import orjson
from aiohttp import web

__all__ = [
    "ABORT",
    "HANG",
    "Plan",
    "Received",
    "FaultServer",
    "ThreadedFaultServer",
    "sse",
    "choice",
    "usage_event",
    "DONE",
    "huge_event",
    "PlanSource",
    "ProcessFaultServer",
    "peak_concurrency",
    "run_delay_ns",
]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ABORT = _Marker("ABORT")  # abort the connection (TCP RST) at this time
HANG = _Marker("HANG")  # stop writing; keep the connection open until the client leaves

Item = tuple[float, Union[bytes, _Marker]]


# ---- building blocks for transcripts ------------------------------------------------------


def sse(obj: Any) -> bytes:
    """``data: <json>\\n\\n`` for a JSON-able object (or a str/bytes payload taken verbatim)."""
    if isinstance(obj, bytes):
        payload = obj
    elif isinstance(obj, str):
        payload = obj.encode()
    else:
        payload = orjson.dumps(obj)
    return b"data: " + payload + b"\n\n"


def choice(text: str, finish: str | None = None, usage: dict | None = None) -> bytes:
    """One completions choice event (``/v1/completions`` streaming chunk)."""
    obj: dict[str, Any] = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return sse(obj)


def usage_event(prompt_tokens: int, completion_tokens: int) -> bytes:
    """A usage-only event (``choices: []``)."""
    return sse(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


DONE = b"data: [DONE]\n\n"


def huge_event(n_bytes: int = 1 << 20, finish: str | None = "length") -> bytes:
    """One choice event whose ``data`` line is about ``n_bytes`` long (text of 'x' * ...)."""
    return choice("x" * max(1, n_bytes - 80), finish)


# ---- plans --------------------------------------------------------------------------------


@dataclass
class Plan:
    """What to play for one request.

    ``status``/``content_type``/``headers``: the response head. ``headers_delay_ms``: time after t0
    before the head is sent (the connection stays silent until then). ``body``: when not None,
    sent as a whole (Content-Length) response at ``headers_delay_ms``; else ``transcript`` is
    streamed (chunked transfer encoding) with each item's timing, then the response is ended
    (unless an ``ABORT``/``HANG`` marker came first). ``close_at_ms``: shorthand for appending
    ``(close_at_ms, ABORT)``.
    """

    transcript: Sequence[Item] = ()
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)
    headers_delay_ms: float = 0.0
    body: bytes | None = None
    close_at_ms: float | None = None

    def items(self) -> list[Item]:
        out = list(self.transcript)
        if self.close_at_ms is not None:
            out.append((self.close_at_ms, ABORT))
        return out


PlanSource = Union[Plan, Sequence[Plan], Callable[[Any], Plan]]


@dataclass
class Received:
    """One request as received: raw ``body`` bytes, ``json`` (parsed, or None), ``t0_ns``
    (perf_counter_ns when the body was fully read; CLOCK_MONOTONIC, comparable across processes
    on Linux), ``path``, ``headers``, and ``write_ns`` (perf_counter_ns after each transcript
    write returned: how late the server itself was), ``end_ns`` (when the handler finished).

    What the server actually did, item by item (a loaded machine writes late): ``write_start_ns``
    (perf_counter_ns just before each transcript write, i.e. before its first byte could reach
    the client) and ``write_at_ms`` (that item's planned ms), both parallel to ``write_ns``;
    ``head_ns`` (just before the response head, or a whole ``body`` response, was handed to the
    transport); ``abort_ns`` (just before an ``ABORT`` reset the connection). ``wrote_ms(ms)``
    gives the actual time of the item planned at ``ms``, in ms after ``t0_ns``. ``run_delays``:
    ``(perf_counter_ns, run_delay_ns())`` samples of the handling thread at ``t0_ns``, before each
    write and at the end (a test may add its own, from the same thread, with ``sample()``);
    ``off_cpu_ms(start_ns, end_ns)`` is the run-queue wait they show over that window.
    ``client_sent_ns``: left to the test, which may record the client's own send time there."""

    body: bytes
    json: Any
    t0_ns: int
    path: str
    headers: dict[str, str]
    write_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    write_start_ns: list[int] = field(default_factory=list)
    write_at_ms: list[float] = field(default_factory=list)
    head_ns: int | None = None
    abort_ns: int | None = None
    run_delays: list[tuple[int, int]] = field(default_factory=list)
    client_sent_ns: int | None = None  # the client's send (perf_counter_ns), if the test sets it

    def sample(self) -> None:
        """Add a ``(perf_counter_ns, run_delay_ns())`` sample of the calling thread."""
        self.run_delays.append((time.perf_counter_ns(), run_delay_ns()))

    def off_cpu_ms(self, start_ns: int, end_ns: int) -> float:
        """Run-queue wait (ms) of the sampled thread from the last sample at or before
        ``start_ns`` to the first at or after ``end_ns``: how long the machine kept it from
        running in that window. ``ValueError`` when no samples cover the window."""
        before = [d for t, d in self.run_delays if t <= start_ns]
        after = [d for t, d in self.run_delays if t >= end_ns]
        if not before or not after:
            raise ValueError(
                f"no run-delay samples cover {start_ns}..{end_ns} (samples at {[t for t, _ in self.run_delays]})"
            )
        return (min(after) - max(before)) / 1e6

    def wrote_ns(self, ms: float) -> int:
        """perf_counter_ns just before the server wrote the transcript item planned at ``ms`` (the
        first such item); ``KeyError`` if it was never written."""
        for at, start in zip(self.write_at_ms, self.write_start_ns):
            if at == ms:
                return start
        raise KeyError(f"no transcript item planned at {ms} ms was written (written: {self.write_at_ms})")

    def wrote_ms(self, ms: float) -> float:
        """When the item planned at ``ms`` was actually written, in ms after ``t0_ns`` (>= ``ms``:
        deadlines are never early; more when the server was late)."""
        return (self.wrote_ns(ms) - self.t0_ns) / 1e6


def peak_concurrency(received: Sequence[Received]) -> int:
    """Most requests in flight at once (between body received and handler end) among ``received``."""
    ev = sorted(
        [(r.t0_ns, 1) for r in received] + [(r.end_ns or 2**63, -1) for r in received], key=lambda e: (e[0], e[1])
    )
    peak = cur = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    return peak


_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def stolen_ns() -> int:
    """CPU time the hypervisor has stolen from this virtual machine so far, in ns, all CPUs
    together (Linux ``/proc/stat``, the ``cpu`` line's 8th value, in clock ticks; 0 where that is
    unavailable). A thread does not see stolen time as run-queue wait: to it, it was running."""
    try:
        with open("/proc/stat", "rb") as f:
            return int(f.readline().split()[8]) * _TICK_NS
    except (OSError, IndexError, ValueError):
        return 0


def run_delay_ns() -> int:
    """The calling thread's time off the CPU so far, in ns: its run-queue wait (time it was ready
    to run while the machine ran something else: Linux ``/proc/thread-self/schedstat``, 2nd
    field) plus the machine's stolen time (``stolen_ns``: of every CPU, an over-count for one
    thread, by clock ticks); 0 where neither is available. About 30-150 us a call."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) + stolen_ns()
    except (OSError, IndexError, ValueError):
        return stolen_ns()


async def _sleep_until(deadline_ns: int) -> None:
    """Sleep until perf_counter_ns() >= deadline_ns (timer, then a short yield-spin: ~0.1 ms)."""
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        if left > 1_500_000:
            await asyncio.sleep((left - 1_000_000) / 1e9)
        else:
            await asyncio.sleep(0)


class FaultServer:
    """The transcript-playing server (see the module docstring). ``await start()`` -> base URL;
    ``await stop()``; or ``async with``. Routes: ``POST`` any path plays a plan; ``GET /health``
    answers 200; ``GET /v1/models`` lists one model, ``m``."""

    def __init__(self, plan: PlanSource | None = None, *, sample_run_delay: bool = True) -> None:
        self.plan = plan if plan is not None else Plan()
        self.sample_run_delay = sample_run_delay  # fill Received.run_delays (~0.1 ms a write)
        self.received: list[Received] = []
        self.active = 0
        self.peak_active = 0
        self.peak_connections = 0
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._handlers: set[asyncio.Task] = set()
        self._n = 0

    def _choose(self, req_json: Any) -> Plan:
        p = self.plan
        i = self._n
        self._n += 1
        if isinstance(p, Plan):
            return p
        if callable(p):
            return p(req_json)
        return p[min(i, len(p) - 1)]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)  # so a whole `replayer run` finds it ready
        app.router.add_post("/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096)
        await site.start()
        self._runner = runner
        self.url = f"http://{host}:{runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        for t in list(self._handlers):
            t.cancel()
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> "FaultServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        self._handlers.add(task)
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        server = self._runner.server if self._runner is not None else None
        if server is not None:
            self.peak_connections = max(self.peak_connections, len(server.connections))
        try:
            body = await request.read()
            t0 = time.perf_counter_ns()
            try:
                req_json = orjson.loads(body) if body else None
            except orjson.JSONDecodeError:
                req_json = None
            rec = Received(body, req_json, t0, request.path, dict(request.headers))
            if self.sample_run_delay:
                rec.run_delays.append((t0, run_delay_ns()))
            self.received.append(rec)
            try:
                return await self._play(request, self._choose(req_json), t0, rec.write_ns, rec)
            finally:
                rec.end_ns = time.perf_counter_ns()
                if self.sample_run_delay:
                    rec.sample()
        finally:
            self.active -= 1
            self._handlers.discard(task)

    async def _play(
        self, request: web.Request, plan: Plan, t0: int, write_ns: list[int], rec: Received | None = None
    ) -> web.StreamResponse:
        rec = rec if rec is not None else Received(b"", None, t0, request.path, {}, write_ns)
        if plan.headers_delay_ms:
            await _sleep_until(t0 + int(plan.headers_delay_ms * 1e6))
        if plan.body is not None:
            items = plan.items()
            if items and items[0][1] is ABORT:  # abort before any byte of the response
                rec.abort_ns = time.perf_counter_ns()
                request.transport.abort()
                raise asyncio.CancelledError  # nothing more to do for this handler
            rec.head_ns = time.perf_counter_ns()
            return web.Response(
                status=plan.status, body=plan.body, headers={"Content-Type": plan.content_type, **plan.headers}
            )
        resp = web.StreamResponse(status=plan.status, headers={"Content-Type": plan.content_type, **plan.headers})
        rec.head_ns = time.perf_counter_ns()
        await resp.prepare(request)
        await resp.write(b"")  # flush the head now (aiohttp holds it until the first write)
        for ms, data in plan.items():
            await _sleep_until(t0 + int(ms * 1e6))
            if data is ABORT:
                rec.abort_ns = time.perf_counter_ns()
                tr = request.transport
                if tr is not None:
                    tr.abort()
                raise asyncio.CancelledError  # aiohttp must not try to end the response
            if data is HANG:
                await asyncio.Event().wait()  # until the client leaves / the server stops
            delay = run_delay_ns() if self.sample_run_delay else None
            start = time.perf_counter_ns()
            if delay is not None:
                rec.run_delays.append((start, delay))
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError):
                return resp  # the client went away
            write_ns.append(time.perf_counter_ns())
            rec.write_start_ns.append(start)
            rec.write_at_ms.append(ms)
        try:
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp


class ThreadedFaultServer:
    """A ``FaultServer`` running in a daemon thread with its own event loop, for sync code.

    ``with ThreadedFaultServer(plan) as srv:`` -> ``srv.url``, ``srv.server`` (the FaultServer:
    read ``received``/``peak_active`` after the requests are done)."""

    def __init__(self, plan: PlanSource | None = None) -> None:
        self.server = FaultServer(plan)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    def __enter__(self) -> "ThreadedFaultServer":
        ready = threading.Event()
        err: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self.url = loop.run_until_complete(self.server.start())
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.stop())
            loop.close()

        self._thread = threading.Thread(target=main, name="faultserver", daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


def _process_main(plan: PlanSource, conn) -> None:  # child process of ProcessFaultServer
    async def main() -> None:
        srv = FaultServer(plan, sample_run_delay=False)  # its thread is not the client's
        conn.send(await srv.start())
        loop = asyncio.get_running_loop()
        asked = asyncio.Event()
        loop.add_reader(conn.fileno(), asked.set)
        await asked.wait()
        loop.remove_reader(conn.fileno())
        os.set_blocking(conn.fileno(), True)  # the loop made it non-blocking; the reply is large
        conn.recv()
        conn.send({"received": srv.received, "peak_active": srv.peak_active, "peak_connections": srv.peak_connections})
        await srv.stop()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover
        asyncio.run(main())


class ProcessFaultServer:
    """A ``FaultServer`` in a child process (spawned; uvloop). ``with ProcessFaultServer(plan) as
    srv:`` -> ``srv.url``; after the block: ``srv.received``, ``srv.peak_active``,
    ``srv.peak_connections`` (copied from the child)."""

    def __init__(self, plan: PlanSource | None = None) -> None:
        self.plan = plan if plan is not None else Plan()
        self.url: str | None = None
        self.received: list[Received] = []
        self.peak_active = 0
        self.peak_connections = 0
        self._proc = None
        self._conn = None

    def __enter__(self) -> "ProcessFaultServer":
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_process_main, args=(self.plan, child), daemon=True)
        self._proc.start()
        self._conn = parent
        if not parent.poll(30):
            self._proc.kill()
            raise TimeoutError("fault server process did not start")
        self.url = parent.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.send("stats")
            if self._conn.poll(10):
                st = self._conn.recv()
                self.received = st["received"]
                self.peak_active = st["peak_active"]
                self.peak_connections = st["peak_connections"]
        finally:
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
