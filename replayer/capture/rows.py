"""What one captured request becomes: the facts read from its body, and its trace row.

``request_facts`` reads a request body once (model, ``max_tokens``, session, token-id prompts,
what to tokenize, image identities) and keeps no prompt text beyond the request's own life: the
text to tokenize is held in memory until the tokenization queue has turned it into hash ids,
then dropped. ``SCHEMA`` is the capture's Parquet schema: the canonical trace columns
(``docs/reference/trace-formats.md``) plus the columns that say how each value was obtained.

Rows whose lengths are unknown (the upstream was down and nothing could be tokenized) or that
produced no output are kept with their status: the trace reader replays only rows with
``input_length >= 1``, ``output_length >= 1`` and hash ids (a capture file's metadata marks it).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import orjson
import pyarrow as pa

#: the OpenAI API paths whose requests are captured (every other path is only passed through)
CAPTURED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/score", "/v1/rerank")
GENERATION = ("/v1/completions", "/v1/chat/completions")

#: outcome of the exchange, as the client saw it (a closed set: also a metric label)
OUTCOMES = ("ok", "http_error", "upstream_unreachable", "upstream_broken", "client_disconnected")

SCHEMA = pa.schema(
    [
        ("timestamp", pa.int64()),  # ns since the capture started (one monotonic clock)
        ("input_length", pa.int64()),  # null: unknown (no usage and nothing tokenized)
        ("output_length", pa.int64()),  # tokens generated (0 when none came back); null: unknown
        ("hash_ids", pa.list_(pa.int64())),  # null: the prompt could not be tokenized
        ("request_id", pa.string()),  # the client's X-Request-Id, when it sent one
        ("session_id", pa.string()),
        ("endpoint", pa.string()),
        ("model", pa.string()),
        ("max_tokens", pa.int64()),  # as requested (max_completion_tokens for chat when given)
        ("status", pa.int32()),  # HTTP status the client got (502: upstream unreachable)
        ("outcome", pa.string()),  # OUTCOMES
        ("input_length_source", pa.string()),  # "usage" (the server's) | "tokens" (counted here)
        ("output_length_source", pa.string()),  # "usage" | "chunks" (streamed chunks counted: an estimate)
        ("tokenized_by", pa.string()),  # "request" | "upstream" | "tokenizer" | "failed" | "dropped"
        ("hashed_tokens", pa.int64()),  # tokens that were hashed (differs from input_length when the
        #                                     tokenization did not match the server's count)
        ("image_count", pa.int32()),  # chat: images in the messages
        ("image_hashes", pa.list_(pa.string())),  # chat: a keyed content hash per image
        ("duration_ms", pa.float64()),  # arrival to the response's last byte
    ]
)


@dataclass(slots=True)
class RequestFacts:
    """What the proxy keeps of a request body (in memory only; see the module docstring)."""

    endpoint: str
    model: str | None = None
    max_tokens: int | None = None
    session_id: str | None = None
    token_ids: array | None = None  # the prompt as token ids, when the request sent ids
    tokenize_body: dict | None = None  # body for the upstream's /tokenize (text prompts, chat)
    text: str | None = None  # text for a local tokenizer (completions, embeddings)
    images: list[str] = field(default_factory=list)  # image identities (keyed hashes), chat only
    parsed: bool = False  # the body was a JSON object


def _int(v) -> int | None:
    return v if type(v) is int else None


def _token_list(v) -> array | None:
    """``v`` as token ids (an ``array('q')``: checked and copied at C speed), or None. A flat
    list of ints, or a batch of such lists (concatenated: one row per request)."""
    if type(v) is not list or not v:
        return None
    try:
        if type(v[0]) is int:
            return array("q", v)  # (a float or a string in the list: TypeError)
        if type(v[0]) is list:
            out = array("q")
            for x in v:
                if type(x) is not list or not x:
                    return None
                out.extend(array("q", x))
            return out
    except (TypeError, OverflowError):
        return None
    return None


def _texts(v) -> list[str] | None:
    if type(v) is str:
        return [v]
    if type(v) is list and v and all(type(x) is str for x in v):
        return v
    return None


def request_facts(endpoint: str, body: bytes, session_header: str | None, image_hash) -> RequestFacts:
    """Read a request body. ``image_hash(data) -> str`` gives an image's keyed identity. A body
    that is not a JSON object yields facts with ``parsed`` False (it is passed through as it is
    and recorded by its status)."""
    facts = RequestFacts(endpoint=endpoint, session_id=session_header)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return facts
    if type(obj) is not dict:
        return facts
    facts.parsed = True
    model = obj.get("model")
    facts.model = model if type(model) is str else None
    if facts.session_id is None and type(obj.get("user")) is str:
        facts.session_id = obj["user"]
    if endpoint == "/v1/chat/completions":
        mt = obj.get("max_completion_tokens")
        facts.max_tokens = _int(obj.get("max_tokens") if mt is None else mt)
        msgs = obj.get("messages")
        if type(msgs) is list:
            tb = {"messages": msgs, "add_generation_prompt": obj.get("add_generation_prompt", True)}
            for k in ("model", "chat_template", "chat_template_kwargs", "tools", "continue_final_message"):
                if obj.get(k) is not None:
                    tb[k] = obj[k]
            facts.tokenize_body = tb
            facts.images = [image_hash(u) for u in _image_urls(msgs)]
        return facts
    facts.max_tokens = _int(obj.get("max_tokens"))
    key = {"/v1/completions": "prompt", "/v1/embeddings": "input"}.get(endpoint)
    if key is None:  # score / rerank: the query and documents, tokenized as one text
        parts = [obj.get(k) for k in ("text_1", "query", "text_2", "documents")]
        texts = [t for p in parts for t in (_texts(p) or [])]
        if texts:
            facts.text = "\n".join(texts)
            facts.tokenize_body = {"prompt": facts.text, **({"model": facts.model} if facts.model else {})}
        return facts
    prompt = obj.get(key)
    ids = _token_list(prompt)
    if ids is not None:
        facts.token_ids = ids
        return facts
    prompt_texts = _texts(prompt)
    if prompt_texts:
        facts.text = "".join(prompt_texts)
        facts.tokenize_body = {"prompt": facts.text, **({"model": facts.model} if facts.model else {})}
    return facts


def _image_urls(msgs: list) -> list[str]:
    """Every image of chat messages (``image_url`` parts: the data URL or the URL), in order."""
    out: list[str] = []
    for m in msgs:
        c = m.get("content") if type(m) is dict else None
        if type(c) is not list:
            continue
        for part in c:
            if type(part) is dict and part.get("type") in ("image_url", "input_image"):
                u = part.get("image_url")
                if type(u) is dict:
                    u = u.get("url")
                if type(u) is str:
                    out.append(u)
    return out


def fit_hash_ids(ids: list[int], input_length: int, block_size: int, fresh) -> list[int]:
    """``ids`` cut or extended to ``ceil(input_length / block_size)`` (the schema's count): when
    the hashed tokens and the server's count differ, the blocks past the tokens that were hashed
    get fresh ids of their own (``fresh()``), shared with nothing."""
    want = math.ceil(input_length / block_size)
    if len(ids) >= want:
        return ids[:want]
    return ids + [fresh() for _ in range(want - len(ids))]
