"""Embedded simulated LLM server that behaves like vLLM's OpenAI-compatible server.

The sim is the default target when no ``--target`` is given (started in-process on a free
127.0.0.1 port, sharing the event loop with the load generator), the standalone server behind
``replayer sim``, and a test fixture. It generates no text: it reproduces the *wire format*,
the *timing shape* and the *Prometheus metrics* of ``vllm serve`` closely enough that the
replayer's client, scheduler and metrics code cannot tell the difference, while costing a few
microseconds per streamed token.

Endpoints (vLLM flavour)
------------------------
``POST /v1/completions``
    Body fields used: ``prompt``, ``max_tokens`` (default 16, must be an int >= 1), ``stream``,
    ``stream_options.include_usage``, ``stream_options.continuous_usage_stats``, ``model``;
    ``min_tokens`` and ``ignore_eos`` are recorded but do not change behaviour; every other
    field (``n``, ``echo``, ``temperature``...) is ignored.

    ``prompt`` may be
      * a list of ints (token ids) - the normal case; ``prompt_tokens == len(prompt)``;
      * a list holding exactly one list of ints, or exactly one string (a batch of one);
        batches of any other size are rejected with HTTP 400 (the sim has one choice per
        request);
      * a string: the sim has no tokenizer, so it counts whitespace-separated words,
        ``prompt_tokens == len(prompt.split())``; for prefix caching each word is one
        "token" (keyed by the word's hash).

    The sim always generates exactly ``max_tokens`` tokens (as with ``ignore_eos=true``), each
    with text ``" tok"``, so ``finish_reason`` is always ``"length"``.

    Streaming (``"stream": true``): HTTP 200 and the headers (``Content-Type:
    text/event-stream``, chunked on HTTP/1.1) are sent as soon as the request is accepted,
    like vLLM; then one event per token::

        data: {"id":"cmpl-<hex>","object":"text_completion","created":<unix s>,"model":M,
               "choices":[{"index":0,"text":" tok","logprobs":null,
                           "finish_reason":null,"stop_reason":null}]}\\n\\n

    the last token's chunk has ``"finish_reason":"length"``; then, if ``include_usage``, a
    usage-only event ``{..., "choices":[], "usage":{"prompt_tokens":P,
    "completion_tokens":N, "total_tokens":P+N}}``; then ``data: [DONE]\\n\\n``. As in vLLM,
    per-chunk running usage is added only when ``include_usage`` AND
    ``continuous_usage_stats`` are both true. Non-streaming returns one JSON body with
    ``choices[0].text`` (``" tok" * N``), ``finish_reason`` and ``usage``.

    The ``model`` field is echoed back; an unknown model name is accepted (no 404).

    Errors (body ``{"error": {"message", "type": "BadRequestError", "param": null,
    "code": 400}}``):
      * invalid JSON, missing/ill-typed ``prompt`` or ``max_tokens``: HTTP 400;
      * ``prompt_tokens + max_tokens > max_model_len`` (vLLM's context-length rule, which
        includes "prompt longer than max_model_len"): HTTP 400, also for streams;
      * a token id ``< 0`` or ``>= vocab_size``: like vLLM this is found by the engine, so a
        streaming request gets HTTP 200, then ``data: {"error": {...}}`` and
        ``data: [DONE]``; a non-streaming one gets HTTP 400.

``POST /v1/chat/completions``
    Same admission, prefix cache, timing, errors and recording as completions (one engine).
    Body: ``messages`` (non-empty list of ``{"role": str, "content": str | [{"type":
    "text", "text": str}, ...] | null}``; other part types -> 400), ``max_completion_tokens``
    (preferred, as vLLM) or ``max_tokens`` (default 16), ``stream``, ``stream_options``,
    ``model``, ``min_tokens``, ``ignore_eos``. ``prompt_tokens`` = whitespace words over all
    message contents, in order (also the prefix-cache "tokens"); the sim applies no chat
    template, so no role/template tokens are counted (a real server counts more). Zero
    words -> 400. Streaming: with the first token, a role chunk
    ``{"id":"chatcmpl-<hex>","object":"chat.completion.chunk","created":..,"model":M,
    "choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,
    "finish_reason":null}]}``, then per token ``"delta":{"content":" tok"}``, the last
    with ``"finish_reason":"length","stop_reason":null``, then the usage-only chunk
    (``"choices":[]``) if ``include_usage``, then ``[DONE]``; with continuous usage every
    chunk carries ``usage`` (0 completion tokens on the role chunk). Non-streaming:
    ``{"id":"chatcmpl-<hex>","object":"chat.completion",..,"choices":[{"index":0,
    "message":{"role":"assistant","reasoning_content":null,"content":" tok"*N,
    "tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],
    "usage":{..},"prompt_logprobs":null}``. Recorded with ``prompt`` = ``messages``.

``POST /v1/embeddings``, ``POST /v1/score`` (+ ``/score``), ``POST /v1/rerank`` (+
``/rerank``, ``/v2/rerank``)
    Pooling endpoints; bodies, token counts, the ``score_usage`` modes and response shapes
    are documented in ``replayer.sim_pooling``. Each request takes a ``max_num_seqs`` slot,
    waits ``ttft_base_ms + prefill_us_per_token * P / 1000`` ms (P = tokens processed; no
    prefix cache, no decode), adds P to ``vllm:prompt_tokens_total`` and counts
    ``vllm:request_success_total{finished_reason="stop"}``. Bad bodies: HTTP 400 as above
    (out-of-vocabulary token ids included).

``GET /v1/models``  OpenAI list with the served model. ``GET /health``  200, empty body.

``GET /metrics``  Prometheus text, vLLM names, labels ``engine="0"``, ``model_name=<model>``:
    counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
    ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (both in
    tokens), ``vllm:request_success_total{finished_reason="stop"|"length"}`` ("length"
    for completions/chat, "stop" for pooling requests); gauges
    ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
    ``vllm:kv_cache_usage_perc`` (0-1: blocks held by the prefix cache / its capacity).
    Each SimServer has its own ``CollectorRegistry``; the hot path bumps plain ints and the
    collector turns them into metric families only when scraped.

Latency model and knobs (``SimConfig``)
---------------------------------------
``model``                 served model name (``/v1/models``, ``model_name`` label).
``kv_block_size``         prefix-cache block size in tokens (vLLM GPU default 16).
``prefix_cache_tokens``   LRU capacity in tokens = ``prefix_cache_tokens // kv_block_size``
                          blocks; 0 disables caching (all hits 0).
``ttft_base_ms``,         time to first token after admission, in ms:
``prefill_us_per_token``  ``ttft_base_ms + prefill_us_per_token * uncached_tokens / 1000``
                          (``prefill_us_per_token`` is microseconds per prompt token NOT
                          found in the prefix cache).
``itl_base_ms``,          duration of one decode step, in ms:
``itl_per_running_us``    ``itl_base_ms + itl_per_running_us * running / 1000`` where
                          ``running`` = ``vllm:num_requests_running`` at the step start
                          (requests in prefill or decode).
``max_num_seqs``          0 = unlimited; else at most this many requests run (generation
                          and pooling), the rest wait FIFO (``vllm:num_requests_waiting``)
                          before their prefill.
``vocab_size``            token ids outside ``[0, vocab_size)`` -> error (see above).
``max_model_len``         context limit in tokens (see above).
``record_requests``,      keep the first ``record_limit`` received requests as
``record_limit``          ``ReceivedRequest`` in ``SimServer.records`` (tests; later ones are
                          counted in ``records_dropped``). ``replayer sim --record-requests
                          FILE`` instead appends one JSON line per request to FILE (flushed
                          per line), also capped at ``record_limit`` lines.
``embedding_dim``         length of embedding vectors (``--embedding-dim``, default 16).
``score_usage``,          score/rerank token accounting: "per_document" (default) or "once"
``score_usage_inflate_``  (``--score-usage``); extra usage tokens per document, default 0
``tokens``                (``--inflate-score-usage N``). See ``replayer.sim_pooling``.

Request lifecycle: parse -> validate -> wait for a slot (if ``max_num_seqs``) -> prefix
cache lookup + insert, counted in the metrics -> sleep TTFT -> first token -> decode.
One engine task runs the decode loop for all requests, like a real engine: each step gives
every decoding request one token and writes its chunk straight to its transport (no await,
no per-token timer), sleeping to absolute step deadlines so steps do not drift. A request
that got its first token less than half a step before a step boundary skips that step, so
the first inter-token gap averages one step rather than half a step.

Prefix cache: the prompt is cut into ``kv_block_size`` blocks; only full blocks count. The
key of block i is a 64-bit hash of the whole prefix (blocks 0..i): per-token
splitmix64(token XOR position-key), summed per block, then cumulatively summed over blocks
(vectorised in numpy, ~0.1-0.2 ms for 14k tokens; blake2b per block was ~1 ms). Not
cryptographic, but content- and position-keyed with 64-bit keys: accidental collisions are
~1e-8 over millions of lookups. Hits = leading blocks found x block size, capped like vLLM so
at least one prompt token is recomputed. Simplifications vs vLLM: a request's blocks enter
(or refresh in) the LRU at admission, not after prefill; blocks of running requests can be
evicted; generated tokens are never cached; concurrent prefills do not slow each other.

A streaming client that stops reading makes the server buffer its output (at most
``max_tokens`` small chunks); one that disconnects is dropped from the running set at the
next step (or at once if aiohttp cancels its handler, which ``SimServer.start`` enables).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .sim_pooling import (SCORE_USAGE_MODES, EmbeddingsJob, PoolingError, PoolingJob,
                          RerankJob, ScoreJob)

log = logging.getLogger(__name__)

__all__ = ["SimConfig", "SimServer", "ReceivedRequest", "prompt_block_hashes", "main",
           "run_sim"]


@dataclass(frozen=True)
class SimConfig:
    """Knobs of the simulated server; units are in the names (see the module docstring)."""

    model: str = "sim-model"
    kv_block_size: int = 16
    prefix_cache_tokens: int = 4_000_000
    ttft_base_ms: float = 20.0
    prefill_us_per_token: float = 2.0
    itl_base_ms: float = 10.0
    itl_per_running_us: float = 20.0
    max_num_seqs: int = 0
    vocab_size: int = 32000
    max_model_len: int = 1_048_576
    record_requests: bool = False
    record_limit: int = 100_000
    embedding_dim: int = 16
    score_usage: str = "per_document"
    score_usage_inflate_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kv_block_size < 1 or self.embedding_dim < 1:
            raise ValueError("kv_block_size and embedding_dim must be >= 1")
        if self.score_usage not in SCORE_USAGE_MODES:
            raise ValueError(f"score_usage must be one of {SCORE_USAGE_MODES}")
        for name in ("prefix_cache_tokens", "max_num_seqs", "record_limit",
                     "score_usage_inflate_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("ttft_base_ms", "prefill_us_per_token", "itl_base_ms",
                     "itl_per_running_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.vocab_size < 1 or self.max_model_len < 1:
            raise ValueError("vocab_size and max_model_len must be >= 1")


@dataclass(slots=True)
class ReceivedRequest:
    """One request as received (after parsing, before validation of lengths/ids).

    ``arrival_ns`` is ``time.perf_counter_ns()`` when the handler started; ``endpoint`` the
    request path; ``prompt`` is the prompt as sent: completions a list of ints or a str (the
    inner item for a batch of one), chat the ``messages`` list, embeddings the ``input``,
    score ``{"text_1", "text_2"}``, rerank ``{"query", "documents"}``; ``prompt_tokens`` is
    the sim's token count (for score/rerank the tokens processed, without inflation);
    ``include_usage`` is ``stream_options.include_usage``. Pooling requests are recorded
    only once fully valid, with ``max_tokens``, ``min_tokens``, ``ignore_eos`` None and
    ``stream`` False.
    """

    arrival_ns: int
    endpoint: str
    prompt: Any
    prompt_tokens: int
    max_tokens: int | None
    min_tokens: int | None
    ignore_eos: bool | None
    stream: bool
    model: str | None
    include_usage: bool

    def to_json(self) -> bytes:
        """One JSON object (no newline) with every field."""
        return orjson.dumps(asdict(self))


# ---------------------------------------------------------------------------------------
# Prefix hashing

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_POS_KEYS = np.zeros(0, dtype=np.uint64)


def _pos_keys(n: int) -> np.ndarray:
    """Per-position keys (position * golden ratio, mod 2**64); grown by doubling, shared."""
    global _POS_KEYS
    if len(_POS_KEYS) < n:
        size = max(n, 2 * len(_POS_KEYS), 1 << 14)
        _POS_KEYS = np.arange(size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return _POS_KEYS


def prompt_block_hashes(ids: np.ndarray, block_size: int) -> list[int]:
    """Chained 64-bit content hashes of the full ``block_size`` blocks of a prompt.

    ``ids``: 1-D int64 array of token ids (any values). Returns ``len(ids) // block_size``
    Python ints; element i depends on tokens ``0 .. (i+1)*block_size - 1`` and their positions,
    so equal keys mean equal prefixes (up to a ~2**-64 chance per pair).
    """
    nb = len(ids) // block_size
    if nb == 0:
        return []
    n = nb * block_size
    with np.errstate(over="ignore"):
        z = ids[:n].view(np.uint64) ^ _pos_keys(n)[:n]  # new array; input untouched
        z ^= z >> _S30
        z *= _M1
        z ^= z >> _S27
        z *= _M2
        z ^= z >> _S31
        h = z.reshape(nb, block_size).sum(axis=1, dtype=np.uint64)
        np.cumsum(h, out=h)
    return h.tolist()


class _PrefixCache:
    """LRU of prefix-block keys, capacity in blocks (0 = disabled)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()

    def lookup_and_insert(self, keys: list[int]) -> int:
        """Return the number of leading keys already cached; insert/refresh all keys."""
        if self.capacity == 0:
            return 0
        lru = self._lru
        move = lru.move_to_end
        hits = 0
        leading = True
        for k in keys:
            if k in lru:
                move(k)
                if leading:
                    hits += 1
            else:
                leading = False
                lru[k] = None
        over = len(lru) - self.capacity
        popitem = lru.popitem
        for _ in range(over):
            popitem(last=False)
        return hits

    def usage(self) -> float:
        return len(self._lru) / self.capacity if self.capacity else 0.0


