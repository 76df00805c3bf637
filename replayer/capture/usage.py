"""What a capture needs of a response: the server's usage, or else an estimate.

Cheap on purpose: a W1 stream is ~100 one-token events per request, relayed as they come, and
this runs for each of them inside the upstream connection's read.
"""

from __future__ import annotations

import orjson

from replayer.http.sse import SSEDecoder


class UsageTracker:
    """What a capture needs of a response: the server's usage (prompt and completion tokens), or
    else a count of the events that carried text (an estimate), and whether an error came.

    Cheap on purpose (a W1 stream is ~100 one-token events per request): a stream's pieces are
    only counted with ``bytes.count`` and the last ``TAIL_BYTES`` kept; at the end that tail is
    decoded and its last event carrying a usage object parsed (with continuous usage stats it is
    the running count, so a stream cut short still gives the tokens it reached). A non-streamed
    body is parsed whole."""

    TAIL_BYTES = 16384
    __slots__ = ("prompt_tokens", "completion_tokens", "chunks", "error", "_tail", "_tail_len", "_done")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.chunks = 0
        self.error = False
        self._tail: list[bytes] = []
        self._tail_len = 0
        self._done = False

    def on_sse_piece(self, b: bytes) -> None:
        self.chunks += b.count(b'"text":"') - b.count(b'"text":""') + b.count(b'"content":"') - b.count(b'"content":""')
        if b'"error"' in b:
            self.error = True
        self._tail.append(b)
        self._tail_len += len(b)
        while self._tail_len - len(self._tail[0]) >= self.TAIL_BYTES:
            self._tail_len -= len(self._tail.pop(0))

    def on_body(self, body: bytes) -> None:
        self._take(body)

    def finish(self) -> None:
        if self._done or not self._tail:
            return
        self._done = True
        last = None
        for ev in SSEDecoder().feed(b"".join(self._tail)):  # (the first line may be cut: it parses as nothing)
            d = ev.data
            if '"usage"' in d and '"usage":null' not in d and '"usage": null' not in d:
                last = d
        self._tail = []
        if last is not None:
            self._take(last)

    def _take(self, data: str | bytes) -> None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if type(obj) is not dict:
            return
        if obj.get("error") is not None:
            self.error = True
        u = obj.get("usage")
        if type(u) is dict:
            if type(u.get("prompt_tokens")) is int:
                self.prompt_tokens = u["prompt_tokens"]
            if type(u.get("completion_tokens")) is int:
                self.completion_tokens = u["completion_tokens"]
