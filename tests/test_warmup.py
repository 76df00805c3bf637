"""The warm-up (``--warmup-requests``, ``--warmup-seconds``): a whole replay (``run_replay``)
against a real aiohttp server whose first requests are slow (a cold server). The warm-up rows are
recorded with ``warmup`` true and left out of every statistic and the verdict: the run's summary
equals the summary recomputed from its other rows alone."""

from __future__ import annotations

import asyncio
import json

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from inprocess import replay_against

from replayer.results import summarize
from replayer.results.merge import merge_results
from replayer.results.report import figure_specs, render_html
from replayer.results.reportdata import ReportData, report_files

ROWS = 10
COLD = 3  # the server's first requests are slow
COLD_S, WARM_S = 0.3, 0.0


def _server():
    seen = {"n": 0}

    async def models(_req):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(req):
        body = await req.json()
        i, seen["n"] = seen["n"], seen["n"] + 1
        await asyncio.sleep(COLD_S if i < COLD else WARM_S)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        n = body["max_tokens"]
        u = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": len(body["prompt"]) + n}
        for k in range(n):
            fin = "length" if k == n - 1 else None
            ev = {"id": "c", "choices": [{"index": 0, "text": "ab", "finish_reason": fin}]}
            if fin:
                ev["usage"] = u
            await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _replay(tmp_path, gap_ms: int, **settings) -> tuple[dict, list[dict]]:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": gap_ms * i, "input_length": 16, "output_length": 3, "hash_ids": [i]}) + "\n"
            for i in range(ROWS)
        )
    )

    summary = replay_against(_server(), trace, tmp_path / "r", **settings)
    return summary, pq.read_table(tmp_path / "r" / "requests.parquet")


#: the summary's keys that describe the run, not its rows
_RUN_KEYS = {"warmup", "target", "target_embedded", "model", "trace", "synthetic_load", "speedup", "speedup_changes"}
_RUN_KEYS |= {"shard", "loop", "results", "run_id", "stopped_early", "stop_signal", "engine"}
_RUN_KEYS |= {"max_concurrent_requests_at_unix_s"}
_RUN_KEYS |= {"fidelity", "drift"}  # (issue 45: the verdicts, from the results files: warm-up left out too)
_RUN_KEYS |= {"buffered_streams"}  # (the run's self-check: this server sends each answer in one burst)
_RUN_KEYS |= {"events"}  # (issue 46: the run's events, with their wall-clock times)


def test_warmup_rows_are_flagged_and_left_out_of_every_statistic_and_the_verdict(tmp_path):
    slos = {"ttft": 200.0}
    summary, table = _replay(tmp_path, 50, warmup_requests=COLD, goodput=["ttft:200"])
    rows = sorted(table.to_pylist(), key=lambda r: r["sent_ns"])
    assert [r["warmup"] for r in rows] == [True] * COLD + [False] * (ROWS - COLD)  # the first sent
    assert all(r["ttft_ms"] >= COLD_S * 1e3 for r in rows[:COLD])  # (the cold ones: over the bound)
    steady = table.filter(pc.invert(table.column("warmup")))
    expected = summarize(steady.drop_columns(["warmup"]), slos)
    expected.pop("max_concurrent_requests_at_unix_s")  # (the run's wall clock: not in a bare table)
    got = {k: v for k, v in summary.items() if k not in _RUN_KEYS}
    assert got.keys() == expected.keys()
    cut_by_token = {"output_throughput", "total_token_throughput"}  # (issue 47: warm-up tokens inside the window)
    for k, v in expected.items():
        if k not in cut_by_token:
            assert got[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    inside = summary["warmup"]["output_tokens_after_boundary"]
    assert summary["output_throughput"] == pytest.approx(
        (expected["total_output_tokens"] + inside) / expected["duration"]
    )
    # the verdict: the cold requests would have missed; out of it, every request met the bound
    assert summary["slo_attainment"] == 1.0 and summary["completed"] == ROWS - COLD
    assert summary["max_ttft_ms"] < COLD_S * 1e3
    # and the warm-up itself: counted apart, its rule stated
    w = summary["warmup"]
    assert (w["requests"], w["sent"], w["completed"], w["failed"]) == (COLD, COLD, COLD, 0)
    assert w["warmup_requests"] == COLD and "send time" in w["boundary"]
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["warmup"] == w
    # without the flag, the same rows give a different summary (the test can fail)
    assert summarize(table.drop_columns(["warmup"]), slos)["slo_attainment"] < 1.0
    # the report: the warm-up counted in its intro, grey and apart in the latency plot, out of the CDFs
    data = ReportData(report_files(str(tmp_path / "r")))
    assert data.warmup_rows == COLD and data.latency["TTFT"].count == ROWS - COLD
    plot = next(sp for sp in figure_specs(data) if sp["title"].startswith("Latency over time"))
    assert {se["name"]: len(se["x"]) for se in plot["series"]} == {
        "TTFT": ROWS - COLD,
        "E2E": ROWS - COLD,
        "TTFT (warm-up)": COLD,
        "E2E (warm-up)": COLD,
    }
    assert f"({COLD} of them warm-up" in render_html(str(tmp_path / "r"))
    # merged (as --workers does): the same steady span, the same warm-up section
    merged = merge_results([str(tmp_path / "r")], quiet=True)
    assert merged["duration"] == pytest.approx(summary["duration"]) and merged["warmup"] == w
    assert merged["slo_attainment"] == 1.0 and merged["completed"] == ROWS - COLD


def test_warmup_seconds_is_decided_by_each_requests_own_send_time(tmp_path):
    summary, table = _replay(tmp_path, 100, warmup_seconds_s=0.25)
    rows = table.to_pylist()
    assert all(r["warmup"] == (r["sent_ns"] < 250_000_000) for r in rows)
    warm = sum(r["warmup"] for r in rows)
    assert 1 <= warm < ROWS and summary["warmup"]["requests"] == warm
    assert summary["scheduled"] == ROWS - warm


def test_no_warmup_flags_nothing(tmp_path):
    summary, table = _replay(tmp_path, 10)
    assert not any(table.column("warmup").to_pylist()) and "warmup" not in summary
