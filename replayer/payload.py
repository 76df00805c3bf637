"""Request bodies for the OpenAI-compatible APIs, serialised once to bytes.

Generation (``/v1/completions``; with text prompts also ``/v1/chat/completions``), streamed with
usage (OpenAI Completions / Chat Completions API; ``ignore_eos`` and ``min_tokens`` are vLLM /
SGLang extensions, left out with ``vllm_extensions=False``)::

    {"model": M, "stream": true, "stream_options": {"include_usage": true},
     "ignore_eos": true, "max_tokens": N, "min_tokens": N, "prompt": [token ids...]}

with ``N = output_length``. The constant part is serialised once; per request only the numbers and
the (pre-serialised) prompt are joined.

Pooling (not streamed; vLLM's OpenAI-compatible server, docs "Pooling models"):

* ``/v1/embeddings``: ``{"model": M, "input": [[ids...], ...]}`` (a batch of token-id inputs);
* ``/v1/score``: ``{"model": M, "text_1": QUERY, "text_2": [DOC, ...]}`` (one query, N documents);
* ``/v1/rerank``: ``{"model": M, "query": QUERY, "documents": [DOC, ...]}`` (Jina/Cohere style).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .result import RequestResult

#: Endpoint paths by kind (the ``endpoint`` trace column accepts either).
COMPLETIONS, CHAT, EMBEDDINGS, SCORE, RERANK = ("/v1/completions", "/v1/chat/completions",
                                                "/v1/embeddings", "/v1/score", "/v1/rerank")
POOLING = frozenset((EMBEDDINGS, SCORE, RERANK))
#: Endpoints whose prompts must be text (need ``--tokenizer``): token ids are refused there.
TEXT_ONLY = frozenset((CHAT, SCORE, RERANK))


def endpoint_kind(path: str) -> str:
    """The known endpoint a path is (``/v1/chat/completions`` for any ``.../chat/completions``),
    else the path itself (sent as completions)."""
    for known in (CHAT, EMBEDDINGS, SCORE, RERANK):
        if path.endswith(known.removeprefix("/v1")):
            return known
    return COMPLETIONS if path.endswith("/completions") else path


@dataclass(slots=True)
class PreparedRequest:
    """A request ready to send: where it came from, when it is due, and its body bytes.

    Sessions (``replayer.sessions``): ``dep`` is the key this request waits on (its session, or
    its parent request), ``key`` the key it releases when it ends, ``think_ns`` the trace's think
    time (trace ns). ``release_ns``: when the session gate let it go (None if never held).
    Pooling audit: ``expected_once`` / ``expected_per_doc`` are the prompt tokens the server
    should report with the query counted once / per document (score, rerank).
    """

    index: int           # position in the schedule (0-based)
    row: int             # row index in the trace
    due_ns: int          # offset from the run anchor t0_ns
    body: bytes
    input_length: int
    output_length: int
    prompt_len: int      # token ids in the body's prompt (all inputs together)
    max_tokens: int
    loop: int = 0
    trace_ns: int = 0    # trace-time offset (loop offset included); due_ns is derived from it
    expected_hits: int | None = None  # expected prefix-cache hit tokens (replayer.prefix_cache)
    path: str | None = None           # endpoint path; None = the client's default
    endpoint: str = COMPLETIONS       # known endpoint kind (results, metrics)
    session_id: str | None = None
    turn: int | None = None
    dep: object = None
    key: object = None
    think_ns: int = 0
    release_ns: int | None = None
    n_documents: int | None = None
    expected_once: int | None = None
    expected_per_doc: int | None = None

    def new_result(self, shard: int, due_ns: int | None = None) -> RequestResult:
        """The result record this request starts with (outcome ``not_started``)."""
        return RequestResult(row=self.row, loop=self.loop, shard=shard, input_length=self.input_length,
                             output_length=self.output_length, prompt_len_sent=self.prompt_len,
                             max_tokens=self.max_tokens, due_ns=self.due_ns if due_ns is None else due_ns,
                             expected_prefix_hit_tokens=self.expected_hits, endpoint=self.endpoint,
                             session_id=self.session_id, turn=self.turn, n_documents=self.n_documents,
                             expected_prompt_tokens_once=self.expected_once,
                             expected_prompt_tokens_per_document=self.expected_per_doc)


class PayloadBuilder:
    """Builds request bodies.

    ``model``: the request's ``model`` field. ``stream``: SSE streaming with usage (default).
    ``vllm_extensions``: send ``ignore_eos``/``min_tokens`` so generation runs to ``max_tokens``.
    ``extra``: additional top-level body fields (e.g. ``{"temperature": 0}``), serialised once.
    ``chat``: text prompts go out as chat ``messages`` (``text_body``).
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
        self._pool_head = orjson.dumps({"model": model})[:-1] + b","
        self._min_tokens = vllm_extensions
        self.chat = chat

    def text_body(self, text: str, max_tokens: int, *, chat: bool | None = None) -> bytes:
        """Body for a text prompt: ``"prompt": text`` (completions) or, for the chat API,
        ``"messages": [{"role": "user", "content": text}]``."""
        if self.chat if chat is None else chat:
            return self.messages_body([{"role": "user", "content": text}], max_tokens)
        return self.body(orjson.dumps(text), max_tokens)

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
