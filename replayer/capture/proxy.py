"""The recording reverse proxy: forwards every request to the upstream unchanged, streams every
response back as it arrives, and turns each OpenAI API request into one trace row.

Transparency: the request body is sent as received (a malformed one too: the upstream answers it
and the row records the status); headers go both ways except the hop-by-hop ones (RFC 9110
7.6.1: ``Connection`` and the headers it names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``) and ``Host``/``Content-Length``, which each hop sets for
itself. A captured request's response is relayed by ``relay`` (each piece of the body written to
the client as the upstream connection reads it, no SSE buffering, no decompression; a copy goes
to the SSE decoder for the usage); other paths go through aiohttp's client, streamed too, and get
no row. The client's ``Authorization`` header is forwarded and kept only in memory until the
prompt is tokenized; it is never written. An unreachable upstream gives the client a 502 with a
JSON error, and a row.

``timestamp`` is the arrival of the request's head: the read that completed it (stamped in the
connection's ``data_received``, before any handler runs, so a burst of requests arriving together
is stamped together however long the loop then takes to start their handlers), on the monotonic
clock ``time.perf_counter_ns``, minus the capture's start.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

from ..sse import SSEDecoder
from .metrics import CaptureMetrics
from .relay import Exchange, UpstreamGone, UpstreamPool
from .rows import CAPTURED, GENERATION
from .tokenize import Tokenization

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"))
#: set again by each hop
_PER_HOP = frozenset(("host", "content-length"))


class _StampingHandler(RequestHandler):
    """aiohttp's connection protocol, recording when each request's head arrived."""

    __slots__ = ("arrivals",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: dict[int, int] = {}  # id(request message) -> arrival ns

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        msgs = self._messages
        n = len(msgs)
        super().data_received(data)
        for i in range(n, len(msgs)):
            self.arrivals[id(msgs[i][0])] = t


class _StampingServer(web.Server):
    """The low-level aiohttp server (every path goes to one handler) with ``_StampingHandler``
    connections and no 1 MB request body limit (a long prompt's body is larger)."""

    def __call__(self) -> RequestHandler:
        return _StampingHandler(self, loop=self._loop, **self._kwargs)

    def _make_request(self, message, payload, protocol, writer, task) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, self._loop, client_max_size=1 << 30)


def _arrival(request: web.BaseRequest) -> int:
    arrivals = getattr(request.protocol, "arrivals", None)
    t = arrivals.pop(id(request.message), None) if arrivals is not None else None
    return t if t is not None else time.perf_counter_ns()


def forward_headers(headers, extra_drop: frozenset = frozenset()) -> CIMultiDict:
    """``headers`` without the hop-by-hop ones (and those the ``Connection`` header names)."""
    named = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    drop = HOP_BY_HOP | named | extra_drop
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


