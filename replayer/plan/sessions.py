"""The session gate: a turn of a multi-turn session is never sent before the previous turn of
its session (or, in parent-chained traces, its parent request) has finished.

Policies (``--session-policy``):

* ``wait`` (default): a turn goes at its trace time, or at the end of its predecessor plus the
  trace's think time (``think_time_s``, scaled by the speed-up like all trace time) when that is
  later.
* ``wait-no-think``: the same, ignoring think time (the turn may go the moment its predecessor
  ends).
* ``off``: trace times only (pure open loop; turns may overlap, as the trace's timestamps say).

Keys: a request waits on ``dep`` and, while it is scheduled or in flight, holds ``key``. In a
session both are the session (turn k+1 waits on turn k); with a ``parent_request_id`` the request
waits on its parent's request id and holds its own, so all children of a parent are released
together when it ends. The time a turn is held back (release - due) is its *session wait*,
recorded apart from dispatch lag: it is the server's slowness, not the replayer's.

A turn whose predecessor failed is not sent (``failed``/``broken``): it would continue a
conversation the server never answered; the dispatcher records it cancelled (kind
``dependency``) and its own dependents after it.

Memory: keys with nothing scheduled keep only their end time, in an LRU of ``max_ended`` keys;
a turn whose predecessor was evicted goes at its trace time.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replayer.core.request import PreparedRequest

POLICIES = ("wait", "wait-no-think", "off")


class _Key:
    __slots__ = ("busy", "end_ns", "waiters")

    def __init__(self) -> None:
        self.busy = 0  # requests holding this key: scheduled to fire, or in flight
        self.end_ns: int | None = None  # when the last of them ended (ns after the anchor)
        self.waiters: deque[PreparedRequest] = deque()  # requests due but waiting for this key to be free


class SessionGate:
    """Decides when a due request with a ``dep``/``key`` may go (see the module docstring).

    ``scale(trace_ns) -> ns``: trace time to replay time (divide by the current speed-up).
    Requests are ``replayer.core.request.PreparedRequest``; times are ns after the run anchor.
    """

    def __init__(
        self, policy: str = "wait", *, scale: Callable[[int], int] = lambda ns: ns, max_ended: int = 1_000_000
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"session policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self._scale = scale
        self._live: dict[object, _Key] = {}
        self._ended: OrderedDict[object, int] = OrderedDict()
        self._max_ended = max_ended
        self.waiting = 0  # requests held in waiter queues now
        self.held = 0  # requests ever held back (waited or delayed)
        self._failed: OrderedDict[object, None] = OrderedDict()  # keys whose request failed (LRU)

    def _think(self, req: PreparedRequest) -> int:
        return self._scale(req.think_ns) if self.policy == "wait" and req.think_ns > 0 else 0

    def admit(self, req: PreparedRequest, due_ns: int) -> int | None:
        """``req`` is due at ``due_ns``: returns when it may go (``>= due_ns``), or None when it
        must wait for its predecessor to end (it is queued here and returned by ``finished``).
        The caller then calls ``started(req)`` when it schedules the request."""
        dep = req.dep
        if dep is None or self.policy == "off":
            return due_ns
        k = self._live.get(dep)
        if k is not None and (k.busy or k.waiters):
            k.waiters.append(req)
            self.waiting += 1
            self.held += 1
            if req.key is not None and req.key != dep:
                self.started(req)  # its own dependents (parent chains) wait for it from now on
            return None
        end = k.end_ns if k is not None else self._ended.get(dep)
        if end is None:
            return due_ns
        release = end + self._think(req)
        if release > due_ns:
            self.held += 1
            return release
        return due_ns

    def started(self, req: PreparedRequest) -> None:
        """``req`` is scheduled to fire (now or at its release time): its key is busy."""
        key = req.key
        if key is None or self.policy == "off":
            return
        k = self._live.get(key)
        if k is None:
            k = self._live[key] = _Key()
            end = self._ended.pop(key, None)
            if end is not None:
                k.end_ns = end
        k.busy += 1

    def finished(self, req: PreparedRequest, end_ns: int) -> list[tuple[object, int]]:
        """``req`` ended at ``end_ns`` (any outcome). Returns the requests it releases as
        ``(request, release_ns)``, already ``started``: the caller fires each at ``release_ns``."""
        key = req.key
        if key is None or self.policy == "off":
            return []
        k = self._live.get(key)
        if k is None:
            return []
        k.busy -= 1
        k.end_ns = end_ns
        out: list[tuple[object, int]] = []
        while k.waiters and k.busy == 0:
            w = k.waiters.popleft()
            self.waiting -= 1
            out.append((w, end_ns + self._think(w)))
            if w.key == key:
                self.started(w)  # the next turn of a session holds the key from now on
        if k.busy == 0 and not k.waiters:
            del self._live[key]
            self._ended[key] = end_ns
            self._ended.move_to_end(key)
            while len(self._ended) > self._max_ended:
                self._ended.popitem(last=False)
        return out

    def failed(self, req: PreparedRequest) -> None:
        """``req`` failed (or was not sent for a failed predecessor): the requests that wait on
        its key are not sent (``broken``), since they continue a conversation that broke."""
        if req.key is None or self.policy == "off":
            return
        self._failed[req.key] = None
        self._failed.move_to_end(req.key)
        while len(self._failed) > self._max_ended:
            self._failed.popitem(last=False)

    def broken(self, req: PreparedRequest) -> bool:
        """Whether ``req`` waits on a key whose request failed (it must not be sent)."""
        return req.dep is not None and req.dep in self._failed

    def take_waiting(self) -> list[PreparedRequest]:
        """Remove and return every request still waiting (at shutdown: they were never sent)."""
        out: list[PreparedRequest] = []
        for k in self._live.values():
            out.extend(k.waiters)
            k.waiters.clear()
        self.waiting = 0
        return out
