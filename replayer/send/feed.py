"""The dispatcher's input: what is replayed (``Feed``) and its batches read ahead off the loop.

``Feed`` holds the schedule's batches and the request factory that turns an item into a request
(``prepare``) or, when it is never prepared, into a result (``unsent``): in a run,
``replayer.payload.prepare.RequestFactory``, which tells the run's event stream of each request it
hands out. ``BatchFeeder`` reads the batches in one worker thread, one batch ahead, so Parquet
reads and batch preparation never run on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from replayer.core.request import PreparedRequest
from replayer.core.result import RequestResult
from replayer.plan.schedule import ScheduleBatch

__all__ = ["BatchFeeder", "Feed", "Position", "RequestSource"]


class RequestSource(Protocol):
    """Item ``j`` of schedule batch ``sb`` as a request (``prepare``: pure, may take ~0.5 ms) or,
    never prepared (a stop), as its result (``unsent``)."""

    def prepare(self, sb: ScheduleBatch, j: int) -> PreparedRequest: ...
    def unsent(self, sb: ScheduleBatch, j: int) -> RequestResult: ...


class BatchFeeder:
    """Runs a synchronous schedule iterator in one worker thread, one batch ahead, so Parquet
    reads and batch preparation never run on the event loop."""

    def __init__(self, batches: Iterator[ScheduleBatch]) -> None:
        self._it = batches
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trace-reader")
        self._next: asyncio.Future[ScheduleBatch | None] | None = None

    def _fetch(self) -> asyncio.Future[ScheduleBatch | None]:
        return asyncio.get_running_loop().run_in_executor(self._pool, next, self._it, None)

    async def next(self) -> ScheduleBatch | None:
        fut = self._next or self._fetch()
        batch: ScheduleBatch | None = await fut
        self._next = self._fetch() if batch is not None else None
        return batch

    def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Feed:
    """What is replayed: the schedule's batches and the factory of their requests."""

    batches: Iterator[ScheduleBatch]
    requests: RequestSource


@dataclass
class Position:
    """Where the replay is: the next request to send (for status and resume checkpoints)."""

    index: int = 0  # schedule position
    loop: int = 0
    row: int = 0  # global trace row
    trace_ns: int = 0