class CaptureProxy:
    """The proxy of ``replayer record``. ``start()`` opens the upstream pool and session;
    ``server`` (a low-level aiohttp server) serves every path; ``wait_idle`` supports the drain on
    SIGTERM; ``close()`` tokenizes what is queued and closes the upstream connections."""

    def __init__(self, upstream: str, tokenization_factory, metrics: CaptureMetrics, *, t0_ns: int,
                 session_header: str = "X-Session-Id", connect_timeout_s: float = 10.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.metrics = metrics
        self.t0_ns = t0_ns
        self.session_header = session_header
        self.connect_timeout_s = connect_timeout_s
        self._tokenization_factory = tokenization_factory
        self.tokenization: Tokenization | None = None
        self.pool: UpstreamPool | None = None
        self.session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.server = _StampingServer(self._handle, access_log=None)

    async def start(self) -> None:
        import ssl as _ssl
        from urllib.parse import urlsplit

        u = urlsplit(self.upstream)
        https = u.scheme == "https"
        self.pool = UpstreamPool(u.hostname, u.port or (443 if https else 80),
                                 ssl=_ssl.create_default_context() if https else None,
                                 connect_timeout_s=self.connect_timeout_s)
        self._host = u.netloc
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s, sock_read=None)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
                                             timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        self.tokenization = self._tokenization_factory(self.session)
        self.tokenization.start()

    async def close(self) -> None:
        if self.tokenization is not None:
            await self.tokenization.drain()
        if self.session is not None:
            await self.session.close()
        self.pool.close()

    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no request is in flight (True) or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- requests --------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrival = _arrival(request)
        path = request.path
        endpoint = path.rstrip("/") if request.method == "POST" and path.rstrip("/") in CAPTURED else None
        self.in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.inc()
        try:
            body = await request.read()
            self.metrics.bytes.labels("request").inc(len(body))
            if endpoint is None:
                self.metrics.passed_through.inc()
                return await self._forward(request, body)
            return await self._capture(request, body, endpoint, arrival)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            if self.in_flight == 0:
                self._idle.set()

    async def _capture(self, request: web.Request, body: bytes, endpoint: str, arrival: int) -> web.StreamResponse:
        """Forward first; the body is read for its facts only after the answer, in the
        tokenization queue (parsing a long token-id prompt here would delay every other request)."""
        acc = UsageTracker()
        resp, (status, outcome) = await self._relay(request, body, acc)
        end = time.perf_counter_ns()
        acc.finish()  # (a stream cut short: the last usage it carried)
        row = self._row(endpoint, acc, request, status, outcome, arrival, end)
        self.metrics.request_done(endpoint, status, outcome)
        h = request.headers
        self.tokenization.submit(row, body, h.get(self.session_header), h.get("Authorization"))
        return resp

    def _row(self, endpoint: str, acc: UsageTracker, request: web.Request, status: int | None, outcome: str,
             arrival: int, end: int) -> dict:
        """The row's measured part; the tokenization queue adds what comes from the body."""
        il = acc.prompt_tokens
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
            "timestamp": arrival - self.t0_ns, "input_length": il, "output_length": ol, "hash_ids": None,
            "request_id": request.headers.get("X-Request-Id"), "session_id": None, "endpoint": endpoint,
            "model": None, "max_tokens": None, "status": status, "outcome": outcome,
            "input_length_source": "usage" if il is not None else None, "output_length_source": ol_src,
            "tokenized_by": None, "hashed_tokens": None, "image_count": None, "image_hashes": None,
            "duration_ms": (end - arrival) / 1e6,
        }

    def _bad_gateway(self, e: BaseException) -> web.Response:
        msg = f"upstream {self.upstream} unreachable: {type(e).__name__}: {e}"
        log.warning("capture: %s", msg)
        return web.json_response({"error": {"message": msg, "type": "BadGateway", "code": 502}}, status=502,
                                 dumps=lambda o: orjson.dumps(o).decode())

    async def _relay(self, request: web.BaseRequest, body: bytes, acc: UsageTracker) -> tuple[web.StreamResponse, tuple]:
        """A captured request over the fast path (``relay``): the response body goes to the
        client from the upstream connection's ``data_received``."""
        hdrs = forward_headers(request.headers, _PER_HOP)
        head = "".join([f"{request.method} {request.raw_path} HTTP/1.1\r\nHost: {self._host}\r\n",
                        *(f"{k}: {v}\r\n" for k, v in hdrs.items()),
                        f"Content-Length: {len(body)}\r\n\r\n"]).encode("latin-1", "replace")
        for attempt in (0, 1):
            try:
                conn, reused = await self.pool.acquire()
            except (OSError, asyncio.TimeoutError) as e:
                return self._bad_gateway(e), (502, "upstream_unreachable")
            ex = Exchange(acc)
            conn.send(head, body, ex)
            try:
                await ex.head
                break
            except UpstreamGone as e:
                if reused and not ex.got_bytes and attempt == 0:
                    continue  # a keep-alive connection the upstream had closed: once more, on a new one
                return self._bad_gateway(e), (502, "upstream_unreachable")
        clen = next((v for k, v in ex.headers if k.lower() == "content-length"), None)
        resp = web.StreamResponse(status=ex.status, headers=forward_headers(CIMultiDict(ex.headers), _PER_HOP))
        if clen is not None and clen.strip().isdigit():
            resp.content_length = int(clen)
        out = self.metrics.bytes.labels("response")
        try:
            await resp.prepare(request)
            if request.transport is None:
                raise ConnectionResetError
        except (ConnectionResetError, ConnectionError):  # the client left while the upstream thought
            conn.abort()
            return resp, (ex.status, "client_disconnected")
        ex.start_relay(request.transport, "chunked" in resp.headers.get("Transfer-Encoding", "").lower())
        try:
            await ex.done
        except UpstreamGone:  # the upstream broke mid-stream: the client's response is cut off too
            out.inc(ex.bytes_out)
            request.transport.close()
            return resp, (ex.status, "upstream_broken")
        out.inc(ex.bytes_out)
        if ex.client_gone:
            return resp, (ex.status, "client_disconnected")
        try:
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            return resp, (ex.status, "client_disconnected")
        outcome = "ok" if ex.status < 400 else "http_error"
        acc.finish()
        return resp, (ex.status, "upstream_broken" if acc.error and outcome == "ok" else outcome)

    async def _forward(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        """Any other path, through aiohttp's client, unmeasured: the response streamed back as it comes."""
        headers = forward_headers(request.headers, _PER_HOP)
        resp: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, self.upstream + request.raw_path, data=body,
                                            headers=headers, allow_redirects=False,
                                            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding",
                                                               "Content-Type")) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason,
                                          headers=forward_headers(up.headers, _PER_HOP))
                if up.content_length is not None and up.headers.get("Content-Encoding") is None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                out = self.metrics.bytes.labels("response")
                async for chunk in up.content.iter_any():
                    out.inc(len(chunk))
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            if resp is None:
                return self._bad_gateway(e)
            if request.transport is not None:  # the client left, or the upstream broke mid-stream
                request.transport.close()
            return resp


