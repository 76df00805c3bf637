"""Before the first request: waiting for the target to answer, and the error of a run that could
not start (nothing was sent)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from urllib.parse import urlsplit

import aiohttp

from replayer.http.tls import TLSOptions, describe_failure, find_ssl_error, probe, tls_answers

log = logging.getLogger("replayer")


class StartupError(RuntimeError):
    """The replay could not start (target unreachable, bad trace...); nothing was sent."""


async def wait_ready(
    base_url: str, timeout_s: float, api_key: str | None, tls: TLSOptions | None = None
) -> list[str | None]:
    """Poll ``GET /v1/models`` until it answers 200 (returns the model ids) or ``timeout_s``
    passes (raises StartupError naming the URL and the last error). A TLS failure (unknown CA,
    name mismatch, expired, client certificate required) raises StartupError at once, naming the
    cause and the server's certificate: waiting would not mend it; so does an ``http://`` target
    whose port speaks TLS. A TLS port that accepts connections and never finishes a handshake is
    waited for (a server still starting does that) and named when the wait ends."""
    start = time.monotonic()
    u = urlsplit(base_url)
    tls = tls or TLSOptions()
    try:
        kw = tls.request_kwargs(u.scheme == "https")
    except ValueError as e:
        raise StartupError(str(e)) from None
    if tls.insecure and u.scheme == "https":
        log.warning(
            "--insecure: the TLS certificate of %s is NOT verified (anyone on the path can pose as it)", base_url
        )
    if u.scheme == "http" and tls != TLSOptions():
        log.warning("%s is an http:// target: the TLS options (--ca-bundle, --client-cert, ...) do not apply", base_url)
    why = _Why(base_url, tls, kw.get("ssl"))
    deadline = start + timeout_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    last = "no answer"
    said = None  # when "waiting" was last logged
    url = base_url.rstrip("/") + "/v1/models"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            try:
                async with session.get(url, headers=headers, **kw) as r:
                    if r.status == 200:
                        data = await r.json(content_type=None)
                        if said is not None:
                            log.info("target %s ready after %.1f s", base_url, time.monotonic() - start)
                        return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
                    last = f"HTTP {r.status}" + (
                        " (no /v1/models there: --target is the server's base URL, e.g. http://host:8000)"
                        if r.status == 404
                        else ""
                    )
            except (aiohttp.ClientError, OSError) as e:
                last = await why.poll_failed(e, timeout_s)
            except asyncio.TimeoutError as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            now = time.monotonic()
            if now >= deadline:
                raise StartupError(
                    f"target {base_url} not ready after {timeout_s:.0f} s ({await why.last_words(last)}; "
                    "--ready-timeout sets how long to wait)"
                )
            if said is None and now - start >= 1.0 or said is not None and now - said >= 10.0:
                said = now
                log.info(
                    "waiting for the target: GET %s: %s (%.0f s of --ready-timeout %.0f s left)",
                    url,
                    last,
                    deadline - now,
                    timeout_s,
                )
            await asyncio.sleep(0.05)


class _Why:
    """Why a readiness poll of ``base_url`` failed, where TLS is the reason: raises StartupError
    when waiting cannot mend it, else says what the poll ran into."""

    def __init__(self, base_url: str, tls: TLSOptions, ctx: ssl.SSLContext | None) -> None:
        self.base_url = base_url
        self.u = urlsplit(base_url)
        self.tls = tls
        self.ctx = ctx
        self.checked_tls = False  # (an http:// target: whether its port was tried for TLS)

    async def poll_failed(self, e: BaseException, timeout_s: float) -> str:
        u, tls = self.u, self.tls
        bad = find_ssl_error(e)
        if bad is not None:
            raise StartupError(
                await describe_failure(
                    bad, u.hostname or "", u.port or 443, tls.server_name, min(timeout_s, 5.0), where=self.base_url
                )
            ) from None
        if u.scheme == "https" and isinstance(e, aiohttp.ServerDisconnectedError) and self.ctx is not None:
            why = await probe(u.hostname or "", u.port or 443, self.ctx, tls.server_name, 5.0, bool(tls.client_cert))
            if why:
                raise StartupError(f"TLS error with {self.base_url}: {why}") from None
        if u.scheme == "http" and not self.checked_tls and _garbled(e):
            self.checked_tls = True
            if await tls_answers(u.hostname or "", u.port or 80, None, 5.0) == "tls":
                raise StartupError(
                    f"target {self.base_url}: the server speaks TLS on this port (an https:// target, with "
                    "--ca-bundle for a private CA?)"
                ) from None
        return _connect_problem(e)

    async def last_words(self, last: str) -> str:
        """The last poll's problem, as the give-up message says it: a TLS port that never finishes
        a handshake is named."""
        u = self.u
        if u.scheme == "https" and "Timeout" in last:
            if await tls_answers(u.hostname or "", u.port or 443, self.tls.server_name, 5.0) == "silent":
                return (
                    "handshake timeout: the TCP connection opens but no TLS handshake finishes within 5 s: "
                    "a server still starting, or one that does not speak TLS on this port"
                )
        return last


def _garbled(e: BaseException) -> bool:
    """A plain-HTTP poll the server answered with no HTTP (closed it, or bytes that are not a
    response): what a TLS port does with a plain request."""
    return isinstance(e, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError | aiohttp.ClientPayloadError)


def _connect_problem(e: BaseException) -> str:
    """The last error of a readiness poll, in a line."""
    if isinstance(e, aiohttp.ClientConnectorError):  # (its text names aiohttp's "ssl:default")
        os_err = e.os_error
        return f"cannot connect: {type(os_err).__name__}" + (f" ({os_err.strerror})" if os_err.strerror else "")
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def wait_ready_all(
    base_urls: list[str], timeout_s: float, api_key: str | None, tls: TLSOptions | None = None
) -> list[list[str | None]]:
    """``wait_ready`` for every target at once (each with the whole ``timeout_s``): each one's
    model ids. Raises StartupError naming every target not ready in time (nothing is sent to any:
    a run whose targets are not all up would measure another fleet than the one asked for)."""
    got = await asyncio.gather(*(wait_ready(u, timeout_s, api_key, tls) for u in base_urls), return_exceptions=True)
    for g in got:
        if isinstance(g, BaseException) and not isinstance(g, StartupError):
            raise g
    bad = [str(g) for g in got if isinstance(g, StartupError)]
    if len(bad) == 1 and len(base_urls) == 1:
        raise StartupError(bad[0])
    if bad:
        raise StartupError(f"{len(bad)} of {len(base_urls)} targets not ready: " + "; ".join(bad))
    return [g for g in got if isinstance(g, list)]
