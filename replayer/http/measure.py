"""An exchange's end -> the fields of its ``RequestResult``: measurements, failures, partial output.

The client's one place for what a finished (or failed, or cancelled) attempt leaves in its result:
the accumulator's counts and moments copied, the latencies ``timestamps.derive`` computes from
them, a failure's outcome, kind and message (never empty), the output tokens that arrived before
a failure, and the server's ``Retry-After``. Called once per attempt, never per token.
"""

from __future__ import annotations

import operator

from replayer.core.errors import ErrorKind, Outcome
from replayer.core.result import RequestResult
from replayer.core.timestamps import Timestamps, derive
from replayer.http.chunks import StreamAccumulator
from replayer.http.sse import SSEDecoder

__all__ = ["RETRY_AFTER_MAX_S", "fail", "measure", "partial", "retry_after_s"]

RETRY_AFTER_MAX_S = 60.0


def retry_after_s(value: bytes | None) -> float:
    """Seconds of a ``Retry-After: <seconds>`` header, capped at 60 s; -1.0 when absent or not a
    number of seconds (an HTTP date is not honoured: the backoff applies)."""
    if value is None:
        return -1.0
    try:
        s = float(value.strip())
    except ValueError:
        return -1.0
    if s != s or s < 0:  # NaN or negative
        return -1.0
    return min(s, RETRY_AFTER_MAX_S)


def fail(res: RequestResult, kind: ErrorKind, error: str | None, outcome: Outcome = Outcome.FAILED) -> None:
    """Record a failure: its outcome, kind and message (never empty: the kind when none was given)."""
    res.outcome = outcome.value
    res.error_kind = kind.value
    res.error = error or f"{kind.value} (no message)"


def partial(res: RequestResult, acc: StreamAccumulator) -> None:
    """A request that did not succeed: the output tokens that arrived become
    ``partial_output_tokens`` (the server's running usage, else one per token-carrying event:
    ``usage_source`` tells which; None when none arrived) and its ``completion_tokens`` unknown,
    so no total and no throughput counts them."""
    n = acc.output_tokens
    res.partial_output_tokens = (acc.output_tokens_estimate if n is None else n) or None
    res.completion_tokens = None


def measure(
    res: RequestResult,
    acc: StreamAccumulator,
    sent: int,
    t0: int,
    dec: SSEDecoder | None = None,
    body_ns: int | None = None,
) -> None:
    """Copy the accumulator's measurements (and the decoder's invalid-UTF-8 count) into ``res``
    (times as offsets from ``t0``), and the latencies ``timestamps.derive`` computes from the
    moments observed (``sent``, ``body_ns``: ``now_ns`` times; ``body_ns`` a whole JSON body's
    arrival when that is the E2E point)."""
    res.prompt_tokens = acc.prompt_tokens
    res.image_tokens = acc.image_tokens
    if acc.image_tokens is not None and acc.prompt_tokens is not None:
        res.text_tokens = acc.prompt_tokens - acc.image_tokens
    res.completion_tokens = acc.completion_tokens
    res.usage_source = "server" if acc.usage_seen else "none"
    res.n_chunks = acc.n_chunks
    res.output_tokens_estimate = acc.output_tokens_estimate if acc.completion_tokens is None else None
    res.invalid_utf8 = acc.invalid_utf8 + (dec.invalid_utf8 if dec is not None else 0)
    res.finish_reason = acc.finish_reason
    first, last = acc.first_token_ns, acc.last_token_ns
    if first is not None:
        res.first_token_ns = first - t0
    if last is not None:
        res.last_token_ns = last - t0
    token_ns, token_counts = acc.token_times()
    if len(token_ns) >= 2 and not acc.whole_body:
        res.max_gap_ms = max(map(operator.sub, token_ns[1:], token_ns)) / 1e6
    lat = derive(
        Timestamps(
            due_ns=res.due_ns + t0,
            sent_ns=sent,
            first_token_ns=first,
            last_token_ns=last,
            body_ns=body_ns or None,
            token_ns=token_ns,
            token_counts=token_counts,
            output_tokens=acc.output_tokens,
            streamed=not acc.whole_body,
            session_wait_ms=res.session_wait_ms,
        )
    )
    res.ttft_ms, res.e2e_ms, res.tpot_ms, res.itl_ms = lat.ttft_ms, lat.e2e_ms, lat.tpot_ms, lat.itl_ms
    res.decode_tpot_ms = lat.decode_tpot_ms
    res.ttft_from_due_ms, res.e2el_from_due_ms = lat.ttft_from_due_ms, lat.e2el_from_due_ms
