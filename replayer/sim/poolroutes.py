"""The simulator's pooling endpoints (embeddings, score, rerank): the HTTP handler.

Parse the job (``replayer.sim.pooling``), take a slot, wait the prefill time of its tokens (no
prefix cache, no decode), count it, answer. A mixin of :class:`replayer.sim.server.SimServer`
(``_PoolingRoutes``), which owns the slots, the handlers in flight and the request record.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable

import orjson
from aiohttp import web

from replayer.sim.config import ReceivedRequest
from replayer.sim.pooling import PoolingError, PoolingJob
from replayer.sim.requests import _error_response

if TYPE_CHECKING:
    from replayer.sim.config import SimConfig
    from replayer.sim.metrics import _Metrics


class _PoolingRoutes:
    """``/v1/embeddings``, ``/v1/score``, ``/v1/rerank`` (and their aliases) of the sim."""

    if TYPE_CHECKING:  # the server's, which this mixin uses
        config: SimConfig
        _on_request: Callable[[ReceivedRequest], None] | None
        _handlers: set[asyncio.Task[Any]]
        _metrics: _Metrics

        def _record(self, rec: ReceivedRequest) -> None: ...
        async def _admit(self) -> None: ...
        def _release(self) -> None: ...

    def _pooling_route(self, job_cls: type[PoolingJob]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            return await self._pooling(request, job_cls)

        return handler

    async def _pooling(self, request: web.Request, job_cls: type[PoolingJob]) -> web.Response:
        """Embeddings/score/rerank (replayer.sim.pooling): parse, take a slot, wait the prefill time
        of ``job.tokens`` (no prefix cache, no decode), count it, answer."""
        arrival_ns = time.perf_counter_ns()
        try:
            job = job_cls.parse(orjson.loads(await request.read()), self.config)
        except orjson.JSONDecodeError as e:
            return _error_response(f"Invalid JSON body: {e}")
        except PoolingError as e:
            return _error_response(str(e))
        cfg = self.config
        if cfg.record_requests or self._on_request is not None:
            self._record(
                ReceivedRequest(
                    arrival_ns=arrival_ns,
                    endpoint=request.path,
                    prompt=job.prompt,
                    prompt_tokens=job.tokens,
                    max_tokens=None,
                    min_tokens=None,
                    ignore_eos=None,
                    stream=False,
                    model=job.model,
                    include_usage=False,
                    request_id=request.headers.get("X-Request-Id"),
                )
            )
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._admit()
            try:
                await asyncio.sleep((cfg.ttft_base_ms + cfg.prefill_us_per_token * job.tokens / 1000.0) / 1000.0)
                self._metrics.prompt_tokens += job.tokens
                self._metrics.success_stop += 1
            finally:
                self._release()
        finally:
            self._handlers.discard(task)
        body = job.response(job.model or cfg.model)
        return web.Response(body=orjson.dumps(body), content_type="application/json")
