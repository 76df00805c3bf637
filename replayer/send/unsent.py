"""What a stop leaves unsent, recorded as ``not_started`` so that ``sent + not_started`` is
everything scheduled so far: the requests due and waiting for a slot, those prepared and held
(ahead of their due time, or a session turn waiting on its predecessor), and the rest of the
current trace batch. A schedule with no end (``--loop forever``) has no rest: only the requests
due by the stop count (the rest of a pass never reached is not counted, and a resume starts there).
Pure: it makes the records, the dispatcher counts and delivers them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.plan.schedule import ScheduleBatch, Timeline


def never_sent(
    waiting: Iterable[tuple[PreparedRequest, int]],
    held: Iterable[PreparedRequest],
    rest: tuple[ScheduleBatch, int] | None,
    *,
    timeline: Timeline,
    until_ns: int | None,
    shard: int,
    unsent: Callable[[ScheduleBatch, int], RequestResult],
) -> Iterator[RequestResult]:
    """The ``not_started`` records of the requests ``waiting`` for a slot (with their due times),
    the ``held`` ones, and the items of the current batch from ``rest`` = (batch, first item)
    on (``unsent`` makes those: they were never prepared). ``until_ns``: only what was due by
    then (a schedule with no end); None: everything."""
    for req, due_ns in waiting:  # due, never given a slot
        yield req.new_result(shard, due_ns=due_ns, sent=False)
    for req in held:
        due = timeline.due(req.trace_ns)
        if until_ns is not None and due > until_ns:
            continue  # never due: not part of what was scheduled
        yield req.new_result(shard, due_ns=due, sent=False)
    if rest is not None:
        batch, first = rest
        for j in range(first, len(batch)):
            if until_ns is not None and timeline.due(int(batch.trace_ns[j])) > until_ns:
                break  # (due times do not decrease within a batch)
            yield unsent(batch, j)
