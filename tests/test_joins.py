"""Joins with the server's side: every request's X-Request-Id (what the server logs is what the
results record, on both send paths), and the server's own per-request timings
(``--server-timings``: vLLM's ``metrics`` object) from the embedded simulator and from servers
that report none. Real servers on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import aiohttp
import orjson
import pyarrow.parquet as pq
import pytest
from conftest import SHORT_OUTPUT, replay_against, write_slice
from faultserver import DONE, Plan, ThreadedFaultServer, choice, usage_event

from replayer.config import load_config
from replayer.core import RequestResult
from replayer.http.servertimings import TimedStreamAccumulator, record
from replayer.observe import ReplayerMetrics
from replayer.record import read_results
from replayer.sim import SimConfig, SimServer

TRACE = "traces/mooncake_conversation_10min.parquet"


def _run(tmp_path, *args, name="res"):
    """The slice's first 12 rows (their responses cut short: what is checked is the joins)."""
    res = tmp_path / name
    trace = write_slice(tmp_path / "slice.jsonl", 10, max_output=SHORT_OUTPUT)
    p = replay_against(trace, None, res, "--speedup", "50", "--max-requests", "12", *args, model=None, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = (
        sorted(read_results(str(res)).to_pylist(), key=lambda r: r["row"])
        if (res / "requests.parquet").exists()
        else None
    )
    return rows, json.loads((res / "summary.json").read_text()), res


def _rid(received) -> str:
    """The X-Request-Id a request came with (header names are case-insensitive)."""
    return next(v for k, v in received.headers.items() if k.lower() == "x-request-id")


def _echo_plan(req):
    """A short stream whose usage reports the prompt's length (no server timings)."""
    n = len(req["prompt"])
    return Plan(transcript=[(0, choice("a")), (2, choice("b", finish="length")), (3, usage_event(n, 2)), (3, DONE)])


@pytest.mark.parametrize("send_path", ["--launcher", "--no-launcher"])
def test_every_request_carries_its_x_request_id_as_recorded(tmp_path, send_path):
    with ThreadedFaultServer(_echo_plan) as srv:
        rows, summary, res = _run(tmp_path, "--target", srv.url, send_path)
        received = list(srv.server.received)
    run_id = summary["run_id"]
    assert run_id and pq.read_schema(res / "requests.parquet").metadata[b"replayer.run_id"].decode() == run_id
    # what the server logged for each request: its X-Request-Id and the prompt it came with
    logged = {_rid(r): len(r.json["prompt"]) for r in received}
    assert len(logged) == len(received) == len(rows) == 12  # one distinct id per request
    for r in rows:
        assert r["outcome"] == "success"
        assert r["x_request_id"] == f"{run_id}-{r['loop']}-{r['row']}"
        assert logged[r["x_request_id"]] == r["prompt_len_sent"]  # the join finds this row's request
        assert r["server_queue_time_ms"] is None and r["client_overhead_ms"] is None  # not asked for


def test_run_id_is_taken_from_the_flag_and_kept_by_a_resume(tmp_path):
    with ThreadedFaultServer(_echo_plan) as srv:
        rows, summary, _ = _run(tmp_path, "--target", srv.url, "--run-id", "nightly-7")
        assert {_rid(r) for r in srv.server.received} == {f"nightly-7-0-{r['row']}" for r in rows}
    assert summary["run_id"] == "nightly-7"
    ckpt = json.loads((tmp_path / "res" / "checkpoint.json").read_text())
    assert ckpt["run_id"] == "nightly-7"
    assert load_config({"trace": str(tmp_path / "slice.jsonl"), "resume": str(tmp_path / "res")}).run_id == "nightly-7"
    with pytest.raises(ValueError, match="HTTP header"):
        load_config({"trace": TRACE, "run_id": "a b"})


def test_a_resumed_run_keeps_its_run_id(tmp_path):
    from conftest import free_port, wait_http

    res, port = tmp_path / "res", free_port()
    with ThreadedFaultServer(_echo_plan) as srv:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replayer",
                "run",
                TRACE,
                "--target",
                srv.url,
                "--results",
                str(res),
                "--admin-port",
                str(port),
                "--quiet",
                "--speedup",
                "2",
                "--max-requests",
                "12",
                "--no-scrape-target-metrics",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60)
            while len(srv.server.received) < 2:  # a few requests out, the rest still to come
                assert p.poll() is None
                time.sleep(0.05)
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/stop", method="POST"), timeout=5)
            assert p.wait(120) == 0
        finally:
            if p.poll() is None:
                p.kill()
        first = json.loads((res / "summary.json").read_text())["run_id"]
        assert first and 0 < len(srv.server.received) < 12
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "replayer",
                "run",
                "--resume",
                str(res),
                "--target",
                srv.url,
                "--admin-port",
                "0",
                "--quiet",
                "--speedup",
                "50",
                "--no-scrape-target-metrics",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        ids = [_rid(x) for x in srv.server.received]
    rows = read_results(str(res)).to_pylist()
    assert len(rows) == 12 and all(x["outcome"] == "success" for x in rows)
    assert sorted(ids) == sorted(x["x_request_id"] for x in rows) == sorted(f"{first}-0-{x['row']}" for x in rows)


