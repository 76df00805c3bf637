"""Which events of a response carried how many tokens (sans-I/O): the per-event token counts
that ITL is weighted by, and the TTFT and E2E events, from what ``StreamAccumulator`` noted per
choice event.

With continuous usage (every choice event with text or a ``finish_reason`` carries a usage
object: vLLM's ``continuous_usage_stats``) an event carries the rise of the running
``completion_tokens``. Otherwise each event with non-empty text carries one token, and when the
final usage reports more than were counted and the last choice event came after the last
counted one (typically an empty-text ``finish_reason`` chunk: the stop token decodes to ""),
that last event carries the missing ones, so sum(ITL) == E2E - TTFT.
"""

from __future__ import annotations

from collections.abc import Sequence

#: bits of an event's flags: it carried text (a token); it carried a finish_reason
TEXT, FINISH = 1, 2


def token_events(
    times: Sequence[int], flags: Sequence[int], totals: Sequence[int], completion_tokens: int | None
) -> tuple[int | None, int | None, list[int], list[int]]:
    """(first token event's time, last event's time (tokens or a finish_reason), the times of
    the token-carrying events, their token counts) of the choice events ``times`` (ns), with
    their ``flags`` (``TEXT`` | ``FINISH``) and the running ``completion_tokens`` each carried
    (-1: none), given the final usage's ``completion_tokens`` (None: no usage)."""
    first = last = None
    tok_t: list[int] = []
    tok_k: list[int] = []
    if times and all(u >= 0 for u, f in zip(totals, flags) if f):
        # Continuous usage (every choice event with text or a finish_reason carries usage; a
        # role-only chunk may lack it): tokens per event = rise of the running completion_tokens.
        prev = 0
        for t, f, u in zip(times, flags, totals):
            if u > prev:
                tok_t.append(t)
                tok_k.append(u - prev)
                prev = u
                if first is None:
                    first = t
                last = t
            elif f & FINISH:
                last = t
        return first, last, tok_t, tok_k
    last_i = tok_i = -1
    for i, f in enumerate(flags):
        if f & TEXT:
            t = times[i]
            tok_t.append(t)
            tok_k.append(1)
            if first is None:
                first = t
            last_i = tok_i = i
        elif f & FINISH:
            last_i = i
    if last_i >= 0:
        last = times[last_i]
    # the tokens text-only counting missed, on the last choice event after the last counted one
    if completion_tokens is not None and last is not None and tok_i >= 0 and last_i > tok_i:
        missing = completion_tokens - len(tok_t)
        if missing > 0:
            tok_t.append(last)
            tok_k.append(missing)
    return first, last, tok_t, tok_k
