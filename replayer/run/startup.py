"""The run's start-up: its order, as data (``START_UP``), and its steps, each a method of
``StartUp``: the work between the assembled parts and the schedule's anchor, in an order that
keeps it from being charged to the first requests as dispatch lag. Each step registers the close
of what it opened on the run's exit stack (``replayer.run.lifecycle``), so a step that fails
leaves nothing open. tests/test_lifecycle.py checks the order and its reasons with no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping

import aiohttp

from replayer.core.clock import Anchor, now_ns
from replayer.core.engines import engine_caps
from replayer.fleet.member import FleetError, join
from replayer.http.client import Client
from replayer.http.launcher import Launcher, launcher_ready, start_launcher
from replayer.observe.dialects import dialect
from replayer.observe.otel import RequestSpans
from replayer.observe.target_metrics import TargetScraper, TargetScrapers
from replayer.plan.schedule import ScheduleBatch
from replayer.run.assemble import Parts
from replayer.run.clients import open_clients
from replayer.run.readiness import StartupError

log = logging.getLogger("replayer")

__all__ = ["START_UP", "STEP_NAMES", "StartUp", "start_up"]

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


class StartUp:
    """Runs the start-up steps on ``parts``; what they made ready stays here: the schedule with
    its first batch read (``batches``), the launcher process, one client per target, the span
    exporter, the target's scraper and the anchor. The launcher process starts at once: it boots
    (~50 ms) while the first trace batch is read."""

    def __init__(self, parts: Parts, stack: contextlib.AsyncExitStack) -> None:
        self.parts, self.stack = parts, stack
        self.batches: Iterator[ScheduleBatch] = parts.batches
        self.first: ScheduleBatch | None = None
        # (over TLS the launcher writes records sealed by the loop)
        self.launcher: Launcher | None = start_launcher() if parts.writes_ahead else None
        if self.launcher is not None:
            stack.callback(self.launcher.stop)
        self.clients: dict[str, Client] = {}
        self.spans: RequestSpans | None = None
        self.scraper = _target_scraper(parts)
        self.anchor: Anchor | None = None

    async def run(self) -> Anchor:
        """Every step, in ``START_UP``'s order; returns the anchor (the last step's)."""
        await start_up(
            {
                "first batch": self.first_batch,
                "warm-up": self.warm_up,
                "prebuild": self.prebuild,
                "tracing": self.tracing,
                "target baseline": self.target_baseline,
                "pool": self.pool,
                "anchor": self.take_anchor,
            }
        )
        assert self.anchor is not None
        return self.anchor

    async def first_batch(self) -> None:
        self.first = await asyncio.get_running_loop().run_in_executor(None, next, self.batches, None)
        if self.first is not None:
            self.batches = itertools.chain((self.first,), self.batches)
        if self.launcher is not None:
            self.launcher = await launcher_ready(self.launcher)

    async def warm_up(self) -> None:
        t_warm = now_ns()
        warmed = await asyncio.get_running_loop().run_in_executor(None, self.parts.factory.warm_up, self.first)
        if any(warmed):
            log.info(
                "made the images of %d rows and decoded %d prompt texts ahead of the first requests in %.2f s "
                "(before the schedule's anchor)",
                warmed[0],
                warmed[1],
                (now_ns() - t_warm) / 1e9,
            )

    async def prebuild(self) -> None:
        t_warm = now_ns()
        factory, lead_ns = self.parts.factory, self.parts.lead_ns
        prebuilt = await asyncio.get_running_loop().run_in_executor(None, factory.prebuild, self.first, lead_ns)
        log.debug(
            "built the first %d requests in %.3f s (before the schedule's anchor)", prebuilt, (now_ns() - t_warm) / 1e9
        )

    async def tracing(self) -> None:  # (the SDK's import: off the loop, before the anchor)
        self.spans = await asyncio.get_running_loop().run_in_executor(None, _request_spans, self.parts)

    async def target_baseline(self) -> None:
        if self.scraper is not None:  # (its rows' t_ns re-based at the anchor, below)
            async with aiohttp.ClientSession() as s:
                await self.scraper.scrape_once(s)

    async def pool(self) -> None:
        parts = self.parts
        self.clients = await open_clients(
            parts.inputs.targets,
            parts.client_options,
            warm_connections=parts.cfg.warm_connections,
            launcher=self.launcher,
        )  # one pool per target, opened ahead
        self.stack.push_async_callback(_close_clients, self.clients)

    async def take_anchor(self) -> None:
        # anchored only now: the time the pool took to open (seconds against a server with a small
        # listen backlog) is start-up, not lateness charged to every request
        cfg = self.parts.cfg
        if cfg.coordinator is None:
            anchor = Anchor.at(cfg.start_delay_s, start_wall_s=cfg.start_at)
        else:  # the fleet's start, on this host's clock; its wall time the coordinator's (merges align)
            try:
                joined = await join(
                    cfg.coordinator,
                    cfg.shard_index[0],
                    results=self.parts.inputs.results_dir,
                    timeout_s=cfg.ready_timeout_s,
                )
            except FleetError as e:
                raise StartupError(str(e)) from None
            here = Anchor.at(start_wall_s=joined.local_epoch_s, max_late_s=math.inf)
            anchor = dataclasses.replace(here, wall_s=joined.epoch_s)
            self.parts.inputs.state.fleet = joined.as_dict()
        for c in self.clients.values():
            c.t0_ns = anchor.t0_ns
        if self.scraper is not None:
            self.scraper.set_anchor(anchor.t0_ns)
        self.anchor = anchor


def _request_spans(parts: Parts) -> RequestSpans | None:
    """With tracing on (``--otlp-endpoint`` or the OTEL_EXPORTER_OTLP_* variables): the exporter
    of the run's spans, on the ids the request heads carry; None (nothing imported) otherwise."""
    cfg = parts.cfg
    url, ids = cfg.otlp_traces_url(), parts.factory.trace_context
    if url is None or ids is None:
        return None
    spans = RequestSpans(
        url,
        ids,
        shard=cfg.shard_index[0],
        shard_text=cfg.shard,
        model=parts.inputs.model,
        target=parts.inputs.targets[0],
        dropped=parts.inputs.metrics.otel_spans_dropped,
        exported=parts.inputs.metrics.otel_spans_exported,
    )
    log.info("OpenTelemetry: a span per request (sample ratio %g) to %s, trace id %s", ids.ratio, url, ids.trace_id_hex)
    return spans


def _target_scraper(parts: Parts) -> TargetScraper | TargetScrapers | None:
    """Each target's ``/metrics`` scraper (``--scrape-target-metrics``), anchored later."""
    cfg, targets = parts.cfg, parts.inputs.targets
    if not cfg.scrape_target_metrics:
        return None
    path, names = engine_caps(cfg.engine or "vllm").metrics_path, dialect(cfg.engine)  # (issue 49: its engine's)
    one = {
        url: TargetScraper(url.rstrip("/") + path, interval_s=cfg.scrape_interval_s, tls=cfg.tls, dialect=names)
        for url in targets
    }
    return one[targets[0]] if len(one) == 1 else TargetScrapers(one)


async def _close_clients(clients: dict[str, Client]) -> None:
    for c in clients.values():
        await c.close()
