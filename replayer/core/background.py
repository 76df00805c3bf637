"""The run's background tasks, owned: none outlives the run and none crashes unseen.

A run starts a handful of tasks beside the dispatcher (the periodic results flush, the event-loop
lag monitor, the status line or console, the self-watch, the target scraper and its sample
flush, the watch on a ``--workers`` parent). Each is meant to run until the run's end cancels it.
One that raises instead is a bug or a broken resource (a full disk, say): left alone, its
exception would sit in a task nobody awaits and the run would go on without it, silently (no
flushes, no scrapes). Here it is logged at once with its traceback, kept in ``failures``, and
``on_failure`` is told (the daemon then stops the run as ``/stop`` does: in-flight requests
drain, results are flushed, ``summary.json``'s ``task_failures`` names the task and the exit
code is ``EXIT_TASK_FAILED``). A task started with ``essential=False`` (the live view: the
console, the progress line) only logs its failure: a soak must not stop because its terminal went
away. ``close`` cancels the others and awaits every one.

Why not an ``asyncio.TaskGroup`` around the run: a child's exception makes a task group cancel
its body at once, which here would cancel the in-flight requests instead of draining them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger("replayer")

__all__ = ["BackgroundTasks", "EXIT_TASK_FAILED"]

#: the exit code of a run (or capture) that a crashed background task stopped
EXIT_TASK_FAILED = 4


class BackgroundTasks:
    """Starts named background tasks and owns them (see the module docstring).

    ``on_failure(name, exc)``: called once per task that raised (not for one cancelled, nor for
    one that returned). ``failures``: ``{"task": name, "error": "Type: message"}`` of each.
    """

    def __init__(self, on_failure: Callable[[str, BaseException], None] | None = None) -> None:
        self._on_failure = on_failure
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._optional: set[asyncio.Task[None]] = set()
        self.failures: list[dict[str, str]] = []

    def start(self, name: str, coro: Coroutine[Any, Any, None], *, essential: bool = True) -> None:
        """Run ``coro`` as the background task ``name`` until it ends or ``close`` (not
        ``essential``: its failure is logged and the run goes on)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = name
        if not essential:
            self._optional.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        name = self._tasks.get(task, task.get_name())
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if task in self._optional:
            log.error(
                "background task %r failed: %s: %s; the run goes on without it",
                name,
                type(exc).__name__,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            return
        log.error(
            "background task %r failed: %s: %s; stopping the run",
            name,
            type(exc).__name__,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        self.failures.append({"task": name, "error": f"{type(exc).__name__}: {exc}"})
        if self._on_failure is not None:
            self._on_failure(name, exc)

    async def close(self) -> None:
        """Cancel the tasks still running and wait for every one (their failures are seen by then)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_of(*aws: Awaitable[object]) -> None:
    """Wait until the first of ``aws`` finishes; cancel the others. An exception of the one that
    finished is raised here (not left in a task nobody reads)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()
    finally:
        for t in tasks:
            t.cancel()
