"""Pooling endpoints of the simulator: embeddings, score and rerank.

Source API: vLLM's OpenAI-compatible server run with a pooling model (``vllm serve
--task embed|score``): ``POST /v1/embeddings``, ``POST /v1/score`` (also ``/score``) and
``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``). This module only parses and validates
bodies, counts tokens and builds response bodies; ``replayer.sim`` owns the routes,
admission (``max_num_seqs``), the prefill wait and ``/metrics``.

Tokens: the sim has no tokenizer. A text counts one token per whitespace-separated word
(``len(text.split())``); a token-id list counts its length. No special tokens (BOS, [CLS],
[SEP]) are added, so counts are a few tokens per input or pair below a real model's.

Each parsed request is a ``PoolingJob`` with two counts:

``tokens``        prompt tokens the engine processes: the prefill wait is
                  ``ttft_base_ms + prefill_us_per_token * tokens / 1000`` ms and
                  ``vllm:prompt_tokens_total`` rises by ``tokens``;
``usage_tokens``  prompt tokens reported in the response's ``usage``; equal to ``tokens``
                  except for score/rerank with ``score_usage_inflate_tokens > 0``.

Score/rerank usage (``SimConfig`` knobs, ``replayer sim`` flags), with q and d the word
counts of a query and a document and n the number of (query, document) pairs:

``score_usage="per_document"`` (default; ``--score-usage per_document``)
    a cross-encoder encodes every pair: tokens = sum over pairs of (q + d), i.e.
    ``n * q + sum(d)`` for one query.
``score_usage="once"`` (``--score-usage once``)
    a bi-encoder / late-interaction model encodes each sent text once:
    tokens = ``q + sum(d)`` for one query (``sum(q_i) + sum(d_i)`` for N:N pairs).
``score_usage_inflate_tokens=K`` (``--inflate-score-usage K``, default 0)
    ``usage_tokens = tokens + K * n``: imitates old vLLM releases whose scoring
    post-processing added tokens to the reported usage. ``/metrics`` still counts the honest
    ``tokens``, so with K > 0 a client's usage audit sees usage above both honest
    expectations and above the server's counter delta.

Errors raise ``PoolingError`` (the sim answers HTTP 400 with vLLM's error body).
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from replayer.sim.config import SCORE_USAGE_MODES as SCORE_USAGE_MODES

if TYPE_CHECKING:
    from replayer.sim.config import SimConfig

__all__ = [
    "PoolingError",
    "PoolingJob",
    "EmbeddingsJob",
    "ScoreJob",
    "RerankJob",
    "SCORE_USAGE_MODES",
    "text_score",
    "embedding_vector",
]


class PoolingError(ValueError):
    """A body vLLM would reject with HTTP 400; the message goes to the client."""


def _words(text: str) -> int:
    return len(text.split())


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def text_score(query: str, document: str) -> float:
    """Deterministic relevance in the open interval (0, 1) from the two texts (not Python's
    per-process ``hash``, so it is stable across runs)."""
    u = _digest(query.encode() + b"\x00" + document.encode())
    return ((u >> 11) + 0.5) / float(1 << 53)


def embedding_vector(item: str | list[int], dim: int) -> np.ndarray:
    """Deterministic unit-norm float32 vector of length ``dim`` for one input (a text or a
    list of token ids; the same text always maps to the same vector)."""
    if isinstance(item, str):
        seed = _digest(b"s" + item.encode())
    else:
        seed = _digest(b"i" + np.asarray(item, dtype=np.int64).tobytes())
    v = np.random.default_rng(seed).standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


def _check_len(n: int, max_model_len: int, what: str) -> None:
    if n > max_model_len:
        raise PoolingError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {n} tokens in the input for {what}. Please reduce the length of the "
            "input."
        )


def _model(body: dict[str, Any]) -> str | None:
    m = body.get("model")
    return m if isinstance(m, str) and m else None


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _require_dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise PoolingError("Request body must be a JSON object")
    return body


class PoolingJob:
    """A parsed pooling request.

    ``prompt``: the input as sent (recorded in ``ReceivedRequest.prompt``); ``model``: the
    body's ``model`` or None; ``tokens`` / ``usage_tokens``: see the module docstring.
    ``response(model)`` -> the JSON-ready response body.
    """

    __slots__ = ("prompt", "model", "tokens", "usage_tokens")

    def __init__(self, prompt: Any, model: str | None, tokens: int, usage_tokens: int) -> None:
        self.prompt = prompt
        self.model = model
        self.tokens = tokens
        self.usage_tokens = usage_tokens

    @classmethod
    def parse(cls, body: Any, cfg: SimConfig) -> PoolingJob:  # pragma: no cover - abstract
        raise NotImplementedError

    def response(self, model: str) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _usage(self) -> dict[str, int]:
        # vLLM's UsageInfo, as in its embeddings/score responses.
        p = self.usage_tokens
        return {"prompt_tokens": p, "total_tokens": p, "completion_tokens": 0}


# ---------------------------------------------------------------------------------------
# Embeddings


class EmbeddingsJob(PoolingJob):
    """``POST /v1/embeddings``.

    Body: ``input`` = a string, a list of strings, a list of ints (one token-id input) or a
    list of lists of ints (a batch); ``encoding_format`` "float" (default) or "base64"
    (little-endian float32 bytes, as vLLM); ``dimensions`` optional int in
    ``[1, embedding_dim]`` (the vector is cut and re-normalised, like a Matryoshka model);
    ``model``. Other fields (``user``, ``truncate_prompt_tokens``...) are ignored.

    Tokens: strings count words, id lists their length; summed over inputs. 400 for: a
    missing/ill-typed/empty ``input``, an input of 0 tokens, a token id outside
    ``[0, vocab_size)``, an input longer than ``max_model_len``, a bad
    ``encoding_format``/``dimensions``.

    Response: ``{"id": "embd-<hex>", "object": "list", "created": <unix s>, "model": M,
    "data": [{"index": i, "object": "embedding", "embedding": [float...] | "<base64>"}],
    "usage": {"prompt_tokens": P, "total_tokens": P, "completion_tokens": 0}}``.
    """

    __slots__ = ("inputs", "dim", "full_dim", "base64")
    inputs: list[str | list[int]]
    dim: int
    full_dim: int
    base64: bool  # the response's encoding_format is "base64"

    @classmethod
    def parse(cls, body: Any, cfg: SimConfig) -> EmbeddingsJob:  # noqa: PLR0912
        body = _require_dict(body)
        raw = body.get("input")
        if isinstance(raw, str):
            inputs: list[str | list[int]] = [raw]
        elif isinstance(raw, list) and raw:
            if all(isinstance(x, str) for x in raw):
                inputs = list(raw)
            elif all(type(x) is int for x in raw):
                inputs = [raw]
            elif all(isinstance(x, list) and all(type(t) is int for t in x) for x in raw):
                inputs = list(raw)
            else:
                raise PoolingError(
                    "input must be a string, a list of strings, a list of "
                    "token ids (ints) or a list of lists of token ids"
                )
        else:
            raise PoolingError("Field required: input (a non-empty string or list)")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise PoolingError(f"encoding_format must be 'float' or 'base64', got {fmt!r}")
        dim = body.get("dimensions")
        if dim is None:
            dim = cfg.embedding_dim
        elif type(dim) is not int or dim < 1:
            raise PoolingError(f"dimensions must be an integer >= 1, got {dim!r}")
        elif dim > cfg.embedding_dim:
            raise PoolingError(f"dimensions={dim} is larger than the model's embedding size {cfg.embedding_dim}")
        total = 0
        for item in inputs:
            if isinstance(item, str):
                n = _words(item)
            else:
                n = len(item)
                if n and (min(item) < 0 or max(item) >= cfg.vocab_size):
                    bad = min(item) if min(item) < 0 else max(item)
                    raise PoolingError(f"Token id {bad} is out of vocabulary")
            if n == 0:
                raise PoolingError("The prompt cannot be empty")
            _check_len(n, cfg.max_model_len, "embedding generation")
            total += n
        job = cls(raw, _model(body), total, total)
        job.inputs, job.dim, job.full_dim = inputs, dim, cfg.embedding_dim
        job.base64 = fmt == "base64"
        return job

    def response(self, model: str) -> dict[str, Any]:
        data = []
        for i, item in enumerate(self.inputs):
            v = embedding_vector(item, self.full_dim)
            if self.dim < self.full_dim:  # Matryoshka: keep a prefix, re-normalise
                v = v[: self.dim]
                v = (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)
            emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if self.base64 else v.tolist()
            data.append({"index": i, "object": "embedding", "embedding": emb})
        return {
            "id": _new_id("embd"),
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": self._usage(),
        }


# ---------------------------------------------------------------------------------------
# Score and rerank


def _texts(value: Any, name: str) -> list[str]:
    if value is None:
        raise PoolingError(f"Field required: {name}")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        if not value:
            raise PoolingError(f"At least one {name} element must be given")
        return list(value)
    raise PoolingError(f"{name} must be a string or a list of strings")


def _pair_tokens(
    queries: list[str], docs: list[str], pairs: list[tuple[int, int]], cfg: SimConfig, what: str
) -> tuple[int, int]:
    """(tokens processed, tokens reported) for scoring ``pairs`` of (query, doc) indices."""
    qw = [_words(t) for t in queries]
    dw = [_words(t) for t in docs]
    if cfg.score_usage == "once":
        for n in qw + dw:
            _check_len(n, cfg.max_model_len, what)
        tokens = sum(qw) + sum(dw)
    else:
        tokens = 0
        for qi, di in pairs:
            n = qw[qi] + dw[di]
            _check_len(n, cfg.max_model_len, what)
            tokens += n
    return tokens, tokens + cfg.score_usage_inflate_tokens * len(pairs)


class ScoreJob(PoolingJob):
    """``POST /v1/score`` (and ``/score``).

    Body: ``text_1`` (str or list[str]), ``text_2`` (str or list[str]), ``model``;
    ``queries`` / ``documents`` are accepted as aliases of ``text_1`` / ``text_2``. Pairing
    as vLLM: one ``text_1`` and N ``text_2`` -> N pairs (1:1, 1:N); N and N -> pairwise;
    anything else, an empty list, a non-string item or a pair (``per_document``) / text
    (``once``) longer than ``max_model_len`` -> 400. Texts may be empty (0 tokens: a real
    cross-encoder pair always has special tokens).

    Response: ``{"id": "score-<hex>", "object": "list", "created": <unix s>, "model": M,
    "data": [{"index": i, "object": "score", "score": s_i}], "usage": {"prompt_tokens": P,
    "total_tokens": P, "completion_tokens": 0}}``, ``s_i = text_score(q, d)`` in (0, 1), P =
    ``usage_tokens`` (module docstring).
    """

    __slots__ = ("queries", "docs", "pairs")
    queries: list[str]
    docs: list[str]
    pairs: list[tuple[int, int]]

    @classmethod
    def parse(cls, body: Any, cfg: SimConfig) -> ScoreJob:
        body = _require_dict(body)
        t1 = _texts(body["text_1"] if "text_1" in body else body.get("queries"), "text_1")
        t2 = _texts(body["text_2"] if "text_2" in body else body.get("documents"), "text_2")
        if len(t1) == 1:
            pairs = [(0, j) for j in range(len(t2))]
        elif len(t1) == len(t2):
            pairs = [(i, i) for i in range(len(t1))]
        else:
            raise PoolingError(
                f"Input lengths must be either 1:1, 1:N or N:N; got {len(t1)} text_1 and {len(t2)} text_2"
            )
        tokens, usage = _pair_tokens(t1, t2, pairs, cfg, "scoring")
        job = cls(
            {"text_1": body.get("text_1", body.get("queries")), "text_2": body.get("text_2", body.get("documents"))},
            _model(body),
            tokens,
            usage,
        )
        job.queries, job.docs, job.pairs = t1, t2, pairs
        return job

    def response(self, model: str) -> dict[str, Any]:
        data = [
            {"index": i, "object": "score", "score": text_score(self.queries[qi], self.docs[di])}
            for i, (qi, di) in enumerate(self.pairs)
        ]
        return {
            "id": _new_id("score"),
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": self._usage(),
        }


class RerankJob(PoolingJob):
    """``POST /v1/rerank`` (and ``/rerank``, ``/v2/rerank``; Jina/Cohere style, as vLLM).

    Body: ``query`` (str), ``documents`` (non-empty list of str or of ``{"text": str}``),
    optional ``top_n`` (int; absent, null or <= 0 = all documents), ``model``. 400 for a
    missing/ill-typed field or a text longer than ``max_model_len`` (as for score).

    Response: ``{"id": "rerank-<hex>", "model": M, "usage": {"total_tokens": P},
    "results": [{"index": i, "document": {"text": d_i}, "relevance_score": s_i}, ...]}``
    sorted by score descending (ties by index), cut to ``top_n``; ``index`` is the position
    in ``documents``; P = ``usage_tokens`` over all documents (vLLM's rerank usage has only
    ``total_tokens``).
    """

    __slots__ = ("query", "docs", "top_n")
    query: str
    docs: list[str]
    top_n: int

    @classmethod
    def parse(cls, body: Any, cfg: SimConfig) -> RerankJob:
        body = _require_dict(body)
        query = body.get("query")
        if not isinstance(query, str):
            raise PoolingError("query must be a string")
        raw = body.get("documents")
        if not isinstance(raw, list) or not raw:
            raise PoolingError("documents must be a non-empty list")
        docs = []
        for d in raw:
            if isinstance(d, dict):
                d = d.get("text")
            if not isinstance(d, str):
                raise PoolingError('documents must be strings or {"text": string} objects')
            docs.append(d)
        top_n = body.get("top_n")
        if top_n is not None and type(top_n) is not int:
            raise PoolingError(f"top_n must be an integer, got {top_n!r}")
        tokens, usage = _pair_tokens([query], docs, [(0, j) for j in range(len(docs))], cfg, "reranking")
        job = cls({"query": query, "documents": raw}, _model(body), tokens, usage)
        job.query, job.docs = query, docs
        job.top_n = top_n if top_n and top_n > 0 else len(docs)
        return job

    def response(self, model: str) -> dict[str, Any]:
        scores = [text_score(self.query, d) for d in self.docs]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: self.top_n]
        results = [{"index": i, "document": {"text": self.docs[i]}, "relevance_score": scores[i]} for i in order]
        return {
            "id": _new_id("rerank"),
            "model": model,
            "usage": {"total_tokens": self.usage_tokens},
            "results": results,
        }
