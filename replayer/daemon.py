"""Composition root: build everything from a RunConfig, run the replay, drain, summarise.

Flow (one way): trace -> schedule -> prompts/payload -> dispatcher -> client -> results
(recorder -> requests.parquet) + metrics (registry -> admin /metrics) -> summary.json.
Signals: the first SIGTERM/SIGINT stops issuing and drains (``drain_timeout_s``); a second one
cancels in-flight requests at once. Results already measured are flushed in every case.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from . import __version__, verdict
from .admin import AdminServer
from .client import Client
from .clock import Anchor, now_ns
from .config import SAME_ON_RESUME, RunConfig, flag_name, new_run_id
from .dispatcher import Dispatcher, Feed, Observer
from .gcpacer import GcPacer
from .imagerows import ImageEndpointError, check_image_endpoints, may_have_images
from .launcher import Launcher
from .logs import ErrorBurstLog, setup_logging
from .console import LiveConsole
from .metrics import EventLoopLagMonitor, ReplayerMetrics
from .target_metrics import SAMPLES_FLUSH_SCRAPES, SampleFiles, TargetScraper
from .payload import TEXT_ONLY, PayloadBuilder, PreparedRequest
from .servertimings import REQUEST_FIELD as SERVER_TIMINGS_FIELD
from .prepare import Prompts, RequestFactory
from .recorder import (Recorder, drop_not_started, earlier_run, new_results_dir, read_results, result_files,
                       write_json)
from .recorder import warm_up as recorder_warm_up
from .result import RequestResult
from .retention import read_removed
from . import selfwatch
from .selfwatch import BEHIND_MS
from .sender import LauncherSender, LoopSender
from .planner import Planner
from .simproc import EMBEDDED_TARGET_ENV, PARENT_PID_ENV, spawn_sim, stop_sim
from .schedule import IdleGapCap, Timeline, iter_schedule
from .sessions import SessionGate
from .summary import format_summary, summarize_files
from .tenants import TenantMetrics, format_tenants, read_tenant_sections
from .trace import TraceError, open_mix, open_trace, parse_mapping

log = logging.getLogger("replayer")


class StartupError(RuntimeError):
    """The replay could not start (target unreachable, bad trace...); nothing was sent."""


@dataclass
class RunState:
    """Live counters behind ``/status`` and the progress line."""

    state: str = "starting"
    scheduled: int = 0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    not_started: int = 0
    max_lag_ms: float = 0.0
    window_max_lag_ms: float = 0.0
    watch_max_lag_ms: float = 0.0  # the same, for the self-watch window
    target: str = ""
    results: str = ""
    started_wall: float = field(default_factory=time.time)
    recorder: Recorder | None = None  # its folder size and oldest result (/status)


class _Accounting(Observer):
    def __init__(self, state: RunState, metrics: ReplayerMetrics) -> None:
        self.s = state
        self.m = metrics
        self.bursts = ErrorBurstLog()  # failures logged per error kind, at most one line per 10 s

    def on_sent(self, req: PreparedRequest) -> None:
        self.s.sent += 1
        self.m.on_sent(req)

    def on_result(self, res: RequestResult) -> None:
        s = self.s
        o = res.outcome
        if o == "success":
            s.completed += 1
        elif o == "failed":
            s.failed += 1
            self.bursts.observe(res)
        elif o == "cancelled":
            s.cancelled += 1
        else:
            s.not_started += 1
        self.m.on_result(res)

    def on_dispatched(self, res: RequestResult) -> None:
        s, lag = self.s, res.dispatch_lag_ms
        if lag is not None:
            if lag > s.max_lag_ms:
                s.max_lag_ms = lag
            if lag > s.window_max_lag_ms:
                s.window_max_lag_ms = lag
            if lag > s.watch_max_lag_ms:
                s.watch_max_lag_ms = lag
            self.m.on_dispatched(res)


class RunControl:
    """The admin server's ``Controller`` over the dispatcher: each change is logged, and each
    speed-up change is kept with its time (``speedup_changes``: ``{"t_s", "speedup"}``, ``t_s`` in
    seconds after the run's anchor) for ``summary.json``, which otherwise says only the speed-up
    the run started with."""

    def __init__(self, dispatcher: Dispatcher, on_change: Callable[[], None] = lambda: None) -> None:
        self.d = dispatcher
        self.speedup_changes: list[dict] = []
        self._on_change = on_change  # called after a pause, resume or speed-up change

    def _t_s(self) -> float:
        return round(self.d.now_rel() / 1e9, 3)

    def pause(self) -> None:
        if not self.d.timeline.paused:
            log.info("paused (POST /pause) at t=%.1f s: no request is sent until POST /resume", self._t_s())
        self.d.pause()
        self._on_change()

    def resume(self) -> None:
        if self.d.timeline.paused:
            log.info("resumed (POST /resume) at t=%.1f s", self._t_s())
        self.d.resume()
        self._on_change()

    def set_speedup(self, speedup: float) -> None:
        old = self.d.timeline.speedup
        self.d.set_speedup(speedup)
        self.speedup_changes.append({"t_s": self._t_s(), "speedup": speedup})
        log.info("speed-up %g -> %g (POST /speedup) at t=%.1f s", old, speedup, self._t_s())
        self._on_change()

    def stop(self) -> None:
        if not self.d.stopping:
            log.info("stopping (POST /stop) at t=%.1f s: no new requests; draining the ones in flight", self._t_s())
        self.d.stop()


async def wait_ready(base_url: str, timeout_s: float, api_key: str | None) -> list[str]:
    """Poll ``GET /v1/models`` until it answers 200 (returns the model ids) or ``timeout_s``
    passes (raises StartupError naming the URL and the last error)."""
    start = time.monotonic()
    deadline = start + timeout_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    last = "no answer"
    said = None  # when "waiting" was last logged
    url = base_url.rstrip("/") + "/v1/models"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            try:
                async with session.get(url, headers=headers) as r:
                    if r.status == 200:
                        data = await r.json(content_type=None)
                        if said is not None:
                            log.info("target %s ready after %.1f s", base_url, time.monotonic() - start)
                        return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
                    last = f"HTTP {r.status}" + (" (no /v1/models there: --target is the server's base URL, "
                                                  "e.g. http://host:8000)" if r.status == 404 else "")
            except aiohttp.ClientConnectorError as e:  # (its text names aiohttp's "ssl:default")
                os_err = e.os_error
                last = f"cannot connect: {type(os_err).__name__}" + (f" ({os_err.strerror})" if os_err.strerror else "")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            now = time.monotonic()
            if now >= deadline:
                raise StartupError(f"target {base_url} not ready after {timeout_s:.0f} s ({last}; "
                                   "--ready-timeout sets how long to wait)")
            if said is None and now - start >= 1.0 or said is not None and now - said >= 10.0:
                said = now
                log.info("waiting for the target: GET %s: %s (%.0f s of --ready-timeout %.0f s left)",
                         url, last, deadline - now, timeout_s)
            await asyncio.sleep(0.05)


def _results_dir(cfg: RunConfig) -> tuple[str, bool]:
    """The results folder, created if needed: (path, whether this call created it). Without
    ``--results``: a new ``results/<timestamp>`` (``-2``, ``-3``... when runs start in the same
    second). Raises StartupError when the path is a file, cannot be created, or (without
    ``--resume``) already holds a run's results."""
    if cfg.resume:
        return cfg.resume, False  # (resume_plan checks it)
    if cfg.results is None:
        try:
            return new_results_dir(), True
        except OSError as e:
            raise StartupError(f"cannot create a results folder under ./results: {e.strerror or e}") from None
    path = cfg.results
    if os.path.exists(path):
        if not os.path.isdir(path):  # (a traceback before)
            raise StartupError(f"--results {path}: exists and is not a folder")
        used = earlier_run(path)
        if used:
            raise StartupError(f"--results {path}: {used}")
        return path, False
    try:
        os.makedirs(path)
    except OSError as e:
        raise StartupError(f"--results {path}: cannot create the folder: {e.strerror or e}") from None
    return path, True


def resume_plan(results_dir: str, cfg: RunConfig | None = None):
    """Where a resumed run starts: (first loop with an unrecorded row, skip function).

    Every (loop, row) already recorded as sent (any outcome but ``not_started``) in the results
    folder is skipped, and the ``not_started`` records are removed (those rows are sent now), so
    the union of the files holds each row once. Raises StartupError when the folder holds no
    checkpoint, or when ``cfg`` differs from the checkpoint in the trace or a ``SAME_ON_RESUME``
    setting (all differences listed; checkpoints written before these were recorded hold the
    trace, shard and seed only)."""
    ckpt_path = os.path.join(results_dir, "checkpoint.json")
    if not os.path.exists(ckpt_path):
        raise StartupError(f"--resume {results_dir}: no checkpoint.json (not a replayer results folder?)")
    with open(ckpt_path, encoding="utf-8") as f:
        ckpt = json.load(f)
    if cfg is not None:
        recorded = {**ckpt.get("settings", {}), **{k: ckpt[k] for k in ("shard", "seed") if k in ckpt}}
        now = _resume_settings(cfg)
        diff = [f"{flag_name(k)} {recorded[k]!r} there, {now[k]!r} now" for k in SAME_ON_RESUME
                if k in recorded and recorded[k] != now[k]]
        if "trace" in ckpt and os.path.realpath(ckpt["trace"]) != os.path.realpath(cfg.trace) \
                and os.path.basename(ckpt["trace"]) != os.path.basename(cfg.trace):
            diff.insert(0, f"trace {ckpt['trace']} there, {os.path.abspath(cfg.trace)} now")
        if diff:
            raise StartupError(f"--resume {results_dir}: settings differ from the run it continues: "
                               + "; ".join(diff))
    table = read_results(results_dir, columns=["loop", "row", "outcome"])
    done: dict[int, np.ndarray] = {}
    if table.num_rows:
        sent = table.filter(pc.not_equal(table.column("outcome"), "not_started"))
        loops = sent.column("loop").to_numpy()
        rows = sent.column("row").to_numpy()
        for lp in np.unique(loops):
            done[int(lp)] = np.unique(rows[loops == lp])
    removed = read_removed(results_dir)  # rows in results files retention removed were sent too
    for lp, rows in (removed.recorded_rows() if removed else {}).items():
        done[lp] = np.union1d(done.get(lp, np.zeros(0, np.int64)), rows)
    # results of the last loop(s) may have been lost with the process: restart one loop earlier
    start_loop = max(0, int(ckpt.get("loop", 0)) - 1)
    # rows a stopped run recorded as not started are sent now: their old records go
    dropped = drop_not_started(results_dir)

    def skip(loop: int, rows: np.ndarray) -> np.ndarray:
        d = done.get(loop)
        return np.isin(rows, d) if d is not None else np.zeros(rows.size, dtype=bool)

    log.info("resuming %s at loop %d, row %d (its checkpoint): %d rows already recorded are skipped "
             "(%d not-started records replaced)", results_dir, int(ckpt.get("loop", 0)),
             int(ckpt.get("next_row", 0)), sum(v.size for v in done.values()), dropped)
    return start_loop, skip


def _scraper_totals(scraper: TargetScraper) -> dict:
    """What a resumed run carries on (summary.json's and checkpoint.json's ``target_metrics``)."""
    return {"scrapes": scraper.scrapes, "scrape_errors": scraper.errors, "counter_resets": scraper.resets,
            "counter_series_resets": scraper.series_resets, "series_totals": scraper.series_totals()}


def _carry_target_totals(results_dir: str, scraper: TargetScraper) -> None:
    """Seed ``scraper`` with the target-metric totals of the runs already in ``results_dir``:
    from ``checkpoint.json`` (written at every flush, so a killed run's totals are there up to
    its last flush), else from ``summary.json`` (checkpoints of older versions hold none)."""
    tm = None
    for name in ("checkpoint.json", "summary.json"):
        try:
            with open(os.path.join(results_dir, name), encoding="utf-8") as f:
                tm = json.load(f).get("target_metrics")
        except (OSError, ValueError, AttributeError):
            continue
        if tm:
            break
    if not tm:
        return
    scraper.add_totals(tm.get("series_totals") or [], scrapes=tm.get("scrapes", 0),
                       errors=tm.get("scrape_errors", 0), resets=tm.get("counter_resets", 0),
                       series_resets=tm.get("counter_series_resets", 0))


def _resume_settings(cfg: RunConfig) -> dict:
    """The ``SAME_ON_RESUME`` settings as JSON values."""
    return {k: json.loads(json.dumps(getattr(cfg, k), default=str)) for k in SAME_ON_RESUME}


BATCH_ROWS = 65_536
#: the requests due within this horizon are counted for the client to open connections ahead
CONNECT_AHEAD_NS = 100_000_000
#: the requests a run will send are counted ahead (``count_scheduled``, a pass over the trace
#: before the start: ~2 ms per 1,000 rows) when at most this many schedule entries are read:
#: every pass of a trace of this size, or under ``--duration`` the entries due before its end
COUNT_LIMIT = 250_000


def count_scheduled(schedule, *, speedup: float, duration_ns: int | None = None, rebase: bool = False,
                    limit: int = COUNT_LIMIT) -> int | None:
    """How many requests a schedule (``iter_schedule``'s batches: shard, loops, ``--max-requests``
    and resume skips applied) will send: all of them, or under ``duration_ns`` those due before it
    (due = (trace_ns - trace0) / speedup, trace0 = 0, or the first entry's with ``rebase``, as the
    dispatcher does on resume). None when the count passes ``limit`` (a schedule without end)."""
    n, trace0 = 0, None
    for sb in schedule:
        t = np.asarray(sb.trace_ns, dtype=np.int64)
        if not t.size:
            continue
        if trace0 is None:
            trace0 = int(t[0]) if rebase else 0
        if duration_ns is None:
            n += int(t.size)
        else:
            k = int(np.count_nonzero(np.round((t - trace0) / speedup) < duration_ns))
            n += k
            if k < t.size:
                return n
        if n > limit:
            return None
    return n


def open_batches_factory(cfg: RunConfig):
    """(function returning a fresh iterator of trace batches — one pass per loop, block size,
    number of rows or None, trace seconds spanned by one loop's schedule or None when not known
    without reading the rows: ``TraceSource.span_ns``). With ``validate_trace=full`` every row
    is checked before anything is sent (a TraceError lists every problem); with ``lazy`` each
    batch is checked as it is read."""
    opts = dict(fmt=cfg.format, block_size=cfg.block_size, strict=cfg.strict, mapping=cfg.map,
                time_unit=cfg.time_unit)
    if cfg.mix:  # several traces (tenants) on one clock: replayer.trace.mix
        source = open_mix([dataclasses.replace(e, hash_id_scope=e.hash_id_scope or cfg.hash_id_scope)
                           for e in cfg.mix_entries], **opts)
    else:
        source = open_trace(cfg.trace, **opts)
    if cfg.validate_trace == "full":
        source.validate()
    if not cfg.tokenizer and _may_have_endpoints(source, cfg):
        check_endpoints(source.batches(BATCH_ROWS), cfg.trace)
    if may_have_images(source, cfg.map):
        try:
            check_image_endpoints(source.batches(BATCH_ROWS), cfg.trace, cfg.endpoint)
        except ImageEndpointError as e:
            raise StartupError(str(e)) from None
    span_ns = source.span_ns(cfg.max_requests)
    span_s = span_ns / 1e9 if span_ns is not None else None
    return (lambda: source.batches(BATCH_ROWS)), source.block_size, source.num_rows, span_s


def _may_have_endpoints(source, cfg: RunConfig) -> bool:
    """Whether the trace may carry an ``endpoint`` column, without reading its rows (Parquet:
    the schema; a loaded trace: the column; other sources: assume it may)."""
    trace = getattr(source, "trace", None)
    if trace is not None:
        return getattr(trace, "endpoint", None) is not None
    files = getattr(source, "files", None)
    if files:
        name = parse_mapping(cfg.map).get("endpoint", "endpoint")
        return name in pq.read_schema(files[0]).names
    return True


def check_endpoints(batches, trace: str) -> None:
    """Without a tokenizer, refuse (before anything is sent) a trace whose ``endpoint`` column
    names a text-only API (chat, score, rerank): token ids cannot go there. Reads the trace only
    when it has that column."""
    for batch in batches:
        col = getattr(batch, "endpoint", None)
        if col is None:
            return
        bad = {e for e in col if e in TEXT_ONLY}
        if bad:
            raise StartupError(f"{trace}: rows for {', '.join(sorted(bad))} need text prompts: pass "
                               "--tokenizer PATH (token-id prompts cannot go to these endpoints)")


async def run_replay(cfg: RunConfig, *, registry: CollectorRegistry | None = None,
                     state: RunState | None = None, sim: tuple | None = None) -> dict:
    """Run one replay as configured; returns the summary dict (also in RESULTS/summary.json).

    Raises StartupError (nothing sent) for an unreachable target; trace.TraceError for a bad trace.
    ``sim``: an embedded simulator already spawned by the caller (``simproc.spawn_sim``), used
    (and stopped) when no ``--target`` is given.
    """
    state = state or RunState()
    registry = registry or CollectorRegistry()
    sim_proc = sim[0] if sim else None
    admin: AdminServer | None = None
    created = False  # the results folder is this run's own
    try:
        target = cfg.target
        if target is None:  # start it first: it boots in its own process while we load the trace
            sim_proc, target = sim if sim else spawn_sim()
            log.info("no --target: starting the embedded simulator at %s", target)
        # warm the results writer in a thread while the trace loads and the target comes up
        warming = asyncio.get_running_loop().run_in_executor(None, recorder_warm_up)
        open_batches, block_size, n_rows, span_s = open_batches_factory(cfg)
        prompts = Prompts(cfg.block_size or block_size, seed=cfg.seed, loop_salt=cfg.loop_salt,
                          vocab_range=cfg.vocab_bounds, tokenizer=cfg.tokenizer, kv_block_size=cfg.kv_block_size,
                          cache_tokens=cfg.expected_cache_tokens)
        results_dir, created = _results_dir(cfg)
        state.results = results_dir
        metrics = ReplayerMetrics(registry, config_info={
            "speedup": str(cfg.speedup), "trace": os.path.basename(cfg.trace), "endpoint": cfg.endpoint,
            "shard": cfg.shard, "loop": cfg.loop})
        rows = min(n_rows, cfg.max_requests) if n_rows and cfg.max_requests else n_rows
        metrics.set_trace(rows=rows or 0, duration_s=span_s or 0.0, speedup=cfg.speedup)
        dispatcher_ref: list[Dispatcher] = []
        control_ref: list[RunControl] = []
        admin = AdminServer(registry, status=lambda: {**_status(state, dispatcher_ref), **metrics.snapshot()},
                            ready=lambda: state.state == "running",  # draining too (derived in _status)
                            control=lambda: control_ref[0] if control_ref else None,
                            token=cfg.control_token())
        try:
            admin_url = await admin.start(cfg.admin_host, cfg.admin_port)
        except OSError as e:  # (the port in use: another replayer, or two `make run`s)
            raise StartupError(f"--admin-port {cfg.admin_port} on {cfg.admin_host}: {e.strerror or e} "
                               "(--admin-port 0 takes a free port)") from None
        log.info("admin server on %s (/metrics, /status)", admin_url)
        api_key = cfg.api_key()
        state.target = target
        models = await wait_ready(target, cfg.ready_timeout_s if cfg.target else 30.0, api_key)
        model = cfg.model or (models[0] if models else None)
        if model is None:
            raise StartupError(f"target {target} lists no model: pass --model")
        payload = PayloadBuilder(model, vllm_extensions=cfg.vllm_extensions,
                                 chat="chat/completions" in cfg.endpoint,
                                 extra={SERVER_TIMINGS_FIELD: True} if cfg.server_timings else None)
        await warming
        summary = await _replay(cfg, open_batches, n_rows, prompts, payload, target, api_key, metrics,
                                state, results_dir, model, dispatcher_ref, control_ref)
    except (StartupError, TraceError):
        # nothing was sent: a folder this run made holds nothing (an empty parts/ at most)
        if created and not any(files for _, _, files in os.walk(results_dir)):
            shutil.rmtree(results_dir, ignore_errors=True)
            if cfg.results is None:  # ./results itself, if this left it empty
                try:
                    os.rmdir(os.path.dirname(results_dir))
                except OSError:
                    pass
        raise
    finally:
        if admin is not None:
            await admin.stop()
        if sim_proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, stop_sim, sim_proc)
    return summary