# ---------------------------------------------------------------------------------------
# Metrics


class _Metrics:
    """Plain counters on the hot path; exported by ``collect`` when scraped."""

    def __init__(self, server: "SimServer") -> None:
        self._server = server
        self.created = time.time()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = 0          # finished_reason="length" (every generation request)
        self.success_stop = 0     # finished_reason="stop" (pooling requests)

    def collect(self):  # prometheus_client Collector protocol
        s = self._server
        labels = ["engine", "model_name"]
        values = ["0", s.config.model]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=labels, created=self.created)
            m.add_metric(values, value, created=self.created)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=labels)
            m.add_metric(values, value)
            return m

        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      self.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      self.generation_tokens)
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.",
                      self.prefix_queries)
        yield counter("vllm:prefix_cache_hits",
                      "Prefix cache hits, in terms of number of cached tokens.",
                      self.prefix_hits)
        m = CounterMetricFamily("vllm:request_success", "Count of successfully processed "
                                "requests.", labels=labels + ["finished_reason"],
                                created=self.created)
        # vLLM's label order (stop, length); pooling requests finish with "stop".
        m.add_metric(values + ["stop"], self.success_stop, created=self.created)
        m.add_metric(values + ["length"], self.success, created=self.created)
        yield m
        yield gauge("vllm:num_requests_running", "Number of requests in model execution "
                    "batches.", s.num_requests_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be "
                    "processed.", s.num_requests_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
                    "usage.", s._cache.usage())


