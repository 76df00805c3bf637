"""Request bodies for the OpenAI-compatible APIs, serialised once to bytes.

Generation (``/v1/completions``; with text prompts also ``/v1/chat/completions``), streamed with
usage (OpenAI Completions / Chat Completions API; ``ignore_eos``, ``min_tokens`` and
``stream_options.continuous_usage_stats`` are vLLM extensions (SGLang has the first two), left
out with ``vllm_extensions=False``)::

    {"model": M, "stream": true,
     "stream_options": {"include_usage": true, "continuous_usage_stats": true},
     "ignore_eos": true, "max_tokens": N, "min_tokens": N, "prompt": [token ids...]}

``continuous_usage_stats`` makes vLLM put the running ``usage`` on every chunk, so each chunk's
token count is known (a chunk may carry several tokens: speculative decoding, MTP), which the
token-weighted ITL needs (``replayer.http.sse``).

with ``N = output_length``. The constant part is serialised once; per request only the numbers and
the (pre-serialised) prompt are joined.

Pooling (not streamed; vLLM's OpenAI-compatible server, docs "Pooling models"):

* ``/v1/embeddings``: ``{"model": M, "input": [[ids...], ...]}`` (a batch of token-id inputs);
* ``/v1/score``: ``{"model": M, "text_1": QUERY, "text_2": [DOC, ...]}`` (one query, N documents);
* ``/v1/rerank``: ``{"model": M, "query": QUERY, "documents": [DOC, ...]}`` (Jina/Cohere style).

A trace row's own fields (``for_row``; ``docs/reference/trace-formats.md``): its ``extra_body`` object is merged
over the top-level fields of the body built above (a key given there replaces the built one),
then its ``model`` replaces the run's and its ``priority`` is sent as ``priority`` (vLLM's
scheduling priority), for every endpoint. The keys that carry the prompt, the output length and
the streaming the measurements rely on (``trace.EXTRA_BODY_RESERVED``) cannot be set that way.
"""

from __future__ import annotations

import copy

import orjson

from replayer.core.engines import engine_caps
from replayer.trace.model import EXTRA_BODY_RESERVED


