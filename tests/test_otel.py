"""OpenTelemetry (--otlp-endpoint): every replayed request a CLIENT span, exported over OTLP/HTTP
to a real receiver on 127.0.0.1 (tests/otlpreceiver.py decodes the protobuf), its traceparent in
the request, the simulator's llm_request SERVER span its child; sampling; a refusing or hanging
collector changes nothing in the results and its spans are counted as dropped."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import pytest
from faultserver import DONE, Plan, ThreadedFaultServer, choice, usage_event
from otlpreceiver import CLIENT, INTERNAL, SERVER, Receiver
from prometheus_client import CollectorRegistry

from replayer.core.tracecontext import TraceContext, parse_traceparent

pytest.importorskip("opentelemetry.sdk")


def _trace(tmp_path, n: int, gap_ms: int = 5, out: int = 4):
    rows = [
        {"timestamp": i * gap_ms, "input_length": 17 + i % 15, "output_length": out, "hash_ids": [i, 1000 + i]}
        for i in range(n)
    ]
    rows[1]["session_id"] = "conv-1"
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path, trace, target: str, otlp: str | None, **kw):
    from replayer.config import load_config

    return load_config(
        {
            "trace": str(trace),
            "block_size": 16,
            "target": target,
            "otlp_endpoint": otlp,
            "results": str(tmp_path / "res"),
            "admin_port": 0,
            "quiet": True,
            "warm_connections": 2,
            "scrape_target_metrics": False,
            **kw,
        }
    )


def _results(tmp_path):
    from replayer.results import read_results

    return read_results(str(tmp_path / "res")).to_pylist()


async def _replay_against_sim(cfg_of, sim_otlp: str | None):
    from replayer.run import run_replay
    from replayer.sim import SimConfig, SimServer

    sim = SimServer(SimConfig(otlp_endpoint=sim_otlp, itl_base_ms=1.0, ttft_base_ms=5.0))
    url = await sim.start("127.0.0.1", 0)
    try:
        registry = CollectorRegistry()
        summary = await asyncio.wait_for(run_replay(cfg_of(url), registry=registry), 120)
    finally:
        await sim.stop()
    return summary, registry


def test_every_request_one_client_span_equal_to_results_and_the_sims_span_its_child(tmp_path):
    trace = _trace(tmp_path, 12)
    with Receiver() as rx:
        summary, registry = asyncio.run(
            _replay_against_sim(lambda url: _cfg(tmp_path, trace, url, rx.url, run_id="otelrun"), rx.url)
        )
        spans = rx.wait_for(
            lambda s: sum(x["kind"] == SERVER for x in s) >= 12 and any(x["kind"] == INTERNAL for x in s)
        )
    rows = _results(tmp_path)
    assert len(rows) == 12 and all(r["outcome"] == "success" for r in rows)
    clients = [s for s in spans if s["kind"] == CLIENT]
    servers = [s for s in spans if s["kind"] == SERVER]
    runs = [s for s in spans if s["kind"] == INTERNAL]
    ids = TraceContext("otelrun")
    assert len(clients) == 12 and len(servers) == 12 and len(runs) == 1
    by_row = {}
    for s in clients:
        key = (s["attributes"]["replayer.loop"], s["attributes"]["replayer.row"])
        assert key not in by_row  # exactly one span per request
        by_row[key] = s
    t0_wall_ns = None
    for r in rows:
        s = by_row[(r["loop"], r["row"])]
        a = s["attributes"]
        assert s["trace_id"] == ids.trace_id_hex
        assert s["span_id"] == f"{ids.span_id(r['loop'], r['row']):016x}"
        assert s["parent_span_id"] == runs[0]["span_id"]
        assert s["name"] == "text_completion sim-model"
        assert a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "sim-model"
        assert a["gen_ai.request.max_tokens"] == r["max_tokens"]
        assert a["gen_ai.request.stream"] is True
        assert a["gen_ai.response.finish_reasons"] == (r["finish_reason"],)
        assert a["gen_ai.usage.input_tokens"] == r["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == r["completion_tokens"]
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(r["ttft_ms"] / 1000.0, rel=1e-12)
        assert a.get("gen_ai.conversation.id") == r["session_id"]
        assert a["server.address"] == "127.0.0.1" and a["server.port"] > 0
        assert "error.type" not in a
        for k in ("ttft_ms", "e2e_ms", "dispatch_lag_ms", "ttft_from_due_ms", "e2el_from_due_ms"):
            assert a[f"replayer.{k}"] == r[k]
        assert a["replayer.due_ns"] == r["due_ns"]
        assert a["replayer.x_request_id"] == r["x_request_id"] == f"otelrun-{r['loop']}-{r['row']}"
        assert a["replayer.expected_prefix_hit_tokens"] == r["expected_prefix_hit_tokens"]
        # the span's times: the results' monotonic offsets through one wall-clock mapping
        off = s["start"] - r["sent_ns"]
        t0_wall_ns = off if t0_wall_ns is None else t0_wall_ns
        assert off == t0_wall_ns
        assert s["end"] - off == r["end_ns"]
        assert dict(s["events"]) == {"first_token": r["first_token_ns"] + off, "last_token": r["last_token_ns"] + off}
        # no prompt text or token id anywhere
        assert not any(isinstance(v, tuple) and len(v) > 1 for v in a.values())
    # the simulator's llm_request span is the child of the request's CLIENT span (the traceparent it got)
    client_ids = {s["span_id"]: s for s in clients}
    for sv in servers:
        assert sv["name"] == "llm_request" and sv["trace_id"] == ids.trace_id_hex
        parent = client_ids[sv["parent_span_id"]]
        pa, sa = parent["attributes"], sv["attributes"]
        assert sa["gen_ai.request.id"] == pa["replayer.x_request_id"]
        assert sa["gen_ai.usage.prompt_tokens"] == pa["gen_ai.usage.input_tokens"]
        assert sa["gen_ai.usage.completion_tokens"] == pa["gen_ai.usage.output_tokens"]
        for k in ("time_in_queue", "time_to_first_token", "time_in_model_prefill", "time_in_model_decode", "e2e"):
            assert sa[f"gen_ai.latency.{k}"] >= 0
        assert sa["gen_ai.latency.time_to_first_token"] * 1000 <= pa["replayer.ttft_ms"]
    run = runs[0]["attributes"]
    assert run["replayer.run_id"] == "otelrun" and run["replayer.shard"] == "0/1"
    assert run["replayer.summary.completed"] == 12 and run["replayer.summary.sent"] == 12
    assert summary["otel"]["spans_exported"] == 13 and summary["otel"]["spans_dropped"] == 0
    assert registry.get_sample_value("replayer_otel_spans_exported_total") == 13
    assert registry.get_sample_value("replayer_otel_spans_dropped_total") == 0
    on_disk = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert on_disk["otel"]["spans_exported"] == 13
    from replayer.results.summarytext import format_summary

    assert "Exported / dropped" in format_summary(on_disk) and "13 / 0" in format_summary(on_disk)


def _one_token() -> Plan:
    return Plan([(0, choice("x", "length")), (1, usage_event(16, 1)), (2, DONE)])


def test_sample_ratio_holds_and_the_flag_tells_the_server(tmp_path):
    n, ratio = 400, 0.3
    trace = _trace(tmp_path, n, gap_ms=1, out=1)
    with Receiver() as rx, ThreadedFaultServer(_one_token()) as srv:
        cfg = _cfg(tmp_path, trace, srv.url, rx.url, run_id="sampled", trace_sample_ratio=ratio, seed=7)
        from replayer.run import run_replay

        asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
        spans = rx.wait_for(lambda s: any(x["kind"] == INTERNAL for x in s))
        got = [r for r in srv.server.received if r.path.endswith("/completions")]
    heads = [parse_traceparent({k.lower(): v for k, v in r.headers.items()}["traceparent"]) for r in got]
    assert len(heads) == n and all(h is not None for h in heads)  # every request carries one
    sampled = {f"{h[1]:016x}" for h in heads if h[2]}
    clients = {s["span_id"] for s in spans if s["kind"] == CLIENT}
    assert clients == sampled  # a span exactly for the requests whose flag says sampled
    k, sd = len(sampled), math.sqrt(n * ratio * (1 - ratio))
    assert abs(k - n * ratio) <= 4 * sd, (k, n * ratio)  # binomial bounds (fixed seed: deterministic)
    ids = TraceContext("sampled", ratio=ratio, seed=7)
    assert k == sum(ids.sampled(0, row) for row in range(n))


@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_a_refusing_or_hanging_collector_changes_no_result_and_drops_are_counted(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # (seconds: the exporter's wait per export)
    trace = _trace(tmp_path, 20, gap_ms=2, out=2)
    with Receiver(mode) as rx, ThreadedFaultServer(_one_token()) as srv:
        cfg = _cfg(tmp_path, trace, srv.url, rx.url, run_id="down")
        from replayer.run import run_replay

        registry = CollectorRegistry()
        summary = asyncio.run(asyncio.wait_for(run_replay(cfg, registry=registry), 120))
        assert rx.exports >= 1  # it was asked
    rows = _results(tmp_path)
    assert len(rows) == 20 and all(r["outcome"] == "success" for r in rows)
    assert summary["completed"] == 20 and summary["failed"] == 0
    assert summary["otel"]["spans_exported"] == 0
    assert summary["otel"]["spans_dropped"] == summary["otel"]["spans_handed"] == 21
    assert registry.get_sample_value("replayer_otel_spans_dropped_total") == 21


def test_off_by_default_no_sdk_imported_and_no_header(tmp_path):
    """Without an endpoint, a run imports no OpenTelemetry module and sends no traceparent."""
    trace = _trace(tmp_path, 3, out=1)
    code = f"""
