"""Request bodies for the OpenAI-compatible ``/v1/completions`` (and, with text prompts,
``/v1/chat/completions``) API, serialised once to bytes.

The body of a trace row (OpenAI Completions API; ``ignore_eos`` and ``min_tokens`` are vLLM /
SGLang extensions, left out with ``vllm_extensions=False``)::

    {"model": M, "stream": true, "stream_options": {"include_usage": true},
     "ignore_eos": true, "max_tokens": N, "min_tokens": N, "prompt": [token ids...]}

with ``N = output_length``. The constant part is serialised once; per request only the numbers and
the (pre-serialised) prompt are joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(slots=True)
class PreparedRequest:
    """A request ready to send: where it came from, when it is due, and its body bytes."""

    index: int           # position in the schedule (0-based)
    row: int             # row index in the trace
    due_ns: int          # offset from the run anchor t0_ns
    body: bytes
    input_length: int
    output_length: int
    prompt_len: int      # token ids in the body's prompt
    max_tokens: int
    loop: int = 0
    trace_ns: int = 0    # trace-time offset (loop offset included); due_ns is derived from it
    expected_hits: int | None = None  # expected prefix-cache hit tokens (replayer.prefix_cache)


class PayloadBuilder:
    """Builds ``/v1/completions`` bodies.

    ``model``: the request's ``model`` field. ``stream``: SSE streaming with usage (default).
    ``vllm_extensions``: send ``ignore_eos``/``min_tokens`` so generation runs to ``max_tokens``.
    ``extra``: additional top-level body fields (e.g. ``{"temperature": 0}``), serialised once.
    """

    def __init__(self, model: str, *, stream: bool = True, vllm_extensions: bool = True,
                 extra: dict | None = None, chat: bool = False) -> None:
        head: dict = {"model": model, "stream": stream}
        if stream:
            head["stream_options"] = {"include_usage": True}
        if vllm_extensions:
            head["ignore_eos"] = True
        head.update(extra or {})
        for k in ("prompt", "messages", "max_tokens", "min_tokens"):
            if k in head:
                raise ValueError(f"extra body field {k!r} is set per request and cannot be overridden")
        self._head = orjson.dumps(head)[:-1] + b","  # '{...,' ready for the per-request fields
        self._min_tokens = vllm_extensions
        self.chat = chat

    def text_body(self, text: str, max_tokens: int) -> bytes:
        """Body for a text prompt: ``"prompt": text`` (completions) or, for the chat API,
        ``"messages": [{"role": "user", "content": text}]``."""
        if self.chat:
            return self.body(b'[{"role":"user","content":' + orjson.dumps(text) + b"}]", max_tokens, key=b"messages")
        return self.body(orjson.dumps(text), max_tokens)

    def body(self, prompt_json: bytes, max_tokens: int, key: bytes = b"prompt") -> bytes:
        """Full JSON body for a prompt already serialised as JSON (``b"[...]"`` of token ids, or
        a JSON string); ``key`` names the field (``prompt``, or ``messages`` for chat)."""
        n = b"%d" % max_tokens
        field = b',"' + key + b'":'
        if self._min_tokens:
            return b"".join((self._head, b'"max_tokens":', n, b',"min_tokens":', n, field, prompt_json, b"}"))
        return b"".join((self._head, b'"max_tokens":', n, field, prompt_json, b"}"))
