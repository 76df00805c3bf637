"""The recording reverse proxy: forwards every request to the upstream unchanged, streams every
response back as it arrives, and turns each OpenAI API request into one trace row.

Transparency: the request body is sent as received (a malformed one too: the upstream answers it
and the row records the status); headers go both ways except the hop-by-hop ones (RFC 9110
7.6.1: ``Connection`` and the headers it names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``) and ``Host``/``Content-Length``, which each hop sets for
itself; the response body's bytes are written to the client read by read (no SSE buffering,
no decompression), while a sans-I/O SSE decoder reads the usage from a copy of each read. The
client's ``Authorization`` header is forwarded and kept only in memory until the prompt is
tokenized; it is never written. Paths other than the captured API paths are passed through
without a row. An unreachable upstream gives the client a 502 with a JSON error, and a row.

``timestamp`` is the arrival of the request (the handler's first instruction), on the monotonic
clock ``time.perf_counter_ns`` minus the capture's start.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from ..sse import SSEDecoder, StreamAccumulator
from .metrics import CaptureMetrics
from .rows import CAPTURED, GENERATION, request_facts
from .tokenize import Tokenization

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"))
#: set again by each hop
_PER_HOP = frozenset(("host", "content-length"))
#: a non-streamed response body is read for its usage up to this size (an embeddings response can
#: be large); past it the body still goes to the client whole, the usage is unknown
MAX_BODY_PARSE = 64 << 20


def forward_headers(headers, extra_drop: frozenset = frozenset()) -> CIMultiDict:
    """``headers`` without the hop-by-hop ones (and those the ``Connection`` header names)."""
    named = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    drop = HOP_BY_HOP | named | extra_drop
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


class CaptureProxy:
    """The aiohttp application of ``replayer record``. ``start()`` opens the upstream session;
    ``app`` serves every path; ``stop_accepting``/``wait_idle`` support the drain on SIGTERM."""

    def __init__(self, upstream: str, tokenization_factory, metrics: CaptureMetrics, *, t0_ns: int,
                 session_header: str = "X-Session-Id", image_hash=None, connect_timeout_s: float = 10.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.metrics = metrics
        self.t0_ns = t0_ns
        self.session_header = session_header
        self.image_hash = image_hash
        self.connect_timeout_s = connect_timeout_s
        self._tokenization_factory = tokenization_factory
        self.tokenization: Tokenization | None = None
        self.session: aiohttp.ClientSession | None = None
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.app = web.Application(client_max_size=1 << 30)
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    async def start(self) -> None:
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

    async def wait_idle(self, timeout_s: float | None) -> bool:
        """Wait until no request is in flight (True) or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- requests --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrival = time.perf_counter_ns()
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
                resp, _ = await self._forward(request, body, None)
                return resp
            return await self._capture(request, body, endpoint, arrival)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            if self.in_flight == 0:
                self._idle.set()

    async def _capture(self, request: web.Request, body: bytes, endpoint: str, arrival: int) -> web.StreamResponse:
        facts = request_facts(endpoint, body, request.headers.get(self.session_header), self.image_hash)
        acc = StreamAccumulator()
        resp, (status, outcome) = await self._forward(request, body, acc)
        end = time.perf_counter_ns()
        row = self._row(facts, acc, request, status, outcome, arrival, end)
        self.metrics.request_done(endpoint, status, outcome)
        self.tokenization.submit(row, facts, request.headers.get("Authorization"))
        return resp

    def _row(self, facts, acc: StreamAccumulator, request: web.Request, status: int | None, outcome: str,
             arrival: int, end: int) -> dict:
        il = acc.prompt_tokens
        if facts.endpoint in GENERATION:
            ol, ol_src = acc.completion_tokens, "usage"
            if ol is None and outcome == "http_error":  # an error answer generated nothing
                ol, ol_src = 0, None
            elif ol is None and status is not None:  # no usage: the chunks that carried text (an estimate)
                ol, ol_src = acc.output_tokens_estimate, "chunks"
            if ol is None:
                ol_src = None
        else:  # pooling endpoints generate nothing; the schema's minimum
            ol, ol_src = (1, "pooling") if outcome == "ok" else (0, None)
        return {
            "timestamp": arrival - self.t0_ns, "input_length": il, "output_length": ol, "hash_ids": None,
            "request_id": request.headers.get("X-Request-Id"), "session_id": facts.session_id,
            "endpoint": facts.endpoint, "model": facts.model, "max_tokens": facts.max_tokens, "status": status,
            "outcome": outcome, "input_length_source": "usage" if il is not None else None,
            "output_length_source": ol_src, "tokenized_by": None, "hashed_tokens": None,
            "image_count": len(facts.images) if facts.endpoint == "/v1/chat/completions" and facts.parsed else None,
            "image_hashes": facts.images if facts.images else None,
            "duration_ms": (end - arrival) / 1e6,
        }

    async def _forward(self, request: web.Request, body: bytes,
                       acc: StreamAccumulator | None) -> tuple[web.StreamResponse, tuple[int | None, str]]:
        """Send the request upstream and stream the answer back. Returns the response and
        (status the client got, outcome)."""
        headers = forward_headers(request.headers, _PER_HOP)
        url = self.upstream + str(request.rel_url)
        resp: web.StreamResponse | None = None
        try:
            async with self.session.request(request.method, url, data=body, headers=headers, allow_redirects=False,
                                            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding",
                                                               "Content-Type")) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason,
                                          headers=forward_headers(up.headers, frozenset(("content-length",))))
                if up.content_length is not None and up.headers.get("Content-Encoding") is None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                sse = "text/event-stream" in up.headers.get("Content-Type", "")
                dec = SSEDecoder() if acc is not None and sse else None
                buf = bytearray() if acc is not None and not sse else None
                out = self.metrics.bytes.labels("response")
                async for chunk in up.content.iter_any():
                    out.inc(len(chunk))
                    try:
                        await resp.write(chunk)
                    except (ConnectionResetError, ConnectionError):
                        _measure(acc, dec, buf, chunk)
                        up.close()
                        return resp, (up.status, "client_disconnected")
                    _measure(acc, dec, buf, chunk)
                if buf is not None and len(buf) <= MAX_BODY_PARSE:
                    acc.on_body(bytes(buf), time.perf_counter_ns())
                try:
                    await resp.write_eof()
                except (ConnectionResetError, ConnectionError):
                    return resp, (up.status, "client_disconnected")
                outcome = "ok" if up.status < 400 else "http_error"
                if acc is not None and acc.error_kind.value == "stream_error" and outcome == "ok":
                    outcome = "upstream_broken"
                return resp, (up.status, outcome)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            if resp is None:  # nothing was sent to the client yet: a 502 it can read
                msg = f"upstream {self.upstream} unreachable: {type(e).__name__}: {e}"
                log.warning("capture: %s", msg)
                err = web.json_response({"error": {"message": msg, "type": "BadGateway", "code": 502}},
                                        status=502, dumps=lambda o: orjson.dumps(o).decode())
                return err, (502, "upstream_unreachable")
            # the upstream broke mid-stream: the client's response is cut off too
            if request.transport is not None:
                request.transport.close()
            return resp, (resp.status, "upstream_broken")


def _measure(acc: StreamAccumulator | None, dec: SSEDecoder | None, buf: bytearray | None, chunk: bytes) -> None:
    if acc is None:
        return
    if dec is not None:
        t = time.perf_counter_ns()
        for ev in dec.feed(chunk):
            acc.on_event(ev.data, t)
    elif buf is not None and len(buf) <= MAX_BODY_PARSE:
        buf += chunk
