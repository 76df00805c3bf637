"""The run put together: ``assemble(cfg, inputs) -> Parts`` calls the parts' constructors with
their settings and does no I/O, so which part gets which setting is read here and checked by a
unit test (tests/test_assemble.py).

The parts built here are those a constructor makes whole: the schedule (lazy: no batch read
yet), the prompts and the payload, the request factory, the planner and its session gate, the
event stream (``EventStream``, its subscribers attached once the recorder exists) and the
subscribers that need nothing opened. What must be opened, started or waited for (the launcher
process, the connection pools, the span exporter, the recorder's files, the anchor) is built by
the lifecycle's start-up steps (``replayer.run.startup``) from the options kept here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from replayer import __version__
from replayer.config.model import RunConfig
from replayer.core.tracecontext import TraceContext
from replayer.http.servertimings import REQUEST_FIELD as SERVER_TIMINGS_FIELD
from replayer.observe.streamcheck import BufferedStreams
from replayer.payload.body import PayloadBuilder
from replayer.payload.loopprompts import Prompts
from replayer.payload.prepare import RequestFactory
from replayer.plan.planner import Planner
from replayer.plan.schedule import IdleGapCap, ScheduleBatch, Timeline, iter_schedule
from replayer.plan.sessions import SessionGate
from replayer.results.fidelity import FidelityBounds
from replayer.results.removed import digest_file
from replayer.results.targets import TargetMetrics
from replayer.results.tenants import TenantMetrics
from replayer.results.verdictwatch import VerdictWatch
from replayer.run.fanout import Accounting, EventStream, WarmupEnd, WarmupMarker
from replayer.run.inputs import Inputs
from replayer.send.routing import TargetRoute
from replayer.send.sender import LAUNCH_AHEAD_NS

__all__ = ["CONNECT_AHEAD_NS", "Parts", "assemble"]

#: the requests due within this horizon are counted for the client to open connections ahead
CONNECT_AHEAD_NS = 100_000_000


@dataclass(frozen=True)
class Parts:
    """A run's parts, built from its settings and inputs (``assemble``)."""

    cfg: RunConfig
    inputs: Inputs
    events: EventStream  # the one event stream: the factory, the dispatcher and every client tell it
    timeline: Timeline
    gap_cap: IdleGapCap | None  # --idle-gap-cap: the schedule's (its report goes in the summary)
    batches: Iterator[ScheduleBatch]  # the schedule (lazy: nothing read yet)
    schedule: Callable[[], Iterator[ScheduleBatch]]  # a fresh pass over it, to count what it sends
    factory: RequestFactory
    planner: Planner
    live: Accounting  # the live state's subscriber
    warmup: WarmupMarker | None  # --warmup-*: marks warm-up requests as they go out
    warmup_end: WarmupEnd | None  # --warmup-*: the run's event at the warm-up's end (issue 46)
    verdicts: VerdictWatch  # the live fidelity figures and drift windows (issue 45)
    checks: BufferedStreams  # the run's self-check: a stream that arrives all at once (issue 47)
    tenants: TenantMetrics | None  # a mix: per-tenant series
    targets: TargetMetrics | None  # several targets: per-target series
    writes_ahead: bool  # the launcher process writes requests at their due time
    duration_ns: int | None  # --duration
    rebase: bool  # the schedule's time zero is its first request's (a resumed run, not a fleet shard's)
    lead_ns: int  # how far ahead requests are built (the first window before the anchor)
    client_options: dict[str, Any]  # each target's Client (replayer.run.clients)
    recorder_options: dict[str, Any]  # the Recorder, built at the anchor (its files' metadata then)
    dispatcher_options: dict[str, Any]  # the Dispatcher, built at the anchor
    metadata: dict[str, str]  # every results file's, less the anchor's wall time