async def _replay(cfg, open_batches, n_rows, prompts, payload, target, api_key, metrics, state,
                  results_dir, model, dispatcher_ref, control_ref) -> dict:
    loop = asyncio.get_running_loop()
    shard, shards = cfg.shard_index
    start_loop, skip = resume_plan(results_dir, cfg) if cfg.resume else (0, None)

    def schedule(gap_cap: IdleGapCap | None = None):
        return iter_schedule(open_batches, loops=cfg.loops, loop_gap_ns=int(cfg.loop_gap_s * 1e9),
                             shard=shard, shards=shards, max_requests=cfg.max_requests,
                             start_loop=start_loop, skip=skip, gap_cap=gap_cap)

    def new_gap_cap() -> IdleGapCap | None:  # one per pass over the schedule (it keeps state)
        return IdleGapCap(cfg.idle_gap_cap_s, cfg.speedup) if cfg.idle_gap_cap_s else None

    gap_cap = new_gap_cap()
    batches = schedule(gap_cap)
    duration_ns = int(cfg.duration_s * 1e9) if cfg.duration_s else None
    if duration_ns or (cfg.loops is not None and n_rows is not None and n_rows * cfg.loops <= COUNT_LIMIT):
        # what will be sent (shard, --duration, resume skips...), for /status and the progress line
        state.scheduled = await loop.run_in_executor(None, lambda: count_scheduled(
            schedule(new_gap_cap()), speedup=cfg.speedup, duration_ns=duration_ns,
            rebase=bool(cfg.resume))) or 0
    # GC at moments of the dispatcher's choosing (replayer.gcpacer): never when a burst is due.
    gc_pacer = GcPacer()
    gc_pacer.start()
    # the launcher process boots (~50 ms) while the first trace batch is read
    launcher = _start_launcher() if cfg.launcher and target.startswith("http://") else None
    # read the first trace batch before anchoring, so the first requests are not late by its read
    first = await loop.run_in_executor(None, next, batches, None)
    if first is not None:
        batches = itertools.chain((first,), batches)
    if launcher is not None:
        launcher = await _launcher_ready(launcher)
    client = Client(target, endpoint=cfg.endpoint, api_key=api_key,
                    connect_timeout_s=cfg.connect_timeout_s, read_timeout_s=cfg.read_timeout_s or None,
                    request_timeout_s=cfg.request_timeout_s,
                    retry_max=cfg.retry_max, retry_backoff_s=cfg.retry_backoff_s,
                    usage_slack_tokens=cfg.usage_slack_tokens, delayed_ack=cfg.delayed_ack,
                    server_timings=cfg.server_timings)
    if cfg.delayed_ack:
        if client.delayed_ack:
            log.info("--delayed-ack: quick ACKs off per response (the target must set TCP_NODELAY)")
        else:
            log.warning("--delayed-ack has no effect here: this OS has no TCP_QUICKACK")
    await client.start()
    if launcher is not None:
        client.use_launcher(launcher)
    try:
        await _open_pool(client, cfg.warm_connections)
    except BaseException:
        await client.close()
        if launcher is not None:
            launcher.stop()
        raise
    # anchored only now: the time the pool took to open (seconds against a server with a small
    # listen backlog) is start-up, not lateness charged to every request
    anchor = Anchor.at(cfg.start_delay_s, start_wall_s=cfg.start_at)
    client.t0_ns = anchor.t0_ns
    if anchor.late_s and cfg.resume:
        log.info("resuming now: the run's --start-at %s passed %.0f s ago", _hms(cfg.start_at), anchor.late_s)
    elif anchor.late_s:
        log.warning("--start-at %s passed %.1f s ago: starting now, %.1f s out of step with runs that kept it "
                    "(the requests overdue are not sent in one burst)", _hms(cfg.start_at), anchor.late_s,
                    anchor.late_s)
    timeline = Timeline(cfg.speedup)

    # X-Request-Id: <run_id>-<loop>-<row>; a resumed run keeps its run's id (config.recorded_settings)
    run_id = cfg.run_id or new_run_id()
    factory = RequestFactory(prompts, payload, timeline, endpoint=cfg.endpoint, text_mode=cfg.prompt_mode == "text",
                             sessions=cfg.session_policy != "off", shard=shard, run_id=run_id,
                             session_header=cfg.session_header, image_size=cfg.image_size,
                             image_format=cfg.image_format, image_token_rule=cfg.image_token_rule,
                             image_cache_mb=cfg.image_cache_mb)
    gate = SessionGate(cfg.session_policy, scale=lambda ns: round(ns / timeline.speedup))

    meta = {"replayer.version": __version__, "replayer.t0_wall_s": repr(anchor.wall_s),
            "replayer.trace": os.path.abspath(cfg.trace), "replayer.target": target, "replayer.model": model,
            "replayer.config": cfg.model_dump_json(), "replayer.run_id": run_id}
    dispatcher_box: list[Dispatcher] = []
    scraper: TargetScraper | None = None

    def checkpoint() -> dict:
        pos = dispatcher_box[0].position if dispatcher_box else None
        ckpt = {"trace": os.path.abspath(cfg.trace), "shard": cfg.shard, "seed": cfg.seed,
                "settings": _resume_settings(cfg), "run_id": run_id,
                "loop": pos.loop if pos else start_loop, "next_row": pos.row if pos else 0,
                "next_index": pos.index if pos else 0, "wall_time": time.time()}
        if scraper is not None:  # a run killed before its summary still hands its totals on
            ckpt["target_metrics"] = _scraper_totals(scraper)
        return ckpt

    recorder = Recorder(results_dir, flush_rows=cfg.flush_rows, flush_interval_s=cfg.flush_interval_s,
                        roll_rows=cfg.roll_rows, roll_interval_s=cfg.roll_interval_s, metadata=meta,
                        checkpoint=checkpoint, itl_format=cfg.itl_format, retain_bytes=cfg.retain_bytes,
                        retain_age_s=cfg.retain_age_s)
    state.recorder = recorder
    metrics.results_disk.source = lambda: (recorder.results_bytes, recorder.oldest_timestamp_s)
    acct = _Accounting(state, metrics)
    slos = cfg.goodput_slos
    metrics.set_slos(slos)
    tenant_metrics = TenantMetrics(metrics.registry, [e.tenant for e in cfg.mix_entries]) if cfg.mix else None

    def sink(res: RequestResult) -> None:  # the verdict (from-due latencies, SLO) before it is recorded
        codes = verdict.apply(res, slos)
        if codes is not None:
            metrics.on_slo(codes)
        if tenant_metrics is not None:
            tenant_metrics.on_result(res)
        recorder.add(res)

    def prepare(sb, j: int) -> PreparedRequest:  # each request built is counted (scheduled, expected hits)
        req = build(sb, j)
        on_prepared(req)
        return req

    build, on_prepared = factory.prepare, metrics.on_prepared
    client.on_dispatched = acct.on_dispatched  # dispatch lag accounted as each request goes out
    sender = LauncherSender(client, shard=shard) if launcher is not None else LoopSender(client, shard=shard)
    planner = Planner(timeline, gate=gate, lead_ns=int(cfg.lead_s * 1e9), duration_ns=duration_ns,
                      rebase_first=bool(cfg.resume), ahead_ns=sender.ahead_ns, connect_ahead_ns=CONNECT_AHEAD_NS)
    dispatcher = Dispatcher(Feed(batches, prepare, factory.unsent), planner, sender, sink, t0_ns=anchor.t0_ns,
                            observer=acct, on_idle=gc_pacer.idle, drain_timeout_s=cfg.drain_timeout_s, shard=shard)
    dispatcher_ref.append(dispatcher)

    def timing_changed() -> None:  # under --duration, a pause or a speed-up changes what will be sent
        if duration_ns is not None:
            state.scheduled = 0  # unknown until the end

    control = RunControl(dispatcher, on_change=timing_changed)
    control_ref.append(control)
    dispatcher_box.append(dispatcher)
    metrics.track_due(count_due=dispatcher.due_count)
    metrics.track_speedup(lambda: timeline.speedup)
    signals: list[str] = []

    def on_signal(signame: str) -> None:
        signals.append(signame)
        if len(signals) == 1:
            log.warning("%s: stopping; draining in-flight requests (again to cancel them)", signame)
            dispatcher.stop()  # /status says draining (from the dispatcher), as after /stop
        else:
            log.warning("%s again: cancelling in-flight requests", signame)
            dispatcher.cancel_in_flight()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    background = [loop.create_task(recorder.run_periodic_flush()),
                  loop.create_task(EventLoopLagMonitor(metrics).run())]
    console = LiveConsole(lambda: {**_status(state, dispatcher_ref), **metrics.snapshot()}, quiet=cfg.quiet)
    if console.enabled:
        background.append(loop.create_task(console.run()))
    elif not cfg.quiet:
        background.append(loop.create_task(_progress(state, dispatcher, anchor)))
    background.append(loop.create_task(_watch_self(
        state, metrics, probe=lambda: selfwatch.read(dispatcher, launcher, gc_pacer))))
    parent = os.environ.get(PARENT_PID_ENV)
    if parent and parent.isdigit():  # a --workers worker: stop with its parent
        background.append(loop.create_task(_stop_with_parent(int(parent), on_signal)))
    samples = None
    if cfg.scrape_target_metrics:
        scraper = TargetScraper(target.rstrip("/") + "/metrics", interval_s=cfg.scrape_interval_s,
                                t0_ns=anchor.t0_ns)
        samples = SampleFiles(results_dir)
        if cfg.resume:  # the summary covers the whole folder: start from the earlier runs' totals
            _carry_target_totals(results_dir, scraper)
        background.append(loop.create_task(scraper.run()))
        every_s = max(cfg.flush_interval_s, SAMPLES_FLUSH_SCRAPES * cfg.scrape_interval_s)
        background.append(loop.create_task(_flush_samples(scraper, samples, every_s)))
    log.info("replaying %s (%s rows%s, passes %s, shard %s) against %s (model %s) at speedup %g; results in %s",
             cfg.trace, n_rows, "" if not cfg.max_requests else f", the first {cfg.max_requests} sent"
             + (f" over all {shards} shards" if shards > 1 else ""), cfg.loop,
             cfg.shard, target, model, cfg.speedup, results_dir)
    try:
        state.state = "running"
        await dispatcher.run()
    finally:
        if launcher is not None:
            launcher.stop()
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if scraper is not None:  # the final values, after the drain
            async with aiohttp.ClientSession() as s:
                await scraper.scrape_once(s)
        await client.close()
        gc_pacer.stop()
        acct.bursts.close()  # the last window of each error burst
        state.state = "flushing"
        # shielded and time-boxed: measured results reach the disk even if we are cancelled
        closing = loop.run_in_executor(None, recorder.close)
        try:
            await asyncio.wait_for(asyncio.shield(closing), 60)
        except TimeoutError:
            log.error("results flush did not finish in 60 s")
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    state.state = "done"
    if recorder.rows_added == 0 and not cfg.resume:
        log.warning("no row of the trace %s: nothing was sent; an empty results file keeps the folder "
                    "mergeable", f"falls in shard {cfg.shard}" if shards > 1 else "was scheduled")
    summary = await loop.run_in_executor(None, functools.partial(summarize_files, result_files(results_dir),
                                                                 slos=cfg.goodput_slos))
    if samples is not None:  # (also the parts a killed earlier run left)
        await loop.run_in_executor(None, samples.roll, scraper.take_samples())
    if scraper is not None and scraper.scrapes:
        summary["target_metrics"] = {"deltas": scraper.deltas(), "latest": scraper.latest,
                                     "first_scrape_s": scraper.first_time_s, "last_scrape_s": scraper.last_time_s,
                                     "missing": scraper.missing, **_scraper_totals(scraper)}
        hits = summary["target_metrics"]["deltas"].get("prefix_cache_hits")
        if hits is not None:
            summary["server_prefix_cache_hit_tokens"] = hits
        mm_hits = summary["target_metrics"]["deltas"].get("mm_cache_hits")
        if mm_hits is not None and "images_sent" in summary:
            summary["server_image_cache_hits"] = int(mm_hits) if float(mm_hits).is_integer() else mm_hits
    elif scraper is not None:
        summary["target_metrics"] = {"scrapes": 0, "scrape_errors": scraper.errors, "last_error": scraper.last_error}
    summary.update({"target": target, "target_embedded": _target_embedded(cfg), "model": model,
                    "trace": cfg.trace, "speedup": cfg.speedup, "speedup_changes": control.speedup_changes,
                    "shard": cfg.shard, "loop": cfg.loop, "results": results_dir, "run_id": run_id,
                    "stopped_early": dispatcher.stopping, "stop_signal": signals[0] if signals else None})
    if gap_cap is not None:  # --idle-gap-cap: gaps capped, time skipped, the trace -> replay map
        summary["idle_gap_cap"] = gap_cap.report()
    if cfg.mix:  # per-tenant sections (replayer.tenants)
        summary["mix"] = list(cfg.mix)
        summary["tenants"] = await loop.run_in_executor(None, read_tenant_sections, results_dir)
    write_json(os.path.join(results_dir, "summary.json"), summary)
    if not os.environ.get(PARENT_PID_ENV):  # (--quiet too; a --workers worker: its parent prints the merge)
        print(format_summary(summary), flush=True)
        if summary.get("tenants"):
            print(format_tenants(summary["tenants"]), flush=True)
        if summary.get("idle_gap_cap"):
            g = summary["idle_gap_cap"]
            print(f"Idle gaps over {g['cap_s']:g} s (replay time) capped: {g['gaps_capped']}, "
                  f"{g['time_skipped_s']:,.3f} s skipped", flush=True)
        files = [os.path.relpath(f, results_dir) for f in result_files(results_dir)]
        listed = ", ".join(files) if len(files) <= 3 else f"{len(files)} results files"
        print(f"results: {results_dir}/ ({listed}, summary.json)", flush=True)
    return summary


