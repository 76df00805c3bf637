"""The HTTP client: owns the aiohttp session; ``send`` turns a PreparedRequest into a measured
RequestResult and never raises for request failures (errors are values at this boundary).

Traps avoided (see DESIGN.md): aiohttp's ``TCPConnector`` allows 100 connections by default, a
hidden client-side queue that counts as server TTFT (case B24): here the pool is unlimited. Its
default 300 s total timeout would cut long generations: here there is no total timeout, only a
connect timeout and a read (stall) timeout between two reads. ``StreamReader.readany`` returns
whatever arrived, so an SSE event of any size is reassembled by ``sse.SSEDecoder`` instead of
``readuntil``'s ~128 KiB line limit.
"""

from __future__ import annotations

import asyncio

import aiohttp

from .clock import now_ns
from .errors import ErrorKind, Outcome, classify_exception
from .payload import PreparedRequest
from .result import RequestResult
from .sse import SSEDecoder, StreamAccumulator

_ERROR_BODY_LIMIT = 64 * 1024
_ERROR_TEXT_LIMIT = 500


class Client:
    """Sends prepared requests to ``base_url + endpoint``.

    ``t0_ns``: the run anchor; recorded times are offsets from it. ``api_key``: sent as a bearer
    token (never logged). ``connect_timeout_s``: TCP connect limit. ``read_timeout_s``: longest
    silence between two reads of a response before it fails as TIMEOUT (``None``: wait forever).
    Use as an async context manager, or call ``start``/``close``.
    """

    def __init__(self, base_url: str, *, t0_ns: int, endpoint: str = "/v1/completions",
                 api_key: str | None = None, connect_timeout_s: float = 30.0,
                 read_timeout_s: float | None = 600.0) -> None:
        self.url = base_url.rstrip("/") + endpoint
        self.t0_ns = t0_ns
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout_s,
                                              sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None,
                                         keepalive_timeout=60.0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                              auto_decompress=False, raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "Client":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, req: PreparedRequest, res: RequestResult) -> RequestResult:
        """Send ``req``, stream its response and fill ``res`` (returned). Request failures are
        recorded in ``res``; ``asyncio.CancelledError`` marks ``res`` cancelled and propagates."""
        assert self._session is not None, "Client.start() was not called"
        t0 = self.t0_ns
        acc = StreamAccumulator()
        sent = now_ns()
        res.sent_ns = sent - t0
        res.dispatch_lag_ms = (res.sent_ns - req.due_ns) / 1e6
        try:
            async with self._session.post(self.url, data=req.body, headers=self._headers) as resp:
                res.http_status = resp.status
                if resp.status != 200:
                    body = await _read_limited(resp.content, _ERROR_BODY_LIMIT)
                    end = now_ns()
                    acc.on_body(body, end)
                    acc.finish()
                    _fail(res, ErrorKind.HTTP_STATUS,
                          acc.error or body.decode("utf-8", "replace")[:_ERROR_TEXT_LIMIT] or f"HTTP {resp.status}")
                    res.end_ns = end - t0
                    return res
                if resp.content_type == "text/event-stream":
                    dec = SSEDecoder()
                    content = resp.content
                    on_event = acc.on_event
                    while True:
                        data = await content.readany()
                        if not data:
                            break
                        t = now_ns()
                        for ev in dec.feed(data):
                            on_event(ev.data, t)
                    dec.close()
                else:
                    body = await resp.read()
                    acc.on_body(body, now_ns())
                acc.finish()
            end = now_ns()
            res.end_ns = end - t0
            _measure(res, acc, sent, t0)
            if not acc.success:
                _fail(res, acc.error_kind, acc.error)
            else:
                res.outcome = Outcome.SUCCESS.value
        except asyncio.CancelledError:
            res.end_ns = now_ns() - t0
            _measure(res, acc, sent, t0)
            _fail(res, ErrorKind.CANCELLED, "cancelled at shutdown", outcome=Outcome.CANCELLED)
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded value
            res.end_ns = now_ns() - t0
            _measure(res, acc, sent, t0)
            _fail(res, classify_exception(exc), f"{type(exc).__name__}: {exc}"[:_ERROR_TEXT_LIMIT])
        return res


async def _read_limited(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to EOF or ``limit`` bytes (``StreamReader.read(n)`` alone returns only what
    has arrived so far: an error body sent in several writes was cut to its first piece)."""
    parts: list[bytes] = []
    left = limit
    while left > 0:
        data = await content.read(left)
        if not data:
            break
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _fail(res: RequestResult, kind: ErrorKind, error: str | None, outcome: Outcome = Outcome.FAILED) -> None:
    res.outcome = outcome.value
    res.error_kind = kind.value
    res.error = error


def _measure(res: RequestResult, acc: StreamAccumulator, sent: int, t0: int) -> None:
    """Copy the accumulator's measurements into ``res`` (times as offsets from ``t0``)."""
    res.prompt_tokens = acc.prompt_tokens
    res.completion_tokens = acc.completion_tokens
    res.usage_source = "server" if acc.usage_seen else "none"
    res.n_chunks = acc.n_chunks
    res.finish_reason = acc.finish_reason
    first, last = acc.first_token_ns, acc.last_token_ns
    if first is not None:
        res.first_token_ns = first - t0
        res.ttft_ms = (first - sent) / 1e6
    if last is not None:
        res.last_token_ns = last - t0
        res.e2e_ms = (last - sent) / 1e6
    res.tpot_ms = acc.tpot_ms()
    res.itl_ms = acc.itl_ms()
