"""Scrape the target's Prometheus ``/metrics`` (in its engine's dialect) during a replay.

``TargetScraper`` polls ``/metrics`` every ``interval_s``, keeps long-format sample rows for the
caller to flush (``replayer.observe.target_samples``: parts during the run, ``target_metrics.parquet`` at
its end) and the counter increases over the whole run (``deltas()``). What is read from the text
and how series combine (exact sample names, one keyed sum, resets per series, unknown left out)
is ``replayer.observe.target_series``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

import aiohttp

from replayer.http.tls import TLSOptions, explain, find_ssl_error
from replayer.observe.dialects import CANONICAL_COUNTERS, CANONICAL_GAUGES, Dialect
from replayer.observe.target_series import (
    VLLM,
    SeriesKey,
    aggregate,
    is_reset,
    parse_series,
    series_deltas,
)

#: metric names a server exports only with a feature on (speculative decoding): their absence
#: is listed in ``missing`` but not warned about
ONLY_WHEN_ENABLED = ("spec_decode_",)

log = logging.getLogger(__name__)

__all__ = ["TargetScraper", "TargetScrapers"]


class TargetScraper:
    """Polls ``metrics_url`` every ``interval_s`` seconds until cancelled.

    ``session``: an ``aiohttp.ClientSession`` to use (not closed here); None creates one for
    ``run``. ``t0_ns``: the run anchor on ``replayer.core.clock.now_ns``'s clock (row field ``t_ns``
    is the offset from it; ``set_anchor`` gives it once known, after a baseline scrape taken
    before it). ``wall``/``mono``: injectable clocks (Unix s / int ns).

    After each successful scrape: ``latest`` (aggregated values, see ``aggregate``), one row per
    raw series appended to ``samples`` (``{"time_s", "t_ns", "metric", "labels", "kind",
    "value"}``; ``labels`` is a JSON object text; the caller takes and flushes them with
    ``take_samples``), and the per-series increases since the previous scrape are added to the
    run totals (``deltas()``). A failed scrape (connection, status, parse) is counted in
    ``errors`` with ``last_error`` and never raises; the next good scrape's increases are taken
    against the last good one. ``missing``: the canonical names (``COUNTERS``/``GAUGES``) no good
    scrape has had so far, logged at the first one (None before it).
    """

    def __init__(
        self,
        metrics_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 10.0,
        t0_ns: int = 0,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], int] = time.perf_counter_ns,
        tls: TLSOptions | None = None,
        dialect: Dialect = VLLM,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = metrics_url
        self.dialect = dialect
        self.unknown = dialect.unknown()
        # an https:// target's CA bundle, client certificate, server name (the run's --ca-bundle ...)
        self._request_kw = (tls or TLSOptions()).request_kwargs(metrics_url.startswith("https://"))
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.t0_ns = t0_ns
        self._session = session
        self._wall = wall
        self._mono = mono
        self.samples: list[dict] = []
        self._samples_lock = threading.Lock()
        self.latest: dict[str, float] = {}
        self.scrapes = 0
        self.first_time_s: float | None = None  # wall time (Unix s) of this run's first / last good scrape
        self.last_time_s: float | None = None
        self.errors = 0
        self.last_error: str | None = None
        self.resets = 0  # scrape intervals in which counters went back (a restart: once)
        self.series_resets = 0  # counter series that went back, over all of them
        self.on_restart: Callable[[str], None] = lambda url: None  # a restart seen (the run's events)
        self.missing: list[str] | None = None
        self._prev: dict[SeriesKey, float] | None = None
        self._prev_created: dict[SeriesKey, float] = {}
        self._run: dict[SeriesKey, float] = defaultdict(float)

    # -- pure step (also used by tests) ---------------------------------------------------------
    def observe(self, text: str, time_s: float | None = None, t_ns: int | None = None) -> dict[str, float]:
        """Take one scrape's text: update rows, run totals and ``latest``; return ``latest``.
        Raises ValueError for unparsable text (nothing is changed then)."""
        d = self.dialect
        values, created = parse_series(text, d)
        time_s = self._wall() if time_s is None else time_s
        t_ns = self._mono() - self.t0_ns if t_ns is None else t_ns
        rows = [
            {
                "time_s": time_s,
                "t_ns": t_ns,
                "metric": name,
                "labels": json.dumps(dict(labels), sort_keys=True),
                "kind": d.kind(name),
                "canonical": r.canon if (r := d.canonical(name, dict(labels))) is not None else None,
                "value": v,
            }
            for (name, labels), v in values.items()
        ]
        with self._samples_lock:  # (take_samples runs on the loop thread, this in a worker)
            self.samples.extend(rows)
        if self._prev is not None:
            prev, pc = self._prev, self._prev_created
            n = 0
            # a new dict, swapped in whole: the loop thread may be reading series_totals() while
            # this runs in a worker thread (a dict growing under its iteration raises)
            run = defaultdict(float, self._run)
            reset: list[str] = []
            for key, inc in series_deltas(prev, values, pc, created, d).items():
                run[key] += inc
                if key in prev and is_reset(prev[key], values[key], pc.get(key), created.get(key)):
                    n += 1
                    reset.append(key[0])
            self._run = run
            self.series_resets += n
            self.resets += n > 0
            if n:
                self.on_restart(self.url)
                log.warning(
                    "target counters went back between two scrapes of %s (a server restart?): %d series "
                    "reset (%s); their increase is taken from their new values",
                    self.url,
                    n,
                    ", ".join(sorted(set(reset))),
                )
        self._prev, self._prev_created = values, created
        self._note_missing(values)
        self.latest = aggregate(values, dialect=d)
        self.scrapes += 1
        if self.first_time_s is None:
            self.first_time_s = time_s
        self.last_time_s = time_s
        return self.latest

    def _note_missing(self, values: Mapping[SeriesKey, float]) -> None:
        """Update ``missing`` from one good scrape; log the missing names at the first one (not
        those a server exports only with a feature on: ``ONLY_WHEN_ENABLED``)."""
        d = self.dialect
        present = {r.canon for (name, labels) in values if (r := d.canonical(name, dict(labels))) is not None}
        if self.missing is None:
            self.missing = sorted((set(d.counters) | set(d.gauges) | set(d.parts)) - present)
            said = [m for m in self.missing if not m.startswith(ONLY_WHEN_ENABLED)]
            if said:
                log.warning(
                    "target metrics missing from %s (left out of the summary, never 0): %s",
                    self.url,
                    ", ".join(said),
                )
        elif self.missing:
            self.missing = [m for m in self.missing if m not in present]

    def unknown_nulls(self, kind: str) -> dict[str, None]:
        """The canonical ``kind`` ("counter"/"gauge") names the engine never exports, each None:
        said null in the summary, never 0."""
        canon = CANONICAL_COUNTERS if kind == "counter" else CANONICAL_GAUGES
        return {name: None for name in self.unknown if name in canon}

    def series_totals(self) -> list[list]:
        """The run's counter increases per raw series, as JSON-able ``[name, labels, value]``
        (``add_totals`` takes them back: a resumed run's deltas then cover every run)."""
        return [[name, dict(labels), v] for (name, labels), v in self._run.items()]

    def add_totals(
        self, totals: list, *, scrapes: int = 0, errors: int = 0, resets: int = 0, series_resets: int = 0
    ) -> None:
        """Start from an earlier run's ``series_totals`` and counts (``--resume``)."""
        for name, labels, v in totals:
            self._run[(name, tuple(sorted(labels.items())))] += float(v)
        self.scrapes += scrapes
        self.errors += errors
        self.resets += resets
        self.series_resets += series_resets

    def deltas(self) -> dict[str, float]:
        """Counter increases over the run (first to last good scrape), aggregated like
        ``aggregate`` with derived ratios over the run (e.g. the run's acceptance rate)."""
        return aggregate(dict(self._run), dialect=self.dialect)

    def take_samples(self) -> list[dict]:
        """Return the rows gathered since the last call and clear them."""
        with self._samples_lock:
            rows, self.samples = self.samples, []
        return rows

    def set_anchor(self, t0_ns: int) -> None:
        """The run's anchor, known only after the baseline scrape (taken during start-up, before
        it): the rows not yet taken are re-based on it (a baseline's ``t_ns`` is then negative)."""
        with self._samples_lock:
            for r in self.samples:
                r["t_ns"] += self.t0_ns - t0_ns
            self.t0_ns = t0_ns

    # -- I/O -------------------------------------------------------------------------------------
    async def scrape_once(self, session: aiohttp.ClientSession | None = None) -> dict[str, float] | None:
        """GET the metrics once and ``observe`` it; None (and ``errors`` += 1) on failure."""
        session = session or self._session
        assert session is not None, "no aiohttp session"
        try:
            async with session.get(self.url, timeout=self.timeout, **self._request_kw) as r:
                text = await r.text()
                if r.status != 200:
                    raise ValueError(f"HTTP {r.status}: {text[:200]}")
            # prometheus_client's parser is pure Python (~10-30 ms for a vLLM page): off the loop
            parse = asyncio.get_running_loop().run_in_executor(None, self.observe, text)
            try:
                return await asyncio.shield(parse)
            except asyncio.CancelledError:
                # (the run's end) the parse goes on in its thread: it ends before this does, so the
                # final scrape, taken once the tasks are stopped, is never observed before it
                await asyncio.wait([parse])
                raise
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a scrape failure must not stop the replay
            self.errors += 1
            bad = find_ssl_error(e)
            self.last_error = (f"TLS error: {explain(bad)}" if bad else f"{type(e).__name__}: {e}")[:500]
            log.debug("scrape of %s failed: %s", self.url, self.last_error)
            return None

    async def run(self) -> None:
        """Scrape at ``interval_s`` on absolute deadlines (no drift) until cancelled: at once, or
        one interval from now when this run already has a good scrape (its baseline)."""
        own = self._session is None
        session = self._session or aiohttp.ClientSession()
        try:
            start = self._mono()
            if self.last_time_s is not None:  # (the baseline was the tick at ``start``)
                await asyncio.sleep(self.interval_s)
            k = 0 if self.last_time_s is None else 1
            while True:
                await self.scrape_once(session)
                k += 1
                left = start + int(k * self.interval_s * 1e9) - self._mono()
                if left < 0:  # a slow scrape: skip the missed ticks rather than burst
                    k += -left // int(self.interval_s * 1e9) + 1
                    left = start + int(k * self.interval_s * 1e9) - self._mono()
                await asyncio.sleep(left / 1e9)
        finally:
            if own:
                await session.close()


class TargetScrapers:
    """One ``TargetScraper`` per target (each target's ``/metrics``), run together; their sample
    rows carry the target as the label ``replayer_target`` (in ``labels``), so one
    ``target_metrics.parquet`` holds every target's series apart."""

    def __init__(self, scrapers: dict[str, TargetScraper]) -> None:
        self.scrapers = scrapers

    async def run(self) -> None:
        await asyncio.gather(*(s.run() for s in self.scrapers.values()))

    async def scrape_once(self, session) -> None:
        await asyncio.gather(*(s.scrape_once(session) for s in self.scrapers.values()))

    def set_anchor(self, t0_ns: int) -> None:
        for s in self.scrapers.values():
            s.set_anchor(t0_ns)

    def take_samples(self) -> list[dict]:
        rows = []
        for url, s in self.scrapers.items():
            for r in s.take_samples():
                labels = json.loads(r["labels"])
                labels["replayer_target"] = url
                rows.append({**r, "labels": json.dumps(labels, sort_keys=True)})
        return rows

    def sections(self) -> dict[str, dict]:
        """Per target: its metric deltas over the run as the one-target summary has them."""
        out: dict[str, dict] = {}
        for url, s in self.scrapers.items():
            out[url] = (
                {
                    "engine": s.dialect.name,
                    "unknown": s.unknown,
                    "deltas": {**s.unknown_nulls("counter"), **s.deltas()},
                    "latest": {**s.unknown_nulls("gauge"), **s.latest},
                    "missing": s.missing,
                    "scrapes": s.scrapes,
                    "scrape_errors": s.errors,
                    "counter_resets": s.resets,
                }
                if s.scrapes
                else {"scrapes": 0, "scrape_errors": s.errors, "last_error": s.last_error}
            )
        return out
