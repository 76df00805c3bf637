"""A request's moments and the latencies derived from them, in one place.

The client observes moments (``Timestamps``: when the request was due, when it went out, when
the first and last tokens and every token-carrying event arrived) and ``derive`` turns them into
the latencies the results and metrics report (``Latencies``): TTFT, E2E, TPOT, the
token-weighted ITL and the same from the due time. Definitions (docs/metrics.md, after
``vllm bench serve``): TTFT = first token-carrying event - send; E2E = last choice event - send
(a whole JSON body: its arrival); TPOT = (last - first) / (N - 1), N the server-reported
completion tokens, only for N >= 2 and a streamed response; decode TPOT = (last - first) / (N -
k1), k1 the first event's tokens, where the events' counts are known; ITL: each gap between successive
token-carrying events that ends in an event of k tokens gives k samples of gap / k, only when
those counts add up to N; from the due time: the latency plus (send - due) minus a session
turn's hold (``session_wait_ms``: it is due at its release). An unmeasured value is None, never 0.

Times are integer ns on the one monotonic clock; offsets from any common origin give the same
latencies (only differences are taken).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Timestamps:
    """One request's moments (ns; None: the moment never came).

    ``due_ns``: the timeline's due time; ``session_wait_ms``: a session turn's hold past it
    (None outside sessions). ``sent_ns``: just before the request's first byte. ``first_token_ns``
    / ``last_token_ns``: the TTFT and E2E event times. ``body_ns``: arrival of a whole JSON body
    whose arrival is its E2E (pooling), None otherwise. ``token_ns``/``token_counts``: each
    token-carrying event's arrival and its tokens. ``output_tokens``: N from the server's usage.
    ``streamed``: per-token timing is observable (False for a whole JSON body)."""

    due_ns: int
    sent_ns: int | None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    body_ns: int | None = None
    token_ns: Sequence[int] = ()
    token_counts: Sequence[int] = ()
    output_tokens: int | None = None
    streamed: bool = True
    session_wait_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Latencies:
    """What ``derive`` computes (ms; None or empty: not measured)."""

    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    itl_ms: list[float] = field(default_factory=list)
    ttft_from_due_ms: float | None = None
    e2el_from_due_ms: float | None = None
    decode_tpot_ms: float | None = None


def derive(ts: Timestamps) -> Latencies:
    """The latencies of ``ts`` (module docstring)."""
    sent = ts.sent_ns
    first, last = ts.first_token_ns, ts.last_token_ns
    ttft = e2e = None
    if sent is not None:
        if first is not None:
            ttft = (first - sent) / 1e6
        if ts.body_ns is not None:
            e2e = (ts.body_ns - sent) / 1e6
        elif last is not None:
            e2e = (last - sent) / 1e6
    n = ts.output_tokens if ts.streamed else None
    since = since_due_ms(sent, ts.due_ns, ts.session_wait_ms)
    return Latencies(
        ttft,
        e2e,
        tpot_ms(first, last, n),
        itl_ms(ts.token_ns, ts.token_counts, n),
        None if since is None or ttft is None else ttft + since,
        None if since is None or e2e is None else e2e + since,
        decode_tpot_ms(first, last, ts.token_counts, n),
    )


def since_due_ms(sent_ns: int | None, due_ns: int, session_wait_ms: float | None) -> float | None:
    """Time from the due time (a held session turn's release) to the send, ms; None unsent."""
    if sent_ns is None:
        return None
    return (sent_ns - due_ns) / 1e6 - (session_wait_ms or 0.0)


def tpot_ms(first_ns: int | None, last_ns: int | None, n: int | None) -> float | None:
    """(last - first) / (N - 1) in ms; None unless N >= 2 and both times are known."""
    if n is None or n < 2 or first_ns is None or last_ns is None:
        return None
    return (last_ns - first_ns) / 1e6 / (n - 1)


def decode_tpot_ms(
    first_ns: int | None, last_ns: int | None, token_counts: Sequence[int], n: int | None
) -> float | None:
    """(last - first) / (N - k1) in ms, k1 the tokens of the first token-carrying event: the time
    per token of the tokens decoded after the first chunk. ``tpot_ms`` (``vllm bench serve``'s)
    divides by N - 1 and so understates it when the first chunk carries several tokens (chunked
    prefill, speculative decoding). None unless N is known, the events' counts add up to N (so k1
    is known), at least one token follows the first chunk, and both times are known."""
    if n is None or first_ns is None or last_ns is None or not token_counts or sum(token_counts) != n:
        return None
    rest = n - token_counts[0]
    return (last_ns - first_ns) / 1e6 / rest if rest >= 1 else None


def itl_ms(token_ns: Sequence[int], token_counts: Sequence[int], n: int | None) -> list[float]:
    """Token-weighted inter-token latencies in ms: each gap between successive token-carrying
    events, ending in an event with k tokens, gives k samples of gap/k. Empty if N is unknown
    or < 2, with fewer than two events, or when the counts do not add up to N (which event
    carried several tokens is then not known)."""
    if n is None or n < 2 or len(token_ns) < 2 or sum(token_counts) != n:
        return []
    out: list[float] = []
    prev = token_ns[0]
    for t, k in zip(token_ns[1:], token_counts[1:]):
        g = (t - prev) / 1e6
        prev = t
        if k == 1:
            out.append(g)
        else:
            out.extend([g / k] * k)
    return out
