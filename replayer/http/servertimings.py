"""The server's own per-request timings (``--server-timings``): read from the response, recorded
beside the client's measurements, so a slow client is told from a slow server.

Wire shape (vLLM PR #46768, ``docs/features/per_request_metrics.md``; served when vLLM runs with
``--enable-per-request-metrics``; the PR's description also names a request field
``include_metrics``, which the replayer sends, while the merged server code gates on the flag
alone): a top-level ``metrics`` object, in a streamed response on the final usage chunk (the one
``stream_options.include_usage`` asks for, sent after every content chunk), in a whole JSON body
beside ``usage``::

    "metrics": {"time_to_first_token_ms": 85.2, "generation_time_ms": 1240.5,
                "queue_time_ms": 12.3, "mean_itl_ms": 9.1, "tokens_per_second": 103.2}

vLLM's definitions (``build_per_request_timing_metrics``): ``queue_time_ms`` = scheduled -
queued; ``time_to_first_token_ms`` = first token - scheduled (it does NOT hold the queue time);
``generation_time_ms`` = last token - first token. Any field may be null (unknown); the object
is null for ``n > 1``. Unknown keys are ignored, and a value that is not a number is unknown.

``client_overhead_ms`` = the client's TTFT - (queue time + the server's TTFT): what the engine's
timings do not cover: the network both ways, the server's HTTP and tokenizer front end before
the request is queued, the first chunk's serialisation, and this client's own delay in reading
it. Unknown unless all three are known.
"""

from __future__ import annotations

from typing import Any

from replayer.core.result import RequestResult
from replayer.http.chunks import StreamAccumulator

#: request body field asking for the timings (PR #46768's request-side gate; harmless elsewhere in vLLM)
REQUEST_FIELD = "include_metrics"


class TimedStreamAccumulator(StreamAccumulator):
    """A ``StreamAccumulator`` that also keeps the last ``metrics`` object of the response
    (``server_metrics``, a dict or None). A subclass, so that without ``--server-timings`` the
    decoder does no per-event work for it."""

    __slots__ = ("server_metrics",)

    def __init__(self, keep_text: bool = False) -> None:
        super().__init__(keep_text)
        self.server_metrics: dict[str, Any] | None = None

    def _take(self, obj: dict[str, Any], t: int) -> None:
        super()._take(obj, t)
        m = obj.get("metrics")
        if type(m) is dict:
            self.server_metrics = m


def _ms(m: dict[str, Any], key: str) -> float | None:
    v = m.get(key)
    if (type(v) is int or type(v) is float) and v == v and v >= 0:  # a number, not NaN, not negative
        return float(v)
    return None


def record(res: RequestResult, acc: StreamAccumulator) -> None:
    """Copy the server's timings from ``acc`` (a ``TimedStreamAccumulator``) into ``res``, and its
    ``client_overhead_ms`` when the client's TTFT and both server parts are known. Fields the
    server did not report stay None."""
    m = getattr(acc, "server_metrics", None)
    if not m:
        return
    res.server_queue_time_ms = queue = _ms(m, "queue_time_ms")
    res.server_time_to_first_token_ms = ttft = _ms(m, "time_to_first_token_ms")
    res.server_generation_time_ms = _ms(m, "generation_time_ms")
    if res.ttft_ms is not None and queue is not None and ttft is not None:
        res.client_overhead_ms = res.ttft_ms - (queue + ttft)