def assemble(cfg: RunConfig, inputs: Inputs) -> Parts:
    """The parts of the run ``cfg`` describes, on ``inputs`` (module docstring). Constructors only:
    no socket, thread or process opened, no file written; the one file read is ``--tokenizer``'s
    vocabulary, by the prompts (token ids and texts are built from it)."""
    shard, shards = cfg.shard_index
    targets = inputs.targets
    timeline = Timeline(cfg.speedup)
    events = EventStream()
    gap_cap = _gap_cap(cfg)
    route = TargetRoute(cfg.target_policy, len(targets)) if len(targets) > 1 else None
    schedule = functools.partial(
        iter_schedule,
        inputs.open_batches,
        loops=cfg.loops,
        loop_gap_ns=int(cfg.loop_gap_s * 1e9),
        shard=shard,
        shards=shards,
        max_requests=cfg.max_requests,
        start_loop=inputs.start_loop,
        skip=inputs.skip,
    )
    duration_ns = int(cfg.duration_s * 1e9) if cfg.duration_s else None
    rebase = bool(cfg.resume) and cfg.coordinator is None  # (a fleet shard keeps the fleet's schedule)
    lead_ns = int(cfg.lead_s * 1e9)
    writes_ahead = cfg.launcher and cfg.max_concurrency is None  # (a cap sends at the due time from the loop)
    planner = Planner(
        timeline,
        gate=SessionGate(cfg.session_policy, scale=lambda ns: round(ns / timeline.speedup)),
        lead_ns=lead_ns,
        duration_ns=duration_ns,
        rebase_first=rebase,
        ahead_ns=LAUNCH_AHEAD_NS if writes_ahead else 0,  # (the launcher's sender takes requests this early)
        connect_ahead_ns=CONNECT_AHEAD_NS,
    )
    metrics = inputs.metrics
    warmup = bool(cfg.warmup_requests or cfg.warmup_seconds_s)
    return Parts(
        cfg=cfg,
        inputs=inputs,
        events=events,
        timeline=timeline,
        gap_cap=gap_cap,
        batches=schedule(gap_cap=gap_cap, route=route),
        schedule=lambda: schedule(gap_cap=_gap_cap(cfg)),  # (a cap keeps state: one per pass)
        factory=_factory(cfg, inputs, timeline, events),
        planner=planner,
        live=Accounting(inputs.state),
        warmup=WarmupMarker(cfg.warmup_requests, cfg.warmup_seconds_s) if warmup else None,  # (one for all targets)
        warmup_end=WarmupEnd(metrics.events.record) if warmup else None,
        verdicts=VerdictWatch(
            metrics.registry,
            window_s=cfg.drift_window_s,
            bounds=FidelityBounds(max_lag_ms=cfg.fidelity_max_lag_ms),
            max_concurrency=cfg.max_concurrency,
            min_change_pct=cfg.drift_min_change_pct,
            reference=cfg.drift_reference,  # (issue 45: --drift-reference)
        ),
        checks=BufferedStreams(),
        tenants=TenantMetrics(metrics.registry, [e.tenant for e in cfg.mix_entries]) if cfg.mix else None,
        targets=TargetMetrics(metrics.registry, targets) if len(targets) > 1 else None,
        writes_ahead=writes_ahead,
        duration_ns=duration_ns,
        rebase=rebase,
        lead_ns=lead_ns if not duration_ns else min(lead_ns, duration_ns - 1),
        client_options=client_options(cfg, inputs.api_key, events),
        recorder_options=recorder_options(cfg),
        dispatcher_options={
            "drain_timeout_s": cfg.drain_timeout_s,
            "shard": shard,
            "max_concurrency": cfg.max_concurrency,
            "until_stop": cfg.loops is None,  # --loop forever: what is scheduled ends at the stop
        },
        metadata={
            "replayer.version": __version__,
            "replayer.trace": os.path.abspath(cfg.trace) if cfg.trace is not None else "synthetic",
            "replayer.target": ",".join(targets),
            "replayer.model": inputs.model,
            "replayer.config": cfg.model_dump_json(),
            "replayer.run_id": inputs.run_id,
        },
    )


def _gap_cap(cfg: RunConfig) -> IdleGapCap | None:
    return IdleGapCap(cfg.idle_gap_cap_s, cfg.speedup) if cfg.idle_gap_cap_s else None


def _factory(cfg: RunConfig, inputs: Inputs, timeline: Timeline, events: EventStream) -> RequestFactory:
    """The request factory: prompts, payload, request ids and trace context, images, the route's
    targets; it tells ``events`` of each request it hands out."""
    otlp_url = cfg.otlp_traces_url()
    prompts = Prompts(
        inputs.block_size,
        seed=cfg.seed,
        loop_salt=cfg.loop_salt,
        vocab_range=cfg.vocab_bounds,
        tokenizer=cfg.tokenizer,
        kv_block_size=cfg.kv_block_size,
        cache_tokens=cfg.expected_cache_tokens,
    )
    payload = PayloadBuilder(
        inputs.model,
        vllm_extensions=cfg.vllm_extensions,
        engine=cfg.engine,
        chat="chat/completions" in cfg.endpoint,
        extra={SERVER_TIMINGS_FIELD: True} if cfg.server_timings else None,
    )
    return RequestFactory(
        prompts,
        payload,
        timeline,
        endpoint=cfg.endpoint,
        text_mode=cfg.prompt_mode == "text",
        sessions=cfg.session_policy != "off",
        shard=cfg.shard_index[0],
        run_id=inputs.run_id,  # X-Request-Id: <run_id>-<loop>-<row>
        session_header=cfg.session_header,
        image_size=cfg.image_size,
        image_format=cfg.image_format,
        image_token_rule=cfg.image_token_rule,
        image_cache_mb=cfg.image_cache_mb,
        trace_context=None
        if otlp_url is None
        else TraceContext(inputs.run_id, ratio=cfg.trace_sample_ratio, seed=cfg.seed, tracestate=cfg.trace_state),
        targets=inputs.targets if len(inputs.targets) > 1 else None,
        events=events,
    )


def client_options(cfg: RunConfig, api_key: str | None, events: EventStream) -> dict[str, Any]:
    """Each target's ``Client`` settings (``replayer.run.clients.open_clients``)."""
    return {
        "endpoint": cfg.endpoint,
        "api_key": api_key,
        "connect_timeout_s": cfg.connect_timeout_s,
        "read_timeout_s": cfg.read_timeout_s or None,
        "request_timeout_s": cfg.request_timeout_s,
        "retry_max": cfg.retry_max,
        "retry_backoff_s": cfg.retry_backoff_s,
        "usage_slack_tokens": cfg.usage_slack_tokens,
        "delayed_ack": cfg.delayed_ack,
        "server_timings": cfg.server_timings,
        "tls": cfg.tls,
        "events": events,
    }


def recorder_options(cfg: RunConfig) -> dict[str, Any]:
    """The ``Recorder``'s settings (its folder, metadata and checkpoint are given at the anchor)."""
    return {
        "flush_rows": cfg.flush_rows,
        "flush_interval_s": cfg.flush_interval_s,
        "roll_rows": cfg.roll_rows,
        "roll_interval_s": cfg.roll_interval_s,
        "itl_format": cfg.itl_format,
        "retain_bytes": cfg.retain_bytes,
        "retain_age_s": cfg.retain_age_s,
        "digest": digest_file,
    }
