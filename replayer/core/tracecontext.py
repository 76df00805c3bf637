"""W3C trace context of a run's requests (``--otlp-endpoint``): the ids and the ``traceparent``
header, derived, not drawn, so that no state is kept per request.

One run is one trace: its trace id is a hash of the run id (every shard of a run, and a resumed
run, shares it). Each shard's run span and each request's CLIENT span have span ids hashed from
the run id and (shard) or (loop, row): the header written into a request's head in the lead
window and the span built from its result after it ended name the same span without a lookup
table. Head sampling by request: a request is sampled when a SplitMix64 hash of (seed, loop, row)
falls below ``ratio * 2**64``; the same seed samples the same requests, and the decision travels
in the ``traceparent`` flags so that the server samples the same ones.
"""

from __future__ import annotations

import hashlib

from replayer.core.hashing import GAMMA, mix64

__all__ = ["TraceContext", "parse_traceparent"]

_HEX = frozenset("0123456789abcdef")
_SAMPLE_SALT = 0x5EED_0F_7_7ACE  # keeps the sampling hash apart from the span ids' hashes


class TraceContext:
    """The run's trace ids. ``run_id``: the run's id (the trace id is derived from it);
    ``ratio``: the fraction of requests sampled (0..1); ``seed``: the sampling seed;
    ``tracestate``: a ``tracestate`` header value sent with every request (None: none)."""

    __slots__ = ("_key", "_limit", "_sample_key", "_state_line", "ratio", "run_id", "trace_id", "trace_id_hex")

    def __init__(self, run_id: str, *, ratio: float = 1.0, seed: int = 0, tracestate: str | None = None) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sample ratio {ratio} is not within [0, 1]")
        digest = hashlib.blake2b(run_id.encode("utf-8"), digest_size=24, person=b"replayer-trace").digest()
        self.run_id = run_id
        self.trace_id = int.from_bytes(digest[:16], "big") or 1  # (all zeros is invalid)
        self.trace_id_hex = f"{self.trace_id:032x}"
        self._key = int.from_bytes(digest[16:], "big")
        self.ratio = ratio
        self._limit = round(ratio * 2**64)  # sampled iff hash < limit (ratio 1: every hash)
        self._sample_key = mix64(seed ^ _SAMPLE_SALT)
        self._state_line = b"" if not tracestate else b"tracestate: " + tracestate.encode("ascii") + b"\r\n"

    def span_id(self, loop: int, row: int) -> int:
        """The CLIENT span id of trace row ``row`` in pass ``loop`` (never 0)."""
        return mix64(self._key + GAMMA * (((loop & 0xFFFFFF) << 40) | (row & 0xFFFFFFFFFF)) + GAMMA) or 1

    def run_span_id(self, shard: int) -> int:
        """The span id of shard ``shard``'s run span (never 0)."""
        return mix64(self._key ^ mix64(_SAMPLE_SALT + shard + 1)) or 1

    def sampled(self, loop: int, row: int) -> bool:
        """Whether the request of (``loop``, ``row``) is sampled (head sampling, seeded)."""
        return mix64(self._sample_key + GAMMA * ((loop << 40) | row)) < self._limit

    def header(self, loop: int, row: int) -> bytes:
        """The request's trace-context header lines (``traceparent``, then ``tracestate`` when
        set), ready for the HTTP head: ``traceparent: 00-TRACE-SPAN-FLAGS\\r\\n``."""
        flags = b"01" if self.sampled(loop, row) else b"00"
        span = b"%016x" % self.span_id(loop, row)
        return (
            b"traceparent: 00-" + self.trace_id_hex.encode() + b"-" + span + b"-" + flags + b"\r\n" + self._state_line
        )


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """A W3C ``traceparent`` value -> (trace id, parent span id, sampled), or None when absent
    or malformed (version 00 layout; a later version's first four fields are read the same way)."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    if parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    if not all(c in _HEX for part in parts[:4] for c in part):
        return None
    trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, bool(flags & 1)
