"""The tasks beside the send path, owned by one ``BackgroundTasks`` (a task that crashes stops
the run, logged): the periodic results flush, the event-loop lag monitor, the console or the
progress line, the self-watch, a fleet shard's heartbeat, a ``--workers`` worker's watch on its
parent, and the target's ``/metrics`` scrape and its samples on disk. Stopped on the run's exit
stack before the send path closes, then the target scraped once more (its final values).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

import replayer.observe.selfwatch as selfwatch
import replayer.record.retention as retention
from replayer.core.background import BackgroundTasks
from replayer.fleet.member import Heartbeat
from replayer.observe.console import LiveConsole
from replayer.observe.looplag import EventLoopLagMonitor
from replayer.observe.stall import watch_stalls
from replayer.observe.target_metrics import TargetScraper, TargetScrapers
from replayer.observe.target_samples import SAMPLES_FLUSH_SCRAPES, SampleFiles, flush_samples
from replayer.record.recorder import Recorder
from replayer.run.assemble import Parts
from replayer.run.gcpacer import GcPacer
from replayer.run.live import progress, status, watch_self
from replayer.run.resume import carry_target_totals
from replayer.run.simproc import PARENT_PID_ENV, stop_with_parent
from replayer.run.startup import StartUp
from replayer.send.dispatcher import Dispatcher

__all__ = ["Beside", "start_tasks"]


@dataclass(frozen=True)
class Beside:
    """The tasks started, and what the finish reads of them."""

    background: BackgroundTasks
    heartbeat: Heartbeat | None  # a fleet shard's (its summary sent at the end)
    samples: SampleFiles | None  # the target's metric samples on disk


def start_tasks(
    parts: Parts,
    up: StartUp,
    dispatcher: Dispatcher,
    recorder: Recorder,
    gc_pacer: GcPacer,
    stack: contextlib.AsyncExitStack,
    on_signal: Callable[[str], None],
) -> Beside:
    """Start the tasks (module docstring); their stop is pushed on ``stack``. ``on_signal(name)``:
    what a worker does when its parent is gone (as a stop signal)."""
    cfg, inputs, state = parts.cfg, parts.inputs, parts.inputs.state
    metrics = inputs.metrics
    background = BackgroundTasks(on_failure=lambda name, exc: dispatcher.stop())
    stack.push_async_callback(_stop_tasks, background, up.scraper)
    background.start("results flush", recorder.run_periodic_flush())
    background.start("event-loop lag", EventLoopLagMonitor(metrics).run())
    console = LiveConsole(inputs.view, quiet=cfg.quiet)
    if console.enabled:
        background.start("console", console.run(), essential=False)
    elif not cfg.quiet:
        assert up.anchor is not None
        background.start("progress", progress(state, dispatcher, up.anchor), essential=False)
    clients = up.clients.values()
    background.start(
        "self-watch",
        watch_self(state, metrics, probe=lambda: selfwatch.read(dispatcher, up.launcher, gc_pacer, clients)),
    )
    if cfg.stall_log_interval_s:  # (issue 47) a hanging target is said, --quiet too
        background.start(
            "stall line",
            watch_stalls(
                cfg.stall_log_interval_s,
                lambda: dispatcher.in_flight,
                lambda: state.completed + state.failed,
                dispatcher.oldest_in_flight_s,
                cfg.read_timeout_s,
            ),
            essential=False,
        )
    heartbeat = None
    if cfg.coordinator is not None and state.fleet is not None:  # the fleet sees this shard live

        def counts() -> dict:
            return {
                "scheduled": state.scheduled,
                "sent": state.sent,
                "in_flight": dispatcher.in_flight,
                "completed": state.completed,
                "failed": state.failed,
                "missed_while_down": state.missed_while_down,
                "dispatch_lag_max_s": round(state.max_lag_ms / 1e3, 6),
                "state": status(state, dispatcher)["state"],
            }

        heartbeat = Heartbeat(cfg.coordinator, cfg.shard_index[0], counts)
        stack.push_async_callback(heartbeat.close)
        background.start("fleet heartbeat", heartbeat.run(), essential=False)
    parent = os.environ.get(PARENT_PID_ENV)
    if parent and parent.isdigit():  # a --workers worker: stop with its parent
        background.start("parent watch", stop_with_parent(int(parent), on_signal))
    return Beside(background, heartbeat, _scrape(parts, up.scraper, recorder, background))


def _scrape(
    parts: Parts, scraper: TargetScraper | TargetScrapers | None, recorder: Recorder, background: BackgroundTasks
) -> SampleFiles | None:
    """The target's ``/metrics`` scraped through the run and its samples flushed to disk."""
    if scraper is None:
        return None
    cfg, results_dir = parts.cfg, parts.inputs.results_dir
    samples = SampleFiles(
        results_dir, keep_since=lambda: retention.samples_kept_since(results_dir, recorder.oldest_timestamp_s)
    )
    if cfg.resume and isinstance(scraper, TargetScraper):  # the summary covers the whole folder:
        carry_target_totals(results_dir, scraper)  # start from the earlier runs' totals
    background.start("target scrape", scraper.run())
    every_s = max(cfg.flush_interval_s, SAMPLES_FLUSH_SCRAPES * cfg.scrape_interval_s)
    background.start("target samples flush", flush_samples(scraper, samples, every_s))
    return samples


async def _stop_tasks(background: BackgroundTasks, scraper: TargetScraper | TargetScrapers | None) -> None:
    """The tasks beside the send path stopped, then the target's final values (after the drain)."""
    await background.close()
    if scraper is not None:
        async with aiohttp.ClientSession() as s:
            await scraper.scrape_once(s)
