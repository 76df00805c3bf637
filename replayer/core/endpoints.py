"""The one table of endpoint kinds: what each OpenAI-compatible API path is and how it is sent.

Every stage reads this table: the trace (``endpoint`` column: a short name or a path), the
builder (which body and prompt form), the client (streamed or a whole JSON body), the audit, the
results and the simulator's routes. A new endpoint is a new row here and its body in
``replayer.payload.body``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint kind. ``name``: the trace's short name; ``path``: its API path. ``pooling``: not
    streamed, answered with one JSON body whose arrival is its E2E. ``text_only``: prompts must be
    text (``--tokenizer``), token ids are refused there. ``query``: one query and N documents
    (rows give ``query_length`` and ``document_lengths``)."""

    name: str
    path: str
    pooling: bool = False
    text_only: bool = False
    query: bool = False


TABLE: tuple[Endpoint, ...] = (
    Endpoint("completions", "/v1/completions"),
    Endpoint("chat", "/v1/chat/completions", text_only=True),
    Endpoint("embeddings", "/v1/embeddings", pooling=True),
    Endpoint("score", "/v1/score", pooling=True, text_only=True, query=True),
    Endpoint("rerank", "/v1/rerank", pooling=True, text_only=True, query=True),
)
BY_PATH: dict[str, Endpoint] = {e.path: e for e in TABLE}

COMPLETIONS, CHAT, EMBEDDINGS, SCORE, RERANK = (e.path for e in TABLE)
#: short name -> API path (the trace's ``endpoint`` column accepts either form)
NAMES: dict[str, str] = {e.name: e.path for e in TABLE}
POOLING = frozenset(e.path for e in TABLE if e.pooling)
TEXT_ONLY = frozenset(e.path for e in TABLE if e.text_only)
QUERY = frozenset(e.path for e in TABLE if e.query)


def endpoint_kind(path: str) -> str:
    """The known endpoint a path is (``/v1/chat/completions`` for any ``.../chat/completions``),
    else the path itself (sent as completions)."""
    for known in (CHAT, EMBEDDINGS, SCORE, RERANK):
        if path.endswith(known.removeprefix("/v1")):
            return known
    return COMPLETIONS if path.endswith("/completions") else path