import asyncio, sys
from faultserver import ThreadedFaultServer, Plan, choice, usage_event, DONE
from prometheus_client import CollectorRegistry
from replayer.config.model import load_config
from replayer.run.daemon import run_replay
plan = Plan([(0, choice("x", "length")), (1, usage_event(16, 1)), (2, DONE)])
with ThreadedFaultServer(plan) as srv:
    cfg = load_config({{"trace": {str(trace)!r}, "block_size": 16, "target": srv.url, "admin_port": 0, "quiet": True,
                       "results": {str(tmp_path / "res")!r}, "scrape_target_metrics": False}})
    asyncio.run(run_replay(cfg, registry=CollectorRegistry()))
    heads = [{{k.lower() for k in r.headers}} for r in srv.server.received if r.path.endswith("/completions")]
assert len(heads) == 3 and not any("traceparent" in h for h in heads), heads
loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
assert not loaded, loaded
print("ok")
"""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_trace_context_header_and_parse():
    ids = TraceContext("r1", tracestate="vendor=x")
    h = ids.header(2, 17).decode()
    tp, ts = h.split("\r\n")[:2]
    assert ts == "tracestate: vendor=x"
    parsed = parse_traceparent(tp.split(": ")[1])
    assert parsed == (ids.trace_id, ids.span_id(2, 17), True)
    assert TraceContext("r1").trace_id == ids.trace_id != TraceContext("r2").trace_id  # one trace per run
    assert len({ids.span_id(loop, row) for loop in range(3) for row in range(1000)}) == 3000
    assert TraceContext("r1", ratio=0.0).header(0, 0).endswith(b"-00\r\n")
    for bad in (
        None,
        "",
        "00-0-0-01",
        "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
        "zz-" + "1" * 32 + "-" + "1" * 16 + "-01",
    ):
        assert parse_traceparent(bad) is None
    with pytest.raises(ValueError):
        TraceContext("r", ratio=1.5)


def test_the_embedded_simulator_traces_to_the_same_collector(tmp_path):
    """No --target: the simulator the run starts gets the run's endpoint, so each request's
    llm_request span is the child of its CLIENT span without any setup."""
    from replayer.config import load_config
    from replayer.run import run_replay

    trace = _trace(tmp_path, 5, out=2)
    with Receiver() as rx:
        cfg = load_config(
            {"trace": str(trace), "block_size": 16, "otlp_endpoint": rx.url, "results": str(tmp_path / "res"),
             "admin_port": 0, "quiet": True, "scrape_target_metrics": False, "run_id": "embedded"}
        )  # fmt: skip
        asyncio.run(asyncio.wait_for(run_replay(cfg, registry=CollectorRegistry()), 120))
        spans = rx.wait_for(lambda s: sum(x["kind"] == SERVER for x in s) >= 5)
    clients = {s["span_id"] for s in spans if s["kind"] == CLIENT}
    servers = [s for s in spans if s["kind"] == SERVER]
    assert len(clients) == 5 and len(servers) == 5
    assert all(s["service"] == "replayer-sim" and s["parent_span_id"] in clients for s in servers)