def _target_embedded(cfg: RunConfig) -> bool:
    """Whether the run's target is the embedded simulator: started by this run (no ``--target``)
    or by the ``--workers`` parent, which names it in ``EMBEDDED_TARGET_ENV``."""
    return cfg.target is None or cfg.target == os.environ.get(EMBEDDED_TARGET_ENV)


#: exit code of a run whose failed requests exceeded ``--max-error-ratio``
EXIT_ERROR_RATIO = 3


def error_ratio_problem(summary: dict, max_error_ratio: float | None) -> str | None:
    """Why the run should exit ``EXIT_ERROR_RATIO``: failed / (completed + failed) is above
    ``max_error_ratio`` (None: no limit, or no request ended); else None."""
    failed, ended = summary.get("failed") or 0, (summary.get("completed") or 0) + (summary.get("failed") or 0)
    if max_error_ratio is None or not ended or failed / ended <= max_error_ratio:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted((summary.get("errors_by_kind") or {}).items()))
    return (f"{failed} of {ended} requests failed ({failed / ended:.1%}{'; ' + kinds if kinds else ''}), "
            f"more than --max-error-ratio {max_error_ratio:g}: exit {EXIT_ERROR_RATIO}")


#: signals that stop a run (drain, flush, exit 128 + the signal's number); SIGHUP: the terminal
#: closed (its default action would end the process without writing what it measured)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def _stop_with_parent(pid: int, stop: Callable[[str], None], every_s: float = 0.5) -> None:
    """Stop the run as on SIGHUP once process ``pid`` (the ``--workers`` parent) is gone: the
    workers run in sessions of their own, so nothing else would stop them when it is killed."""
    while os.getppid() == pid:
        await asyncio.sleep(every_s)
    log.warning("the --workers parent (pid %d) is gone: stopping", pid)
    stop("SIGHUP")


