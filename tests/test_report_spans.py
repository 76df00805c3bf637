"""``replayer report --spans FILE``: the join of replayer's CLIENT spans with the server's
llm_request spans, computed exactly on a scripted file (the Collector's file-exporter form), and
end to end from the spans a real replay exported."""

from __future__ import annotations

import asyncio
import json

import pytest

from replayer.results.spanjoin import PARTS, SpansError, read_spans, split_spans

pytest.importorskip("opentelemetry.sdk")

T0 = 1_700_000_000_000_000_000


def _attr(k, v):
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}  # (int64 as a string: proto3 JSON)
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    return {"key": k, "value": {"stringValue": v}}


def _span(span_id, parent, kind, start_ns, attrs, name="x"):
    return {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(start_ns + 10**9),
        "attributes": [_attr(k, v) for k, v in attrs.items()],
    }


def _client(span_id, row, sent_ns, ttft_ms, e2e_ms, run="r"):
    return _span(
        span_id,
        "00000000000000aa",
        3,
        sent_ns,
        {"replayer.row": row, "replayer.loop": 0, "replayer.ttft_ms": ttft_ms, "replayer.e2e_ms": e2e_ms,
         "replayer.x_request_id": f"{run}-0-{row}", "replayer.outcome": "success", "replayer.run_id": run},
    )  # fmt: skip


def _server(span_id, parent, ttft, queue, prefill, decode, e2e):
    return _span(
        span_id,
        parent,
        2,
        T0,
        {
            "gen_ai.latency.time_to_first_token": ttft,
            "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_in_model_prefill": prefill,
            "gen_ai.latency.time_in_model_decode": decode,
            "gen_ai.latency.e2e": e2e,
            "gen_ai.usage.prompt_tokens": 100,
        },
        name="llm_request",
    )


def _line(spans, service):
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_attr("service.name", service)]},
                    "scopeSpans": [{"scope": {"name": service}, "spans": spans}],
                }
            ]
        }
    )


def test_split_is_exact_on_a_scripted_file(tmp_path):
    f = tmp_path / "spans.jsonl"
    lines = [
        _line([_client("1111111111111111", 0, T0, 250.0, 1250.0), _client("2222222222222222", 1, T0 + 2 * 10**9, 500.0, 3000.0)], "replayer"),
        _line([_server("3333333333333333", "1111111111111111", 0.2, 0.05, 0.125, 0.75, 1.0)], "vllm"),
        "",
        _line([_client("4444444444444444", 2, T0 + 4 * 10**9, 100.0, 200.0)], "replayer"),
        _line([_server("5555555555555555", "2222222222222222", 0.375, 0.25, 0.0625, 2.0, 2.5)], "vllm"),
    ]  # fmt: skip
    f.write_text("\n".join(lines) + "\n")
    split = split_spans(read_spans(str(f)))
    by_row = {r["row"]: r for r in split.rows}
    r0, r1, r2 = by_row[0], by_row[1], by_row[2]
    # (binary fractions: the differences are exact)
    assert r0["network_front_end_s"] == 0.25 - 0.2
    assert (r0["queue_s"], r0["prefill_s"], r0["decode_s"]) == (0.05, 0.125, 0.75)
    assert r0["server_other_s"] == 0.2 - 0.05 - 0.125
    assert r0["e2e_network_s"] == 1.25 - 1.0
    assert r1["network_front_end_s"] == 0.125 and r1["server_other_s"] == 0.0625 and r1["e2e_network_s"] == 0.5
    assert r1["sent_s"] == 2.0 and r2["sent_s"] == 4.0
    assert r2["server"] is False and all(r2[p] is None for p in PARTS)  # unknown is not zero
    assert split.missing == [
        {"row": 2, "loop": 0, "x_request_id": "r-0-2", "span_id": "4444444444444444", "outcome": "success"}
    ]
    d = split.distributions()
    assert d["network_front_end_s"]["count"] == 2  # the request without a server span left out
    assert d["network_front_end_s"]["p50"] == 0.25 - 0.2 and d["network_front_end_s"]["max"] == 0.125
    assert d["ttft_s"]["count"] == 3 and d["ttft_s"]["p99"] == 0.5
    assert d["queue_s"]["mean"] == (0.05 + 0.25) / 2
    t = split.over_time(bins=2)
    assert t["x"] == [0.0, 1.0] and t["queue_s"] == [0.05, 0.25]


