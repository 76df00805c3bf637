"""Usage audit of pooling responses (``/v1/embeddings``, ``/v1/score``, ``/v1/rerank``).

The server's reported prompt tokens (``usage.prompt_tokens``; a rerank usage holds only
``total_tokens``, which is then used) are recorded next to what the request should cost:

* embeddings: the token ids sent (``prompt_len_sent``);
* score / rerank with query length q and document lengths d_1..d_n (trace tokens):
  ``once = q + sum(d)`` (an engine that encodes the query once: bi-encoders) and
  ``per_document = n*q + sum(d)`` (a cross-encoder encodes each (query, document) pair).

``usage_audit`` is ``inflated`` when the server reports more than the larger expectation plus
``slack_tokens`` per input (special tokens a model adds, e.g. [CLS]/[SEP]: 0 by default) — extra
tokens added by the server's post-processing, as vLLM once did for bi-encoder and late-interaction
scoring — else ``ok``. A response without a usable usage object is a failed request of kind
``usage`` (``missing``), never a crash.
"""

from __future__ import annotations

from replayer.core.endpoints import EMBEDDINGS, POOLING
from replayer.core.errors import ErrorKind, Outcome
from replayer.core.result import RequestResult


def audit_pooling(res: RequestResult, prompt_tokens: int | None, slack_tokens: int = 0) -> None:
    """Set ``res.prompt_tokens`` and ``res.usage_audit`` for a successful pooling response
    (``res.endpoint`` in ``POOLING``); a missing usage marks ``res`` failed (kind ``usage``)."""
    if res.endpoint not in POOLING:
        return
    if prompt_tokens is None:
        res.usage_audit = "missing"
        res.outcome, res.error_kind = Outcome.FAILED.value, ErrorKind.USAGE.value
        res.error = res.error or "response carries no usage.prompt_tokens or usage.total_tokens"
        return
    res.prompt_tokens = prompt_tokens
    n = res.n_documents or 1
    if res.endpoint == EMBEDDINGS:
        bound = res.prompt_len_sent
    else:
        bound = max(res.expected_prompt_tokens_once or 0, res.expected_prompt_tokens_per_document or 0)
    res.usage_audit = "inflated" if prompt_tokens > bound + slack_tokens * n else "ok"
