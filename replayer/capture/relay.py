"""The fast path of the capture proxy: an upstream HTTP/1.1 connection that relays a response's
body to the client's socket from inside ``data_received``.

Why not aiohttp's client: each streamed chunk then costs a parser feed into a ``StreamReader``, a
task wake-up, a ``StreamResponse.write`` and its framing in Python; on W1 (~12,000 one-token
chunks/s at 10x) that made the proxy CPU-bound on a shared host and its queue grew to seconds.
Here one ``asyncio.Protocol`` per upstream connection parses the response with llhttp
(``httptools``, as ``replayer.http.client`` does) and, at the end of each read, writes the body bytes
it held at once to the client's socket (``downstream.ClientConnection.write``: one chunk frame,
the body's bytes unchanged): no task switch, no per-event work. Stream pieces are only handed to
the usage tracker (``usage``: counted and the last few kept). Connections are kept alive. A
response with neither a length nor chunks ends when the upstream closes; it goes to the client
chunked.

Why not the client's connection (``replayer.http.connection``), though both are one
``asyncio.Protocol`` over llhttp: the two do opposite work on each read. The client's measures
a response and keeps nothing of it: it stamps each event's arrival, decodes SSE into token
counts and usage, and enforces read and total timeouts, with its writes done by the launcher
process. The relay measures nothing of the response and keeps all of it: it writes the body's
bytes to another socket unchanged, frames, chunk sizes and all, at the end of each read. A
shared layer would put a branch on either hot path for what the other needs; the parser
(``httptools``) is the part they share.

With ``UpstreamPool(stamped=True)`` (``replayer record --stamp-responses``), plain-HTTP upstream
connections run on ``stamps.StampedTransport``: each read carries the kernel's receive stamp, and
the pool's ``observe_forward(ns)`` gets, for each read that reached the client, the time from
that stamp to the client's write (``metrics.ForwardDelay``, direction ``response``).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Callable

import httptools

from replayer.capture.stamps import StampedTransport, open_stamped

#: a non-streamed response body is read for its usage up to this size
MAX_BODY_PARSE = 64 << 20


class UpstreamGone(Exception):
    """The upstream connection failed or closed before the response ended."""


class Exchange:
    """One request's response as it comes: head (``head`` future: status, reason, headers),
    then the body relayed to ``client`` (a ``ClientConnection``, set once the client's head is written;
    pieces that come earlier wait in ``pending``), ``done`` when the message ends."""

    __slots__ = (
        "head",
        "done",
        "client",
        "pending",
        "chunked",
        "acc",
        "sse",
        "buf",
        "bytes_out",
        "client_gone",
        "status",
        "reason",
        "headers",
        "got_bytes",
        "conn",
        "until_close",
        "on_head",
        "on_end",
        "keep",
        "ended",
        "writes",
    )

    def __init__(self, acc) -> None:
        self.conn: UpstreamConnection | None = None
        loop = asyncio.get_running_loop()
        self.head: asyncio.Future = loop.create_future()
        self.done: asyncio.Future = loop.create_future()
        self.client = None
        self.pending: list[bytes] = []
        self.chunked = True
        self.acc = acc
        self.sse = False
        self.buf: bytearray | None = None
        self.bytes_out = 0
        self.client_gone = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[str, str]] = []
        self.got_bytes = False
        self.until_close = False  # the body ends when the upstream closes
        self.on_head: Callable[[], None] | None = (
            None  # called in the read that completed the response head (writes the client's)
        )
        self.keep = True  # the client's connection stays open after this response
        self.on_end: Callable[[], None] | None = (
            None  # called when the client has the whole response (releases its connection)
        )
        self.ended = False
        self.writes = 0  # writes to the client (its response head included)

    def start_relay(self, client, chunked: bool) -> None:
        """The client's response head is written: relay what came so far, then as it comes.
        ``client``: a ``downstream.ClientConnection`` (its ``write``; backpressure pauses the
        upstream connection)."""
        self.chunked = chunked
        self.client = client
        self.writes += 1
        conn = self.conn
        if conn is not None and conn.transport is not None:
            client.on_pause = conn.transport.pause_reading
            client.on_resume = conn.transport.resume_reading
        self.flush()

    def body(self, b: bytes) -> None:
        """A piece of the response body (in the upstream connection's ``data_received``)."""
        self.bytes_out += len(b)
        self.pending.append(b)
        acc = self.acc
        if acc is not None:
            if self.sse:
                acc.on_sse_piece(b)
            elif self.buf is not None and len(self.buf) <= MAX_BODY_PARSE:
                self.buf += b

    def flush(self) -> None:
        """Write the pieces that came (one client write per upstream read, however many chunks it held)."""
        if self.client is None or not self.pending:
            return
        b = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        self.pending.clear()
        c = self.client
        if self.client_gone:
            return
        if c.closed:
            self.client_left()
            return
        c.write(b"%x\r\n%b\r\n" % (len(b), b) if self.chunked else b)
        self.writes += 1

    def end(self) -> None:
        """The response's last byte came: write what is left, end the client's chunks, release
        the client's connection (``on_end``), all in this read."""
        self.flush()
        c = self.client
        if c is None or self.client_gone:
            return
        if c.closed:
            self.client_left()
            return
        if self.chunked:
            c.write(b"0\r\n\r\n")
            self.writes += 1
        self.ended = True
        if self.on_end is not None:
            self.on_end()

    def client_left(self) -> None:
        """The client went away: stop the upstream too (the server stops generating)."""
        if self.client_gone:
            return
        self.client_gone = True
        self.pending.clear()
        for f in (self.head, self.done):
            if not f.done():
                f.set_exception(UpstreamGone("the client went away"))
                f.exception()  # (retrieved: whoever waits checks client_gone)
        if self.conn is not None and self.conn.ex is self:
            self.conn.abort()


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the upstream (see the module docstring)."""

    def __init__(self, pool: "UpstreamPool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | StampedTransport | None = None  # set in connection_made
        self.parser = httptools.HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.closed = False
        self.reusable = False
        self.stamped = False

    # -- asyncio ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.stamped = isinstance(transport, StampedTransport)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no Nagle: a request's last segment must not wait for an ACK
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        writes = 0
        if ex is not None:
            ex.got_bytes = True
            writes = ex.writes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(f"bad response from the upstream: {e}")
        if ex is not None:
            if ex.pending:
                ex.flush()
            if self.stamped and ex.writes != writes:  # this read reached the client: how long it was held
                t = self.transport
                assert isinstance(t, StampedTransport)
                self.pool.observe_forward(time.perf_counter_ns() - t.stamp_ns)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.forget(self)
        ex = self.ex
        if ex is not None and ex.until_close and exc is None and ex.head.done():  # the body's end
            self.ex = None
            ex.end()
            if not ex.done.done():
                if ex.buf is not None and len(ex.buf) <= MAX_BODY_PARSE:
                    ex.acc.on_body(bytes(ex.buf))
                ex.done.set_result(None)
            return
        self._fail(f"the upstream closed the connection{': ' + str(exc) if exc else ''}")

    # -- httptools callbacks ------------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        if self.ex is not None:
            self.ex.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.ex is not None:
            self.ex.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        ex.status = self.parser.get_status_code()
        names = {k.lower() for k, _ in ex.headers}
        ex.until_close = (
            "content-length" not in names
            and "transfer-encoding" not in names
            and ex.status >= 200
            and ex.status not in (204, 304)
        )
        if ex.acc is not None:
            ctype = next((v for k, v in ex.headers if k.lower() == "content-type"), "")
            if "text/event-stream" in ctype:
                ex.sse = True
            else:
                ex.buf = bytearray()
        if ex.on_head is not None:
            ex.on_head()
        if not ex.head.done():
            ex.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.ex is not None:
            self.ex.body(body)

    def on_message_complete(self) -> None:
        ex, self.ex = self.ex, None
        self.reusable = self.parser.should_keep_alive()
        if ex is not None:
            ex.end()
        if ex is not None and not ex.done.done():
            if ex.buf is not None and len(ex.buf) <= MAX_BODY_PARSE:
                ex.acc.on_body(bytes(ex.buf))
            ex.done.set_result(None)
        self.pool.release(self)

    # -- use ----------------------------------------------------------------------------------
    def send(self, head: bytes, body: bytes, ex: Exchange) -> None:
        self.ex = ex
        ex.conn = self
        self.reusable = False
        assert self.transport is not None  # a connection from UpstreamPool.acquire is connected
        self.transport.write(head + body)  # one write: head and body leave together

    def _fail(self, msg: str) -> None:
        ex, self.ex = self.ex, None
        if ex is None:
            return
        for f in (ex.head, ex.done):
            if not f.done():
                f.set_exception(UpstreamGone(msg))
                f.exception()  # (retrieved: a head that failed leaves done unawaited)

    def abort(self) -> None:
        self.ex = None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class UpstreamPool:
    """Idle keep-alive connections to one upstream (host, port), opened on demand.

    ``stamped``: plain-HTTP connections on ``stamps.StampedTransport`` (each response read
    stamped, for ``observe_forward``), else on uvloop's transport (cheaper by ~3-4 us of CPU per
    read). TLS always uses the event loop's transport (``ssl``: the context, ``server_hostname``:
    SNI and the certificate's name, default the host)."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl=None,
        connect_timeout_s: float = 10.0,
        observe_forward=None,
        stamped: bool = False,
        server_hostname: str | None = None,
    ) -> None:
        self.host, self.port, self.ssl = host, port, ssl
        self.server_hostname = (server_hostname or host) if ssl is not None else None
        self.connect_timeout_s = connect_timeout_s
        self.stamped = stamped and ssl is None
        self.idle: list[UpstreamConnection] = []
        #: called with the ns from a read's kernel stamp to the client's write of it (stamped only)
        self.observe_forward = observe_forward if observe_forward is not None else (lambda ns: None)

    def take_idle(self) -> UpstreamConnection | None:
        """An idle keep-alive connection, or None (it may turn out closed: retry once, anew)."""
        while self.idle:
            c = self.idle.pop()
            assert c.transport is not None  # an idle connection has been connected
            if not c.closed and not c.transport.is_closing():
                return c
        return None

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        """A connection and whether it was reused (a reused one may turn out closed: retry once)."""
        c = self.take_idle()
        if c is not None:
            return c, True
        loop = asyncio.get_running_loop()

        def factory() -> UpstreamConnection:
            return UpstreamConnection(self)

        if self.stamped:
            proto = await asyncio.wait_for(open_stamped(self.host, self.port, factory), self.connect_timeout_s)
        else:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    factory, self.host, self.port, ssl=self.ssl, server_hostname=self.server_hostname
                ),
                self.connect_timeout_s,
            )
        return proto, False  # type: ignore[return-value]

    def release(self, c: UpstreamConnection) -> None:
        if c.reusable and not c.closed:
            assert c.transport is not None  # reusable: a response came on it
            if not c.transport.is_reading():  # (paused for a slow client as its response ended)
                c.transport.resume_reading()
            self.idle.append(c)
        elif c.transport is not None:
            c.closed = True
            c.transport.close()

    def forget(self, c: UpstreamConnection) -> None:
        if c in self.idle:
            self.idle.remove(c)

    def close(self) -> None:
        for c in self.idle:
            assert c.transport is not None  # an idle connection has been connected
            c.transport.close()
        self.idle.clear()
