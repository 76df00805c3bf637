"""The simulated vLLM OpenAI-compatible HTTP server (:class:`SimServer`): construction, routes,
lifecycle and the small endpoints. The completions/chat handler is in ``genroutes.py`` (mixin
``_GenerationRoutes``, built on the decode engine and slots of ``engine.py``, mixin ``_Engine``, and
the request parsing and validation of ``requests.py``, mixin ``_Parsing``), the pooling endpoints'
handler in ``poolroutes.py`` (mixin ``_PoolingRoutes``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from replayer.core.engines import engine_caps
from replayer.payload.chattemplate import ChatCounter
from replayer.sim import dialects
from replayer.sim.cache import PrefixCache
from replayer.sim.config import ReceivedRequest, SimConfig
from replayer.sim.engine import _Req
from replayer.sim.genroutes import _GenerationRoutes
from replayer.sim.images import SimImages
from replayer.sim.metrics import _Metrics
from replayer.sim.pooling import EmbeddingsJob, RerankJob, ScoreJob
from replayer.sim.poolroutes import _PoolingRoutes
from replayer.sim.requests import _BadRequest, _error_response
from replayer.sim.tracing import SimSpans

# The package's logger name, as before the split into modules.
log = logging.getLogger("replayer.sim")


# ---------------------------------------------------------------------------------------
# Server


class SimServer(_GenerationRoutes, _PoolingRoutes):
    """Simulated vLLM OpenAI server (see the module docstring).

    ``SimServer(config)``; ``await start(host, port)`` -> base URL, ``await stop()``. Or mount
    ``app()`` in your own aiohttp runner (the engine task starts on the first request and is
    cancelled at app cleanup). ``records`` holds ``ReceivedRequest`` when
    ``config.record_requests``; ``on_request`` (optional) is called synchronously with every
    ``ReceivedRequest`` (used by ``replayer sim --record-requests``).
    """

    def __init__(
        self, config: SimConfig | None = None, *, on_request: Callable[[ReceivedRequest], None] | None = None
    ) -> None:
        self.config = config or SimConfig()
        self.records: list[ReceivedRequest] = []
        self.records_dropped = 0
        self._on_request = on_request
        self.prefix_cache = PrefixCache(self.config.prefix_cache_tokens // self.config.kv_block_size)
        self.images = SimImages(self.config.image_token_rule, self.config.encoder_cache_images)
        self.counter = ChatCounter(self.config.tokenizer) if self.config.tokenizer else None
        # one thread: parsing touches the image caches, which are not shared between threads
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix="sim-tokenize") if self.counter else None
        self._metrics = _Metrics(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._metrics)
        # the process's memory and CPU, as a real server's prometheus_client exports them (the drift
        # verdict reads process_resident_memory_bytes)
        ProcessCollector(registry=self.registry)
        self._running = 0  # admitted: prefill + decode
        self.born_s = time.perf_counter()  # (the start of --*-drift-ms-per-min; reset by start())
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._joining: list[_Req] = []  # got token 1, not yet stepping
        self._decoding: list[_Req] = []
        self._wake: asyncio.Event | None = None
        self._engine: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        # vLLM --otlp-traces-endpoint: an llm_request span per request (the SDK imported only then)
        self.spans: SimSpans | None = None if self.config.otlp_endpoint is None else SimSpans(self.config.otlp_endpoint)

    # -- public ---------------------------------------------------------------------------

    @property
    def num_requests_running(self) -> int:
        return self._running

    @property
    def num_requests_waiting(self) -> int:
        return len(self._waiters)

    @property
    def requests_in_flight(self) -> int:
        """Requests being answered now (generation and pooling handlers)."""
        return len(self._handlers)

    def app(self) -> web.Application:
        """The aiohttp application (created once)."""
        if self._app is None:
            app = web.Application(client_max_size=1 << 30)  # long token-id prompts
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_post("/v1/embeddings", self._pooling_route(EmbeddingsJob))
            for path in ("/v1/score", "/score"):
                app.router.add_post(path, self._pooling_route(ScoreJob))
            for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
                app.router.add_post(path, self._pooling_route(RerankJob))
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            prom, json_stats = dialects.metrics_paths(self.config.engine)  # (trtllm-serve: /prometheus/metrics)
            app.router.add_get(prom, self._metrics_handler)
            if json_stats:
                app.router.add_get(json_stats, dialects.iteration_stats)
            app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
            app.router.add_post("/tokenize", self._tokenize)
            app.on_shutdown.append(self._on_shutdown)
            app.on_cleanup.append(self._on_cleanup)
            self._app = app
        return self._app

    async def start(self, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None) -> str:
        """Serve on host:port (0 = a free port), over TLS with ``ssl_context``
        (``replayer.sim.certs.server_context``); return the base URL ``http(s)://host:port``."""
        if self._runner is not None:
            raise RuntimeError("SimServer already started")
        self.born_s = time.perf_counter()
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096, ssl_context=ssl_context)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        real_port = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if ssl_context else 'http'}://{shown}:{real_port}"
        return self.url

    async def stop(self) -> None:
        """Abort in-flight requests (clients see a disconnect) and close the server."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # runs _on_shutdown / _on_cleanup
        else:
            await self._on_shutdown(None)
            await self._on_cleanup(None)

    # -- lifecycle ------------------------------------------------------------------------

    async def _on_shutdown(self, _app: Any) -> None:
        for t in list(self._handlers):
            t.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=2.0)

    async def _on_cleanup(self, _app: Any) -> None:
        spans, self.spans = self.spans, None
        if spans is not None:
            await asyncio.get_running_loop().run_in_executor(None, spans.close)
        eng, self._engine = self._engine, None
        if eng is not None:
            eng.cancel()
            try:
                await eng
            except asyncio.CancelledError:
                pass

    # -- handlers -------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Empty the prefix cache, as vLLM's ``POST /reset_prefix_cache`` does (200, empty body):
        requests sent after it hit only what they themselves cache. The metrics' counters stay."""
        self.prefix_cache.reset()
        return web.Response(status=200)

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: ``{"prompt": ...}`` or ``{"messages": [...]}`` -> ``{"count",
        "max_model_len", "tokens", "token_strs"}``, tokenized as the simulator counts a prompt
        (whitespace words; token-id prompts as they are); word ids are non-negative 31-bit values,
        stable for the life of the process."""
        try:
            body = orjson.loads(await request.read())
            _, ids, n, _ = (self._parse_chat if isinstance(body, dict) and "messages" in body else self._parse)(
                {**body, "max_tokens": None} if isinstance(body, dict) else body
            )
        except orjson.JSONDecodeError:
            return _error_response("Request body is not valid JSON")
        except _BadRequest as e:
            return _error_response(str(e))
        tokens = (ids & 0x7FFFFFFF).tolist()
        return web.json_response(
            {"count": n, "max_model_len": self.config.max_model_len, "tokens": tokens, "token_strs": None}
        )

    async def _models(self, request: web.Request) -> web.Response:
        c = self.config
        body = {
            "object": "list",
            "data": [
                {
                    "id": c.model,
                    "object": "model",
                    "created": int(self._metrics.created),
                    "owned_by": engine_caps(c.engine).owned_by or c.model,
                    "root": c.model,
                    "parent": None,
                    "max_model_len": c.max_model_len,
                    "permission": [],
                }
            ],
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        if self.config.engine != "vllm":  # another engine's names (replayer.sim.dialects)
            return web.Response(text=dialects.dialect_page(self), content_type="text/plain", charset="utf-8")
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    def _record(self, rec: ReceivedRequest) -> None:
        if self.config.record_requests:
            if len(self.records) < self.config.record_limit:
                self.records.append(rec)
            else:
                self.records_dropped += 1
        if self._on_request is not None:
            try:
                self._on_request(rec)
            except Exception:
                log.exception("sim on_request callback failed")
