"""Self-check: a stream that arrives all at once. A proxy or gateway that buffers a streamed
response hands the client every event together at the end: the replayer then times TTFT as the
whole response's time and ITL as zero gaps, as if the server had streamed nothing. A successful
response of several token events whose first and last arrived within ``AT_ONCE_NS`` is counted
here (when that span is also under 1/50 of its TTFT: its first token waited for the whole
answer), logged once as it is first seen (``SAY_AFTER`` of them), and reported in the summary
(``buffered_streams``)."""

from __future__ import annotations

import logging

from replayer.core.result import RequestResult

log = logging.getLogger("replayer")

__all__ = ["AT_ONCE_NS", "BufferedStreams"]

#: first to last token event within this: arrived at once (a streamed response's events are
#: at least a decode step apart, milliseconds)
AT_ONCE_NS = 1_000_000
#: ... and within this fraction of its TTFT: a buffered response's first token waited for the
#: whole answer (a fast local server streaming a short answer in under 1 ms has a TTFT as short)
TTFT_RATIO = 50
#: token events a response needs to tell "at once" from a short answer
MIN_EVENTS = 3
#: responses seen at once before the live warning (one could be chance)
SAY_AFTER = 3


class BufferedStreams:
    """Counts streamed responses whose token events arrived at once (``on_result``: a fan-out step)."""

    def __init__(self) -> None:
        self.streams = 0  # successful responses with >= MIN_EVENTS token events
        self.at_once = 0
        self._said = False

    def on_result(self, res: RequestResult) -> None:
        first, last = res.first_token_ns, res.last_token_ns
        if res.outcome != "success" or first is None or last is None or res.n_chunks < MIN_EVENTS:
            return
        self.streams += 1
        ttft_ns = (res.ttft_ms or 0.0) * 1e6
        if last - first < AT_ONCE_NS and (last - first) * TTFT_RATIO < ttft_ns:
            self.at_once += 1
            if self.at_once >= SAY_AFTER and not self._said:
                self._said = True
                log.warning(
                    "%d streamed responses arrived all at once (their %d+ token events within %.0f ms): something "
                    "between the replayer and the server buffers the stream (a proxy, a gateway), so TTFT is the "
                    "whole response's time and ITL is meaningless for them",
                    self.at_once,
                    MIN_EVENTS,
                    AT_ONCE_NS / 1e6,
                )

    def report(self) -> dict[str, int] | None:
        """The summary's ``buffered_streams`` ({at_once, streams}); None when none arrived at once."""
        if not self.at_once:
            return None
        return {"at_once": self.at_once, "streams": self.streams}
