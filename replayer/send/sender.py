"""How a request leaves: the ``Sender`` interface between the dispatcher and the client.

``send(req, due_ns)`` is a coroutine that returns the request's ``RequestResult`` (request
failures are values in it; ``SendCancelled``, a ``CancelledError`` carrying the result so far,
when the send is cancelled). ``hand_over(req, due_ns)`` gives a request ahead of its due time
to a sender that writes it at the due time by itself (the launcher process): it returns the
coroutine to await, None when it cannot take the request now (then it is offered again, and
at its due time goes through ``send``), or ``LOOP_WRITES`` when it will not take it at all (no
connection to the target can be written by the launcher: TLS 1.2; the request goes through
``send`` at its due time and is not offered again). ``ahead_ns`` says how far ahead a sender takes requests
(0: only at their due time). ``expect(n)``: n requests are due soon (connections ahead).

Two senders share one client (``replayer.http.client``), which stamps the send time the same way for
both (``Client`` stamps ``sent_ns`` when the request's first byte goes, computes
``dispatch_lag_ms`` from the lag origin to when the kernel took the last byte (the same moment
unless the socket could not take the request whole) and tells the dispatch to the run's event
stream then, ``dispatched``: the live dispatch-lag accounting needs no queue):

* ``LoopSender``: the event loop writes each request when the dispatcher starts it;
* ``LauncherSender``: requests outside sessions are bound to an idle connection ``ahead_ns``
  before their due time and written by the launcher process (``replayer.http.launcher``) at it; the
  others, and a request no connection was free for, go as with ``LoopSender``.

``send_queued(req, due_ns, wait_ns)`` is ``send`` for a request that waited ``wait_ns`` for a
slot under ``--max-concurrency`` (the dispatcher's queue): the wait is recorded as
``queue_wait_ms`` and its dispatch lag counts from the slot's release (less any lateness of the
dispatcher before it joined the queue), so the lag stays the replayer's own lateness while the
latencies from the due time include the wait. Only a capped dispatcher calls it: an uncapped
send path is unchanged.

The due time is the dispatcher's argument, fixed when the request fires (the timeline may have
changed since it was prepared). A session turn the gate held back is due at its release
(``PreparedRequest.release_ns``): its dispatch lag counts from there, and the hold is recorded
apart as ``session_wait_ms`` (``result_for``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine
from typing import Any, Protocol

from replayer.core.errors import ErrorKind, Outcome
from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.http.client import Client, Reserved

#: a request outside sessions is handed to the launcher process this long before its due time
LAUNCH_AHEAD_NS = 50_000_000

Sending = Coroutine[Any, Any, RequestResult]


class Refusal(enum.Enum):
    """``hand_over``'s answer for a request the loop writes at its due time, not offered again."""

    LOOP_WRITES = "loop_writes"


LOOP_WRITES = Refusal.LOOP_WRITES


class SendCancelled(asyncio.CancelledError):
    """The send was cancelled (shutdown); ``result`` holds what was measured (outcome
    ``cancelled``). A ``CancelledError``: cancellation is never swallowed."""

    def __init__(self, result: RequestResult) -> None:
        super().__init__("send cancelled")
        self.result = result


class Sender(Protocol):
    ahead_ns: int

    def send(self, req: PreparedRequest, due_ns: int) -> Sending: ...
    def send_queued(self, req: PreparedRequest, due_ns: int, wait_ns: int) -> Sending: ...
    def hand_over(self, req: PreparedRequest, due_ns: int) -> Sending | Refusal | None: ...
    def expect(self, n: int) -> None: ...


def lag_origin(req: PreparedRequest, due_ns: int) -> int:
    """The time ``req``'s dispatch lag counts from: its due time, or the release of a session
    turn the gate held past it."""
    release = req.release_ns
    return release if release is not None and release > due_ns else due_ns


def result_for(req: PreparedRequest, due_ns: int, shard: int) -> RequestResult:
    """The result record ``req`` starts with when it fires at ``due_ns`` (outcome
    ``not_started``); a session turn's ``session_wait_ms`` is its hold past the due time (0 when
    not held)."""
    res = req.new_result(shard, due_ns=due_ns)
    if req.dep is not None:
        res.session_wait_ms = (lag_origin(req, due_ns) - due_ns) / 1e6
    return res


class LoopSender:
    """Every request written by the event loop when it fires (``client.send``)."""

    ahead_ns = 0

    def __init__(self, client: Client, *, shard: int = 0) -> None:
        self.client = client
        self.shard = shard

    def send(self, req: PreparedRequest, due_ns: int) -> Sending:
        return self._send(req, result_for(req, due_ns, self.shard), lag_origin(req, due_ns), None)

    def send_queued(self, req: PreparedRequest, due_ns: int, wait_ns: int) -> Sending:
        """``send`` after ``wait_ns`` in the ``--max-concurrency`` queue (module docstring)."""
        res = result_for(req, due_ns, self.shard)
        res.queue_wait_ms = wait_ns / 1e6
        return self._send(req, res, lag_origin(req, due_ns) + wait_ns, None)

    def hand_over(self, req: PreparedRequest, due_ns: int) -> Sending | Refusal | None:
        return LOOP_WRITES

    def expect(self, n: int) -> None:
        self.client.expect(n)

    async def _send(
        self, req: PreparedRequest, res: RequestResult, origin: int, reserved: Reserved | None
    ) -> RequestResult:
        try:
            await self.client.send(req, res, reserved, lag_from_ns=origin)
        except asyncio.CancelledError:
            if res.outcome == Outcome.NOT_STARTED.value:  # cancelled before the client began
                res.outcome, res.error_kind = Outcome.CANCELLED.value, ErrorKind.CANCELLED.value
            raise SendCancelled(res) from None
        return res


class LauncherSender(LoopSender):
    """Requests handed over ``ahead_ns`` before their due time are written by the launcher
    process the client uses (``Client.use_launcher``); ``send`` writes from the loop."""

    def __init__(self, client: Client, *, shard: int = 0, ahead_ns: int = LAUNCH_AHEAD_NS) -> None:
        super().__init__(client, shard=shard)
        self.ahead_ns = ahead_ns

    def hand_over(self, req: PreparedRequest, due_ns: int) -> Sending | Refusal | None:
        """Bind ``req`` to an idle connection and queue its write for its due time; None when no
        connection the launcher may write on is ready; ``LOOP_WRITES`` when the launcher cannot
        write this target's requests at all (``Client.launcher_writes``: TLS 1.2)."""
        if not self.client.launcher_writes:
            return LOOP_WRITES
        res = result_for(req, due_ns, self.shard)
        reserved = self.client.reserve(req, res)
        if reserved is None:
            return None
        origin = lag_origin(req, due_ns)
        self.client.launch(self.client.t0_ns + origin, req, res, reserved)
        return self._send(req, res, origin, reserved)