class PayloadBuilder:
    """Builds request bodies.

    ``model``: the request's ``model`` field. ``stream``: SSE streaming with usage (default).
    ``vllm_extensions``: send the engine's exact-length fields (``ignore_eos``/``min_tokens``, or
    Dynamo's ``nvext.ignore_eos``) so generation runs to ``max_tokens``, and ask for
    ``continuous_usage_stats`` (per-chunk token counts) when streaming, where the engine has it.
    ``engine``: the target's engine (``replayer.core.engines``; None: vLLM's fields).
    ``extra``: additional top-level body fields (e.g. ``{"temperature": 0}``), serialised once.
    ``chat``: text prompts go out as chat ``messages`` (``text_body``). ``for_row`` gives the
    builder of a row with its own ``model``/``priority``/``extra_body`` (module docstring).
    """

    #: Distinct rows' builders kept by ``for_row`` (cleared when full).
    ROW_BUILDERS = 1024

    def __init__(
        self,
        model: str,
        *,
        stream: bool = True,
        vllm_extensions: bool = True,
        extra: dict | None = None,
        chat: bool = False,
        engine: str | None = None,
    ) -> None:
        caps = engine_caps(engine or "vllm")
        head: dict = {"model": model, "stream": stream}
        if stream:
            head["stream_options"] = (
                {"include_usage": True, "continuous_usage_stats": True}
                if vllm_extensions and caps.continuous_usage
                else {"include_usage": True}
            )
        if vllm_extensions:
            head.update(caps.exact_length)
        _check_reserved(extra or {}, "extra body field")
        head.update(extra or {})
        self._head = orjson.dumps(head)[:-1] + b","  # '{...,' ready for the per-request fields
        self._pool_head = orjson.dumps({"model": model})[:-1] + b","
        self._fields = (head, {"model": model})  # (generation, pooling) heads, for for_row
        self._rows: dict[tuple, PayloadBuilder] = {}
        self._min_tokens = vllm_extensions and caps.min_tokens
        self.chat = chat

    def for_row(self, model: str | None, priority: int | None, extra_body: str | None) -> "PayloadBuilder":
        """The builder for a row's own fields (``extra_body`` a JSON object's text, as the trace
        reader keeps it): itself when none is set, else a copy whose heads hold them, cached per
        distinct (model, priority, extra_body), so the per-row cost is a dict lookup. Raises
        ValueError for an ``extra_body`` that is not a JSON object or sets a reserved key (the trace
        reader refuses both before a run)."""
        if model is None and priority is None and extra_body is None:
            return self
        key = (model, priority, extra_body)
        b = self._rows.get(key)
        if b is None:
            over = orjson.loads(extra_body) if extra_body is not None else {}
            if not isinstance(over, dict):
                raise ValueError(f"extra_body must be a JSON object, got {str(extra_body)[:80]!r}")
            _check_reserved(over, "extra_body key")
            if model is not None:
                over["model"] = model
            if priority is not None:
                over["priority"] = priority
            gen, pool = self._fields
            b = copy.copy(self)
            b._rows = {}  # noqa: SLF001
            b._fields = ({**gen, **over}, {**pool, **over})
            b._head = orjson.dumps(b._fields[0])[:-1] + b","  # noqa: SLF001
            b._pool_head = orjson.dumps(b._fields[1])[:-1] + b","  # noqa: SLF001
            if len(self._rows) >= self.ROW_BUILDERS:
                self._rows.clear()
            self._rows[key] = b
        return b

    def text_body(self, text: str, max_tokens: int, *, chat: bool | None = None) -> bytes:
        """Body for a text prompt: ``"prompt": text`` (completions) or, for the chat API,
        ``"messages": [{"role": "user", "content": text}]``."""
        if self.chat if chat is None else chat:
            return self.messages_body([{"role": "user", "content": text}], max_tokens)
        return self.body(orjson.dumps(text), max_tokens)

    def image_body(self, text: str, parts: list[bytes], max_tokens: int) -> bytes:
        """Chat body of one user message whose content is the text, then the images: ``parts``
        are content parts already serialised (``replayer.payload.images.content_part``), only joined."""
        content = b",".join((b'{"type":"text","text":' + orjson.dumps(text) + b"}", *parts))
        return self.body(b'[{"role":"user","content":[' + content + b"]}]", max_tokens, key=b"messages")

    def messages_body(self, messages: list[dict], max_tokens: int) -> bytes:
        """Chat body for a list of ``{"role", "content"}`` messages (a conversation so far)."""
        return self.body(orjson.dumps(messages), max_tokens, key=b"messages")

    def body(self, prompt_json: bytes, max_tokens: int, key: bytes = b"prompt") -> bytes:
        """Full JSON body for a prompt already serialised as JSON (``b"[...]"`` of token ids, or
        a JSON string); ``key`` names the field (``prompt``, or ``messages`` for chat)."""
        n = b"%d" % max_tokens
        field = b',"' + key + b'":'
        if self._min_tokens:
            return b"".join((self._head, b'"max_tokens":', n, b',"min_tokens":', n, field, prompt_json, b"}"))
        return b"".join((self._head, b'"max_tokens":', n, field, prompt_json, b"}"))

    def embeddings_body(self, inputs_json: list[bytes]) -> bytes:
        """``/v1/embeddings`` body for token-id inputs, each already a JSON array (``b"[...]"``)."""
        return b"".join((self._pool_head, b'"input":[', b",".join(inputs_json), b"]}"))

    def score_body(self, query: str, documents: list[str]) -> bytes:
        """``/v1/score`` body: one query (``text_1``) scored against each document (``text_2``)."""
        return self._pool_head + orjson.dumps({"text_1": query, "text_2": documents})[1:]

    def rerank_body(self, query: str, documents: list[str]) -> bytes:
        """``/v1/rerank`` body: ``query`` and ``documents`` (every document ranked)."""
        return self._pool_head + orjson.dumps({"query": query, "documents": documents})[1:]


def _check_reserved(fields: dict, what: str) -> None:
    bad = EXTRA_BODY_RESERVED.intersection(fields)
    if bad:
        raise ValueError(
            f"{what} {', '.join(map(repr, sorted(bad)))}: set by the replayer per request "
            "(prompt, output length, streaming); it cannot be overridden"
        )
