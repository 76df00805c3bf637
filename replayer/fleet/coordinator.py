"""``replayer coordinate``: one start and one clock for a fleet of shards, and the fleet live.

An aiohttp server (its endpoints are the fleet protocol, ``replayer.fleet.member`` is the other
side): ``GET /clock`` answers its wall clock (the shards' offset probes); ``POST /ready`` registers
a ready shard and answers the start epoch once there is one (a long poll); ``POST /heartbeat`` and
``POST /ended`` carry a shard's counts and, at its end, its summary; ``GET /status`` shows every
shard and the fleet's totals; ``GET /metrics`` the fleet's gauges for Prometheus (each shard's own
``/metrics`` stays the place for latency histograms). The book-keeping is the pure
``replayer.fleet.roster.Roster``.

When the fleet has ended (every shard ended, or the rest lost for ``--give-up-after``), it writes
``OUTPUT/fleet.json`` (the fleet's view and each shard's summary) and, when the shards' results
folders are readable from here (one host, or a shared volume), merges them into
``OUTPUT/merged`` (``replayer.results.merge``). Exit 0 when every shard ended and the merge is one
whole run, 1 otherwise (a shard missing or lost, named).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from replayer.fleet.roster import STATES, Roster

log = logging.getLogger("replayer")

#: longest a ``POST /ready`` is held before it is answered without an epoch (the shard asks again)
LONG_POLL_S = 20.0


class FleetCollector(Collector):
    """The fleet's gauges, read from the roster at each scrape."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster

    def collect(self):
        r = self.roster
        shards = GaugeMetricFamily("replayer_fleet_shards", "shards of the fleet by state", labels=["state"])
        for s in STATES:
            shards.add_metric([s], sum(1 for m in r.members if m.state == s))
        yield shards
        t = r.totals()
        for key, what in (
            ("sent", "requests the shards sent"),
            ("completed", "requests that completed"),
            ("failed", "requests that failed"),
            ("missed_while_down", "rows a shard missed while it was down (not sent)"),
        ):
            c = CounterMetricFamily(f"replayer_fleet_requests_{key}", f"{what}, over the fleet (last reports)")
            c.add_metric([], t[key])
            yield c
        g = GaugeMetricFamily("replayer_fleet_requests_in_flight", "requests in flight over the fleet")
        g.add_metric([], t["in_flight"])
        yield g
        off = GaugeMetricFamily(
            "replayer_fleet_clock_offset_seconds", "each shard's clock offset to the coordinator's", labels=["shard"]
        )
        for m in r.members:
            if "offset_s" in m.clock:
                off.add_metric([str(m.shard)], float(m.clock["offset_s"]))
        yield off
        if r.epoch_s is not None:
            e = GaugeMetricFamily("replayer_fleet_start_epoch_seconds", "the fleet's start (Unix time, coordinator)")
            e.add_metric([], r.epoch_s)
            yield e


