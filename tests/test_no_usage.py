"""Issue 17, "A stream without usage": a whole replay (``run_replay``) against a real aiohttp
server on 127.0.0.1 that streams several tokens per text event and sends no ``usage`` for some or
all requests (those that report it get it on every chunk, as vLLM's ``continuous_usage_stats``).
Output tokens, TPOT, ITL and the token totals are unknown for those requests (null
per request, out of the statistics and out of the Prometheus histograms); the count of text
events is only an estimate, under its own name."""

from __future__ import annotations

import asyncio
import json

import orjson
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from inprocess import replay_against
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

ROWS = 6
OUTPUT = 8  # tokens per request
PER_EVENT = 4  # tokens per text event (as a server batching writes, or MTP, sends them)
GAP_S = 0.013 * PER_EVENT  # 13 ms per token


def _server(with_usage):
    """aiohttp app: ``/v1/models`` and a streaming ``/v1/completions`` that ignores
    ``stream_options``; the i-th request (arrival order) gets running usage on every chunk and a
    usage-only chunk at the end iff ``with_usage(i)``."""
    seen = {"n": 0}

    async def models(_req):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(req):
        body = await req.json()
        i, seen["n"] = seen["n"], seen["n"] + 1
        n = body["max_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        sent = 0
        while sent < n:
            k = min(PER_EVENT, n - sent)
            sent += k
            fin = "length" if sent == n else None
            ev = {
                "id": "c",
                "object": "text_completion",
                "choices": [{"index": 0, "text": "ab" * k, "finish_reason": fin}],
            }
            if with_usage(i):
                ev["usage"] = {
                    "prompt_tokens": len(body["prompt"]),
                    "completion_tokens": sent,
                    "total_tokens": len(body["prompt"]) + sent,
                }
            await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
            if sent < n:
                await asyncio.sleep(GAP_S)
        if with_usage(i):
            u = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": len(body["prompt"]) + n}
            await resp.write(b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": u}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _replay(tmp_path, with_usage) -> tuple[dict, list[dict], dict[str, float]]:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 20 * i, "input_length": 16, "output_length": OUTPUT, "hash_ids": [i]}) + "\n"
            for i in range(ROWS)
        )
    )
    reg = CollectorRegistry()

    summary = replay_against(_server(with_usage), trace, tmp_path / "r", registry=reg)
    rows = pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist()
    samples = {
        s.name: s.value
        for fam in text_string_to_metric_families(generate_latest(reg).decode())
        for s in fam.samples
        if not s.labels or s.name.endswith("_count")
    }
    return summary, rows, samples


@pytest.mark.parametrize("mode", ["none", "every-other"])
def test_a_stream_without_usage_has_no_token_numbers_only_a_flagged_estimate(tmp_path, mode):
    summary, rows, samples = _replay(tmp_path, (lambda i: False) if mode == "none" else (lambda i: i % 2 == 0))
    assert len(rows) == ROWS and all(r["outcome"] == "success" for r in rows)
    known = [r for r in rows if r["usage_source"] == "server"]
    unknown = [r for r in rows if r["usage_source"] == "none"]
    assert len(known) == (0 if mode == "none" else ROWS // 2)
    for r in unknown:  # unknown, not guessed: null per request
        assert r["completion_tokens"] is None and r["prompt_tokens"] is None
        assert r["tpot_ms"] is None and r["itl_ms"] == []
        assert r["ttft_ms"] is not None and r["e2e_ms"] > r["ttft_ms"]  # times are still measured
        assert r["output_tokens_estimate"] == OUTPUT // PER_EVENT  # text events: an estimate, apart
    for r in known:
        assert r["completion_tokens"] == OUTPUT and r["prompt_tokens"] == 16 and r["output_tokens_estimate"] is None
        # a gap ending in a 4-token event: 4 samples of gap/4 (the first event's tokens have no gap)
        assert r["tpot_ms"] is not None and len(r["itl_ms"]) == OUTPUT - PER_EVENT
        assert r["itl_ms"] == pytest.approx([r["itl_ms"][0]] * (OUTPUT - PER_EVENT), rel=1e-6)
        # N from usage: TPOT is the span over 7 token gaps, not over 1 event gap
        assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / (OUTPUT - 1))

    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s == json.loads(json.dumps(summary))
    assert s["completed"] == ROWS and s["usage_missing"] == len(unknown)
    assert s["tpot_ms_count"] == len(known) and s["itl_ms_count"] == len(known) * (OUTPUT - PER_EVENT)
    assert s["output_tokens_estimate"] == len(unknown) * (OUTPUT // PER_EVENT)
    if mode == "none":  # nothing reported: unknown totals, never 0
        assert s["total_output_tokens"] is None and s["total_input_tokens"] is None
        assert s["output_throughput"] is None and s["total_token_throughput"] is None
        assert s["mean_tpot_ms"] is None and s["mean_itl_ms"] is None
    else:  # the server-reported totals of the requests that reported, nothing guessed mixed in
        assert s["total_output_tokens"] == len(known) * OUTPUT and s["total_input_tokens"] == len(known) * 16
        assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration"])
    # Prometheus: no TPOT, ITL or token samples from guessed counts
    assert samples["replayer_tpot_seconds_count"] == len(known)
    assert samples["replayer_itl_seconds_count"] == len(known) * (OUTPUT - PER_EVENT)
    assert samples["replayer_server_completion_tokens_total"] == len(known) * OUTPUT
    assert samples["replayer_ttft_seconds_count"] == ROWS