def _hms(wall_s: float) -> str:
    """A Unix time as local ``YYYY-mm-dd HH:MM:SS``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_s))


def _status(state: RunState, dispatcher_ref: list[Dispatcher]) -> dict:
    d = dispatcher_ref[0] if dispatcher_ref else None
    pos = d.position if d else None
    st, rec = state.state, state.recorder
    if st == "running" and d is not None and d.stopping:  # after SIGTERM or /stop
        st = "draining"
    elif st == "running" and d is not None and d.timeline.paused:  # POST /pause
        st = "paused"
    elif st == "running" and d is not None and d.now_rel() < 0:  # before --start-at (or the start delay)
        st = "waiting"
    return {"state": st, "target": state.target, "results": state.results,
            "scheduled": state.scheduled, "sent": state.sent, "completed": state.completed,
            "failed": state.failed, "cancelled": state.cancelled, "not_started": state.not_started,
            "in_flight": d.in_flight if d else 0,
            "position": {"index": pos.index, "loop": pos.loop, "row": pos.row} if pos else None,
            "speedup": d.timeline.speedup if d else None, "paused": d.timeline.paused if d else False,
            "dispatch_lag_max_s": round(state.max_lag_ms / 1e3, 6),  # (seconds, as every /status time)
            # the results folder's size and its oldest result kept (Unix s), as of the last flush
            "results_bytes": rec.results_bytes if rec else None,
            "results_oldest_timestamp_s": rec.oldest_timestamp_s if rec else None}




async def _flush_samples(scraper: TargetScraper, samples: SampleFiles, every_s: float) -> None:
    """Write the target-metric samples to a part file every ``every_s`` (off the loop)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        fut = loop.run_in_executor(None, samples.write_part, scraper.take_samples())
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:  # the run ends: this part must be on disk before the final roll
            await fut
            raise