def test_workers_share_one_run_id(tmp_path):
    _, summary, res = _run(tmp_path, "--workers", "2")
    rows = [r for w in ("worker-0", "worker-1") for r in read_results(str(res / w)).to_pylist()]
    assert len(rows) == 12 and {r["shard"] for r in rows} == {0, 1}
    assert sorted(r["x_request_id"] for r in rows) == sorted(f"{summary['run_id']}-0-{r['row']}" for r in rows)


def test_server_timings_from_the_embedded_simulator(tmp_path):
    rows, summary, _ = _run(tmp_path, "--server-timings")
    assert len(rows) == 12
    for r in rows:
        assert r["outcome"] == "success"
        queue, ttft, gen = r["server_queue_time_ms"], r["server_time_to_first_token_ms"], r["server_generation_time_ms"]
        assert queue is not None and ttft is not None and gen is not None
        assert ttft >= SimConfig().ttft_base_ms * 0.9  # the simulator's prefill model, from scheduling
        assert gen > 0 and gen <= r["e2e_ms"]
        # the client's TTFT holds the server's queue and TTFT: the rest is network and front ends
        assert r["client_overhead_ms"] == pytest.approx(r["ttft_ms"] - queue - ttft)
        assert 0 <= r["client_overhead_ms"] < r["ttft_ms"]
    for k in (
        "server_queue_time_ms",
        "server_time_to_first_token_ms",
        "server_generation_time_ms",
        "client_overhead_ms",
    ):
        assert summary[f"{k}_count"] == 12
        assert summary[f"mean_{k}"] is not None and summary[f"p99_{k}"] >= summary[f"median_{k}"]


def test_server_timings_are_null_when_off_or_not_reported(tmp_path):
    rows, summary, _ = _run(tmp_path, name="off")  # the simulator sends none unless asked
    assert all(r["server_time_to_first_token_ms"] is None and r["client_overhead_ms"] is None for r in rows)
    assert "mean_client_overhead_ms" not in summary
    with ThreadedFaultServer(_echo_plan) as srv:  # asked, but the server does not report them
        rows, summary, _ = _run(tmp_path, "--target", srv.url, "--server-timings", name="unreported")
        assert all(r.json["include_metrics"] is True for r in srv.server.received)
    assert all(r["outcome"] == "success" for r in rows)
    assert all(
        r[k] is None
        for r in rows
        for k in (
            "server_queue_time_ms",
            "server_time_to_first_token_ms",
            "server_generation_time_ms",
            "client_overhead_ms",
        )
    )
    assert "mean_client_overhead_ms" not in summary


