"""Configuration of the simulated server (:class:`SimConfig`) and the record of one received
request (:class:`ReceivedRequest`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

#: how ``/v1/score`` and ``/v1/rerank`` count a query in ``usage.prompt_tokens`` (``--score-usage``)
SCORE_USAGE_MODES = ("per_document", "once")


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
    tokens_per_chunk: int = 1
    otlp_endpoint: str | None = None  # vLLM --otlp-traces-endpoint: an llm_request span per request (sim/tracing)
    per_request_metrics: bool = False  # vLLM --enable-per-request-metrics: every response has `metrics`
    image_token_rule: str = "qwen2-vl"  # tokens per decoded image (replayer.payload.image_tokens)
    encoder_cache_images: int = 1024  # images the encoder cache holds (LRU by content; 0 = none)
    image_encode_us_per_token: float = 20.0  # encoder time per image token, skipped on an encoder-cache hit
    prompt_tokens_details: bool = True  # image requests' usage has prompt_tokens_details (image_tokens)
    # a local tokenizer (file, folder or builtin:NAME): text prompts are encoded with it and chat
    # messages rendered through its folder's chat template first, as vLLM counts them (None: words)
    tokenizer: str | None = None
    # issue 45, a test aid: the simulator degrades on purpose, by this many ms per minute since it
    # started, added to every first token (TTFT) and to every decode step (ITL)
    ttft_drift_ms_per_min: float = 0.0
    itl_drift_ms_per_min: float = 0.0

    def __post_init__(self) -> None:
        if self.kv_block_size < 1 or self.embedding_dim < 1 or self.tokens_per_chunk < 1:
            raise ValueError("kv_block_size, embedding_dim and tokens_per_chunk must be >= 1")
        if self.score_usage not in SCORE_USAGE_MODES:
            raise ValueError(f"score_usage must be one of {SCORE_USAGE_MODES}")
        for name in ("prefix_cache_tokens", "max_num_seqs", "record_limit", "score_usage_inflate_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("ttft_base_ms", "prefill_us_per_token", "itl_base_ms", "itl_per_running_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.encoder_cache_images < 0 or self.image_encode_us_per_token < 0:
            raise ValueError("encoder_cache_images and image_encode_us_per_token must be >= 0")
        from replayer.payload.image_tokens import parse_rule

        parse_rule(self.image_token_rule)
        if self.tokenizer is not None:
            from replayer.core.tokenizerfiles import tokenizer_problem

            problem = tokenizer_problem(self.tokenizer)
            if problem:
                raise ValueError(f"--tokenizer: {problem}")
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
    request_id: str | None = None  # its X-Request-Id header (replayer's <run>-<loop>-<row>)

    def to_json(self) -> bytes:
        """One JSON object (no newline) with every field."""
        return orjson.dumps(asdict(self))