async def _watch_self(state: RunState, metrics: ReplayerMetrics, every_s: float = 1.0,
                      probe: Callable[[], selfwatch.Reading] = selfwatch.Reading, repeat_s: float = 10.0) -> None:
    """Say loudly when the replayer, not the server, is the bottleneck: late sends and a busy
    event loop are the client's problem and would otherwise be reported as server latency.
    Checked every ``every_s`` (the first warning comes within about that much of falling behind);
    the warning names what is saturated (``replayer.selfwatch``: CPU, event loop, preparation,
    hand-over, launcher process, GC) from ``probe()`` readings, and is repeated at most every
    ``repeat_s`` while that list stays the same.
    (The numbers are also exported: replayer_dispatch_lag_seconds, replayer_event_loop_lag_*.)"""
    warned = False
    said_at, said = -float("inf"), None
    prev = probe()
    while True:
        await asyncio.sleep(every_s)
        cur = probe()
        lag, state.watch_max_lag_ms = state.watch_max_lag_ms, 0.0
        # both maxima are over this interval (the exported loop-lag gauge is over 10-20 s)
        loop_lag, metrics.loop_lag_recent_s = metrics.loop_lag_recent_s * 1e3, 0.0
        parts = selfwatch.saturated(prev, cur, loop_lag)
        prev = cur
        if lag > BEHIND_MS:
            names = [p.split(" (")[0] for p in parts]
            if names != said or time.monotonic() - said_at >= repeat_s:
                said, said_at = names, time.monotonic()
                log.warning("the replayer is behind schedule: max dispatch lag %.0f ms, event-loop lag %.0f ms "
                            "in the last %g s; saturated: %s; its own resources are the bottleneck (measured "
                            "latencies include client delay): use --workers, shards or a lower --speedup",
                            lag, loop_lag, every_s, "; ".join(parts) or "nothing measured (another process "
                            "takes the CPU?)")
            warned = True
        elif loop_lag > BEHIND_MS:  # sends on time (the launcher process), but reads waited
            log.warning("the replayer's event loop stalled for up to %.0f ms in the last %g s (requests still "
                        "went out on time, max dispatch lag %.1f ms): TTFT and ITL of tokens read then include "
                        "up to that much client delay", loop_lag, every_s, lag)
        elif warned:
            log.info("the replayer is back on schedule (max dispatch lag %.1f ms)", lag)
            warned, said = False, None