class UsageTracker:
    """What a capture needs of a response: the server's usage (prompt and completion tokens), or
    else a count of the events that carried text (an estimate), and whether an error came.

    Cheap on purpose (a W1 stream is ~100 one-token events per request): a stream's pieces are
    only counted with ``bytes.count`` and the last ``TAIL_BYTES`` kept; at the end that tail is
    decoded and its last event carrying a usage object parsed (with continuous usage stats it is
    the running count, so a stream cut short still gives the tokens it reached). A non-streamed
    body is parsed whole."""

    TAIL_BYTES = 16384
    __slots__ = ("prompt_tokens", "completion_tokens", "chunks", "error", "_tail", "_tail_len", "_done")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.chunks = 0
        self.error = False
        self._tail: list[bytes] = []
        self._tail_len = 0
        self._done = False

    def on_sse_piece(self, b: bytes) -> None:
        self.chunks += (b.count(b'"text":"') - b.count(b'"text":""') + b.count(b'"content":"')
                        - b.count(b'"content":""'))
        if b'"error"' in b:
            self.error = True
        self._tail.append(b)
        self._tail_len += len(b)
        while self._tail_len - len(self._tail[0]) >= self.TAIL_BYTES:
            self._tail_len -= len(self._tail.pop(0))

    def on_body(self, body: bytes) -> None:
        self._take(body)

    def finish(self) -> None:
        if self._done or not self._tail:
            return
        self._done = True
        last = None
        for ev in SSEDecoder().feed(b"".join(self._tail)):  # (the first line may be cut: it parses as nothing)
            d = ev.data
            if '"usage"' in d and '"usage":null' not in d and '"usage": null' not in d:
                last = d
        self._tail = []
        if last is not None:
            self._take(last)

    def _take(self, data: str | bytes) -> None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if type(obj) is not dict:
            return
        if obj.get("error") is not None:
            self.error = True
        u = obj.get("usage")
        if type(u) is dict:
            if type(u.get("prompt_tokens")) is int:
                self.prompt_tokens = u["prompt_tokens"]
            if type(u.get("completion_tokens")) is int:
                self.completion_tokens = u["completion_tokens"]
