"""A run's inputs (``Inputs``), gathered and checked before anything is sent (``open_inputs``):
the trace's batches (validated, endpoints and images checked against the settings), the results
folder, the target (started when embedded, waited for, its model), the metrics and the admin
server, where a resumed run starts again; and how many requests the schedule will send.

Everything here reads or waits; ``replayer.run.assemble`` then builds the run's parts from the
settings and these inputs without any I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

import replayer.record.lock as folder_lock
from replayer.config.model import RunConfig
from replayer.core.endpoints import TEXT_ONLY
from replayer.observe.admin import AdminServer
from replayer.observe.metrics import ReplayerMetrics
from replayer.observe.runlabels import RunInfo, RunLabels
from replayer.payload.imagerows import ImageEndpointError, check_image_endpoints, may_have_images
from replayer.record.folder import earlier_run, new_results_dir
from replayer.record.recorder import warm_up as recorder_warm_up
from replayer.results.traceinspect import GRIDS_NS
from replayer.run.enginecheck import engine_settings
from replayer.run.live import RunState, StatusView
from replayer.run.readiness import StartupError, wait_ready_all
from replayer.run.resume import resume_plan
from replayer.run.simproc import embedded_args, spawn_sim, stop_sim
from replayer.trace import TraceError, open_mix, open_trace, parse_mapping
from replayer.trace.synth import SynthSource
from replayer.trace.values import set_length_bound

log = logging.getLogger("replayer")


@dataclass(frozen=True)
class Inputs:
    """What a run found before it is assembled (``open_inputs``)."""

    cfg: RunConfig  # the settings as the target made them (its engine: replayer.run.enginecheck)
    open_batches: Callable[[], Iterable[Any]]  # a fresh iterator of the trace's batches (one pass)
    block_size: int  # the trace's hash-id block size
    n_rows: int | None  # rows of one pass (None: not known without reading them)
    targets: list[str]  # the target URLs (the embedded simulator's when none was given)
    model: str
    api_key: str | None
    results_dir: str
    metrics: ReplayerMetrics  # (served by the admin server since before the target was ready)
    state: RunState
    view: StatusView  # /status; the dispatcher joins it once built
    admin: AdminServer  # (the last scrape, a push or a linger, is its at the end: issue 46)
    run_id: str
    start_loop: int = 0  # resume: the pass it starts in
    skip: Callable[[int, np.ndarray], np.ndarray] | None = None  # resume: the rows already recorded


async def open_inputs(
    cfg: RunConfig,
    stack: contextlib.AsyncExitStack,
    *,
    state: RunState,
    registry: CollectorRegistry,
    sim: tuple | None = None,
) -> Inputs:
    """Gather the run's inputs; what needs closing after the summary (the embedded simulator,
    the admin server, an empty results folder this run made when nothing was sent) is pushed on
    ``stack``. Raises StartupError (nothing sent) or trace.TraceError."""
    if sim is not None:  # (stopped whatever happens, used only without --target)
        stack.push_async_callback(_stop_sim, sim[0])
    # warm the results writer in a thread while the trace loads and the target comes up
    warming = asyncio.get_running_loop().run_in_executor(None, recorder_warm_up)
    open_batches, block_size, n_rows, span_s = open_batches_factory(cfg)
    check_tracing(cfg)
    results_dir, created = results_dir_for(cfg)  # (locked: one writer per folder, issue 47)
    if created:
        stack.push(_forget_if_empty(cfg, results_dir))
    stack.callback(release_results_dir, results_dir)  # (the lock first: then an empty folder goes)
    state.results = results_dir
    metrics = ReplayerMetrics(
        registry,
        config_info={
            "speedup": str(cfg.speedup),
            "trace": os.path.basename(cfg.trace_label),
            "endpoint": cfg.endpoint,
            "shard": cfg.shard,
            "loop": cfg.loop,
        },
        window_s=cfg.metrics_window_s,
    )
    rows = min(n_rows, cfg.max_requests) if n_rows and cfg.max_requests else n_rows
    metrics.set_trace(rows=rows or 0, duration_s=span_s or 0.0, speedup=cfg.speedup)
    view = StatusView(state, metrics)
    admin = await _serve_admin(cfg, stack, registry, metrics, state, view)
    targets = cfg.targets
    if not targets:  # only once the trace, the folder and the port are good (issue 47)
        sim_proc, embedded = sim or _spawn_embedded(cfg)
        if sim is None:
            stack.push_async_callback(_stop_sim, sim_proc)
        targets = [embedded]
    api_key = cfg.api_key()
    state.target = ", ".join(targets)
    cfg, model = await _target_model(cfg, targets, api_key)
    RunInfo(registry, model=model, targets=targets, shard=cfg.shard, trace=os.path.basename(cfg.trace_label))
    await warming
    start_loop, skip = resume_plan(results_dir, cfg) if cfg.resume else (0, None)
    return Inputs(
        cfg, open_batches, cfg.block_size or block_size, n_rows, list(targets), model, api_key, results_dir,
        metrics, state, view, admin, str(cfg.run_id), start_loop, skip,
    )  # fmt: skip


def _spawn_embedded(cfg: RunConfig) -> tuple:
    """The embedded simulator for a run without ``--target`` (its process, its URL)."""
    sim_proc, embedded = spawn_sim(
        embedded_args(
            cfg.tokenizer,
            cfg.otlp_traces_url(),
            ttft_drift=cfg.sim_ttft_drift_ms_per_min,  # (issue 45: the drift verdict's test aid)
            itl_drift=cfg.sim_itl_drift_ms_per_min,
        )
    )
    log.info("no --target: starting the embedded simulator at %s", embedded)
    return sim_proc, embedded


async def _stop_sim(proc: Any) -> None:
    await asyncio.get_running_loop().run_in_executor(None, stop_sim, proc)


async def _serve_admin(
    cfg: RunConfig,
    stack: contextlib.AsyncExitStack,
    registry: CollectorRegistry,
    metrics: ReplayerMetrics,
    state: RunState,
    view: StatusView,
) -> AdminServer:
    """The admin server (``/metrics`` with the run id on every series, ``/status``, control: its
    changes recorded as the run's events), up while the target is waited for."""
    admin = AdminServer(
        RunLabels(registry, {"run_id": str(cfg.run_id)}),
        status=view,
        ready=lambda: state.state == "running",  # draining too (derived in live.status)
        control=lambda: metrics.events.control(view.control),
        token=cfg.control_token(),
    )
    try:
        admin_url = await admin.start(cfg.admin_host, cfg.admin_port)
    except OSError as e:  # (the port in use: another replayer, or two `make run`s)
        raise StartupError(
            f"--admin-port {cfg.admin_port} on {cfg.admin_host}: {e.strerror or e} (--admin-port 0 takes a free port)"
        ) from None
    stack.push_async_callback(admin.stop)
    log.info("admin server on %s (/metrics, /status)", admin_url)
    return admin


async def _target_model(cfg: RunConfig, targets: list[str], api_key: str | None) -> tuple[RunConfig, str]:
    """Every target waited for; the model (``--model``, else the first target's first) and the
    settings with the target's engine (``replayer.run.enginecheck``)."""
    listed = await wait_ready_all(targets, cfg.ready_timeout_s if cfg.target else 30.0, api_key, cfg.tls)
    model = cfg.model or (listed[0][0] if listed[0] else None)
    if model is None:
        raise StartupError(f"target {targets[0]} lists no model: pass --model")
    return await engine_settings(cfg, targets, listed, model, api_key), model


def _forget_if_empty(cfg: RunConfig, results_dir: str) -> Callable[..., bool]:
    """An exit callback: a run that could not start (nothing sent) removes the folder it made
    when it holds nothing (an empty parts/ at most), and ./results itself if that left it empty."""

    def forget(exc_type: type[BaseException] | None, *_: object) -> bool:
        if exc_type is None or not issubclass(exc_type, StartupError | TraceError):
            return False
        if not any(files for _, _, files in os.walk(results_dir)):
            shutil.rmtree(results_dir, ignore_errors=True)
            if cfg.results is None:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(results_dir))
        return False

    return forget