async def _open_pool(client: Client, n: int) -> None:
    """Open ``n`` keep-alive connections before the run is anchored, and say how long it took."""
    if not n:
        return
    t = now_ns()
    opened = await client.warm_up(n)
    log.info("opened %d keep-alive connections ahead of the first request in %.3f s (before the "
             "schedule's anchor)", opened, (now_ns() - t) / 1e9)


_NO_LAUNCHER = "the launcher process failed to start (%s); the event loop writes every request"


def _start_launcher() -> Launcher | None:
    launcher = Launcher()
    try:
        launcher.start()
    except OSError as e:
        log.warning(_NO_LAUNCHER, e)
        return None
    return launcher


async def _launcher_ready(launcher: Launcher) -> Launcher | None:
    try:
        await launcher.ready()
    except (OSError, RuntimeError) as e:
        log.warning(_NO_LAUNCHER, e)
        return None
    log.info("launcher process started (%s priority)", launcher.priority)
    return launcher


async def _progress(state: RunState, dispatcher: Dispatcher, anchor: Anchor, every_s: float = 5.0) -> None:
    if anchor.t0_ns - now_ns() > 1_000_000_000:  # a --start-at ahead
        log.info("waiting to start: %.0f s to go (at %s)", (anchor.t0_ns - now_ns()) / 1e9, _hms(anchor.wall_s))
    while True:
        await asyncio.sleep(every_s)
        t = (now_ns() - anchor.t0_ns) / 1e9
        if t < 0:
            log.info("waiting to start: %.0f s to go (at %s)", -t, _hms(anchor.wall_s))
            continue
        log.info("t=%.0fs sent %d/%s in-flight %d ok %d failed %d max lag %.1f ms (last %.0fs)",
                 t, state.sent, state.scheduled or "?", dispatcher.in_flight, state.completed, state.failed,
                 state.window_max_lag_ms, every_s)
        state.window_max_lag_ms = 0.0