# ---------------------------------------------------------------------------------------
# Server


class _BadRequest(Exception):
    pass


def _error_body(message: str, code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None,
                      "code": code}}


def _error_response(message: str) -> web.Response:
    return web.Response(status=400, body=orjson.dumps(_error_body(message)),
                        content_type="application/json")


def _frame(payload: bytes, chunked: bool) -> bytes:
    """HTTP/1.1 chunked-transfer framing for a direct transport write."""
    if chunked:
        return b"%x\r\n%b\r\n" % (len(payload), payload)
    return payload


_TOKEN_TEXT = " tok"
_DONE = b"data: [DONE]\n\n"


class _Req:
    """A request in prefill/decode; mutated only on the event loop."""

    __slots__ = ("max_tokens", "prompt_tokens", "generated", "transport", "chunk",
                 "chunked", "continuous", "base", "done", "t_first", "aborted", "chat")

    def __init__(self, max_tokens: int, prompt_tokens: int, chat: bool) -> None:
        self.chat = chat           # chat.completion(.chunk) format instead of text_completion
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        self.transport: asyncio.Transport | None = None  # set for streams after token 1
        self.chunk = b""           # framed bytes of a non-final token event
        self.chunked = True
        self.continuous = False    # per-chunk usage
        self.base: dict[str, Any] = {}
        self.done: asyncio.Future[bool] | None = None
        self.t_first = 0.0
        self.aborted = False


