"""The HTTP client of the hot path: ``send`` turns a PreparedRequest into a measured
RequestResult and never raises for request failures (errors are values at this boundary).

Not aiohttp's client (it serves the admin server, the simulator, readiness and scraping): its
per-chunk machinery (a StreamReader, a future, a task wake-up and a timer re-armed per chunk) is
too dear on the hot path. This client is an asyncio ``Protocol`` per connection
(``replayer.http.connection``), llhttp (``httptools``) parsing the response, its bytes decoded
and measured inside ``data_received``, stamped once per read with the one monotonic clock; the
sending coroutine wakes once per request. Its pool is ``replayer.http.pool``, each request's
head ``replayer.http.heads``'s, what an attempt leaves in its result ``replayer.http.measure``'s.

Behaviour (the traps of DESIGN.md avoided):
* unlimited keep-alive connections: no hidden client-side queue (case B24); the time spent
  opening a connection is recorded apart (``connect_ms``) and ``sent_ns`` is stamped when the
  request bytes are handed to the socket;
* a request is dispatched when the kernel has taken its last byte: ``dispatch_lag_ms`` counts to
  then. The socket takes a request whole in the usual case, and then its dispatch is its send
  (stamped just before the write, as ``sent_ns``). When it does not (the launcher's write was
  short, or the transport kept bytes: a link slower than the requests' bytes fills the socket's
  buffer), the dispatch is stamped when the transport's buffer drains (asyncio flow control,
  ``Connection.watch_send``), the wait recorded as ``send_wait_ms`` and counted for the
  self-watch (``send_waited``, ``take_send_wait_max_ms``). TLS connections too: their
  transport is plain TCP, the TLS being the connection's own (``replayer.http.tlsrecord``);
* timeouts told apart by kind (``replayer.core.errors``): connect (``connect_timeout_s``), first byte
  and idle (``read_timeout_s`` of silence after the send or between two reads: a slow but steady
  stream is never cut), and an optional total (``request_timeout_s`` from the send to the end of
  the response; none by default), all checked by one lazy timer per request (not re-armed per
  chunk). A failed or cancelled request keeps what arrived as ``partial_output_tokens``, never
  as ``completion_tokens``; every failure has a non-empty message;
* a reused keep-alive connection (one that served a response before) that closes before any
  byte of the response is ``STALE_CONNECTION``, apart from the server's disconnects: the server
  closed it idle as the request went out (or went away). No byte came back, so it is retried
  like a connect failure (below). A connection reserved for the launcher that closes before the
  launcher wrote the request is no failure at all: nothing reached the server, and the request
  goes out on another connection at once (not counted as a retry);
* SSE events of any size (``sse.SSEDecoder`` on a byte buffer), chunked, Content-Length or
  close-delimited bodies, HTTP and HTTPS.

Retries (off by default: ``retry_max=0``): a request answered HTTP 429 or 5xx, or whose
connection failed before any response byte (CONNECT, CONNECT_TIMEOUT, STALE_CONNECTION, or
DISCONNECT before the headers), is sent again after ``retry_backoff_s * 2**k`` s (k = retries so
far) or the response's ``Retry-After`` (capped at 60 s), at most ``retry_max`` times; never any
other 4xx, nor a failure after a 200's headers (output may have arrived). ``res.retries`` counts
them; the result holds the LAST attempt's outcome, status, error, ``sent_ns``/``connect_ms`` and
TTFT/E2E, while ``dispatch_lag_ms`` stays the first send's (the first that wrote the request).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from urllib.parse import urlsplit

from replayer.core.clock import now_ns
from replayer.core.errors import ErrorKind, Outcome
from replayer.core.events import QUIET, RequestEvents
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.http.chunks import ERROR_TEXT_LIMIT, StreamAccumulator
from replayer.http.connection import Connection, Exchange, Failure, fd_limit_hint
from replayer.http.heads import RequestHeads
from replayer.http.launcher import Launcher
from replayer.http.measure import answered, broken, cut_short, fail
from replayer.http.pool import IDLE_EXPIRY_S, Pool
from replayer.http.servertimings import TimedStreamAccumulator
from replayer.http.tls import TLSOptions

_UNSENT = -2.0  # _attempt: the launcher never wrote the reserved request (its connection closed first)
#: what ``Client.reserve`` returns: the connection bound, its exchange and the request head
Reserved = tuple[Connection, Exchange, bytes]


class Client:
    """Sends prepared requests to ``base_url + endpoint`` (``http://`` or ``https://``).

    ``t0_ns``: the run anchor; recorded times are offsets from it (may be set after ``warm_up``,
    before the first send: the daemon anchors the schedule once the pool is open). ``api_key``: sent as a bearer
    token (never logged). ``connect_timeout_s``: TCP (and TLS) connect limit.
    ``read_timeout_s``: longest silence after the send (FIRST_BYTE_TIMEOUT) or between two reads
    (IDLE_TIMEOUT) (``None``: wait forever). ``request_timeout_s``: the longest a response may take
    from the send to its end (TOTAL_TIMEOUT; ``None``: no total timeout).
    ``retry_max``/``retry_backoff_s``: the retry policy (see the module docstring; 0 = never retry). ``usage_slack_tokens``: the pooling usage audit's
    allowance per input (``replayer.http.audit``). ``delayed_ack``: turn TCP quick ACKs off on a
    connection when a response's headers arrive (``TCP_QUICKACK`` 0, Linux), so the kernel ACKs
    every second SSE event instead of each one (Linux ACKs at once each read that empties the
    buffer of a small pushed segment, unless the socket is in "pingpong" mode, which this sets
    and which lasts until a delayed-ACK timer fires: about one response). Half the ACK segments
    and ~3.5 us less system CPU per event (bench/bench_stream.py). Only for servers with
    ``TCP_NODELAY``: a server using Nagle's algorithm holds each small write until the previous
    one is acknowledged, so tokens would wait for the delayed ACK (up to 40 ms). A request with its own ``path`` goes to
    ``base_url + path``. A request's ``headers`` (its ``X-Request-Id``) go into its head.
    ``server_timings``: read the server's own timings from the response and record them
    (``replayer.http.servertimings``). ``idle_expiry_s``: an idle connection beyond the
    ``spare_target`` spares is closed once unused this long, and one the server closed leaves
    the pool: a burst or a backlog opens a connection per request in flight, and without this
    the pool would keep them all (a few KB each, with their parsers) for the rest of a soak.
    ``tls``: the CA bundle, client certificate, server name and verification for an ``https://``
    target (``replayer.http.tls``; default: the system's CAs, the URL's host). ``events``: the run's
    event stream (``replayer.core.events``), told of each request as the kernel takes it
    (``dispatched``). Use as an async context manager, or call ``start``/``close``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        t0_ns: int = 0,
        endpoint: str = "/v1/completions",
        api_key: str | None = None,
        connect_timeout_s: float = 30.0,
        read_timeout_s: float | None = 600.0,
        request_timeout_s: float | None = None,
        retry_max: int = 0,
        retry_backoff_s: float = 0.5,
        usage_slack_tokens: int = 0,
        delayed_ack: bool = False,
        server_timings: bool = False,
        idle_expiry_s: float = IDLE_EXPIRY_S,
        tls: TLSOptions | None = None,
        events: RequestEvents = QUIET,
    ) -> None:
        u = urlsplit(base_url.rstrip("/") + endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"target must be an http(s) URL, got {base_url!r}")
        #: the keep-alive connections (composition: the pool owns them, the client asks it)
        self.pool = Pool(
            u.hostname,
            u.port or (443 if u.scheme == "https" else 80),
            (tls or TLSOptions()).context() if u.scheme == "https" else None,
            connect_timeout_s,
            owner=self,
            idle_expiry_s=idle_expiry_s,
            server_name=tls.server_name if tls else None,
        )
        self.url = base_url.rstrip("/") + endpoint
        self.t0_ns = t0_ns
        self._heads = RequestHeads(base_url, endpoint, api_key)
        self.usage_slack_tokens = usage_slack_tokens
        self.server_timings = server_timings
        self._acc = TimedStreamAccumulator if server_timings else StreamAccumulator
        self.delayed_ack = delayed_ack and hasattr(socket, "TCP_QUICKACK")
        self._read_timeout_ns = int(read_timeout_s * 1e9) if read_timeout_s else None
        self._total_ns = int(request_timeout_s * 1e9) if request_timeout_s else None
        if retry_max < 0 or retry_backoff_s < 0:
            raise ValueError("retry_max and retry_backoff_s must be >= 0")
        self.retry_max = retry_max
        self.retry_backoff_s = retry_backoff_s
        #: the run's event stream: ``dispatched`` for each result whose request has just gone out
        #: (first send, or its connect failed at the due time), its dispatch lag set
        self.events = events
        self._launcher: Launcher | None = None
        # launcher token -> (req, res, conn, ex, head and body as written (TLS: records), due time)
        self._launches: dict[int, tuple[PreparedRequest, RequestResult, Connection, Exchange, bytes, bytes, int]] = {}
        #: first sends whose bytes waited for the socket to take them (``_dispatched``), for the self-watch
        self.send_waited = 0
        self._send_wait_max_ms = 0.0  # the longest such wait since take_send_wait_max_ms last read it

    async def start(self) -> None:
        """Nothing to set up beyond the constructor (kept for symmetry with ``close``)."""

    async def close(self) -> None:
        """Close every connection (in-flight exchanges fail as DISCONNECT)."""
        await self.pool.close()

    async def warm_up(self, n: int) -> int:
        """Open up to ``n`` keep-alive connections ahead of the replay (``Pool.warm_up``)."""
        return await self.pool.warm_up(n)

    def expect(self, n: int) -> None:
        """``n`` requests are due soon: connections opened ahead for them (``Pool.expect``)."""
        self.pool.expect(n)

    @property
    def open_connections(self) -> int:
        return self.pool.open_connections

    async def __aenter__(self) -> "Client":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def use_launcher(self, launcher: Launcher) -> None:
        """Write reserved requests through ``launcher`` (started and ready; its reports go to
        ``on_launched``): see ``reserve`` and ``launch``."""
        launcher.attach(self.on_launched)
        self._launcher = launcher

    @property
    def launcher_writes(self) -> bool:
        """Whether the launcher process can write this client's requests at all: it runs, and
        the target's connections are plain HTTP or TLS whose records are sealed here
        (``Pool.sealing``: not over TLS 1.2). False: the loop writes every request."""
        return self._launcher is not None and self._launcher.running and self.pool.sealing

    def reserve(self, req: PreparedRequest, res: RequestResult) -> Reserved | None:
        """Bind ``req`` to an idle keep-alive connection the launcher may write on
        (``Connection.launchable``: one writer at a time) and build its bytes, to be written at
        its due time by the launcher process (``launch``; ``replayer.http.launcher``). The
        launcher writes next on that connection, until its report (``on_launched``). None when
        no such connection is ready (or ``launcher_writes`` is False): ``send`` writes it from
        the loop. Pass the returned handle to ``launch`` and then to ``send(req, res, reserved)``."""
        if not self.launcher_writes:
            return None
        conn = self.pool.launchable_connection()
        if conn is None:
            return None
        ex = Exchange(asyncio.get_running_loop().create_future(), self._read_timeout_ns, self._total_ns, self._acc())
        conn.ex = ex  # the connection is ours from now on
        res.connect_ms = 0.0
        return conn, ex, self._heads.head(req)

    def launch(self, at_ns: int, req: PreparedRequest, res: RequestResult, reserved: Reserved) -> None:
        """Queue the reserved request's write in the launcher for ``at_ns`` (``now_ns`` clock).
        The launcher writes its head at that time (every request due then starts before any
        body goes; see ``replayer.http.launcher``); ``on_launched`` records it."""
        conn, ex, head = reserved
        if conn.closed:  # the server closed it since reserve: the exchange has failed already
            return
        if at_ns > ex.last_ns:  # the read timeout counts from the write, not from the hand-over
            ex.last_ns = at_ns
        head, body = conn.wire(head), conn.wire(req.body)
        self.pool.tls_requests_sealed += conn.tls is not None
        token = self._launcher.submit(at_ns, conn.fd, head, body)  # type: ignore[union-attr]
        self._launches[token] = (req, res, conn, ex, head, body, at_ns)
        conn.launch = token

    def on_launched(self, token: int, sent: int, written: int, err: int) -> None:
        """The launcher's report on the write ``token``: stamp ``sent_ns`` (just before the
        first byte) and write what the socket did not take, or fail the exchange as a disconnect
        before any response byte."""
        item = self._launches.pop(token, None)
        if item is None:
            return
        req, res, conn, ex, head, body, at_ns = item
        conn.launch = 0
        if err:
            what = "the launcher process exited" if err == errno.ECHILD else os.strerror(err)
            if conn.ex is ex:
                conn.finish_error(ErrorKind.DISCONNECT, f"write failed: {what}")
        else:
            if sent > ex.last_ns:
                ex.last_ns = sent
            if ex.total_ns is not None and conn.ex is ex:
                ex.deadline_ns = sent + ex.total_ns
                conn.check_stall()
            if written < len(head) + len(body):
                if ex.done.done():  # answered before its body went out: the stream is out of step
                    conn.abort()
                elif not conn.closed and conn.transport is not None:
                    if written < len(head):
                        conn.transport.writelines((memoryview(head)[written:], body))
                    else:
                        conn.transport.write(memoryview(body)[written - len(head) :])
                self._dispatch_when_drained(res, conn, sent, at_ns - self.t0_ns)
            else:
                self._stamp_sent(res, sent, at_ns - self.t0_ns, written=True)
        _reported(ex)

    def cancel_launch(self, conn: Connection) -> None:
        """``conn`` is closing: drop its write queued in the launcher, if any (the exchange
        fails through the connection)."""
        token = conn.launch
        if token:
            conn.launch = 0
            item = self._launches.pop(token, None)
            if self._launcher is not None:
                self._launcher.cancel(token)
            if item is not None:
                _reported(item[3])

    def _stamp_sent(self, res: RequestResult, sent: int, lag_from_ns: int, written: bool = False) -> None:
        """The one way a send is stamped, whoever wrote it (the loop or the launcher process):
        ``sent_ns`` (``sent``: ``now_ns`` just before the first byte); on the first send (retries
        keep it) ``dispatch_lag_ms`` = sent - ``lag_from_ns`` (ns after the anchor), reported
        to the event stream (``dispatched``). ``written``: the socket took the request whole (``send_wait_ms``
        0; else nothing was written: a connect that failed at the due time). A request the
        socket did not take whole goes through ``_dispatch_when_drained`` instead."""
        res.sent_ns = sent - self.t0_ns
        if res.dispatch_lag_ms is None:
            res.dispatch_lag_ms = (res.sent_ns - lag_from_ns) / 1e6
            if written:
                res.send_wait_ms = 0.0
            self.events.dispatched(res)

    def _dispatch_when_drained(self, res: RequestResult, conn: Connection, sent: int, lag_from_ns: int) -> None:
        """``_stamp_sent`` for a request the socket did not take whole: ``sent_ns`` (its first
        byte) now; on the first send, its dispatch once the kernel has its last byte: when the
        connection's transport has drained (``Connection.watch_send``; ``_attempt`` stamps it at
        the exchange's end if that comes first), or now when nothing is left in it (the
        launcher wrote part, the transport the rest at once; or the connection is gone)."""
        res.sent_ns = sent - self.t0_ns
        if res.dispatch_lag_ms is not None:  # a retry: dispatch lag is the first send's
            return

        def drained() -> None:
            self._dispatched(res, sent, now_ns(), lag_from_ns)

        if not conn.watch_send(drained):
            drained()

    def _dispatched(self, res: RequestResult, sent: int, last: int, lag_from_ns: int) -> None:
        """The kernel took the last byte of ``res``'s request at ``last`` (``now_ns``), its first
        at ``sent``: ``send_wait_ms``, ``dispatch_lag_ms`` to ``last``, the self-watch's counts,
        the ``dispatched`` event."""
        wait_ms = (last - sent) / 1e6
        res.send_wait_ms = wait_ms
        res.dispatch_lag_ms = (last - self.t0_ns - lag_from_ns) / 1e6
        self.send_waited += 1
        if wait_ms > self._send_wait_max_ms:
            self._send_wait_max_ms = wait_ms
        self.events.dispatched(res)

    def take_send_wait_max_ms(self) -> float:
        """The longest wait of a request's bytes for the socket since the last call (self-watch)."""
        wait, self._send_wait_max_ms = self._send_wait_max_ms, 0.0
        return wait

    def _write(
        self, req: PreparedRequest, res: RequestResult, conn: Connection, t_start: int, lag_from_ns: int
    ) -> Exchange:
        ex = Exchange(asyncio.get_running_loop().create_future(), self._read_timeout_ns, self._total_ns, self._acc())
        request = self._heads.request(req)
        sent = now_ns()
        if ex.total_ns is not None:
            ex.deadline_ns = sent + ex.total_ns
        res.connect_ms = (sent - t_start) / 1e6
        conn.start(request, ex)
        self.pool.tls_requests_loop += conn.tls is not None
        if conn.transport.get_write_buffer_size():  # type: ignore[union-attr]
            self._dispatch_when_drained(res, conn, sent, lag_from_ns)  # (the socket did not take it whole)
        else:
            self._stamp_sent(res, sent, lag_from_ns, written=True)
        return ex

    async def send(
        self,
        req: PreparedRequest,
        res: RequestResult,
        reserved: Reserved | None = None,
        *,
        lag_from_ns: int | None = None,
    ) -> RequestResult:
        """Send ``req`` (with ``reserved`` from ``reserve``: the launcher process writes it; this
        only waits), stream its response and fill ``res`` (returned). Request failures are
        recorded in ``res``; ``asyncio.CancelledError`` marks ``res`` cancelled and propagates;
        retries per the policy (module docstring). ``lag_from_ns``: when the request was due (ns
        after the anchor; default ``req.due_ns``), the origin of its ``dispatch_lag_ms``."""
        origin = req.due_ns if lag_from_ns is None else lag_from_ns
        # (callers hold the handle opaquely; it is always what ``reserve`` returned)
        retry_after = await self._attempt(req, res, origin, reserved)
        if retry_after == _UNSENT:  # nothing reached the server: no attempt yet, send it now
            retry_after = await self._attempt(req, res, origin)
        if retry_after is None or not self.retry_max:
            return res
        while retry_after is not None and res.retries < self.retry_max:
            delay = retry_after if retry_after >= 0 else self.retry_backoff_s * (2**res.retries)
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                res.end_ns = now_ns() - self.t0_ns
                fail(res, ErrorKind.CANCELLED, "cancelled at shutdown (waiting to retry)", outcome=Outcome.CANCELLED)
                raise
            res.retries += 1
            res.outcome, res.error_kind, res.error = Outcome.NOT_STARTED.value, ErrorKind.NONE.value, None
            res.http_status = res.end_ns = res.partial_output_tokens = None
            retry_after = await self._attempt(req, res, origin)
        return res

    async def _attempt(  # noqa: C901, PLR0912, PLR0915
        self, req: PreparedRequest, res: RequestResult, lag_from_ns: int, reserved: Reserved | None = None
    ) -> float | None:
        """One exchange of ``req``, filling ``res``. Returns None when the outcome is final
        (success, or a failure that must not be retried), else the delay the server asked for
        (``Retry-After`` seconds, capped) or -1.0 (none: use the backoff); ``_UNSENT`` when the
        launcher never wrote the ``reserved`` request (``res`` untouched: send it again)."""
        retry: float | None = None
        t0 = self.t0_ns
        ex: Exchange | None = None
        conn: Connection | None = None
        t_start = now_ns()
        try:
            if reserved is not None:
                conn, ex = reserved[0], reserved[1]
                if ex.timer is None:  # (on_launched may have armed it already)
                    conn.check_stall()
            else:
                try:
                    conn = await self.pool.acquire()
                except asyncio.TimeoutError:
                    raise Failure(
                        ErrorKind.CONNECT_TIMEOUT,
                        f"connect timeout: no connection to {self.pool.host}:"
                        f"{self.pool.port} within {self.pool.connect_timeout_s:g} s (--connect-timeout)",
                    ) from None
                except OSError as e:
                    raise Failure(
                        ErrorKind.CONNECT,
                        f"cannot connect to {self.pool.host}:{self.pool.port}: {type(e).__name__}: {e}{fd_limit_hint(e)}",
                    ) from None
                ex = self._write(req, res, conn, t_start, lag_from_ns)
            await ex.done
            if res.sent_ns is None and reserved is not None and conn.launch:
                # the response ended before the launcher's report was read (a stalled loop)
                ex.sent = asyncio.get_running_loop().create_future()
                await ex.sent
            if res.sent_ns is None:  # the exchange failed before it was written
                raise Failure(ErrorKind.DISCONNECT, "connection closed before the request was written")
            res.end_ns = now_ns() - t0
            retry = answered(res, ex, req.endpoint, t0, self.usage_slack_tokens, self.server_timings)
        except Failure as f:
            if reserved is not None and res.sent_ns is None and ex is not None and not ex.t_ns:
                return _UNSENT  # the reserved connection went away before the launcher wrote it
            res.end_ns = now_ns() - t0
            kind = broken(res, f.kind, str(f), ex, t0, reused=conn is not None and bool(conn.served))
            if ex is None:  # the connection could not be opened (refused, connect timeout)
                retry = -1.0 if kind in (ErrorKind.CONNECT, ErrorKind.CONNECT_TIMEOUT) else None
                if res.sent_ns is None:  # the attempt counts as sent when it began: it was issued
                    res.connect_ms = (now_ns() - t_start) / 1e6
                    self._stamp_sent(res, t_start, lag_from_ns)
            elif kind in (ErrorKind.DISCONNECT, ErrorKind.STALE_CONNECTION) and not ex.headers_done:
                retry = -1.0  # closed before the response began
        except asyncio.CancelledError:
            res.end_ns = now_ns() - t0
            if conn is not None:
                conn.abort()
            if ex is not None and res.sent_ns is not None:
                cut_short(res, ex, t0)
            fail(res, ErrorKind.CANCELLED, "cancelled at shutdown", outcome=Outcome.CANCELLED)
            raise
        except Exception as exc:  # noqa: BLE001 - a bug here must not stop the replay
            res.end_ns = now_ns() - t0
            if conn is not None:
                conn.abort()
            fail(res, ErrorKind.CLIENT, f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT])
        finally:
            if conn is not None:
                if conn.on_drained is not None:  # ended before the kernel took every byte: dispatched now
                    conn.drained()
                self.pool.release(conn)
        return retry


def _reported(ex: Exchange) -> None:
    """Wake an ``_attempt`` waiting for the launcher's report on ``ex`` (see ``Client.send``)."""
    if ex.sent is not None and not ex.sent.done():
        ex.sent.set_result(None)
