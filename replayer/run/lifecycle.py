"""The run's lifecycle, from its assembled parts to the drain: one exit stack, the start-up steps
(``replayer.run.startup``), the recorder and the event stream's subscribers attached at the
anchor, the dispatcher, the stop signals and the tasks beside the send path; then every part
closed, in reverse, whatever stopped the run (its end, a signal, a failed start-up step).

Each part registers its own close on the stack as it is built. The results flush is registered
before every part but the signal handlers, so it runs after the rest is closed (the pools'
sockets among them: a process at its open-file limit writes its results once they are gone),
shielded and time-boxed. Signals: the first SIGTERM/SIGINT/SIGHUP stops issuing and drains
(``drain_timeout_s``); a second one cancels the requests in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

from replayer.core.clock import Anchor, now_ns
from replayer.http.client import Client
from replayer.observe.otel import RequestSpans
from replayer.observe.target_metrics import TargetScraper, TargetScrapers
from replayer.observe.target_samples import SampleFiles
from replayer.record.recorder import Recorder
from replayer.results.summarytext import synthetic_text
from replayer.run.assemble import Parts
from replayer.run.fanout import result_fanout
from replayer.run.gcpacer import GcPacer
from replayer.run.inputs import COUNT_LIMIT, count_scheduled
from replayer.run.live import RunControl, RunState, hms
from replayer.run.resume import Checkpoint
from replayer.run.startup import StartUp
from replayer.run.tasks import Beside, start_tasks
from replayer.send.dispatcher import Dispatcher
from replayer.send.feed import Feed
from replayer.send.routing import senders_for

log = logging.getLogger("replayer")

__all__ = ["STOP_SIGNALS", "Ended", "run_parts"]

#: signals that stop a run (drain, flush, exit 128 + the signal's number); SIGHUP: the terminal
#: closed (its default action would end the process without writing what it measured)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Ended:
    """What the finish (``replayer.run.finish``) needs of a run that ended."""

    recorder: Recorder
    dispatcher: Dispatcher
    control: RunControl
    beside: Beside  # the background tasks, the heartbeat, the target's samples
    stop_signal: str | None  # the first stop signal received
    clients: dict[str, Client]
    scraper: TargetScraper | TargetScrapers | None
    samples: SampleFiles | None
    spans: RequestSpans | None


class StopSignals:
    """The stop signals' handler: the first stops issuing and drains, a second cancels."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.received: list[str] = []
        self.dispatcher = dispatcher

    def __call__(self, signame: str) -> None:
        self.received.append(signame)
        if len(self.received) == 1:
            log.warning("%s: stopping; draining in-flight requests (again to cancel them)", signame)
            self.dispatcher.stop()  # /status says draining (from the dispatcher), as after /stop
        else:
            log.warning("%s again: cancelling in-flight requests", signame)
            self.dispatcher.cancel_in_flight()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self, sig.name)


async def run_parts(parts: Parts) -> Ended:
    """Start, run and close the run of ``parts`` (module docstring); returns what the finish needs."""
    inputs, state = parts.inputs, parts.inputs.state
    loop = asyncio.get_running_loop()
    await _count_scheduled(parts)
    async with contextlib.AsyncExitStack() as stack:
        # the stop signals' handlers (installed once the dispatcher exists) outlive the results flush
        stack.callback(_remove_signal_handlers, loop)
        # GC at moments of the dispatcher's choosing (replayer.run.gcpacer): never when a burst is due.
        gc_pacer = GcPacer()
        gc_pacer.start()
        stack.callback(gc_pacer.stop)
        flush = _ResultsFlush(state)
        stack.push_async_callback(flush.run)
        up = StartUp(parts, stack)
        anchor = await up.run()
        _say_late_start(parts, anchor)
        recorder, checkpoint = _recorder(parts, up, anchor)
        flush.recorder = recorder
        stack.callback(parts.live.bursts.close)  # the last window of each error burst
        _subscribe(parts, recorder, up.spans, anchor)
        dispatcher = _dispatcher(parts, up, anchor, gc_pacer)
        signals = StopSignals(dispatcher)
        signals.install(loop)
        control = RunControl(dispatcher, on_change=lambda: _timing_changed(parts))
        inputs.view.attach(dispatcher, control)
        checkpoint.position = dispatcher.position
        inputs.metrics.track_due(count_due=dispatcher.due_count)
        inputs.metrics.track_speedup(lambda: parts.timeline.speedup)
        beside = start_tasks(parts, up, dispatcher, recorder, gc_pacer, stack, signals)
        _say_start(parts)
        events = inputs.metrics.events  # the run's events (issue 46): start, stop, the target's restarts
        events.anchor_wall_s = anchor.wall_s
        for one in up.scraper.scrapers.values() if isinstance(up.scraper, TargetScrapers) else [up.scraper]:
            if one is not None:
                one.on_restart = events.on_target_restart
        try:
            state.state = "running"
            events.record("start")
            await dispatcher.run()
        finally:
            events.record("stop", stopped_early=dispatcher.stopping)
            await stack.aclose()  # (each part's close, in reverse: tasks, bursts, results flush, pools, ...)
    state.state = "done"
    stop = signals.received[0] if signals.received else None
    return Ended(recorder, dispatcher, control, beside, stop, up.clients, up.scraper, beside.samples, up.spans)


async def _count_scheduled(parts: Parts) -> None:
    """What will be sent (shard, --duration, resume skips...), for /status and the progress line,
    counted off the loop when it can be (a schedule of known, bounded size)."""
    cfg, n_rows = parts.cfg, parts.inputs.n_rows
    if parts.duration_ns or (cfg.loops is not None and n_rows is not None and n_rows * cfg.loops <= COUNT_LIMIT):
        n = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: count_scheduled(
                parts.schedule(),
                speedup=cfg.speedup,
                duration_ns=parts.duration_ns,
                rebase=parts.rebase,
            ),
        )
        parts.inputs.state.scheduled = n or 0


