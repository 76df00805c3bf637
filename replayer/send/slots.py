"""The concurrency cap (``--max-concurrency``, as ``vllm bench serve``): the requests in flight
are at most the cap; a request that fires while every slot is taken waits in a queue, in the
order requests fired (due order), and takes the next slot freed (when a request in flight ends).

Its wait is recorded as ``queue_wait_ms`` and the latencies from the due time include it (a cap
never hides lateness); its dispatch lag counts from the slot's release, so the lag stays the
replayer's own lateness (``sent - due = queue_wait + dispatch_lag``, plus a session turn's
hold). Without a cap the dispatcher has no ``Slots`` and none of this is on its path. A capped
dispatcher never hands requests over ahead of their due time (a slot is known free only when a
request is due)."""

from __future__ import annotations

import logging
from collections import deque

from replayer.core.request import PreparedRequest

log = logging.getLogger(__name__)


class Slots:
    """The cap ``limit`` and its queue of (request, due time, when it joined the queue), ns
    since the anchor. ``queued_total``: the requests that ever waited."""

    __slots__ = ("limit", "queue", "queued_total")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {limit}")
        self.limit = limit
        self.queue: deque[tuple[PreparedRequest, int, int]] = deque()
        self.queued_total = 0

    def free(self, in_flight: int) -> bool:
        """A request that fires now may go at once: a slot is free and nobody waits for one."""
        return in_flight < self.limit and not self.queue

    def wait(self, req: PreparedRequest, due_ns: int, now_ns: int) -> None:
        """``req`` (due at ``due_ns``) waits for a slot from ``now_ns``."""
        if not self.queued_total:
            log.info(
                "--max-concurrency %d reached: requests now wait for a slot (queue_wait_ms; their "
                "latency from the due time includes the wait)",
                self.limit,
            )
        self.queued_total += 1
        self.queue.append((req, due_ns, now_ns))

    def __len__(self) -> int:
        return len(self.queue)
