"""A request's life told to the rest of the run: the one event stream (``RequestEvents``).

Four events, each once per request, in this order:

* ``prepared(req)``: the request factory (``replayer.payload.prepare``) handed the request to the
  dispatcher (built in the lead window; its target chosen when there are several);
* ``sent(req)``: the dispatcher started its send (a task of its task group);
* ``dispatched(res)``: the client saw the kernel take its last byte (``dispatch_lag_ms`` set;
  a connect that failed at the due time counts as its dispatch), at most once;
* ``finished(res)``: its result is final (measured, failed, cancelled, or never sent: a
  request never prepared is ``finished`` without the others).

The factory, the dispatcher and the client each receive the stream when they are built; the run
implements it once (``replayer.run.fanout.EventStream``, its subscribers in a stated order). A stage
never calls back into the run by any other way. ``QUIET`` is the stream nobody listens to: a
stage used alone (a test, a benchmark) gets it by default.
"""

from __future__ import annotations

from typing import Protocol

from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult

__all__ = ["QUIET", "Quiet", "RequestEvents"]


class RequestEvents(Protocol):
    """What the stages tell of each request (module docstring). Each call is on the event loop's
    thread and must be quick: ``sent`` and ``dispatched`` are on the send path."""

    def prepared(self, req: PreparedRequest) -> None: ...
    def sent(self, req: PreparedRequest) -> None: ...
    def dispatched(self, res: RequestResult) -> None: ...
    def finished(self, res: RequestResult) -> None: ...


class Quiet:
    """The stream nobody listens to: every event is dropped."""

    def prepared(self, req: PreparedRequest) -> None:
        pass

    def sent(self, req: PreparedRequest) -> None:
        pass

    def dispatched(self, res: RequestResult) -> None:
        pass

    def finished(self, res: RequestResult) -> None:
        pass


#: the default stream of a stage built without one
QUIET: RequestEvents = Quiet()