def check_tracing(cfg: RunConfig) -> None:
    """Tracing asked for without the OpenTelemetry SDK installed: a start-up error (nothing sent)."""
    if cfg.otlp_traces_url() is None:
        return
    import importlib.util

    for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise StartupError(
                f"tracing (--otlp-endpoint {cfg.otlp_traces_url()}) needs the OpenTelemetry SDK and its OTLP/HTTP "
                "exporter: pip install 'replayer[otel]'"
            )


def results_dir_for(cfg: RunConfig) -> tuple[str, bool]:
    """The results folder, created if needed and locked for this run (``record.lock``: released
    by ``release_results_dir``): (path, whether this call created it). Without ``--results``: a
    new ``results/<timestamp>`` (``-2``, ``-3``... when runs start in the same second). Raises
    StartupError when the path is a file, cannot be created, has another writer, or (without
    ``--resume``) already holds a run's results."""
    if cfg.resume:
        _lock(cfg.resume, "--resume")
        return cfg.resume, False  # (resume_plan checks it)
    if cfg.results is None:
        try:
            path = new_results_dir()
        except OSError as e:
            raise StartupError(f"cannot create a results folder under ./results: {e.strerror or e}") from None
        _lock(path, "--results")
        return path, True
    path = cfg.results
    created = False
    if not os.path.exists(path):
        try:
            os.makedirs(path)
            created = True
        except FileExistsError:  # (another run made it first: its lock says who)
            pass
        except OSError as e:
            raise StartupError(f"--results {path}: cannot create the folder: {e.strerror or e}") from None
    if not os.path.isdir(path):  # (a traceback before)
        raise StartupError(f"--results {path}: exists and is not a folder")
    _lock(path, "--results")
    used = earlier_run(path)
    if used:
        folder_lock.release(path)
        raise StartupError(f"--results {path}: {used}")
    return path, created


