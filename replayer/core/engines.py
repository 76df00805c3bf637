"""What each serving engine accepts and how it answers: the request-side half of an engine's
dialect (the ``/metrics`` half is ``replayer.observe.dialects``).

One ``EngineCaps`` per engine, read from the engine's OpenAI-compatible request models:

* ``vllm``: ``vllm/entrypoints/openai/protocol.py`` (``ignore_eos``, ``min_tokens``,
  ``stream_options.continuous_usage_stats``; ``prompt`` may be token ids).
* ``sglang``: ``python/sglang/srt/entrypoints/openai/protocol.py`` (``ignore_eos``,
  ``min_tokens``, ``stream_options.continuous_usage_stats``; ``prompt`` may be token ids).
* ``tgi``: ``router/src/lib.rs`` ``CompletionRequest`` (``prompt`` is text only; no
  ``ignore_eos``/``min_tokens``: generation may stop at EOS before ``max_tokens``; usage on the
  last chunk).
* ``trtllm``: ``tensorrt_llm/serve/openai_protocol.py`` (``ignore_eos``, ``min_tokens``,
  ``stream_options.continuous_usage_stats``; token-id prompts).
* ``dynamo``: ``lib/llm/src/protocols/openai/nvext.rs`` (``nvext.ignore_eos``) and the
  completions request (token-id prompts; usage on the last chunk).
* ``llamacpp``: ``tools/server/README.md`` / ``server-common.cpp`` (``ignore_eos``; no
  ``min_tokens``; ``prompt`` may be token ids; usage and ``timings`` on the last chunk; an error
  inside a stream is an SSE ``error:`` field, not ``data:`` (then ``[DONE]`` on its OpenAI
  endpoints, nothing on its own), which the SSE grammar drops: ``replayer.http.sse`` keeps it;
  later builds send ``data: {"error": {...}}``).

Every engine answers in-band errors as a ``data:`` event holding ``{"error": ...}`` (an object
with ``message``, or TGI's string), except llama.cpp (above).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ENGINES", "EngineCaps", "engine_caps"]

#: the engines replayer speaks, by the name ``--engine`` takes
ENGINES = ("vllm", "sglang", "tgi", "trtllm", "dynamo", "llamacpp")


@dataclass(frozen=True)
class EngineCaps:
    """One engine's request dialect.

    ``label``: its name in logs and docs. ``exact_length``: top-level body fields that make
    generation run to ``max_tokens`` (merged into every generation body; empty: the engine has
    none, the output length is only bounded). ``min_tokens``: it takes ``min_tokens`` (sent equal
    to ``max_tokens``). ``token_ids``: ``/v1/completions`` takes a list of token ids as
    ``prompt``. ``continuous_usage``: it puts the running ``usage`` on every chunk when asked
    (``stream_options.continuous_usage_stats``); else usage comes once, on the last chunk.
    ``metrics_path``: where its Prometheus text is. ``owned_by``: the ``owned_by`` of its
    ``/v1/models`` entries (one of the detection clues). ``stream_errors``: how an error inside a
    stream looks (docs)."""

    name: str
    label: str
    exact_length: dict[str, object] = field(default_factory=dict)
    min_tokens: bool = False
    token_ids: bool = True
    continuous_usage: bool = False
    metrics_path: str = "/metrics"
    owned_by: str | None = None
    stream_errors: str = 'data: {"error": {"message": ...}}'

    @property
    def exact(self) -> bool:
        """Whether a request's output length can be forced to ``max_tokens``."""
        return bool(self.exact_length) or self.min_tokens


_CAPS = {
    c.name: c
    for c in (
        EngineCaps(
            "vllm",
            "vLLM",
            {"ignore_eos": True},
            min_tokens=True,
            continuous_usage=True,
            owned_by="vllm",
        ),
        EngineCaps(
            "sglang",
            "SGLang",
            {"ignore_eos": True},
            min_tokens=True,
            continuous_usage=True,
            owned_by="sglang",
        ),
        EngineCaps(
            "tgi",
            "Text Generation Inference",
            token_ids=False,
            owned_by=None,  # (TGI lists the model id as its owner)
            stream_errors='data: {"error": "...", "error_type": "..."}',
        ),
        EngineCaps(
            "trtllm",
            "TensorRT-LLM (trtllm-serve)",
            {"ignore_eos": True},
            min_tokens=True,
            continuous_usage=True,
            metrics_path="/prometheus/metrics",
            owned_by="tensorrt_llm",
        ),
        EngineCaps("dynamo", "NVIDIA Dynamo (frontend)", {"nvext": {"ignore_eos": True}}, owned_by="nvidia"),
        EngineCaps(
            "llamacpp",
            "llama.cpp server",
            {"ignore_eos": True},
            owned_by="llamacpp",
            stream_errors="error: {...} (an SSE error field: the stream ends without [DONE])",
        ),
    )
}


def engine_caps(name: str) -> EngineCaps:
    """The ``EngineCaps`` of ``name`` (one of ``ENGINES``); ValueError naming the known ones."""
    try:
        return _CAPS[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}") from None
