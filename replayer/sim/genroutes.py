"""The simulator's generation endpoints (``/v1/completions``, ``/v1/chat/completions``): the HTTP
handler.

Parse and check the request (``requests.py``), record it, take a slot, wait the prefill time (the
prefix cache's hits and the images' encoding taken off), then stream the tokens through the decode
loop (``engine.py``) or answer once; an OpenTelemetry span per request (``tracing.py``). A mixin of
:class:`replayer.sim.server.SimServer` (``_GenerationRoutes``), which owns the caches, the handlers
in flight and the request record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import orjson
from aiohttp import web

from replayer.core.engines import engine_caps
from replayer.sim import dialects
from replayer.sim.cache import prompt_block_hashes
from replayer.sim.config import ReceivedRequest
from replayer.sim.engine import _TOKEN_TEXT, _Engine, _frame, _Req, timing_metrics
from replayer.sim.requests import _BadRequest, _error_body, _error_response, _Parsing

if TYPE_CHECKING:
    from replayer.sim.cache import PrefixCache
    from replayer.sim.tracing import SimSpans


class _GenerationRoutes(_Engine, _Parsing):
    """``/v1/completions`` and ``/v1/chat/completions`` of the sim (the decode engine and the
    parsing are the mixins it builds on)."""

    if TYPE_CHECKING:  # the server's, set by SimServer.__init__
        prefix_cache: PrefixCache
        spans: SimSpans | None
        _tokenizing: ThreadPoolExecutor | None
        _on_request: Callable[[ReceivedRequest], None] | None
        _handlers: set[asyncio.Task[Any]]

        def _record(self, rec: ReceivedRequest) -> None: ...

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
