"""One keep-alive HTTP/1.1 connection of the hot-path client (``replayer.http.client``): an asyncio
``Protocol`` with llhttp (``httptools``) parsing the response, one exchange (request/response)
at a time, the response decoded and measured inside ``data_received`` (one timestamp per read,
for every event it completes), and one lazy timer per exchange for the read and total timeouts.
Failures end the exchange's future with ``Failure`` (a kind and a message); the client turns
them into result values."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

import httptools

from replayer.core.clock import now_ns
from replayer.core.errors import ErrorKind
from replayer.http.chunks import StreamAccumulator
from replayer.http.fdlimit import fd_limit_hint as fd_limit_hint, raise_open_file_limit as raise_open_file_limit
from replayer.http.sse import SSEDecoder
from replayer.http.tls import explain
from replayer.http.tlskeylog import KeyLog
from replayer.http.tlsrecord import TLSSession

#: the most bytes of an error response body kept (its message)
ERROR_BODY_LIMIT = 64 * 1024
_ERROR_BODY_LIMIT = ERROR_BODY_LIMIT


class Failure(Exception):
    """A transport-level failure of one exchange (kind + message)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Exchange:
    """One request/response on a connection: parses and measures the response as it arrives."""

    __slots__ = (
        "acc",
        "dec",
        "status",
        "sse",
        "body",
        "body_len",
        "done",
        "last_ns",
        "t_ns",
        "content_type",
        "has_length",
        "chunked",
        "headers_done",
        "read_timeout_ns",
        "timer",
        "retry_after",
        "sent",
        "total_ns",
        "deadline_ns",
    )

    def __init__(
        self,
        done: asyncio.Future[None],
        read_timeout_ns: int | None,
        total_ns: int | None = None,
        acc: StreamAccumulator | None = None,
    ) -> None:
        self.acc = StreamAccumulator() if acc is None else acc
        self.dec: SSEDecoder | None = None
        self.status = 0
        self.sse = False
        self.body: list[bytes] = []
        self.body_len = 0
        self.done = done
        self.last_ns = now_ns()
        self.t_ns = 0
        self.content_type = b""
        self.has_length = False
        self.chunked = False
        self.headers_done = False
        self.read_timeout_ns = read_timeout_ns
        self.total_ns = total_ns  # total timeout: deadline_ns = send + total_ns, set at the send
        self.deadline_ns: int | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.retry_after: bytes | None = None
        self.sent: asyncio.Future[None] | None = None  # set when awaited for the launcher's report


def _where(ex: Exchange) -> str:
    """How far a response had come when the server closed the connection: before its headers,
    after them with nothing more, or mid-stream after so many events (or body bytes)."""
    if not ex.headers_done:
        return "before the response headers"
    n = ex.acc.n_chunks if ex.sse else ex.body_len
    if not n:
        return "after the response headers, before any " + ("event" if ex.sse else "byte of the body")
    if ex.sse:
        return f"mid-stream, after {n} event{'s' if n > 1 else ''}"
    return f"mid-response, after {n} bytes of the body"


