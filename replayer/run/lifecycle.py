"""The run's lifecycle: its start-up order, as data, and its teardown, as each part registers it.

Start-up (``START_UP``) is the work done between opening the trace and the schedule's anchor, in
an order that keeps it from being charged to the first requests as dispatch lag. The daemon gives
one step per name (``start_up``); tests/test_lifecycle.py checks the order and its reasons with
no network.

Teardown is an ``contextlib.AsyncExitStack``: each part registers its own close as it is built,
and they run in reverse, whatever stopped the run (its end, a signal, a failed start-up step).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

#: the start-up steps in the order they run, each with why it comes where it does
START_UP: tuple[tuple[str, str], ...] = (
    ("first batch", "the first trace batch is read before the anchor: the first requests are not late by its read"),
    ("warm-up", "the first requests' images and prompt texts are made (their child processes started)"),
    ("prebuild", "the first lead window's requests are built before they are due, not behind their due times"),
    (
        "tracing",
        "with --otlp-endpoint, the OpenTelemetry SDK is imported and its exporter thread started (a tenth of a "
        "second or more): not after the anchor, where the first requests would be late by it",
    ),
    (
        "target baseline",
        "the target's /metrics scraped once before the anchor: every run has its baseline (and its final "
        "scrape) however starved the loop is later, and it counts none of the run's requests",
    ),
    ("pool", "keep-alive connections open after the slow work: a server may close connections left idle"),
    ("anchor", "the schedule's time zero comes last: everything before it is start-up, not lateness"),
)
STEP_NAMES: tuple[str, ...] = tuple(name for name, _ in START_UP)

Step = Callable[[], Awaitable[None]]


async def start_up(steps: Mapping[str, Step], *, on_step: Callable[[str], None] | None = None) -> None:
    """Run ``steps`` (one per name of ``START_UP``, no other) in ``START_UP``'s order; a step that
    raises ends the start-up there (the parts already built are closed by their owner's stack).
    ``on_step(name)`` is called before each step. Raises ValueError for a missing or unknown step."""
    if set(steps) != set(STEP_NAMES):
        missing, extra = set(STEP_NAMES) - set(steps), set(steps) - set(STEP_NAMES)
        raise ValueError(f"start-up steps: missing {sorted(missing)}, unknown {sorted(extra)}")
    for name in STEP_NAMES:
        if on_step is not None:
            on_step(name)
        await steps[name]()