def _lock(path: str, flag: str) -> None:
    """Take ``path``'s writer lock, or raise StartupError naming its holder."""
    try:
        folder_lock.acquire(path, "run")
    except folder_lock.FolderBusy as e:
        raise StartupError(f"{flag} {e}") from None
    except OSError as e:
        raise StartupError(f"{flag} {path}: cannot lock the folder: {e.strerror or e}") from None


def release_results_dir(path: str | None) -> None:
    """Let go of the run's lock on its results folder (taken by ``results_dir_for``)."""
    if path is not None:
        folder_lock.release(path)


BATCH_ROWS = 65_536
#: the requests a run will send are counted ahead (``count_scheduled``, a pass over the trace
#: before the start: ~2 ms per 1,000 rows) when at most this many schedule entries are read:
#: every pass of a trace of this size, or under ``--duration`` the entries due before its end
COUNT_LIMIT = 250_000


def count_scheduled(
    schedule, *, speedup: float, duration_ns: int | None = None, rebase: bool = False, limit: int = COUNT_LIMIT
) -> int | None:
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
    batch is checked as it is read. A synthetic load (``--request-rate``) is generated batch by
    batch, the same rows on every pass (``replayer.trace.synth.SynthSource``)."""
    opts: dict[str, Any] = dict(
        fmt=cfg.format, block_size=cfg.block_size, strict=cfg.strict, mapping=cfg.map, time_unit=cfg.time_unit
    )
    spec = cfg.synthetic_spec()
    if spec is not None:
        bs = cfg.synthetic_block_size
        if cfg.prefix_len % bs:
            log.warning(
                "--prefix-len %d: its first %d tokens are shared (whole %d-token blocks, --block-size or "
                "--kv-block-size: what a server with that block size can hit), the rest is each request's own",
                cfg.prefix_len,
                cfg.prefix_len // bs * bs,
                bs,
            )
        synthetic = SynthSource(spec)
        span_ns = synthetic.span_ns(cfg.max_requests)
        return (
            (lambda: synthetic.batches(BATCH_ROWS)),
            synthetic.block_size,
            synthetic.num_rows,
            span_ns / 1e9 if span_ns is not None else None,
        )
    assert cfg.trace is not None  # (RunConfig: a trace or a synthetic load)
    set_length_bound(cfg.max_trace_length)  # (issue 47: a length beyond any model is refused)
    if cfg.mix:  # several traces (tenants) on one clock: replayer.trace.mix
        source = open_mix(
            [dataclasses.replace(e, hash_id_scope=e.hash_id_scope or cfg.hash_id_scope) for e in cfg.mix_entries],
            **opts,
        )
    else:
        source = open_trace(cfg.trace, **opts)
    if cfg.validate_trace == "full":
        source.validate()
    if not cfg.tokenizer and may_have_endpoints(source, cfg):
        check_endpoints(source.batches(BATCH_ROWS), cfg.trace)
    if may_have_images(source, cfg.map):
        try:
            check_image_endpoints(source.batches(BATCH_ROWS), cfg.trace, cfg.endpoint)
        except ImageEndpointError as e:
            raise StartupError(str(e)) from None
    warn_coarse_grid(source, cfg.trace_label)  # (issue 47)
    span_ns = source.span_ns(cfg.max_requests)
    span_s = span_ns / 1e9 if span_ns is not None else None
    return (lambda: source.batches(BATCH_ROWS)), source.block_size, source.num_rows, span_s


def coarse_grid(timestamp_ns: np.ndarray) -> str | None:
    """The trace's timestamp grid (``trace inspect``'s: the coarsest of 1 s .. 1 us that every
    offset is a multiple of) when it is coarser than 1 ms, else None (also for fewer than 2 rows)."""
    if len(timestamp_ns) < 2:
        return None
    for label, g in GRIDS_NS:
        if g <= 1_000_000:
            return None
        if not (timestamp_ns % g).any():
            return label
    return None


def warn_coarse_grid(source: Any, label: str) -> None:
    """Warn when the trace's first batch has timestamps on a grid coarser than 1 ms: requests
    that arrived apart replay together, as bursts at each grid step."""
    first = next(iter(source.batches(BATCH_ROWS)), None)
    grid = coarse_grid(np.asarray(first.timestamp_ns)) if first is not None else None
    if grid is not None:
        log.warning(
            "%s: the trace's timestamps are on a %s grid: requests that arrived apart within a step replay "
            "together, as a burst at each step (trace inspect shows the grid; a finer trace replays arrivals "
            "as they came)",
            label,
            grid,
        )


def may_have_endpoints(source, cfg: RunConfig) -> bool:
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
            raise StartupError(
                f"{trace}: rows for {', '.join(sorted(bad))} need text prompts: pass "
                "--tokenizer PATH (token-id prompts cannot go to these endpoints)"
            )