def test_the_parser_keeps_known_numbers_and_ignores_the_rest():
    acc = TimedStreamAccumulator()
    acc.on_event(orjson.dumps({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}), 1_000_000)
    acc.on_event(
        orjson.dumps(
            {
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                "metrics": {
                    "time_to_first_token_ms": 4.5,
                    "queue_time_ms": "soon",
                    "generation_time_ms": None,
                    "mean_itl_ms": None,
                    "future_ms": 1,
                    "output_token_metrics": {"content": {}},
                },
            }
        ),
        2_000_000,
    )
    acc.finish()
    res = RequestResult(row=0, ttft_ms=10.0)
    record(res, acc)
    assert res.server_time_to_first_token_ms == 4.5
    assert res.server_queue_time_ms is None and res.server_generation_time_ms is None  # not numbers: unknown
    assert res.client_overhead_ms is None  # needs the queue time too
    acc2 = TimedStreamAccumulator()
    acc2.on_event(orjson.dumps({"choices": [], "usage": {"completion_tokens": 1}, "metrics": None}), 1)
    res2 = RequestResult(row=0, ttft_ms=10.0)
    record(res2, acc2)
    assert (res2.server_queue_time_ms, res2.server_time_to_first_token_ms) == (None, None)


def test_client_overhead_histogram_observes_successes_that_have_it():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    m = ReplayerMetrics(reg, process_collector=False)
    m.in_flight.inc(2)
    m.on_result(RequestResult(row=0, outcome="success", ttft_ms=30.0, client_overhead_ms=2.5))
    m.on_result(RequestResult(row=1, outcome="success", ttft_ms=30.0))  # unknown: not observed
    assert reg.get_sample_value("replayer_client_overhead_seconds_count") == 1
    assert reg.get_sample_value("replayer_client_overhead_seconds_sum") == pytest.approx(0.0025)


async def _sse_objects(resp) -> list[dict]:
    text = (await resp.read()).decode()
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def test_simulator_reports_timings_like_vllm_and_echoes_the_request_id():
    async def main():
        sim = SimServer(SimConfig(max_num_seqs=1, ttft_base_ms=200.0))  # (200 ms between their tokens)
        url = await sim.start()
        try:
            body = {
                "prompt": list(range(1000, 1100)),
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
                "include_metrics": True,
            }
            async with aiohttp.ClientSession() as s:

                async def one(rid):
                    events, seen = [], []  # (each token chunk's receive time: when its slot served it)
                    async with s.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
                        async for line in r.content:
                            if line.startswith(b"data: {"):
                                events.append(json.loads(line[6:]))
                                if events[-1].get("choices"):
                                    seen.append(time.monotonic())
                        return r.headers.get("X-Request-Id"), events, (seen[0], seen[-1])

                (h1, ev1, t1), (h2, ev2, t2) = await asyncio.gather(one("run-0-1"), one("run-0-2"))
                async with s.post(url + "/v1/completions", json={**body, "stream": False}) as r:
                    whole = await r.json()
                plain = {k: v for k, v in body.items() if k != "include_metrics"}
                async with s.post(url + "/v1/completions", json=plain) as r:
                    unasked = await _sse_objects(r)
        finally:
            await sim.stop()
        return h1, ev1, h2, ev2, whole, unasked, t1, t2

    h1, ev1, h2, ev2, whole, unasked, t1, t2 = asyncio.run(main())
    assert (h1, h2) == ("run-0-1", "run-0-2")
    assert ev1[0]["id"] == "cmpl-run-0-1"  # vLLM takes the header as its request id
    for ev in (ev1, ev2):
        assert all("metrics" not in e for e in ev[:-1])  # only on the final usage chunk
        assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 5
    m1, m2 = ev1[-1]["metrics"], ev2[-1]["metrics"]
    for m in (m1, m2):
        assert m["time_to_first_token_ms"] >= 200.0 * 0.9 and m["generation_time_ms"] > 0
        assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 4)
    # one slot: one of the two waited in the queue for the other to finish (its wait is what was
    # left of the other's service when it arrived, which a busy client host sends late: the
    # order of their tokens says it, not the wait's length)
    (first, t_first), (second, t_second) = sorted(((m1, t1), (m2, t2)), key=lambda mt: mt[0]["queue_time_ms"])
    assert second["queue_time_ms"] > 0 and first["queue_time_ms"] < second["queue_time_ms"]
    assert t_second[0] > t_first[1], "the two were served at once by a simulator of one slot"
    assert set(whole["metrics"]) >= {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms"}
    assert all("metrics" not in e for e in unasked)