class Owner(Protocol):
    """What a connection needs of the pool that opened it (``replayer.http.pool.Pool``)."""

    delayed_ack: bool

    def cancel_launch(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; at most one exchange at a time."""

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.fd = -1  # the socket, for writes from the launcher process (plain HTTP, or TLS records sealed here)
        self.sock = None  # the transport's socket, where Client.delayed_ack needs it
        self.launch = 0  # token of this connection's write queued in the launcher (0 = none)
        self.parser = httptools.HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.closed = False
        self.keep_alive = True
        self.served = 0  # responses completed on this connection (> 0: a reused keep-alive connection)
        self.idle_since_ns = 0  # when it last went back to the client's idle pool
        self._header_name = b""
        self.tls: TLSSession | None = None  # TLS done here over the plain transport (``start_tls``)
        self._handshake: asyncio.Future[None] | None = None
        self._fd = -1  # (the socket, kept while TLS is not ready for the launcher)
        self.on_drained: Callable[[], None] | None = None  # ``watch_send``'s call, while it waits
        #: the launcher could write its requests: plain HTTP, or TLS records sealed here (False
        #: until a TLS handshake is done, and for good where no sealer can be had)
        self.sealed = True

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
        if sock is not None and self.pool.delayed_ack:
            self.sock = sock

    def start_tls(
        self, ctx: ssl.SSLContext, server_name: str, session: ssl.SSLSession | None, keylog: KeyLog | None
    ) -> asyncio.Future[None]:
        """Begin the TLS handshake on this (plain) connection (``replayer.http.tlsrecord``); the
        future ends when it is done, or with the ``ssl.SSLError`` (or ``ConnectionResetError``)
        that ended it. Until then, and for good where no record sealer can be had, the launcher
        process cannot write on this connection (``fd`` -1)."""
        self.tls = TLSSession(ctx, server_name, session, keylog)
        self.sealed = False
        self._handshake = asyncio.get_running_loop().create_future()
        self._fd, self.fd = self.fd, -1
        self._tls_data(b"")
        return self._handshake

    def _tls_data(self, data: bytes) -> None:
        """Bytes from the server on a TLS connection: the handshake's, then records to decrypt."""
        tls = self.tls
        assert tls is not None
        if data:
            tls.feed(data)
        if tls.handshaking:
            try:
                done = tls.step()
            except ssl.SSLError as e:
                self._handshake_failed(e)
                return
            out = tls.outgoing()
            if out:
                self.transport.write(out)  # type: ignore[union-attr]
            if not done:
                return
            if tls.sealer is not None:
                self.fd = self._fd
            self.sealed = tls.sealer is not None
            hs = self._handshake
            if hs is not None and not hs.done():
                hs.set_result(None)
        try:
            plain = tls.read()
        except ssl.SSLError as e:  # (TLS 1.3: a refused client certificate arrives after the handshake)
            if self.ex is not None:
                self.finish_error(ErrorKind.TLS_ERROR, f"TLS error {_where(self.ex)}: {explain(e)}")
            else:
                self.abort()
            return
        if tls.sealer is None:  # (sealed: the SSLObject's own records are never sent; see tlsrecord)
            out = tls.outgoing()
            if out:
                self.transport.write(out)  # type: ignore[union-attr]
        if plain:
            self._received(plain)
        if tls.peer_closed:  # close_notify: no request after it (the TCP close may come much later)
            self.keep_alive = False
            if self.ex is None:
                self.abort()

    def _handshake_failed(self, e: BaseException) -> None:
        hs = self._handshake
        if self.tls is not None:
            self.tls.forget()
        self.abort()
        if hs is not None and not hs.done():
            hs.set_exception(e)

    def wire(self, data: bytes) -> bytes:
        """``data`` as written on the connection: itself, or TLS records."""
        tls = self.tls
        return data if tls is None else tls.wire(data)

    def data_received(self, data: bytes) -> None:
        if self.tls is not None:
            self._tls_data(data)
        else:
            self._received(data)

    def _received(self, data: bytes) -> None:
        """Response bytes (plaintext)."""
        ex = self.ex
        if ex is None:  # bytes with no request outstanding: the connection is unusable
            self.abort()
            return
        ex.t_ns = ex.last_ns = now_ns()  # one timestamp per read, for every event it completes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.finish_error(ErrorKind.PROTOCOL, "unexpected protocol upgrade")
        except httptools.HttpParserError as e:
            self.finish_error(ErrorKind.PROTOCOL, f"invalid HTTP response: {e}")

    def eof_received(self) -> None:
        self._closing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing()
        hs = self._handshake
        if hs is not None and not hs.done():
            if self.tls is not None:
                self.tls.forget()
            hs.set_exception(exc or ConnectionResetError("the server closed the connection during the TLS handshake"))
        ex = self.ex
        if ex is None:
            return
        if ex.headers_done and not ex.has_length and not ex.chunked and exc is None:
            self.on_message_complete()  # a body delimited by the connection closing
            return
        if isinstance(exc, ssl.SSLError):  # (TLS 1.3: a refused client certificate arrives after the handshake)
            self.finish_error(ErrorKind.TLS_ERROR, f"TLS error {_where(ex)}: {explain(exc)}")
            return
        self.finish_error(
            ErrorKind.DISCONNECT, f"server closed the connection {_where(ex)}" + (f": {exc}" if exc else "")
        )

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        ex = self.ex
        if ex is None:
            return
        if n == b"content-type":
            ex.content_type = value.lower()
        elif n == b"content-length":
            ex.has_length = True
        elif n == b"transfer-encoding" and b"chunked" in value.lower():
            ex.chunked = True
        elif n == b"retry-after":
            ex.retry_after = value

    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        ex.headers_done = True
        if self.sock is not None:  # (Client.delayed_ack) once per response: the mode outlasts the reads
            try:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            except OSError:
                pass
        ex.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if ex.status == 200 and ex.content_type.startswith(b"text/event-stream"):
            ex.sse = True
            ex.dec = SSEDecoder()

    def on_body(self, body: bytes) -> None:
        ex = self.ex
        if ex is None:
            return
        if ex.sse:
            dec = ex.dec
            data = dec.simple_event(body)  # type: ignore[union-attr]
            if data is not None:  # one plain "data: ...\n\n" event: no decoding needed
                ex.acc.on_event(data, ex.t_ns)
            else:
                on_event, t = ex.acc.on_event, ex.t_ns
                for ev in dec.feed(body):  # type: ignore[union-attr]
                    on_event(ev.data, t)
        elif ex.status == 200 or ex.body_len < _ERROR_BODY_LIMIT:
            ex.body.append(body)
            ex.body_len += len(body)

    def on_message_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        self.ex = None
        self.served += 1
        if ex.timer is not None:
            ex.timer.cancel()
        if ex.sse:
            ex.dec.close()  # type: ignore[union-attr]
        else:
            ex.acc.on_body(b"".join(ex.body), ex.t_ns or now_ns())
        if not ex.done.done():
            ex.done.set_result(None)

    # -- helpers ----------------------------------------------------------------------------
    def finish_error(self, kind: ErrorKind, message: str) -> None:
        ex = self.ex
        self.ex = None
        self.abort()
        if ex is not None:
            if ex.timer is not None:
                ex.timer.cancel()
            if not ex.done.done():
                ex.done.set_exception(Failure(kind, message))

    def abort(self) -> None:
        self._closing()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close an idle connection with a TLS close_notify (RFC 8446 section 6.1), then TCP;
        one busy (an exchange, a write queued in the launcher) is aborted."""
        tls, t = self.tls, self.transport
        if self.closed or self.ex is not None or self.launch or t is None or tls is None or tls.handshaking:
            self.abort()
            return
        self._closing()
        try:
            t.write(tls.close_notify())
        except Exception:  # noqa: BLE001 - a polite close that fails is an abort
            t.abort()
            return
        t.close()

    @property
    def launchable(self) -> bool:
        """Whether the launcher may write the next request here (one writer at a time): it can
        (``fd``: plain, or TLS sealed here), no close_notify nor FIN came, and the transport
        holds nothing (a request's or the handshake's tail would go after the launcher's bytes)."""
        t = self.transport
        return (
            self.fd >= 0
            and not self.closed
            and self.keep_alive
            and self.ex is None
            and not self.launch
            and t is not None
            and not t.get_write_buffer_size()
        )

    def _closing(self) -> None:
        """The connection is going away: no new exchange on it, and its write queued in the
        launcher (if any) is cancelled."""
        self.closed = True
        self.pool.cancel_launch(self)

    def check_stall(self) -> None:
        """The lazy timeout timer: fail the exchange whose total deadline passed (TOTAL_TIMEOUT) or
        that has been silent for the read timeout (FIRST_BYTE_TIMEOUT before any response byte,
        else IDLE_TIMEOUT); otherwise (re-)arm one timer for the nearer of the two. Called at the
        send and when the timer fires: once per timeout period, not per chunk."""
        ex = self.ex
        if ex is None:
            return
        if ex.timer is not None:
            ex.timer.cancel()
            ex.timer = None
        now = now_ns()
        wake = ex.deadline_ns
        if wake is not None and now >= wake:
            self.finish_error(
                ErrorKind.TOTAL_TIMEOUT,
                f"total timeout: the response was not complete "
                f"{(ex.total_ns or 0) / 1e9:g} s after the request was sent (--request-timeout)",
            )
            return
        rt = ex.read_timeout_ns
        if rt is not None:
            idle = now - ex.last_ns
            if idle >= rt:
                if ex.t_ns:
                    self.finish_error(
                        ErrorKind.IDLE_TIMEOUT,
                        f"idle timeout: no data for {idle / 1e9:.3g} s "
                        f"after {ex.acc.n_chunks} response events (--read-timeout {rt / 1e9:g} s)",
                    )
                else:
                    self.finish_error(
                        ErrorKind.FIRST_BYTE_TIMEOUT,
                        f"first-byte timeout: no response byte "
                        f"{idle / 1e9:.3g} s after the request (--read-timeout {rt / 1e9:g} s)",
                    )
                return
            wake = ex.last_ns + rt if wake is None else min(wake, ex.last_ns + rt)
        if wake is not None:
            ex.timer = asyncio.get_running_loop().call_later((wake - now) / 1e9, self.check_stall)

    # -- send flow ----------------------------------------------------------------------------
    def watch_send(self, on_drained: Callable[[], None]) -> bool:
        """Whether the transport still holds bytes of what was written (the socket's buffer was
        full: the link is slower than the bytes); if so, ``on_drained()`` is called once the
        kernel has taken them all (``resume_writing``), or earlier by ``drained`` (the exchange
        ended first). Costs nothing on a write the socket took whole: flow control is turned
        on only here, for this connection (high-water mark 0: ``pause_writing`` at once,
        ``resume_writing`` when nothing is left in the transport's buffer)."""
        t = self.transport
        if t is None or not t.get_write_buffer_size():
            return False
        self.on_drained = on_drained
        t.set_write_buffer_limits(high=0)
        return True

    def resume_writing(self) -> None:
        """asyncio flow control: the transport's buffer is down to its low-water mark (0 once
        ``watch_send`` set it): the kernel has every byte written so far."""
        self.drained()

    def drained(self) -> None:
        """Call what ``watch_send`` was given, once, if it still waits."""
        call = self.on_drained
        if call is not None:
            self.on_drained = None
            call()

    def start(self, request: bytes, ex: Exchange) -> None:
        """The loop writes ``request`` (through the transport: after whatever it still holds)."""
        assert not self.launch, "a connection with a write queued in the launcher is the launcher's to write"
        self.ex = ex
        self.check_stall()
        self.transport.write(self.wire(request))  # type: ignore[union-attr]