class SimServer:
    """Simulated vLLM OpenAI server (see the module docstring).

    ``SimServer(config)``; ``await start(host, port)`` -> base URL, ``await stop()``. Or mount
    ``app()`` in your own aiohttp runner (the engine task starts on the first request and is
    cancelled at app cleanup). ``records`` holds ``ReceivedRequest`` when
    ``config.record_requests``; ``on_request`` (optional) is called synchronously with every
    ``ReceivedRequest`` (used by ``replayer sim --record-requests``).
    """

    def __init__(self, config: SimConfig | None = None, *,
                 on_request: Callable[[ReceivedRequest], None] | None = None) -> None:
        self.config = config or SimConfig()
        self.records: list[ReceivedRequest] = []
        self.records_dropped = 0
        self._on_request = on_request
        self._cache = _PrefixCache(self.config.prefix_cache_tokens // self.config.kv_block_size)
        self._metrics = _Metrics(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._metrics)
        self._running = 0                                   # admitted: prefill + decode
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._joining: list[_Req] = []                      # got token 1, not yet stepping
        self._decoding: list[_Req] = []
        self._wake: asyncio.Event | None = None
        self._engine: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # -- public ---------------------------------------------------------------------------

    @property
    def num_requests_running(self) -> int:
        return self._running

    @property
    def num_requests_waiting(self) -> int:
        return len(self._waiters)

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
            app.router.add_get("/metrics", self._metrics_handler)
            app.on_shutdown.append(self._on_shutdown)
            app.on_cleanup.append(self._on_cleanup)
            self._app = app
        return self._app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on host:port (0 = a free port); return the base URL ``http://host:port``."""
        if self._runner is not None:
            raise RuntimeError("SimServer already started")
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                               shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=4096)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        real_port = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{real_port}"
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
        eng, self._engine = self._engine, None
        if eng is not None:
            eng.cancel()
            try:
                await eng
            except asyncio.CancelledError:
                pass

    def _ensure_engine(self) -> None:
        if self._engine is None or self._engine.done():
            self._wake = asyncio.Event()
            self._engine = asyncio.get_running_loop().create_task(self._engine_loop())

    # -- slots (max_num_seqs) -------------------------------------------------------------

    async def _admit(self) -> None:
        limit = self.config.max_num_seqs
        if limit and (self._running >= limit or self._waiters):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut  # the releaser counts us in _running before resolving
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release()
                else:
                    try:
                        self._waiters.remove(fut)
                    except ValueError:
                        pass
                raise
        else:
            self._running += 1

    def _release(self) -> None:
        self._running -= 1
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._running += 1
                fut.set_result(None)
                break

    # -- engine ---------------------------------------------------------------------------

    def _step_s(self) -> float:
        c = self.config
        return (c.itl_base_ms + c.itl_per_running_us * self._running / 1000.0) / 1000.0

    async def _engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        deadline: float | None = None
        while True:
            if not self._decoding and not self._joining:
                wake.clear()
                await wake.wait()
                deadline = None
            step = self._step_s()
            now = loop.time()
            if deadline is None or deadline + step < now:  # idle or fell behind: re-anchor
                deadline = now + step
            else:
                deadline += step
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            try:
                self._step(loop.time(), step)
            except Exception:  # a bug must not stop every stream
                log.exception("sim engine step failed")

    def _step(self, now: float, step: float) -> None:
        if self._joining:
            half = step / 2
            keep = []
            for r in self._joining:
                if r.aborted:
                    continue
                if now - r.t_first >= half:
                    self._decoding.append(r)
                else:
                    keep.append(r)
            self._joining = keep
        survivors = []
        tokens = 0
        for r in self._decoding:
            if r.aborted:
                continue
            t = r.transport
            if t is not None and t.is_closing():
                self._abort(r)
                continue
            r.generated += 1
            tokens += 1
            if r.generated >= r.max_tokens:
                # The handler writes the final chunk(s) and closes the response.
                if not r.done.done():
                    r.done.set_result(True)
                continue
            if t is not None:
                data = self._usage_chunk(r) if r.continuous else r.chunk
                try:
                    t.write(data)
                except Exception:  # transport died between the check and the write
                    self._abort(r)
                    continue
            survivors.append(r)
        self._decoding = survivors
        self._metrics.generation_tokens += tokens

    def _abort(self, r: _Req) -> None:
        r.aborted = True
        if r.done is not None and not r.done.done():
            r.done.set_result(False)

    def _join(self, r: _Req, t_first: float) -> None:
        r.t_first = t_first
        self._joining.append(r)
        self._ensure_engine()
        assert self._wake is not None
        self._wake.set()

    # -- chunks ---------------------------------------------------------------------------

    def _token_event(self, r: _Req, finish: str | None, n_done: int | None) -> bytes:
        obj = dict(r.base)
        if r.chat:
            # vLLM dumps chat chunks with exclude_unset: stop_reason only on the last one.
            ch: dict[str, Any] = {"index": 0, "delta": {"content": _TOKEN_TEXT},
                                  "logprobs": None, "finish_reason": finish}
            if finish is not None:
                ch["stop_reason"] = None
            obj["choices"] = [ch]
        else:
            obj["choices"] = [{"index": 0, "text": _TOKEN_TEXT, "logprobs": None,
                               "finish_reason": finish, "stop_reason": None}]
        if n_done is not None:
            obj["usage"] = {"prompt_tokens": r.prompt_tokens, "completion_tokens": n_done,
                            "total_tokens": r.prompt_tokens + n_done}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _role_event(self, r: _Req) -> bytes:
        """vLLM's first chat chunk (sent with the first token, as vLLM does)."""
        obj = dict(r.base)
        obj["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": ""},
                           "logprobs": None, "finish_reason": None}]
        if r.continuous:
            obj["usage"] = {"prompt_tokens": r.prompt_tokens, "completion_tokens": 0,
                            "total_tokens": r.prompt_tokens}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _usage_chunk(self, r: _Req) -> bytes:
        return _frame(self._token_event(r, None, r.generated), r.chunked)

    def _final_events(self, r: _Req, include_usage: bool) -> bytes:
        out = self._token_event(r, "length", r.max_tokens if r.continuous else None)
        if include_usage:
            obj = dict(r.base)
            obj["choices"] = []
            obj["usage"] = {"prompt_tokens": r.prompt_tokens,
                            "completion_tokens": r.max_tokens,
                            "total_tokens": r.prompt_tokens + r.max_tokens}
            out += b"data: " + orjson.dumps(obj) + b"\n\n"
        return out + _DONE

    # -- handlers -------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        c = self.config
        body = {"object": "list", "data": [{
            "id": c.model, "object": "model", "created": int(self._metrics.created),
            "owned_by": "vllm", "root": c.model, "parent": None,
            "max_model_len": c.max_model_len, "permission": []}]}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    def _parse(self, body: Any) -> tuple[Any, np.ndarray | None, int, dict[str, Any]]:
        """Validate a completions body -> (prompt as sent, ids or None, prompt_tokens, opts).

        ``ids`` is an int64 array for token-id prompts, a hash-per-word array for text.
        Raises _BadRequest with a vLLM-like message.
        """
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        if "prompt" not in body or body["prompt"] is None:
            raise _BadRequest("Field required: prompt")
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            if len(prompt) != 1:
                raise _BadRequest("The sim supports one prompt per request; got a batch "
                                  f"of {len(prompt)}")
            prompt = prompt[0]
        if isinstance(prompt, str):
            words = prompt.split()
            ids = np.fromiter((hash(w) for w in words), dtype=np.int64, count=len(words))
            text = True
        elif isinstance(prompt, list):
            try:
                # fromiter accepts bool/float silently; vLLM's pydantic would reject them,
                # but the replayer only sends ints, so we skip a per-item type check.
                ids = np.fromiter(prompt, dtype=np.int64, count=len(prompt))
            except (TypeError, ValueError, OverflowError):
                raise _BadRequest("prompt must be a string, a list of token ids (ints), or a "
                                  "list with one of those") from None
            text = False
        else:
            raise _BadRequest("prompt must be a string or a list of token ids")
        if len(ids) == 0:
            raise _BadRequest("Prompt cannot be empty")
        return prompt, ids, len(ids), self._opts(body, body.get("max_tokens"), text, False)

    def _parse_chat(self, body: Any) -> tuple[Any, np.ndarray, int, dict[str, Any]]:
        """Validate a chat body -> (messages as sent, word-hash ids, prompt_tokens, opts).

        prompt_tokens = whitespace words over all message contents (string or text parts);
        the sim adds no chat-template tokens. Raises _BadRequest.
        """
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _BadRequest("messages must be a non-empty list")
        words: list[str] = []
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _BadRequest('each message must be an object with a string "role"')
            c = m.get("content")
            if isinstance(c, str):
                words += c.split()
            elif isinstance(c, list):
                for part in c:
                    if not (isinstance(part, dict) and part.get("type") == "text"
                            and isinstance(part.get("text"), str)):
                        raise _BadRequest('the sim supports only {"type": "text", "text": '
                                          '...} content parts')
                    words += part["text"].split()
            elif c is not None:
                raise _BadRequest("message content must be a string, a list of parts or null")
        if not words:
            raise _BadRequest("Prompt cannot be empty")
        ids = np.fromiter((hash(w) for w in words), dtype=np.int64, count=len(words))
        mt = body.get("max_completion_tokens")  # vLLM: preferred over max_tokens
        return msgs, ids, len(ids), self._opts(
            body, body.get("max_tokens") if mt is None else mt, True, True)

    @staticmethod
    def _opts(body: dict[str, Any], max_tokens: Any, text: bool, chat: bool
              ) -> dict[str, Any]:
        """Generation options shared by completions and chat. Raises _BadRequest."""
        if max_tokens is None:
            max_tokens = 16
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict):
            raise _BadRequest("stream_options must be an object")
        return {
            "max_tokens": max_tokens,
            "stream": bool(body.get("stream", False)),
            "include_usage": bool(so.get("include_usage", False)),
            "continuous": bool(so.get("include_usage", False))
            and bool(so.get("continuous_usage_stats", False)),
            "model": body.get("model"),
            "min_tokens": body.get("min_tokens"),
            "ignore_eos": body.get("ignore_eos"),
            "text": text,
            "chat": chat,
        }

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

    async def _generation(self, request: web.Request, endpoint: str,
                          parse: Callable[[Any], tuple[Any, np.ndarray, int, dict[str, Any]]]
                          ) -> web.StreamResponse:
        arrival_ns = time.perf_counter_ns()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error_response(f"Invalid JSON body: {e}")
        try:
            prompt, ids, n_prompt, o = parse(body)
        except _BadRequest as e:
            return _error_response(str(e))
        cfg = self.config
        if self.config.record_requests or self._on_request is not None:
            self._record(ReceivedRequest(
                arrival_ns=arrival_ns, endpoint=endpoint, prompt=prompt,
                prompt_tokens=n_prompt, max_tokens=o["max_tokens"],
                min_tokens=o["min_tokens"], ignore_eos=o["ignore_eos"], stream=o["stream"],
                model=o["model"], include_usage=o["include_usage"]))
        max_tokens = o["max_tokens"]
        if n_prompt + max_tokens > cfg.max_model_len:
            return _error_response(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However,"
                f" you requested {n_prompt + max_tokens} tokens ({n_prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion.")
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
                await resp.write_eof(b"data: " + orjson.dumps(_error_body(msg)) + b"\n\n"
                                     + _DONE)
                return resp
        model = o["model"] if isinstance(o["model"], str) and o["model"] else cfg.model
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._generate(request, ids, n_prompt, o, model)
        finally:
            self._handlers.discard(task)

    async def _generate(self, request: web.Request, ids: np.ndarray, n_prompt: int,
                        o: dict[str, Any], model: str) -> web.StreamResponse:
        cfg = self.config
        loop = asyncio.get_running_loop()
        r = _Req(o["max_tokens"], n_prompt, o["chat"])
        if r.chat:
            r.base = {"id": f"chatcmpl-{uuid.uuid4().hex}",
                      "object": "chat.completion.chunk" if o["stream"] else "chat.completion",
                      "created": int(time.time()), "model": model}
        else:
            r.base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                      "created": int(time.time()), "model": model}
        resp: web.StreamResponse | None = None
        if o["stream"]:
            # Like vLLM (uvicorn), the 200 + headers go out as soon as the request is
            # accepted; tokens follow after queueing and prefill.
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            try:
                await resp.prepare(request)
                await resp.write(b"")  # flushes the headers aiohttp would otherwise hold
            except ConnectionError:
                return resp
        await self._admit()
        try:
            t_admit = loop.time()
            bs = cfg.kv_block_size
            hit_blocks = (self._cache.lookup_and_insert(prompt_block_hashes(ids, bs))
                          if self._cache.capacity else 0)
            # vLLM always recomputes at least the last prompt token.
            hits = min(hit_blocks, (n_prompt - 1) // bs) * bs
            m = self._metrics
            m.prefix_queries += n_prompt
            m.prefix_hits += hits
            ttft_s = (cfg.ttft_base_ms + cfg.prefill_us_per_token
                      * (n_prompt - hits) / 1000.0) / 1000.0
            await asyncio.sleep(max(0.0, t_admit + ttft_s - loop.time()))
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
                    r.chunk = _frame(self._token_event(r, None, None), r.chunked)
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
            usage = {"prompt_tokens": n_prompt, "completion_tokens": r.max_tokens,
                     "total_tokens": n_prompt + r.max_tokens}
            if r.chat:
                body = {**r.base, "choices": [{
                    "index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                            "content": _TOKEN_TEXT * r.max_tokens,
                                            "tool_calls": []},
                    "logprobs": None, "finish_reason": "length", "stop_reason": None}],
                    "usage": usage, "prompt_logprobs": None}
            else:
                body = {**r.base, "choices": [{
                    "index": 0, "text": _TOKEN_TEXT * r.max_tokens, "logprobs": None,
                    "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}],
                    "usage": usage}
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        except ConnectionError:
            # The client went away while we wrote; nobody reads what we return.
            return resp if resp is not None else web.Response(status=499)
        finally:
            r.aborted = True  # the engine drops it at its next step, if still listed
            self._release()

    def _pooling_route(self, job_cls: type[PoolingJob]
                       ) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            return await self._pooling(request, job_cls)
        return handler

    async def _pooling(self, request: web.Request, job_cls: type[PoolingJob]
                       ) -> web.Response:
        """Embeddings/score/rerank (sim_pooling): parse, take a slot, wait the prefill time
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
            self._record(ReceivedRequest(
                arrival_ns=arrival_ns, endpoint=request.path, prompt=job.prompt,
                prompt_tokens=job.tokens, max_tokens=None, min_tokens=None, ignore_eos=None,
                stream=False, model=job.model, include_usage=False))
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._admit()
            try:
                await asyncio.sleep((cfg.ttft_base_ms + cfg.prefill_us_per_token
                                     * job.tokens / 1000.0) / 1000.0)
                self._metrics.prompt_tokens += job.tokens
                self._metrics.success_stop += 1
            finally:
                self._release()
        finally:
            self._handlers.discard(task)
        body = job.response(job.model or cfg.model)
        return web.Response(body=orjson.dumps(body), content_type="application/json")


# ---------------------------------------------------------------------------------------
# Standalone server


async def _serve(config: SimConfig, host: str, port: int, record_file: str | None) -> None:
    fh = open(record_file, "ab") if record_file else None  # noqa: SIM115 - closed below
    written = 0

    def on_request(rec: ReceivedRequest) -> None:
        nonlocal written
        if fh is None or written >= config.record_limit:
            return
        fh.write(rec.to_json() + b"\n")
        fh.flush()  # one line per request survives a kill
        written += 1

    server = SimServer(config, on_request=on_request if fh else None)
    try:
        url = await server.start(host, port)
        print(f"replayer sim: model {config.model!r} serving at {url}", file=sys.stderr,
              flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.stop()
        if fh is not None:
            fh.close()


def run_sim(config: SimConfig, host: str = "127.0.0.1", port: int = 8000,
            record_file: str | None = None) -> None:
    """Serve until SIGINT/SIGTERM (blocking, uvloop). ``record_file``: append JSON lines."""
    try:
        import uvloop
        uvloop.run(_serve(config, host, port, record_file))
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(_serve(config, host, port, record_file))


def _parser() -> argparse.ArgumentParser:
    d = SimConfig()
    p = argparse.ArgumentParser(
        prog="replayer sim",
        description="Simulated vLLM OpenAI-compatible server (see replayer/sim.py).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--kv-block-size", type=int, default=d.kv_block_size,
                   help="prefix-cache block size, tokens")
    p.add_argument("--prefix-cache-tokens", type=int, default=d.prefix_cache_tokens,
                   help="prefix-cache capacity, tokens (0 disables)")
    p.add_argument("--ttft-base-ms", type=float, default=d.ttft_base_ms)
    p.add_argument("--prefill-us-per-token", type=float, default=d.prefill_us_per_token,
                   help="microseconds per uncached prompt token")
    p.add_argument("--itl-base-ms", type=float, default=d.itl_base_ms)
    p.add_argument("--itl-per-running-us", type=float, default=d.itl_per_running_us)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="max running requests (0 = unlimited)")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--record-requests", metavar="FILE", default=None,
                   help="append one JSON line per received request (prompt included)")
    p.add_argument("--record-limit", type=int, default=d.record_limit,
                   help="max requests written to --record-requests FILE")
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim,
                   help="length of /v1/embeddings vectors")
    p.add_argument("--score-usage", choices=SCORE_USAGE_MODES, default=d.score_usage,
                   help="score/rerank prompt tokens: per_document (cross-encoder, query "
                   "counted per document) or once (query counted once)")
    p.add_argument("--inflate-score-usage", type=int, metavar="N",
                   default=d.score_usage_inflate_tokens,
                   help="add N tokens per document to score/rerank usage (imitates an old "
                   "vLLM usage bug; /metrics stays honest)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``replayer sim``: parse flags, serve until SIGINT/SIGTERM, return 0."""
    a = _parser().parse_args(argv)
    try:
        cfg = SimConfig(
            model=a.model, kv_block_size=a.kv_block_size,
            prefix_cache_tokens=a.prefix_cache_tokens, ttft_base_ms=a.ttft_base_ms,
            prefill_us_per_token=a.prefill_us_per_token, itl_base_ms=a.itl_base_ms,
            itl_per_running_us=a.itl_per_running_us, max_num_seqs=a.max_num_seqs,
            vocab_size=a.vocab_size, max_model_len=a.max_model_len,
            record_requests=False, record_limit=a.record_limit,
            embedding_dim=a.embedding_dim, score_usage=a.score_usage,
            score_usage_inflate_tokens=a.inflate_score_usage)
    except ValueError as e:
        print(f"replayer sim: {e}", file=sys.stderr)
        return 2
    run_sim(cfg, a.host, a.port, a.record_requests)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
