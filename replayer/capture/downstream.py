"""The capture proxy's client side: a listening socket and one raw connection per client, each
request's arrival stamped by the kernel.

Why not aiohttp's server (or an asyncio transport): a request's ``timestamp`` must be when it
arrived, not when a busy event loop got to it. Each client socket has ``SO_TIMESTAMPNS`` on and is
read with ``recvmsg``: the kernel's receive time of the data comes with it (on loopback, taken
during the sender's own write). The first read of each new request is at most ``HEAD_READ``
bytes, so its stamp is that of the request's first segment (Linux returns the stamp of the last
segment a read consumed; a client that writes the head and the body apart, as replayer's
launcher does, sends them in two segments, the body maybe much later if the host stalled it).
The reads after it are stamped too: the read that completes a request carries its last byte's
arrival (``Request.complete_ns``), from which the proxy counts the time it held the request
(``metrics.ForwardDelay``). Stamps are on the monotonic clock (``stamps``). A loop that falls
behind now only delays the forwarding, not the stamp.

Requests are parsed with llhttp (``httptools``); a connection handles its requests one after the
other (pipelined ones wait their turn). Writes go straight to the socket (``send``); what it does
not take waits in a buffer written when the socket is writable, and past ``WRITE_HIGH`` bytes the
response's producer is paused (``on_pause`` / ``on_resume``): a slow client never makes the
proxy hold an unbounded stream. ``Expect: 100-continue`` is answered at once (the proxy sends the
upstream the whole body).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import Callable

import httptools

from replayer.capture.stamps import READ, SO_TIMESTAMPNS, kernel_stamp_ns

HEAD_READ = 64  # first read of a new request: within its first segment, so the stamp is that segment's
WRITE_HIGH = 1 << 20  # bytes waiting for a client before its producer is paused
WRITE_LOW = 1 << 18


class Request:
    """One request as it came: arrival (its first byte's, monotonic ns), its last byte's arrival
    (``complete_ns``), method, target, raw headers, body pieces."""

    __slots__ = ("arrival_ns", "complete_ns", "method", "url", "headers", "body", "keep_alive", "http10", "released")

    def __init__(self, arrival_ns: int) -> None:
        self.arrival_ns = arrival_ns
        self.complete_ns = arrival_ns
        self.method = ""
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.keep_alive = True
        self.http10 = False
        self.released = False  # answered: its connection went on to the next request

    def header(self, name: str) -> str | None:
        n = name.lower()
        return next((v for k, v in self.headers if k.lower() == n), None)

    @property
    def path(self) -> str:
        return self.url.split(b"?", 1)[0].decode("latin-1")


class ClientConnection:
    """One client's connection (see the module docstring). ``handler(conn, request)`` is called
    for each request when the one before it has been answered; it calls ``done(keep_alive)``
    when its response has been written. The exchange in progress sets ``on_lost`` (the client
    went away) and ``on_pause`` / ``on_resume`` (backpressure)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        handler: Callable[["ClientConnection", Request], None],
        on_close: Callable[["ClientConnection"], None],
        reading: set[int] | None = None,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.handler = handler
        self._on_close = on_close
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()
        self.cur: Request | None = None
        self.busy = False
        self.between = True  # nothing of the next request read yet
        self.t_read = 0  # stamp of the read that began the current request
        self.t_last = 0  # stamp of the latest read
        self.unstamped = 0  # requests whose first read came without a kernel stamp
        self.wbuf: collections.deque[bytes] = collections.deque()
        self.wbuf_bytes = 0
        self.paused = False
        self.closed = False
        self.close_when_written = False
        self.on_lost: Callable[[], None] | None = None
        self.on_pause: Callable[[], None] | None = None
        self.on_resume: Callable[[], None] | None = None
        self._reading = reading if reading is not None else set()  # fds read now (``Listener.reading``)
        loop.add_reader(self.fd, self._on_readable)
        self._reading.add(self.fd)

    # -- reading --------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        """Read what is there: a new request's first read is ``HEAD_READ`` bytes (its stamp is
        the request's arrival), then the rest is read in this same call until the socket is
        empty or the request is complete (a request is not left waiting a loop turn per read
        while many streams are relayed). Every read is stamped (``recvmsg``); the one that
        completes a request gives its ``complete_ns``. The next request's first read waits for
        its own readiness, so it gets its own stamp."""
        while True:
            first = self.between
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(HEAD_READ if first else READ, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.abort()
                return
            if not data:
                self.abort()
                return
            t = kernel_stamp_ns(anc)
            if t is None:  # (no stamp: stamping not on yet, another socket type) the read's time
                t = time.perf_counter_ns()
                self.unstamped += first
            self.t_last = t
            if first:
                self.t_read = t
                self.between = False
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._refuse(b"501 Not Implemented", b"protocol upgrades are not proxied")
                return
            except httptools.HttpParserError as e:
                self._refuse(b"400 Bad Request", str(e).encode("latin-1", "replace"))
                return
            if self.between or self.closed or len(data) < (HEAD_READ if first else READ):
                return  # a request completed, or the socket is (most likely) empty

    def _stop_reading(self) -> None:
        self.loop.remove_reader(self.fd)
        self._reading.discard(self.fd)

    def _refuse(self, status: bytes, msg: bytes) -> None:
        self._stop_reading()
        self.queue.clear()
        if not self.busy:
            self.write(
                b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (status, len(msg), msg)
            )
            self.close()
        else:
            self.close_when_written = True

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.cur = Request(self.t_read)

    def on_url(self, url: bytes) -> None:
        self.cur.url += url  # type: ignore[union-attr]

    def on_header(self, name: bytes, value: bytes) -> None:
        self.cur.headers.append((name.decode("latin-1"), value.decode("latin-1")))  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        r = self.cur
        assert r is not None
        r.method = self.parser.get_method().decode("latin-1")
        r.keep_alive = self.parser.should_keep_alive()
        r.http10 = self.parser.get_http_version() == "1.0"
        expect = r.header("Expect")
        if expect is not None and expect.lower() == "100-continue" and not r.http10:
            r.headers = [(k, v) for k, v in r.headers if k.lower() != "expect"]
            if not self.busy and not self.queue:
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.cur.body.append(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        r, self.cur = self.cur, None
        self.between = True
        self.t_read = self.t_last  # (a next request that begins in this same read came with its newest bytes)
        if r is not None:
            r.complete_ns = self.t_last
            self.queue.append(r)
            self._next()

    def _next(self) -> None:
        if self.busy or not self.queue or self.closed:
            return
        self.busy = True
        self.handler(self, self.queue.popleft())

    def done(self, keep_alive: bool) -> None:
        """The current response is written: the next request, or close."""
        self.busy = False
        self.on_lost = self.on_pause = self.on_resume = None
        if self.paused:
            self.paused = False
        if not keep_alive or self.close_when_written:
            self.close()
        else:
            self._next()

    # -- writing --------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.wbuf:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.abort()
                return
            if n == len(data):
                return
            data = data[n:]
            self.loop.add_writer(self.fd, self._on_writable)
        self.wbuf.append(data)
        self.wbuf_bytes += len(data)
        if self.wbuf_bytes > WRITE_HIGH and not self.paused and self.on_pause is not None:
            self.paused = True
            self.on_pause()

    def _on_writable(self) -> None:
        while self.wbuf:
            chunk = self.wbuf[0]
            try:
                n = self.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.abort()
                return
            self.wbuf_bytes -= n
            if n < len(chunk):
                self.wbuf[0] = chunk[n:]
                break
            self.wbuf.popleft()
        if self.paused and self.wbuf_bytes < WRITE_LOW:
            self.paused = False
            if self.on_resume is not None:
                self.on_resume()
        if not self.wbuf:
            self.loop.remove_writer(self.fd)
            if self.close_when_written and not self.busy:
                self._close_now()

    async def drain(self) -> None:
        """Wait while more than ``WRITE_HIGH`` bytes wait for this client (pass-through streams)."""
        while self.wbuf_bytes > WRITE_HIGH and not self.closed:
            await asyncio.sleep(0.005)

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        """Close once everything written has gone out."""
        if self.wbuf:
            self.close_when_written = True
            self._stop_reading()
        else:
            self._close_now()

    def abort(self) -> None:
        """The client went away (or the connection failed): drop everything."""
        self.wbuf.clear()
        self.wbuf_bytes = 0
        self._close_now()

    def _close_now(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_reading()
        self.loop.remove_writer(self.fd)
        try:
            self.sock.close()
        except OSError:
            pass
        self.queue.clear()
        lost, self.on_lost = self.on_lost, None
        if lost is not None and self.busy:
            lost()
        self._on_close(self)


class Listener:
    """The listening socket: accepts clients into ``ClientConnection``s (all kept in
    ``connections``) until ``stop``. ``reading``: the descriptors being read for requests (the
    listening socket's and the clients'), for ``poll.Poller`` to wake on."""

    def __init__(self, handler: Callable[[ClientConnection, Request], None]) -> None:
        self.handler = handler
        self.connections: set[ClientConnection] = set()
        self.unstamped_closed = 0  # reads without a kernel stamp on connections now closed
        self.reading: set[int] = set()
        self.sock: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, host: str, port: int, backlog: int = 1024) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port. OSError when it cannot."""
        self.loop = asyncio.get_running_loop()
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        s = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # on now (the kernel enables stamping a moment later) and inherited by every client socket
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.bind(info[4])
            s.listen(backlog)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.sock = s
        self.loop.add_reader(s.fileno(), self._accept)
        self.reading.add(s.fileno())
        return s.getsockname()[1]

    def _accept(self) -> None:
        assert self.sock is not None and self.loop is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # (out of descriptors, a connection reset while queued)
                return
            conn.setblocking(False)
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.connections.add(ClientConnection(self.loop, conn, self.handler, self._closed, self.reading))

    def _closed(self, c: ClientConnection) -> None:
        self.connections.discard(c)
        self.unstamped_closed += c.unstamped

    @property
    def unstamped(self) -> int:
        """Reads stamped at the read, not by the kernel (their requests' arrival may be late)."""
        return self.unstamped_closed + sum(c.unstamped for c in self.connections)

    def stop(self) -> None:
        """Accept no more connections (those open stay)."""
        if self.sock is not None and self.loop is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.reading.discard(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def close_all(self) -> None:
        for c in list(self.connections):
            c.close()
