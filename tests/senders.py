"""A ``replayer.send.sender.Sender`` over plain functions, for dispatcher tests (tests only)."""

from __future__ import annotations

import asyncio

from replayer.core import RequestResult
from replayer.send.sender import SendCancelled, lag_origin, result_for


class CallSender:
    """Sends with ``send(req, res)`` (a coroutine function filling ``res``). With ``hand_over``
    (``hand_over(req, res, at_ns) -> handle or None``, ``at_ns`` the lag origin after the anchor)
    it takes requests ``ahead_ns`` before their due time, and ``send(req, res, handle)`` then
    only waits. ``expect(n)``: told the demand (default: ignored)."""

    def __init__(self, send, *, shard: int = 0, ahead_ns: int = 0, hand_over=None, expect=None) -> None:
        self._send_fn = send
        self.shard = shard
        self.ahead_ns = ahead_ns if hand_over is not None else 0
        self._hand_over = hand_over
        self._expect = expect

    def send(self, req, due_ns):
        return self._run(req, result_for(req, due_ns, self.shard), None)

    def hand_over(self, req, due_ns):
        res = result_for(req, due_ns, self.shard)
        handle = self._hand_over(req, res, lag_origin(req, due_ns))
        return None if handle is None else self._run(req, res, handle)

    def expect(self, n: int) -> None:
        if self._expect is not None:
            self._expect(n)

    async def _run(self, req, res: RequestResult, handle) -> RequestResult:
        try:
            if handle is None:
                await self._send_fn(req, res)
            else:
                await self._send_fn(req, res, handle)
        except asyncio.CancelledError:
            if res.outcome == "not_started":
                res.outcome, res.error_kind = "cancelled", "cancelled"
            raise SendCancelled(res) from None
        return res
