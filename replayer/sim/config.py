"""Configuration of the simulated server (:class:`SimConfig`) and the record of one received
request (:class:`ReceivedRequest`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

from replayer.core.engines import ENGINES

#: how ``/v1/score`` and ``/v1/rerank`` count a query in ``usage.prompt_tokens`` (``--score-usage``)
SCORE_USAGE_MODES = ("per_document", "once")


def flag(default: object, help: str, **argparse_kwargs: Any) -> Any:
    """A ``SimConfig`` field that is also a ``replayer sim`` flag: ``--field-name`` unless
    ``argparse_kwargs`` names ``flags`` (a tuple of option strings, the first the flag's name);
    ``help`` its help text; the rest goes to ``add_argument`` as it is (``metavar``,
    ``choices``). A bool field's flag takes no value: it sets True (a default True field's flag,
    named ``--no-...``, sets False). ``replayer.sim.cli`` adds the flags in the fields' order."""
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass(frozen=True)
class SimConfig:
    """Knobs of the simulated server; units are in the names (see the module docstring). Each
    field made with ``flag`` is a ``replayer sim`` flag of the same name, so a new knob is one
    field here (and its check in ``__post_init__``)."""

    model: str = flag("sim-model", "served model name (a request naming another gets a 404)")
    kv_block_size: int = flag(16, "prefix-cache block size, tokens")
    prefix_cache_tokens: int = flag(4_000_000, "prefix-cache capacity, tokens (0 disables)")
    ttft_base_ms: float = flag(20.0, "time to first token of an empty prompt, ms")
    prefill_us_per_token: float = flag(2.0, "microseconds per uncached prompt token")
    itl_base_ms: float = flag(10.0, "gap between two tokens with one request running, ms")
    itl_per_running_us: float = flag(20.0, "added to every token gap per running request, us (a batch decodes slower)")
    max_num_seqs: int = flag(0, "max running requests (0 = unlimited)")
    vocab_size: int = flag(32000, "a prompt token id outside [0, N) is an error, as in vLLM")
    max_model_len: int = flag(
        1_048_576, "longest prompt + output in tokens; a longer request is answered 400, as vLLM does"
    )
    # keep received requests in SimServer.records (tests); `replayer sim --record-requests FILE` writes them
    record_requests: bool = False
    record_limit: int = flag(100_000, "max requests written to --record-requests FILE")
    embedding_dim: int = flag(16, "length of /v1/embeddings vectors")
    score_usage: str = flag(
        "per_document",
        "score/rerank prompt tokens: per_document (cross-encoder, query counted per document) or once (query "
        "counted once)",
        choices=SCORE_USAGE_MODES,
    )
    score_usage_inflate_tokens: int = flag(
        0,
        "add N tokens per document to score/rerank usage (imitates an old vLLM usage bug; /metrics stays honest)",
        flags=("--inflate-score-usage",),
        metavar="N",
    )
    tokens_per_chunk: int = flag(
        1,
        "tokens per decode step and streamed chunk after the first token (as speculative decoding or MTP "
        "delivers them)",
        metavar="K",
    )
    otlp_endpoint: str | None = flag(  # an llm_request span per request (sim/tracing)
        None,
        "as vLLM's --otlp-traces-endpoint: export an llm_request SERVER span per request (vLLM's attribute "
        "names, parented by the request's traceparent) over OTLP/HTTP to this collector (/v1/traces added "
        "unless given)",
        flags=("--otlp-endpoint", "--otlp-traces-endpoint"),
        metavar="URL",
    )
    per_request_metrics: bool = flag(
        False,
        "as vLLM's flag: every completions/chat response carries its timings in a 'metrics' object (streams: "
        'on the final usage chunk); without it, only requests with "include_metrics": true get them',
        flags=("--enable-per-request-metrics",),
    )
    image_token_rule: str = flag(  # replayer.payload.image_tokens
        "qwen2-vl",
        "tokens of each decoded image: qwen2-vl, llava (576), fixed:N or none (0); the default is replayer "
        "run's default expectation",
    )
    encoder_cache_images: int = flag(1024, "images the encoder cache holds (LRU keyed by image content; 0 = no cache)")
    image_encode_us_per_token: float = flag(
        20.0, "simulated encoder time per image token, skipped when the image hits the encoder cache"
    )
    prompt_tokens_details: bool = flag(
        True,
        "leave usage.prompt_tokens_details (image_tokens) out, as vLLM does without --enable-prompt-tokens-details",
        flags=("--no-prompt-tokens-details",),
    )
    tokenizer: str | None = flag(
        None,
        "count text prompts as vLLM does: a local tokenizer.json or folder (or builtin:gpt2); chat messages are "
        "rendered through the folder's chat template first (default: whitespace words)",
    )
    # issue 49: the engine whose dialect the simulator speaks (replayer.sim.dialects)
    engine: str = flag(
        "vllm",
        "the engine whose dialect to speak: its /metrics names and path, /v1/models owner, what it refuses, "
        "its in-band errors (docs/engines.md)",
        choices=ENGINES,
    )
    accept_any_model: bool = flag(
        False, "answer requests naming any model (default: a 404 for a model other than --model, as vLLM)"
    )
    # issue 45, a test aid: the simulator degrades on purpose (the drift verdict)
    ttft_drift_ms_per_min: float = flag(
        0.0,
        "a test aid: every time to first token grows by this many ms per minute since the start (a server "
        "that degrades, for the drift verdict; negative: one that gets faster, down to 0 ms)",
    )
    itl_drift_ms_per_min: float = flag(
        0.0,
        "a test aid: every gap between tokens grows by this many ms per minute since the start (negative: "
        "shrinks, down to 0 ms)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # (an inf or nan time is no time: refused, as replayer run refuses it)
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                name = f.metadata.get("flags", (f"--{f.name.replace('_', '-')}",))[0]
                raise ValueError(f"{name} must be a finite number, got {v}")
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
        from replayer.core.engines import engine_caps

        engine_caps(self.engine)  # (ValueError naming the engines)
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
