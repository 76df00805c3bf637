"""A spans file in another shape (issue 47): one JSON object per span (an OTLP span per line, or
an OpenTelemetry SDK's ``to_json`` shape, as some receivers write them) is read and joined as the
Collector's form is; a file holding no span in any known shape is an error (exit 2), never
"0 requests traced"."""

from __future__ import annotations

import json

import pytest
from test_report_spans import T0, _client, _server

from replayer.core import RequestResult
from replayer.record import Recorder
from replayer.results.report import main_report
from replayer.results.spanjoin import SpansError, read_spans, split_spans

pytest.importorskip("opentelemetry.sdk")


def test_one_otlp_span_per_line_is_joined_as_the_collectors_form(tmp_path):
    f = tmp_path / "spans.jsonl"
    spans = [
        _client("1111111111111111", 0, T0, 250.0, 1250.0),
        _server("3333333333333333", "1111111111111111", 0.2, 0.05, 0.125, 0.75, 1.0),
    ]
    f.write_text("".join(json.dumps(s) + "\n" for s in spans))
    [row] = split_spans(read_spans(str(f))).rows
    assert row["server"] is True and row["network_front_end_s"] == 0.25 - 0.2 and row["decode_s"] == 0.75


def test_an_sdk_spans_to_json_shape_is_read(tmp_path):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("POST", kind=trace.SpanKind.CLIENT) as c:
        c.set_attributes({"replayer.row": 7, "replayer.loop": 0, "replayer.ttft_ms": 250.0, "replayer.e2e_ms": 1250.0})
        with tracer.start_as_current_span("llm_request", kind=trace.SpanKind.SERVER) as s:
            s.set_attributes({"gen_ai.latency.time_to_first_token": 0.2, "gen_ai.latency.time_in_model_decode": 0.75})
    f = tmp_path / "sdk.jsonl"
    f.write_text("".join(sp.to_json(indent=None) + "\n" for sp in exporter.get_finished_spans()))
    spans = read_spans(str(f))
    assert {sp.kind for sp in spans} == {2, 3} and all(sp.start_ns > 10**18 for sp in spans)
    [row] = split_spans(spans).rows
    assert row["row"] == 7 and row["server"] is True and row["network_front_end_s"] == pytest.approx(0.05)


def test_a_file_with_no_spans_is_refused_by_report_with_exit_2(tmp_path, capsys):
    f = tmp_path / "other.jsonl"
    f.write_text('{"message": "hello", "level": "info"}\n{"message": "again"}\n')
    with pytest.raises(SpansError, match="holds no OTLP spans"):
        read_spans(str(f))
    res = tmp_path / "r"
    rec = Recorder(str(res))
    rec.add(RequestResult(row=0, outcome="success", sent_ns=1, end_ns=2))
    rec.close()
    assert main_report(str(res), str(tmp_path / "report.html"), spans_file=str(f)) == 2
    err = capsys.readouterr().err
    assert f"--spans: {f}: holds no OTLP spans (2 line(s)" in err
