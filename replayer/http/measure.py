"""An exchange's end -> the fields of its ``RequestResult``: measurements, failures, partial output.

The client's one place for what a finished (or failed, or cancelled) attempt leaves in its result:
the accumulator's counts and moments copied, the latencies ``timestamps.derive`` computes from
them, a failure's outcome, kind and message (never empty), the output tokens that arrived before
a failure, and the server's ``Retry-After``. Called once per attempt, never per token.
"""

from __future__ import annotations

import operator

from replayer.core.endpoints import POOLING
from replayer.core.errors import ErrorKind, Outcome
from replayer.core.result import RequestResult
from replayer.core.timestamps import Timestamps, derive
from replayer.http.audit import audit_pooling
from replayer.http.chunks import ERROR_TEXT_LIMIT, StreamAccumulator
from replayer.http.connection import ERROR_BODY_LIMIT, Exchange
from replayer.http.servertimings import record as record_server_timings
from replayer.http.sse import SSEDecoder

__all__ = [
    "RETRY_AFTER_MAX_S",
    "answered",
    "broken",
    "cut_short",
    "fail",
    "measure",
    "partial",
    "retry_after_s",
]

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


def answered(
    res: RequestResult, ex: Exchange, endpoint: str, t0_ns: int, usage_slack_tokens: int, server_timings: bool
) -> float | None:
    """A response that came to its end (``res.sent_ns`` and ``end_ns`` set): its status, its
    measurements, the usage audit of a pooling response, a failure's kind and message and the
    output that arrived before it. Returns the retry delay a 429 or 5xx asks for
    (``retry_after_s``: -1.0 for the backoff), None when the outcome is final."""
    res.http_status = ex.status
    acc = ex.acc
    _in_band_errors(ex)
    acc.finish()
    if ex.status != 200:
        text = b"".join(ex.body)[:ERROR_BODY_LIMIT]
        error = acc.error or text.decode("utf-8", "replace")[:ERROR_TEXT_LIMIT] or f"HTTP {ex.status}"
        fail(res, ErrorKind.HTTP_STATUS, error)
        return retry_after_s(ex.retry_after) if ex.status == 429 or ex.status >= 500 else None
    pooled = acc.success and endpoint in POOLING  # (a pooling response is one JSON body: its E2E is its arrival)
    measure(res, acc, res.sent_ns + t0_ns, t0_ns, ex.dec, body_ns=ex.t_ns if pooled else None)  # type: ignore[operator]
    if server_timings:
        record_server_timings(res, acc)
    if acc.success:
        res.outcome = Outcome.SUCCESS.value
        if pooled:
            reported = acc.prompt_tokens if acc.prompt_tokens is not None else acc.total_tokens
            audit_pooling(res, reported, usage_slack_tokens)
    elif endpoint in POOLING and acc.body_without_usage:
        audit_pooling(res, None)
    else:
        fail(res, acc.error_kind, acc.error)
    if res.outcome != Outcome.SUCCESS.value:
        partial(res, acc)
    return None


def _in_band_errors(ex: Exchange) -> bool:
    """Hand the stream's SSE ``error`` fields (``SSEDecoder.errors``: llama.cpp's in-band error,
    which the decoder keeps out of the events) to its accumulator, once per response; whether
    there were any."""
    dec = ex.dec
    if dec is None or not dec.errors:
        return False
    for value in dec.errors:
        ex.acc.on_error_field(value)
    dec.errors.clear()
    return True


def cut_short(res: RequestResult, ex: Exchange, t0_ns: int) -> None:
    """An exchange cut short after its request was sent (``res.sent_ns`` set): its status and what
    arrived measured, as partial output."""
    res.http_status = ex.status or None
    measure(res, ex.acc, res.sent_ns + t0_ns, t0_ns, ex.dec)  # type: ignore[operator]
    partial(res, ex.acc)


def broken(
    res: RequestResult, kind: ErrorKind, message: str, ex: Exchange | None, t0_ns: int, *, reused: bool
) -> ErrorKind:
    """A failed attempt recorded (``ex``: its exchange, None when no connection was had): what
    arrived measured, and a ``reused`` keep-alive connection that closed before any response byte
    told apart as ``STALE_CONNECTION``. Returns the kind recorded."""
    if ex is not None:
        res.http_status = ex.status or None
        if res.sent_ns is not None:
            cut_short(res, ex, t0_ns)
        if _in_band_errors(ex):  # (the server said why before the stream broke: its message, not the break)
            kind, message = ErrorKind.STREAM_ERROR, ex.acc.error or message
        if kind is ErrorKind.DISCONNECT and not ex.t_ns and reused:
            kind = ErrorKind.STALE_CONNECTION
            message = f"reused keep-alive connection closed before any response byte ({message})"
    fail(res, kind, message[:ERROR_TEXT_LIMIT])
    return kind
