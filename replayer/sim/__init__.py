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
      * a string: without ``--tokenizer`` the sim counts whitespace-separated words,
        ``prompt_tokens == len(prompt.split())``; for prefix caching each word is one
        "token" (keyed by the word's hash). With ``--tokenizer`` (``SimConfig.tokenizer``) the
        string is encoded with that tokenizer, special tokens added, as vLLM does.

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
    template, so no role/template tokens are counted (a real server counts more). With
    ``--tokenizer`` it counts as vLLM does: the folder's chat template rendered over the
    messages with the generation prompt (``replayer.payload.chattemplate``), encoded without
    added special tokens, each image's placeholder token replaced by its image tokens. Zero
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
    are documented in ``replayer.sim.pooling``. Each request takes a ``max_num_seqs`` slot,
    waits ``ttft_base_ms + prefill_us_per_token * P / 1000`` ms (P = tokens processed; no
    prefix cache, no decode), adds P to ``vllm:prompt_tokens_total`` and counts
    ``vllm:request_success_total{finished_reason="stop"}``. Bad bodies: HTTP 400 as above
    (out-of-vocabulary token ids included).

``GET /v1/models``  OpenAI list with the served model. ``GET /health``  200, empty body.

``POST /reset_prefix_cache``  empties the prefix cache (vLLM's endpoint, served there in dev
mode): 200, empty body; ``replayer sweep --prefix-cache reset`` calls it before each point.

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
``ttft_drift_ms_per_min``, a test aid (the drift verdict): added to every TTFT (every decode
``itl_drift_ms_per_min``  step), in ms per minute since the server started: a server that
                          degrades on purpose.
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
``tokens``                (``--inflate-score-usage N``). See ``replayer.sim.pooling``.
``tokens_per_chunk``      K tokens per decode step after the first token, sent as one chunk
                          with text ``" tok" * K`` (the last one may hold fewer), as
                          speculative decoding or MTP delivers them (``--tokens-per-chunk``;
                          default 1). With continuous usage each chunk's running
                          ``completion_tokens`` rises by its K, as vLLM's does.

Request lifecycle: parse -> validate -> wait for a slot (if ``max_num_seqs``) -> prefix
cache lookup + insert, counted in the metrics -> sleep TTFT -> first token -> decode.
One engine task runs the decode loop for all requests, like a real engine: each step gives
every decoding request ``tokens_per_chunk`` tokens (one by default) and writes its chunk straight to its transport (no await,
no per-token timer), sleeping to absolute step deadlines so steps do not drift. A request
that got its first token less than half a step before a step boundary skips that step, so
the first inter-token gap averages one step rather than half a step.

Prefix cache: the prompt is cut into ``kv_block_size`` blocks; only full blocks count. The
key of block i is a 64-bit hash of the whole prefix (blocks 0..i): per-token
SplitMix64 (``replayer.core.hashing``) of (token XOR position-key), summed per block, then cumulatively summed over blocks
(vectorised in numpy, ~0.1-0.2 ms for 14k tokens, where a blake2b per block costs ~1 ms). Not
cryptographic, but content- and position-keyed with 64-bit keys: accidental collisions are
~1e-8 over millions of lookups. Hits = leading blocks found x block size, capped like vLLM so
at least one prompt token is recomputed. Simplifications vs vLLM: a request's blocks enter
(or refresh in) the LRU at admission, not after prefill; blocks of running requests can be
evicted; generated tokens are never cached; concurrent prefills do not slow each other.

A streaming client that stops reading makes the server buffer its output (at most
``max_tokens`` small chunks); one that disconnects is dropped from the running set at the
next step (or at once if aiohttp cancels its handler, which ``SimServer.start`` enables).
Modules of this package: ``config`` (``SimConfig``, ``ReceivedRequest``), ``cache`` (prefix
block hashes, LRU), ``metrics`` (Prometheus collector), ``engine`` (slots, decode loop, token
chunks), ``server`` (``SimServer``: routes, parsing, generation and pooling handlers),
``pooling`` (embeddings/score/rerank bodies) and ``cli`` (``replayer sim``: ``main``,
``run_sim``). Everything public is imported from ``replayer.sim``.
"""

from __future__ import annotations

from replayer.sim.cache import PrefixCache, prompt_block_hashes
from replayer.sim.cli import main, parser, run_sim
from replayer.sim.config import ReceivedRequest, SimConfig
from replayer.sim.server import SimServer

__all__ = [
    "SimConfig",
    "SimServer",
    "ReceivedRequest",
    "PrefixCache",
    "prompt_block_hashes",
    "main",
    "parser",
    "run_sim",
]