class Coordinator:
    """The server around a ``Roster``; ``done`` is set once the fleet has ended."""

    def __init__(self, roster: Roster, *, tick_s: float = 0.5, epoch_file: str | None = None) -> None:
        self.roster = roster
        self.epoch_file = epoch_file  # where the start is kept (a restarted coordinator keeps it)
        self.tick_s = tick_s
        self.done = asyncio.Event()
        self._epoch_set = asyncio.Event()
        self.registry = CollectorRegistry()
        self.registry.register(FleetCollector(roster))
        self._runner: web.AppRunner | None = None
        self._said = 0  # events already logged
        app = web.Application()
        app.router.add_get("/clock", self._clock)
        app.router.add_post("/ready", self._ready)
        app.router.add_post("/heartbeat", self._heartbeat)
        app.router.add_post("/ended", self._ended)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        self.app = app

    async def start(self, host: str, port: int) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]  # noqa: SLF001 (the port taken for 0)
        return f"http://{host}:{sock.getsockname()[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def watch(self) -> None:
        """The deadline, lost shards and the end, every ``tick_s``."""
        while not self.done.is_set():
            now = time.time()
            self.roster.tick(now)
            self._after_change(now)
            await asyncio.sleep(self.tick_s)

    def _after_change(self, now: float) -> None:
        r = self.roster
        for e in r.events[self._said :]:
            log.warning("%s", e) if "lost" in e or "without" in e else log.info("%s", e)
        self._said = len(r.events)
        if r.epoch_s is not None and not self._epoch_set.is_set():
            self._epoch_set.set()
            if self.epoch_file is not None:
                _write_json(self.epoch_file, {"epoch_s": r.epoch_s, "missing_at_start": r.missing_at_start})
            log.info(
                "every shard ready%s: the fleet starts at %s (in %.1f s)",
                "" if not r.missing_at_start else " but " + ", ".join(map(str, r.missing_at_start)),
                time.strftime("%H:%M:%S", time.localtime(r.epoch_s)),
                r.epoch_s - now,
            )
        if r.finished(now):
            self.done.set()

    async def _clock(self, request: web.Request) -> web.Response:
        return web.json_response({"wall_s": time.time()})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
            shard = int(body["shard"])
        except (ValueError, KeyError, TypeError) as e:
            raise web.HTTPBadRequest(text=f"a JSON object with an integer 'shard' is expected ({e})") from None
        if not 0 <= shard < self.roster.shards:
            raise web.HTTPBadRequest(text=f"shard {shard} is not one of 0..{self.roster.shards - 1}")
        return body

    def _answer(self) -> web.Response:
        r = self.roster
        return web.json_response({"epoch_s": r.epoch_s, "shards": r.shards, "missing_at_start": r.missing_at_start})

    async def _ready(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self.roster.ready(int(body["shard"]), time.time(), body)
        self._after_change(time.time())
        wait_s = min(float(body.get("wait_s", LONG_POLL_S)), LONG_POLL_S)
        if self.roster.epoch_s is None and wait_s > 0:
            try:
                await asyncio.wait_for(self._epoch_set.wait(), wait_s)
            except TimeoutError:
                pass
        return self._answer()

    async def _heartbeat(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self.roster.heard(int(body["shard"]), time.time(), body.get("counts") or {})
        self._after_change(time.time())
        return self._answer()

    async def _ended(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        self.roster.ended(int(body["shard"]), time.time(), body.get("summary") or {}, body.get("counts") or {})
        log.info("shard %s ended", body["shard"])
        self._after_change(time.time())
        return self._answer()

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.roster.status(time.time()))

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def _write_outputs(roster: Roster, output: str | None) -> int:
    """``fleet.json`` and the merge of the shards' folders; the exit code."""
    now = time.time()
    view = roster.status(now)
    view["summaries"] = {str(m.shard): m.summary for m in roster.members if m.summary is not None}
    missing = roster.not_ended()
    if missing:
        log.warning("the fleet ended without shard(s) %s (lost or never came)", ", ".join(map(str, missing)))
    code = 1 if missing or not roster.epoch_s else 0
    if output is None:
        return code
    os.makedirs(output, exist_ok=True)
    folders = [m.results for m in roster.members if m.results]
    readable = [d for d in folders if os.path.isdir(d)]
    if readable and len(readable) == len(folders):
        from replayer.results.merge import merge_results  # (only for the end of the fleet)

        try:
            merged = merge_results(readable, os.path.join(output, "merged"), quiet=True)
            view["merged"] = os.path.join(output, "merged", "summary.json")
            view["merge_warnings"] = merged.get("merge_warnings", [])
            code = code or (1 if merged.get("merge_warnings") else 0)
        except (FileNotFoundError, OSError) as e:
            view["merge_error"] = str(e)
            code = 1
    elif folders:
        view["merged"] = None
        view["merge_note"] = "the shards' results folders are not readable here: merge them with `replayer merge`"
    _write_json(os.path.join(output, "fleet.json"), view)
    log.info("fleet summary: %s", os.path.join(output, "fleet.json"))
    return code


def _write_json(path: str, obj: object) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def _kept_epoch(path: str, roster: Roster) -> None:
    """A coordinator restarted mid-run keeps the fleet's start (``OUTPUT/epoch.json``)."""
    try:
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
        roster.epoch_s = float(kept["epoch_s"])
        roster.missing_at_start = list(kept.get("missing_at_start", []))
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s unreadable (%s): a new start will be set", path, e)
        return
    log.info("the fleet started at %s already (%s): its shards keep that schedule", roster.epoch_s, path)


async def coordinate(roster: Roster, host: str, port: int, output: str | None) -> int:
    """Serve until the fleet has ended (or SIGTERM/SIGINT); then write the outputs."""
    epoch_file = os.path.join(output, "epoch.json") if output else None
    if epoch_file is not None:
        _kept_epoch(epoch_file, roster)
    c = Coordinator(roster, epoch_file=epoch_file)
    url = await c.start(host, port)
    log.info("coordinator on %s for %d shard(s) (/status, /metrics)", url, roster.shards)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, c.done.set)
    watcher = asyncio.create_task(c.watch(), name="fleet watch")
    try:
        await c.done.wait()
        await asyncio.sleep(0.2)  # the last shard's answer leaves before the server closes
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await c.stop()
    return _write_outputs(roster, output)