def _recorder(parts: Parts, up: StartUp, anchor: Anchor) -> tuple[Recorder, Checkpoint]:
    """The results writer, its files' metadata holding the anchor, and its checkpoint (resume:
    the target's totals when one target is scraped; the dispatcher's position once it exists)."""
    cfg, inputs = parts.cfg, parts.inputs
    scraper = up.scraper if isinstance(up.scraper, TargetScraper) else None
    checkpoint = Checkpoint(cfg, inputs.run_id, inputs.start_loop, scraper)
    recorder = Recorder(
        inputs.results_dir,
        metadata={**parts.metadata, "replayer.t0_wall_s": repr(anchor.wall_s)},
        checkpoint=checkpoint,
        **parts.recorder_options,
    )
    inputs.state.recorder = recorder
    inputs.metrics.results_disk.source = lambda: (recorder.results_bytes, recorder.oldest_timestamp_s)
    return recorder, checkpoint


def _subscribe(parts: Parts, recorder: Recorder, spans: RequestSpans | None, anchor: Anchor) -> None:
    """The event stream's subscribers, in their order (``replayer.run.fanout``), attached before
    the first request is prepared; the span exporter's run span starts at the anchor."""
    slos = parts.cfg.goodput_slos
    parts.inputs.metrics.set_slos(slos)
    if spans is not None:
        spans.start(round(anchor.wall_s * 1e9))
    parts.inputs.view.extra = parts.verdicts.status  # (/status says the live verdicts: issue 45)
    parts.events.subscribe(
        result_fanout(
            slos=slos,
            metrics=parts.inputs.metrics,
            live=parts.live,
            recorder=recorder,
            warmup=parts.warmup,
            warmup_end=parts.warmup_end,
            tenants=parts.tenants,
            targets=parts.targets,
            spans=spans,
            live_window=parts.inputs.metrics.live_window,
            verdicts=parts.verdicts,
            checks=parts.checks,
        )
    )


def _dispatcher(parts: Parts, up: StartUp, anchor: Anchor, gc_pacer: GcPacer) -> Dispatcher:
    """The dispatcher over the schedule (its first batch read), the factory, the planner and the
    sender of the clients; a fleet shard (re)joining after the start sends nothing due while it
    was down."""
    cfg = parts.cfg
    sender = senders_for(up.clients, writes_ahead=up.launcher is not None, shard=cfg.shard_index[0])
    if sender.ahead_ns != parts.planner.ahead_ns:  # the launcher did not start: the loop writes every request
        parts.planner.ahead_ns = sender.ahead_ns
    late_ns = now_ns() - anchor.t0_ns - int(cfg.rejoin_max_late_s * 1e9)
    missed_before_ns = late_ns if cfg.coordinator is not None and late_ns > 0 else None
    if missed_before_ns is not None:
        log.warning(
            "joining the fleet %.1f s after its start: rows due more than %g s ago are recorded "
            "missed_while_down (not sent); the rest go at their due times",
            (now_ns() - anchor.t0_ns) / 1e9,
            cfg.rejoin_max_late_s,
        )
    return Dispatcher(
        Feed(up.batches, parts.factory),
        parts.planner,
        sender,
        parts.events,
        t0_ns=anchor.t0_ns,
        on_idle=gc_pacer.idle,
        missed_before_ns=missed_before_ns,
        **parts.dispatcher_options,
    )


def _timing_changed(parts: Parts) -> None:
    """Under --duration, a pause or a speed-up changes what will be sent: unknown until the end."""
    if parts.duration_ns is not None:
        parts.inputs.state.scheduled = 0


def _say_late_start(parts: Parts, anchor: Anchor) -> None:
    cfg = parts.cfg
    if anchor.late_s and cfg.start_at is not None and cfg.resume:
        log.info("resuming now: the run's --start-at %s passed %.0f s ago", hms(cfg.start_at), anchor.late_s)
    elif anchor.late_s and cfg.start_at is not None:
        log.warning(
            "--start-at %s passed %.1f s ago: starting now, %.1f s out of step with runs that kept it "
            "(the requests overdue are not sent in one burst)",
            hms(cfg.start_at),
            anchor.late_s,
            anchor.late_s,
        )


def _say_start(parts: Parts) -> None:
    cfg, inputs = parts.cfg, parts.inputs
    shards = cfg.shard_index[1]
    load = cfg.synthetic_load()
    log.info(
        "replaying %s (%s rows%s, passes %s, shard %s) against %s (model %s) at speedup %g; results in %s",
        cfg.trace_label if load is None else f"a synthetic load ({synthetic_text(load)})",
        inputs.n_rows,
        ""
        if not cfg.max_requests
        else f", the first {cfg.max_requests} sent" + (f" over all {shards} shards" if shards > 1 else ""),
        cfg.loop,
        cfg.shard,
        ", ".join(inputs.targets),
        inputs.model,
        cfg.speedup,
        inputs.results_dir,
    )


def _remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for sig in STOP_SIGNALS:
        loop.remove_signal_handler(sig)


class _ResultsFlush:
    """The results flush, its place on the stack taken before the recorder is built."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.recorder: Recorder | None = None

    async def run(self) -> None:
        """Shielded and time-boxed: measured results reach the disk even if the run is cancelled."""
        if self.recorder is None:
            return
        self.state.state = "flushing"
        closing = asyncio.get_running_loop().run_in_executor(None, self.recorder.close)
        try:
            await asyncio.wait_for(asyncio.shield(closing), 60)
        except TimeoutError:
            log.error("results flush did not finish in 60 s")