def test_bad_line_is_named(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(_line([], "x") + "\n{not json\n")
    with pytest.raises(SpansError, match="line 2"):
        read_spans(str(f))


def test_report_spans_end_to_end_from_a_real_replay(tmp_path, capsys):
    """The spans a replay and the simulator exported, written as OTLP JSON lines, joined by
    ``replayer report --spans``: every request joined, the split's parts add up to the TTFT."""
    from otlpreceiver import SERVER, Receiver
    from test_otel import _cfg, _replay_against_sim, _trace

    from replayer.cli import main

    trace = _trace(tmp_path, 10)
    with Receiver() as rx:
        asyncio.run(_replay_against_sim(lambda url: _cfg(tmp_path, trace, url, rx.url, run_id="rep"), rx.url))
        rx.wait_for(lambda s: sum(x["kind"] == SERVER for x in s) >= 10)
        rx.write_jsonl(tmp_path / "spans.jsonl")
    split = split_spans(read_spans(str(tmp_path / "spans.jsonl")))
    assert len(split.rows) == 10 and split.missing == []
    for r in split.rows:
        parts = r["network_front_end_s"] + r["queue_s"] + r["server_other_s"] + r["prefill_s"]
        assert parts == pytest.approx(r["ttft_s"], abs=1e-9)
        assert r["network_front_end_s"] >= 0 and r["server_prompt_tokens"] > 0
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "res"), "-o", str(out), "--spans", str(tmp_path / "spans.jsonl")]) == 0
    page = out.read_text()
    assert "Where the time went" in page and "Where the TTFT went" in page
    assert "10 requests traced; 10 joined" in page
    csv = (tmp_path / "report.spans.csv").read_text().splitlines()
    assert len(csv) == 11 and "network_front_end_s" in csv[0]
    assert "joined with their server span" in capsys.readouterr().out


def test_compare_spans_splits_each_run_by_its_run_id(tmp_path, capsys):
    """One collector file holding two runs: ``compare A B --spans FILE`` puts each run's split
    side by side (each run's requests picked by the run id in its summary)."""
    from replayer.results.compare import main_compare

    f = tmp_path / "both.jsonl"
    f.write_text(
        _line([_client("1111111111111111", 0, T0, 250.0, 1250.0, run="runa"),
               _client("2222222222222222", 0, T0, 500.0, 1500.0, run="runb"),
               _client("6666666666666666", 1, T0, 500.0, 1500.0, run="runb")], "replayer") + "\n"
        + _line([_server("3333333333333333", "1111111111111111", 0.125, 0.0625, 0.03125, 0.75, 1.0),
                 _server("4444444444444444", "2222222222222222", 0.25, 0.125, 0.0625, 0.75, 1.25)], "vllm") + "\n"
    )  # fmt: skip
    for name, rid in (("a", "runa"), ("b", "runb")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"completed": 1, "duration": 1.0, "run_id": rid}))
    assert main_compare(str(tmp_path / "a"), str(tmp_path / "b"), True, [str(f)]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    nfe = rows["spans.network_front_end_s.p50"]
    assert (nfe["a"], nfe["b"]) == (125.0, 250.0) and nfe["better"] == "a"
    assert (rows["spans.queue_s.p99"]["a"], rows["spans.queue_s.p99"]["b"]) == (62.5, 125.0)
    assert (rows["spans.missing"]["a"], rows["spans.missing"]["b"]) == (0, 1)  # run B's row 1 has none
    assert main_compare(str(tmp_path / "a"), str(tmp_path / "b"), False, [str(f)] * 3) == 2
