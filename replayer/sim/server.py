"""The simulated vLLM OpenAI-compatible HTTP server (:class:`SimServer`): routes, lifecycle,
the completions/chat generation path and the pooling endpoints. The decode engine and slots
are in ``engine.py`` (mixin ``_Engine``), request parsing and validation in ``requests.py``
(mixin ``_Parsing``), the pooling endpoints' handler in ``poolroutes.py`` (mixin ``_PoolingRoutes``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from replayer.core.engines import engine_caps
from replayer.payload.chattemplate import ChatCounter
from replayer.sim import dialects
from replayer.sim.cache import PrefixCache, prompt_block_hashes
from replayer.sim.config import ReceivedRequest, SimConfig
from replayer.sim.engine import _TOKEN_TEXT, _Engine, _frame, _Req, timing_metrics
from replayer.sim.images import SimImages
from replayer.sim.metrics import _Metrics
from replayer.sim.pooling import EmbeddingsJob, RerankJob, ScoreJob
from replayer.sim.poolroutes import _PoolingRoutes
from replayer.sim.requests import _BadRequest, _error_body, _error_response, _Parsing
from replayer.sim.tracing import SimSpans

# The package's logger name, as before the split into modules.
log = logging.getLogger("replayer.sim")


# ---------------------------------------------------------------------------------------
# Server


class SimServer(_Engine, _Parsing, _PoolingRoutes):
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

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "/v1/completions", self._parse)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "/v1/chat/completions", self._parse_chat)

    async def _generation(
        self, request: web.Request, endpoint: str, parse: Callable[[Any], tuple[Any, np.ndarray, int, dict[str, Any]]]
    ) -> web.StreamResponse:
        arrival_ns = time.perf_counter_ns()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error_response(f"Invalid JSON body: {e}")
        try:
            if self.counter is not None:  # encoding takes ms: off the loop, as a server tokenizes
                prompt, ids, n_prompt, o = await asyncio.get_running_loop().run_in_executor(
                    self._tokenizing, parse, body
                )
            else:
                prompt, ids, n_prompt, o = parse(body)
        except _BadRequest as e:
            return _error_response(str(e))
        cfg = self.config
        if self.config.record_requests or self._on_request is not None:
            self._record(
                ReceivedRequest(
                    arrival_ns=arrival_ns,
                    endpoint=endpoint,
                    prompt=prompt,
                    prompt_tokens=n_prompt,
                    max_tokens=o["max_tokens"],
                    min_tokens=o["min_tokens"],
                    ignore_eos=o["ignore_eos"],
                    stream=o["stream"],
                    model=o["model"],
                    include_usage=o["include_usage"],
                    request_id=request.headers.get("X-Request-Id"),
                )
            )
        refused = (None if cfg.accept_any_model else dialects.model_not_found(o["model"], cfg.model)) or (
            None if o["text"] else dialects.token_ids_refused(cfg.engine)
        )
        if refused is not None:
            return refused
        if o["continuous"] and not engine_caps(cfg.engine).continuous_usage:
            o["continuous"] = False  # (usage comes once, on the last chunk)
        max_tokens = o["max_tokens"]
        if n_prompt + max_tokens > cfg.max_model_len:
            return _error_response(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However,"
                f" you requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion."
            )
        stream = o["stream"]
        if not o["text"]:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= cfg.vocab_size:
                bad = lo if lo < 0 else hi
                msg = f"Token id {bad} is out of vocabulary"
                if not stream:
                    return _error_response(msg)
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write_eof(dialects.stream_error(cfg.engine, _error_body(msg)))
                return resp
        model = o["model"] if isinstance(o["model"], str) and o["model"] else cfg.model
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._generate(request, ids, n_prompt, o, model, arrival_ns)
        finally:
            self._handlers.discard(task)

    async def _generate(  # noqa: C901, PLR0912, PLR0915
        self, request: web.Request, ids: np.ndarray, n_prompt: int, o: dict[str, Any], model: str, arrival_ns: int = 0
    ) -> web.StreamResponse:
        cfg = self.config
        loop = asyncio.get_running_loop()
        r = _Req(o["max_tokens"], n_prompt, o["chat"])
        # like vLLM: a client's X-Request-Id is the request's id (and is echoed in the response)
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        echo = {"X-Request-Id": rid} if "X-Request-Id" in request.headers else {}
        if r.chat:
            r.base = {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion.chunk" if o["stream"] else "chat.completion",
                "created": int(time.time()),
                "model": model,
            }
        else:
            r.base = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()), "model": model}
        resp: web.StreamResponse | None = None
        if o["stream"]:
            # Like vLLM (uvicorn), the 200 + headers go out as soon as the request is
            # accepted; tokens follow after queueing and prefill.
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **echo})
            try:
                await resp.prepare(request)
                await resp.write(b"")  # flushes the headers aiohttp would otherwise hold
            except ConnectionError:
                return resp
        queued = time.perf_counter()
        scheduled = t_first = None  # (the span's times: sim/tracing)
        await self._admit()
        try:
            t_admit = loop.time()
            scheduled = time.perf_counter()
            if o["metrics"] or cfg.per_request_metrics:
                r.timing = [queued, time.perf_counter(), 0.0]
            bs = cfg.kv_block_size
            hit_blocks = (
                self.prefix_cache.lookup_and_insert(prompt_block_hashes(ids, bs)) if self.prefix_cache.capacity else 0
            )
            # vLLM always recomputes at least the last prompt token.
            hits = min(hit_blocks, (n_prompt - 1) // bs) * bs
            m = self._metrics
            m.prefix_queries += n_prompt
            m.prefix_hits += hits
            encode_us = 0.0
            images = o.get("images")
            if images:  # encoder: images missing from the encoder cache are encoded (a hit skips it)
                encode_us = cfg.image_encode_us_per_token * sum(
                    im.tokens for im in images if not self.images.lookup(im)
                )
                if cfg.prompt_tokens_details:
                    r.details = {"cached_tokens": hits, "image_tokens": sum(im.tokens for im in images)}
            ttft_s = (cfg.ttft_base_ms + (cfg.prefill_us_per_token * (n_prompt - hits) + encode_us) / 1000.0) / 1000.0
            if cfg.ttft_drift_ms_per_min:  # (--ttft-drift-ms-per-min: degrading on purpose)
                ttft_s += cfg.ttft_drift_ms_per_min * (time.perf_counter() - self.born_s) / 60.0 / 1000.0
            await asyncio.sleep(max(0.0, t_admit + ttft_s - loop.time()))
            t_first = time.perf_counter()
            if r.timing is not None:
                r.timing[2] = t_first
            m.prompt_tokens += n_prompt
            r.done = loop.create_future()
            r.generated = 1
            m.generation_tokens += 1
            if o["stream"]:
                assert resp is not None
                r.continuous = o["continuous"]
                head = self._role_event(r) if r.chat else b""
                if r.max_tokens == 1:
                    await resp.write_eof(head + self._final_events(r, o["include_usage"]))
                    m.success += 1
                    return resp
                r.chunked = request.version >= (1, 1)
                if not r.continuous:
                    r.chunk = _frame(self._token_event(r, None, None, cfg.tokens_per_chunk), r.chunked)
                first = head + self._token_event(r, None, 1 if r.continuous else None)
                await resp.write(first)
                r.transport = request.transport
                if r.transport is None:
                    raise ConnectionResetError("client went away")
                self._join(r, loop.time())
                if not await r.done:
                    return resp  # client disconnected; nothing more to send
                await resp.write_eof(self._final_events(r, o["include_usage"]))
                m.success += 1
                return resp
            if r.max_tokens > 1:
                self._join(r, loop.time())
                await r.done
            m.success += 1
            usage: dict[str, int | dict[str, int]] = {
                "prompt_tokens": n_prompt,
                "completion_tokens": r.max_tokens,
                "total_tokens": n_prompt + r.max_tokens,
            }
            if r.details is not None:
                usage["prompt_tokens_details"] = r.details
            if r.chat:
                body = {
                    **r.base,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "reasoning_content": None,
                                "content": _TOKEN_TEXT * r.max_tokens,
                                "tool_calls": [],
                            },
                            "logprobs": None,
                            "finish_reason": "length",
                            "stop_reason": None,
                        }
                    ],
                    "usage": usage,
                    "prompt_logprobs": None,
                }
            else:
                body = {
                    **r.base,
                    "choices": [
                        {
                            "index": 0,
                            "text": _TOKEN_TEXT * r.max_tokens,
                            "logprobs": None,
                            "finish_reason": "length",
                            "stop_reason": None,
                            "prompt_logprobs": None,
                        }
                    ],
                    "usage": usage,
                }
            if r.timing is not None:
                body["metrics"] = timing_metrics(r)
            return web.Response(body=orjson.dumps(body), content_type="application/json", headers=echo)
        except ConnectionError:
            # The client went away while we wrote; nobody reads what we return.
            return resp if resp is not None else web.Response(status=499)
        finally:
            r.aborted = True  # the engine drops it at its next step, if still listed
            self._release()
            self._metrics.observe(queued, scheduled, t_first, time.perf_counter(), r.generated)
            if self.spans is not None and scheduled is not None:
                self.spans.emit(
                    request.headers.get("traceparent"),
                    request_id=rid,
                    model=model,
                    arrival_s=arrival_ns / 1e9,
                    queued_s=queued,
                    scheduled_s=scheduled,
                    first_s=t_first,
                    last_s=time.perf_counter(),
                    prompt_tokens=n_prompt,
                    completion_tokens=r.generated if t_first is not None else None,
                    max_tokens=r.max_tokens,
                )
