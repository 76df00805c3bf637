"""The admin HTTP server: ``/metrics`` (Prometheus text), ``/healthz``, ``/readyz``, ``/status``.

Bound to 127.0.0.1 by default. Metric exposition runs in a worker thread so a scrape never
stalls the event loop when requests are due.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class AdminServer:
    """``status()`` returns the JSON-able dict served at ``/status``; ``ready()`` gates ``/readyz``."""

    def __init__(self, registry: CollectorRegistry, *, status: Callable[[], dict],
                 ready: Callable[[], bool]) -> None:
        self.registry = registry
        self._status = status
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        app = web.Application()
        app.add_routes([web.get("/metrics", self._metrics), web.get("/healthz", self._healthz),
                        web.get("/readyz", self._readyz), web.get("/status", self._status_h)])
        self.app = app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 = a free port); returns the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        bound_host, bound_port = sock.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def _status_h(self, request: web.Request) -> web.Response:
        return web.json_response(self._status())
