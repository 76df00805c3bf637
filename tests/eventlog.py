"""Event streams and request sources for tests that drive one stage alone (the dispatcher, the
client): a stream that hands each finished result to a callable, one that logs every event, and
a request source made of two functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from replayer.core import PreparedRequest, Quiet, RequestResult
from replayer.plan.schedule import ScheduleBatch
from replayer.send import Feed


class Finished(Quiet):
    """A stream that hands each finished result to ``on_result`` (the other events dropped)."""

    def __init__(self, on_result: Callable[[RequestResult], object]) -> None:
        self._on_result = on_result

    def finished(self, res: RequestResult) -> None:
        self._on_result(res)


class EventLog:
    """A stream that logs every event as (event, row) in ``log``, and keeps the results."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.results: list[RequestResult] = []

    def prepared(self, req: PreparedRequest) -> None:
        self.log.append(("prepared", req.row))

    def sent(self, req: PreparedRequest) -> None:
        self.log.append(("sent", req.row))

    def dispatched(self, res: RequestResult) -> None:
        self.log.append(("dispatched", res.row))

    def finished(self, res: RequestResult) -> None:
        self.log.append(("finished", res.row))
        self.results.append(res)


class Requests:
    """A request source (``replayer.send.feed.RequestSource``) of two functions of (batch, item)."""

    def __init__(
        self,
        prepare: Callable[[ScheduleBatch, int], PreparedRequest],
        unsent: Callable[[ScheduleBatch, int], RequestResult],
    ) -> None:
        self.prepare, self.unsent = prepare, unsent


def feed_of(batches: Iterator[ScheduleBatch], prepare, unsent) -> Feed:
    """A ``Feed`` of ``batches`` whose requests ``prepare`` and ``unsent`` make."""
    return Feed(batches, Requests(prepare, unsent))
