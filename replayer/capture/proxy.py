"""The recording reverse proxy: forwards every request to the upstream unchanged, streams every
response back as it arrives, and turns each OpenAI API request into one trace row.

Transparency: the request body is sent as received (a malformed one too: the upstream answers it
and the row records the status); headers go both ways except the hop-by-hop ones and those each
hop sets for itself (``headers``). Clients are served by ``downstream`` (raw sockets, the kernel's arrival stamps). A
captured request (POST to ``rows.CAPTURED``) is relayed by ``relay``: each piece of the response
body is written to the client as the upstream connection reads it (no SSE buffering, no
decompression), a copy goes to the usage tracker (``usage``). Other requests go through aiohttp's
client, streamed too, and get no row. The client's ``Authorization`` header is forwarded and kept
only in memory until the prompt is tokenized; it is never written. An unreachable upstream gives
the client a 502 with a JSON error, and a row.

``timestamp`` is the request's arrival: the kernel's receive time of its first segment
(``downstream``), on the monotonic clock ``time.perf_counter_ns``, minus the capture's start.
The same stamps give the time the proxy held each request and each read of a response, from
arrival to its write on (``metrics.ForwardDelay``). The row is built when the response has
ended; what comes from the body (tokens, hash ids, model, session) is added later, off the
request path, by ``tokenize``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
from multidict import CIMultiDict

from replayer.capture.downstream import ClientConnection, Listener, Request
from replayer.capture.headers import PER_HOP, SKIP_AUTO, forward_headers, response_head
from replayer.capture.metrics import CaptureMetrics
from replayer.capture.poll import POLL_MIN_IN_FLIGHT, Poller
from replayer.capture.relay import Exchange, UpstreamGone, UpstreamPool
from replayer.capture.rows import CAPTURED, GENERATION
from replayer.capture.tokenize import Tokenization
from replayer.capture.usage import UsageTracker
from replayer.http.tls import TLSOptions, explain, find_ssl_error

log = logging.getLogger(__name__)


class CaptureProxy:
    """The proxy of ``replayer record``. ``start()`` opens the upstream pool and session;
    ``listen()`` serves; ``stop_accepting`` and ``wait_idle`` support the drain on SIGTERM;
    ``close()`` tokenizes what is queued and closes every connection."""

    def __init__(
        self,
        upstream: str,
        tokenization_factory,
        metrics: CaptureMetrics,
        *,
        t0_ns: int,
        session_header: str = "X-Session-Id",
        connect_timeout_s: float = 10.0,
        poll_interval_s: float = 0.0,
        stamp_responses: bool = False,
        tls: TLSOptions | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.tls = tls or TLSOptions()
        #: keywords of every aiohttp request upstream (the TLS server name, when one is set)
        self.request_kw: dict = {}
        self.metrics = metrics
        self.t0_ns = t0_ns
        self.session_header = session_header
        self.connect_timeout_s = connect_timeout_s
        self.stamp_responses = stamp_responses
        self._tokenization_factory = tokenization_factory
        self.tokenization: Tokenization | None = None
        self.pool: UpstreamPool | None = None
        self.session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task] = set()
        self.listener = Listener(self._handle)
        self.poller: Poller | None = (
            Poller(poll_interval_s, lambda: self.in_flight >= POLL_MIN_IN_FLIGHT, self.listener.reading)
            if poll_interval_s > 0
            else None
        )
        self._bytes_request = metrics.bytes.labels("request")
        self._bytes_response = metrics.bytes.labels("response")
        self._request_held = metrics.forward_delay.observer("request")

    async def start(self) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(self.upstream)
        if not u.hostname:
            raise ValueError(f"upstream must be an http(s) URL with a host, got {self.upstream!r}")
        https = u.scheme == "https"
        ctx = self.tls.context() if https else None  # (ValueError naming the file)
        if https and self.tls.server_name:
            self.request_kw = {"server_hostname": self.tls.server_name}
        self.pool = UpstreamPool(
            u.hostname,
            u.port or (443 if https else 80),
            ssl=ctx,
            connect_timeout_s=self.connect_timeout_s,
            observe_forward=self.metrics.forward_delay.observer("response"),
            stamped=self.stamp_responses,
            server_hostname=self.tls.server_name,
        )
        self._host = u.netloc
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s, sock_read=None)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, ssl=ctx if ctx is not None else True),
            timeout=timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.tokenization = self._tokenization_factory(self.session)
        self.tokenization.request_kw = self.request_kw
        self.tokenization.start()

    def listen(self, host: str, port: int) -> int:
        """Serve on ``host:port``; returns the port (OSError when it cannot listen)."""
        return self.listener.start(host, port)

    def stop_accepting(self) -> None:
        self.listener.stop()

    async def close(self) -> None:
        self.listener.stop()
        if self.tokenization is not None:
            await self.tokenization.drain()
        self.listener.close_all()
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            self.pool.close()

    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no request is in flight (True) or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- requests --------------------------------------------------------------------------

    def _handle(self, conn: ClientConnection, req: Request) -> None:
        """A whole request from ``conn`` (called in its read): captured or passed through. A
        captured request goes to the upstream at once, from this read, when an idle upstream
        connection is at hand (no wait for a task to start); the rest runs in a task."""
        path = req.path.rstrip("/")
        endpoint = path if req.method == "POST" and path in CAPTURED else None
        self.in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.inc()
        if self.poller is not None:
            self.poller.kick()
        body = b"".join(req.body)
        req.body = []
        self._bytes_request.inc(len(body))
        acc = pre = None
        if endpoint is not None:
            acc = UsageTracker()
            up = self.pool.take_idle() if self.pool is not None else None
            if up is not None:
                pre = (up, True, self._send(conn, req, up, self._upstream_head(req, len(body)), body, acc))
        task = asyncio.get_running_loop().create_task(self._serve(conn, req, body, endpoint, acc, pre))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, conn: ClientConnection, req: Request, up, head: bytes, body: bytes, acc: UsageTracker) -> Exchange:
        ex = Exchange(acc)
        conn.on_lost = ex.client_left
        ex.on_head = lambda: self._respond(conn, req, ex)
        ex.on_end = lambda: self._release(conn, req, ex.keep)
        up.send(head, body, ex)
        self._request_held(time.perf_counter_ns() - req.complete_ns)  # (a retry on a new connection counts again)
        return ex

    @staticmethod
    def _release(conn: ClientConnection, req: Request, keep: bool) -> None:
        """``req`` is answered: its connection goes on to its next request (or closes)."""
        if not req.released:
            req.released = True
            conn.done(keep)

    def _respond(self, conn: ClientConnection, req: Request, ex: Exchange) -> None:
        """The upstream's response head came (in its read): write the client's, start the relay."""
        clen = next((v.strip() for k, v in ex.headers if k.lower() == "content-length"), None)
        no_body = ex.status < 200 or ex.status in (204, 304)
        if clen is not None and clen.isdigit():
            framing, chunked, keep = f"Content-Length: {clen}", False, req.keep_alive
        elif no_body:
            framing, chunked, keep = None, False, req.keep_alive
        elif req.http10:  # (no chunks for HTTP/1.0: the body ends when the connection does)
            framing, chunked, keep = None, False, False
        else:
            framing, chunked, keep = "Transfer-Encoding: chunked", True, req.keep_alive
        ex.keep = keep
        conn.write(response_head(ex.status, ex.reason, forward_headers(ex.headers, PER_HOP), framing, keep, req.http10))
        ex.start_relay(conn, chunked)

    async def _serve(
        self,
        conn: ClientConnection,
        req: Request,
        body: bytes,
        endpoint: str | None,
        acc: UsageTracker | None,
        pre: tuple | None,
    ) -> None:
        keep = False
        try:
            if endpoint is None:
                self.metrics.passed_through.inc()
                keep = await self._forward(conn, req, body)
            else:
                assert acc is not None
                keep = await self._capture(conn, req, body, endpoint, acc, pre)
        except Exception:  # a bug here must not stop the proxy: this client's connection goes
            log.exception("capture: request %s %s failed in the proxy", req.method, req.path)
            if not req.released:
                conn.on_lost = None
                conn.abort()
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            if self.in_flight == 0:
                self._idle.set()
            self._release(conn, req, keep)

    async def _capture(
        self, conn: ClientConnection, req: Request, body: bytes, endpoint: str, acc: UsageTracker, pre: tuple | None
    ) -> bool:
        """Forward first; the body is read for its facts only after the answer, in the
        tokenization queue (parsing a long token-id prompt here would delay every other request)."""
        status, outcome, keep = await self._relay(conn, req, body, acc, pre)
        end = time.perf_counter_ns()
        acc.finish()  # (a stream cut short: the last usage it carried)
        row = self._row(endpoint, acc, req, status, outcome, end)
        self.metrics.request_done(endpoint, status, outcome)
        assert self.tokenization is not None
        self.tokenization.submit(row, body, req.header(self.session_header), req.header("Authorization"))
        return keep

    def _row(self, endpoint: str, acc: UsageTracker, req: Request, status: int | None, outcome: str, end: int) -> dict:
        """The row's measured part; the tokenization queue adds what comes from the body."""
        il = acc.prompt_tokens
        ol_src: str | None
        if endpoint in GENERATION:
            ol, ol_src = acc.completion_tokens, "usage"
            if ol is None and outcome == "http_error":  # an error answer generated nothing
                ol, ol_src = 0, None
            elif ol is None and status is not None:  # no usage: the chunks that carried text (an estimate)
                ol, ol_src = acc.chunks, "chunks"
            if ol is None:
                ol_src = None
        else:  # pooling endpoints generate nothing; the schema's minimum
            ol, ol_src = (1, "pooling") if outcome == "ok" else (0, None)
        return {
            "timestamp": req.arrival_ns - self.t0_ns,
            "input_length": il,
            "output_length": ol,
            "hash_ids": None,
            "request_id": req.header("X-Request-Id"),
            "session_id": None,
            "endpoint": endpoint,
            "model": None,
            "max_tokens": None,
            "status": status,
            "outcome": outcome,
            "input_length_source": "usage" if il is not None else None,
            "output_length_source": ol_src,
            "tokenized_by": None,
            "hashed_tokens": None,
            "image_count": None,
            "image_hashes": None,
            "duration_ms": (end - req.arrival_ns) / 1e6,
        }

    def _bad_gateway(self, conn: ClientConnection, req: Request, e: BaseException) -> None:
        bad = find_ssl_error(e)
        msg = (
            f"upstream {self.upstream}: TLS error: {explain(bad)}"
            if bad is not None
            else f"upstream {self.upstream} unreachable: {type(e).__name__}: {e}"
        )
        log.warning("capture: %s", msg)
        body = orjson.dumps({"error": {"message": msg, "type": "BadGateway", "code": 502}})
        conn.write(
            response_head(
                502,
                b"Bad Gateway",
                [("Content-Type", "application/json; charset=utf-8")],
                f"Content-Length: {len(body)}",
                req.keep_alive,
                req.http10,
            )
            + body
        )

    def _upstream_head(self, req: Request, body_len: int) -> bytes:
        return b"".join(
            [
                b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (req.method.encode(), req.url, self._host.encode()),
                *(f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in forward_headers(req.headers, PER_HOP)),
                b"Content-Length: %d\r\n\r\n" % body_len,
            ]
        )

    async def _relay(
        self, conn: ClientConnection, req: Request, body: bytes, acc: UsageTracker, pre: tuple | None
    ) -> tuple[int | None, str, bool]:
        """A captured request over the fast path (``relay``): the response body goes to the
        client from the upstream connection's ``data_received``. ``pre``: (connection, reused,
        exchange) when ``_handle`` sent it already. Returns (status the client got, outcome, keep
        the client's connection)."""
        assert self.pool is not None
        for attempt in (0, 1):
            if pre is not None:
                up, reused, ex = pre
                pre = None
            else:
                try:
                    up, reused = await self.pool.acquire()
                except (OSError, asyncio.TimeoutError) as e:
                    self._bad_gateway(conn, req, e)
                    return 502, "upstream_unreachable", req.keep_alive
                if conn.closed:  # the client left while a connection was opened
                    self.pool.release(up)
                    return None, "client_disconnected", False
                ex = self._send(conn, req, up, self._upstream_head(req, len(body)), body, acc)
            try:
                await ex.head
                break
            except UpstreamGone as e:
                if ex.client_gone:
                    return None, "client_disconnected", False
                if reused and not ex.got_bytes and attempt == 0:
                    continue  # a keep-alive connection the upstream had closed: once more, on a new one
                self._bad_gateway(conn, req, e)
                return 502, "upstream_unreachable", req.keep_alive
        try:
            await ex.done
        except UpstreamGone:
            self._bytes_response.inc(ex.bytes_out)
            if ex.client_gone:
                return ex.status, "client_disconnected", False
            conn.on_lost = None  # the upstream broke mid-stream: the client's response is cut off too
            conn.abort()
            return ex.status, "upstream_broken", False
        self._bytes_response.inc(ex.bytes_out)
        if ex.client_gone or not ex.ended:
            return ex.status, "client_disconnected", False
        outcome = "ok" if ex.status < 400 else "http_error"
        acc.finish()
        return ex.status, "upstream_broken" if acc.error and outcome == "ok" else outcome, ex.keep

    async def _forward(self, conn: ClientConnection, req: Request, body: bytes) -> bool:
        """Any other request, through aiohttp's client, unmeasured: the response streamed back as
        it comes. Returns whether the client's connection stays open."""
        assert self.session is not None
        started = False
        try:
            async with self.session.request(
                req.method,
                self.upstream + req.url.decode("latin-1"),
                data=body,
                headers=CIMultiDict(forward_headers(req.headers, PER_HOP)),
                allow_redirects=False,
                skip_auto_headers=SKIP_AUTO,
                **self.request_kw,
            ) as up:
                hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in up.raw_headers]
                no_body = req.method == "HEAD" or up.status < 200 or up.status in (204, 304)
                fwd = forward_headers(hdrs, frozenset(("host",)) if no_body else PER_HOP)
                if no_body:
                    framing, chunked, keep = None, False, req.keep_alive
                elif up.content_length is not None and up.headers.get("Content-Encoding") is None:
                    framing, chunked, keep = f"Content-Length: {up.content_length}", False, req.keep_alive
                elif req.http10:
                    framing, chunked, keep = None, False, False
                else:
                    framing, chunked, keep = "Transfer-Encoding: chunked", True, req.keep_alive
                conn.write(
                    response_head(
                        up.status, (up.reason or "").encode("latin-1", "replace"), fwd, framing, keep, req.http10
                    )
                )
                started = True
                if no_body:
                    return keep
                async for chunk in up.content.iter_any():
                    if conn.closed:
                        return False
                    self._bytes_response.inc(len(chunk))
                    conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.drain()
                if chunked:
                    conn.write(b"0\r\n\r\n")
                return keep
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            if not started:
                self._bad_gateway(conn, req, e)
                return req.keep_alive
            conn.abort()  # the upstream broke mid-stream
            return False
