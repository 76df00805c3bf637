"""Which part of a run gets which setting (replayer.run.assemble), read from the parts
``assemble`` builds, with no server, no file and no event loop: the constructors only. And
``assemble`` does no I/O: under an audit hook it opens no file, socket or process."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry

from replayer.config import RunConfig
from replayer.observe import AdminServer, ReplayerMetrics
from replayer.run.assemble import CONNECT_AHEAD_NS, Parts, assemble
from replayer.run.fanout import EventStream
from replayer.run.inputs import Inputs
from replayer.run.live import RunState, StatusView
from replayer.send.sender import LAUNCH_AHEAD_NS

TRACE = "traces/mooncake_conversation_10min.parquet"
ONE, TWO = "http://127.0.0.1:1", "http://127.0.0.1:2"


def _inputs(cfg: RunConfig, *, block_size: int = 512, start_loop: int = 0) -> Inputs:
    state = RunState()
    registry = CollectorRegistry()
    metrics = ReplayerMetrics(registry)
    view = StatusView(state, metrics)
    return Inputs(
        cfg=cfg,
        open_batches=lambda: iter(()),
        block_size=block_size,
        n_rows=10,
        targets=cfg.targets,
        model="m",
        api_key="k",
        results_dir="/nonexistent/results",
        metrics=metrics,
        state=state,
        view=view,
        admin=AdminServer(registry, status=view, ready=lambda: False),  # (built, never started)
        run_id="run1",
        start_loop=start_loop,
    )


def _parts(targets: list[str] | None = None, **settings) -> Parts:
    cfg = RunConfig(trace=TRACE, target=targets or [ONE], **settings)
    return assemble(cfg, _inputs(cfg))


def test_the_defaults_one_target_the_launcher_writes_ahead_and_no_optional_subscriber():
    p = _parts()
    assert p.writes_ahead and p.planner.ahead_ns == LAUNCH_AHEAD_NS  # the launcher's sender takes requests early
    assert p.planner.connect_ahead_ns == CONNECT_AHEAD_NS and p.planner.duration_ns is None
    assert p.planner.lead_ns == p.lead_ns == int(p.cfg.lead_s * 1e9)
    assert p.warmup is None and p.tenants is None and p.targets is None  # each only when asked for
    assert p.factory.targets is None and p.factory.trace_context is None
    assert p.gap_cap is None and not p.rebase
    assert p.dispatcher_options == {
        "drain_timeout_s": p.cfg.drain_timeout_s,
        "shard": 0,
        "max_concurrency": None,
        "until_stop": False,
    }


def test_the_event_stream_is_one_and_the_factory_and_every_client_get_it():
    p = _parts([ONE, TWO])
    assert isinstance(p.events, EventStream) and p.events.steps == ()  # subscribers attached at the anchor
    assert p.factory.events is p.events and p.client_options["events"] is p.events


def test_request_settings_go_to_the_factory():
    p = _parts(
        endpoint="/v1/chat/completions",
        tokenizer="builtin:gpt2",
        prompt_mode="text",
        session_policy="off",
        session_header="x-session-id",
        image_size="64x64",
        image_format="jpeg",
        image_cache_mb=8,
        shard="1/2",
        seed=7,
        otlp_endpoint="http://127.0.0.1:4318",
        trace_sample_ratio=0.5,
    )
    f = p.factory
    assert f.default_endpoint == "/v1/chat/completions" and not f.sessions and f.shard == 1
    assert f.run_id == "run1" and f.session_header is not None
    assert (f.image_size, f.image_format, f.image_cache_mb) == ("64x64", "jpeg", 8)
    assert f.trace_context is not None and f.trace_context.ratio == 0.5
    assert f.prompts.block_size == 512 and f.prompts.seed == 7 and f.prompts.tokenizer == "builtin:gpt2"
    assert f.payload.for_row(None, None, None).body(b"[1]", 1).startswith(b'{"model":"m"')


def test_the_trace_block_size_is_taken_unless_block_size_is_set():
    assert _parts().factory.prompts.block_size == 512  # the trace's (inputs)
    cfg = RunConfig(trace=TRACE, target=[ONE], block_size=16)
    p = assemble(cfg, _inputs(cfg, block_size=16))
    assert p.factory.prompts.block_size == 16


def test_a_cap_sends_from_the_loop_at_the_due_time_and_goes_to_the_dispatcher():
    p = _parts(max_concurrency=4)
    assert not p.writes_ahead and p.planner.ahead_ns == 0
    assert p.dispatcher_options["max_concurrency"] == 4
    assert not _parts(launcher=False).writes_ahead


def test_pace_settings_go_to_the_planner_and_the_dispatcher():
    p = _parts(duration_s=30, lead_s=0.25, drain_timeout_s=7, loop="forever", shard="1/2")
    assert p.planner.duration_ns == p.duration_ns == 30_000_000_000
    assert p.planner.lead_ns == 250_000_000 and p.lead_ns == 250_000_000
    assert p.dispatcher_options == {"drain_timeout_s": 7, "shard": 1, "max_concurrency": None, "until_stop": True}
    assert _parts(duration_s=0.1, lead_s=0.25).lead_ns == 100_000_000 - 1  # the prebuild stays inside --duration


def test_connection_settings_go_to_every_client():
    o = _parts(
        connect_timeout_s=3, read_timeout_s=9, request_timeout_s=20, retry_max=2, retry_backoff_s=0.1, delayed_ack=True
    ).client_options
    assert o["connect_timeout_s"] == 3 and o["read_timeout_s"] == 9 and o["request_timeout_s"] == 20
    assert o["retry_max"] == 2 and o["retry_backoff_s"] == 0.1 and o["delayed_ack"] is True
    assert o["api_key"] == "k" and o["endpoint"] == "/v1/completions"
    assert _parts(read_timeout_s=0).client_options["read_timeout_s"] is None  # 0: wait forever


def test_results_settings_go_to_the_recorder_and_its_files_metadata():
    p = _parts(flush_rows=11, flush_interval_s=0.5, roll_rows=1000, itl_format="sketch")
    o = p.recorder_options
    assert (o["flush_rows"], o["flush_interval_s"], o["roll_rows"], o["itl_format"]) == (11, 0.5, 1000, "sketch")
    assert p.metadata["replayer.run_id"] == "run1" and p.metadata["replayer.model"] == "m"
    assert p.metadata["replayer.target"] == ONE and "replayer.t0_wall_s" not in p.metadata  # (taken at the anchor)


def test_optional_subscribers_exist_only_when_asked_for():
    p = _parts([ONE, TWO], warmup_requests=3, warmup_seconds_s=2)
    assert p.warmup is not None and (p.warmup.left, p.warmup.until_ns) == (3, 2_000_000_000)
    assert p.targets is not None and p.factory.targets == [ONE, TWO]  # the route's index -> URL


def test_a_resumed_run_rebases_its_schedule_but_a_fleet_shard_does_not(tmp_path):
    assert _parts(resume=str(tmp_path)).rebase
    assert not _parts(resume=str(tmp_path), coordinator="http://127.0.0.1:3").rebase


def test_assemble_does_no_io():
    targets = [ONE, TWO]
    cfg = RunConfig(trace=TRACE, target=targets, warmup_requests=1, otlp_endpoint="http://127.0.0.1:4318")
    assemble(cfg, _inputs(cfg))  # (a first call imports what the constructors import lazily)
    inputs = _inputs(cfg)
    seen: list[str] = []
    watching = True

    def hook(event: str, args: tuple) -> None:
        if watching and event.split(".")[0] in ("open", "socket", "subprocess", "os", "shutil"):
            seen.append(event)

    sys.addaudithook(hook)  # (it cannot be removed: it stops watching below)
    try:
        parts = assemble(cfg, inputs)
    finally:
        watching = False
    assert seen == [] and parts.factory is not None


@pytest.mark.parametrize("settings", [{}, {"max_concurrency": 2}, {"idle_gap_cap_s": 5.0}])
def test_the_schedule_is_lazy_until_read(settings):
    read: list[int] = []

    def open_batches():
        read.append(1)
        return iter(())

    cfg = RunConfig(trace=TRACE, target=[ONE], **settings)
    inputs = Inputs(**{**_inputs(cfg).__dict__, "open_batches": open_batches})
    p = assemble(cfg, inputs)
    assert read == []  # nothing read until the start-up's first batch
    assert list(p.batches) == [] and read == [1]
    assert (p.gap_cap is not None) == ("idle_gap_cap_s" in settings)