def main_run(cfg: RunConfig, sim: tuple | None = None) -> int:
    """Run with uvloop. Exit code: 0 when the replay ended by itself (or by ``/stop``), 2 on a
    startup/trace error, 3 when more requests failed than ``--max-error-ratio`` allows, 128 + the
    signal's number when SIGTERM (143), SIGINT (130) or SIGHUP (129: the terminal closed, or the
    ``--workers`` parent is gone) stopped it,
    its results on disk and resumable (a Kubernetes Job then retries the pod, which resumes)."""
    import uvloop

    from .trace import TraceError

    # Worker threads (results writer, trace reader, scrape parser, metrics exposition) hold the
    # GIL in pure-Python stretches; a short switch interval gives it back to the loop quickly.
    sys.setswitchinterval(0.0005)
    # text or one JSON object per line (--log-format); the API key and control token are redacted
    setup_logging(cfg.log_format, cfg.log_level, secrets=(cfg.api_key(), cfg.control_token()),
                  fields={"shard": cfg.shard} if cfg.shard_index[1] > 1 else None)
    try:
        summary = uvloop.run(run_replay(cfg, sim=sim))
    except (StartupError, TraceError) as e:
        print(f"replayer: error: {e}", file=sys.stderr)
        return 2
    sig = summary.get("stop_signal") if isinstance(summary, dict) else None
    if sig:
        return 128 + signal.Signals[sig].value
    problem = error_ratio_problem(summary, cfg.max_error_ratio)
    if problem:
        print(f"replayer: {problem}", file=sys.stderr)
        return EXIT_ERROR_RATIO
    return 0
