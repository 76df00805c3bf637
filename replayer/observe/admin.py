"""The admin HTTP server: ``/metrics`` (Prometheus text), ``/healthz``, ``/readyz``, ``/status``,
and control: ``POST /pause``, ``/resume``, ``/speedup`` (``{"speedup": X}`` or ``?value=X``),
``/stop`` (drain, like SIGTERM).

Bound to 127.0.0.1 by default. Control endpoints require ``Authorization: Bearer <token>`` when a
token is configured; ``/metrics`` and the health endpoints stay open. Metric exposition runs in a
worker thread so a scrape never stalls the event loop when requests are due.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from replayer.observe.runlabels import RunLabels

log = logging.getLogger(__name__)

#: the header a Prometheus scrape carries (also the OpenTelemetry Collector's prometheus receiver,
#: vmagent, Grafana Alloy): what tells a scraper that will come back from a one-off ``curl``
SCRAPE_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"


class Controller(Protocol):
    """What the control endpoints steer (the dispatcher)."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def set_speedup(self, speedup: float) -> None: ...
    def stop(self) -> None: ...


class AdminServer:
    """``status()`` returns the JSON-able dict served at ``/status``; ``ready()`` gates ``/readyz``;
    ``control()`` returns the Controller once the replay runs (None before: control answers 503);
    ``token``: bearer token required by the control endpoints (None = open)."""

    def __init__(
        self,
        registry: CollectorRegistry | RunLabels,
        *,
        status: Callable[[], dict],
        ready: Callable[[], bool],
        control: Callable[[], Controller | None] = lambda: None,
        token: str | None = None,
    ) -> None:
        self.registry = registry  # (or any object with collect(): runlabels.RunLabels)
        self.scrapers: dict[tuple[str, str], float] = {}  # (peer address, user agent) -> its last scrape
        self.scrape_jobs: set[tuple[str, str]] = set()  # those that sent SCRAPE_HEADER
        self._status = status
        self._ready = ready
        self._control = control
        self._token = token
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        app = web.Application()
        app.add_routes(
            [
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/status", self._status_h),
                web.post("/pause", self._pause),
                web.post("/resume", self._resume),
                web.post("/speedup", self._speedup),
                web.post("/stop", self._stop),
            ]
        )
        self.app = app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 = a free port); returns the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        # (two processes starting on one port at once: uvloop's server may hold no socket then)
        socks = [x for x in (getattr(site._server, "sockets", None) or []) if x is not None]  # noqa: SLF001
        if not socks:
            await self.stop()
            raise OSError(errno.EADDRINUSE, f"cannot listen on {host}:{port}")
        bound_host, bound_port = socks[0].getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, self.registry)
        # (after the exposition: a scrape counts once its values were read)
        key = (request.remote or "?", request.headers.get("User-Agent", "?"))
        self.scrapers[key] = time.monotonic()
        if SCRAPE_HEADER in request.headers:
            self.scrape_jobs.add(key)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def _status_h(self, request: web.Request) -> web.Response:
        return web.json_response(self._status())

    # -- control ------------------------------------------------------------------------------
    def _authorise(self, request: web.Request) -> Controller:
        if self._token is not None:
            got = request.headers.get("Authorization", "")
            if not got:
                raise web.HTTPUnauthorized(
                    text="control needs a token: send Authorization: Bearer TOKEN "
                    "(the replayer's --control-token-file or $REPLAYER_CONTROL_TOKEN)\n",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if not hmac.compare_digest(got.encode(), f"Bearer {self._token}".encode()):
                log.warning("control request %s %s refused: wrong bearer token", request.method, request.path)
                raise web.HTTPUnauthorized(
                    text="wrong bearer token (not the one the replayer was given)\n",
                    headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
                )
        ctl = self._control()
        if ctl is None:
            raise web.HTTPServiceUnavailable(text="replay not running\n")
        return ctl

    async def _pause(self, request: web.Request) -> web.Response:
        self._authorise(request).pause()
        return web.json_response(self._status())

    async def _resume(self, request: web.Request) -> web.Response:
        self._authorise(request).resume()
        return web.json_response(self._status())

    async def _stop(self, request: web.Request) -> web.Response:
        self._authorise(request).stop()
        return web.json_response(self._status())

    async def _speedup(self, request: web.Request) -> web.Response:
        ctl = self._authorise(request)
        raw = request.query.get("value")
        if raw is None and request.can_read_body:
            try:
                raw = (await request.json()).get("speedup")
            except (ValueError, AttributeError):
                raw = None
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise web.HTTPBadRequest(text='give the new speed-up as {"speedup": X} or ?value=X\n') from None
        if not (value > 0 and math.isfinite(value)):
            raise web.HTTPBadRequest(text="speedup must be a finite number > 0\n")
        ctl.set_speedup(value)
        return web.json_response(self._status())
