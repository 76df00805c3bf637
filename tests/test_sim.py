"""Tests for replayer.sim: a real SimServer on 127.0.0.1 driven by an aiohttp client."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package may not be installed in the venv
    sys.path.insert(0, str(ROOT))

from conftest import free_port  # noqa: E402
from faultserver import run_delay_ns  # noqa: E402

from replayer.sim import SimConfig, SimServer, prompt_block_hashes  # noqa: E402

FAST = dict(ttft_base_ms=1.0, prefill_us_per_token=0.0, itl_base_ms=1.0, itl_per_running_us=0.0)


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def with_sim(cfg: SimConfig, fn):
    sim = SimServer(cfg)
    url = await sim.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as c:
            return await fn(sim, url, c)
    finally:
        await sim.stop()


def parse_sse(raw: bytes) -> list:
    """Events of an SSE body: dicts, or the string '[DONE]'. Asserts the framing."""
    assert raw.endswith(b"\n\n"), raw[-50:]
    out = []
    for ev in raw.split(b"\n\n")[:-1]:
        assert ev.startswith(b"data: "), ev
        data = ev[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


async def metrics(c: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Sample name (with labels except engine/model_name folded away) -> value."""
    async with c.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.labels["engine"] == "0"
            out[s.name] = s.value
    return out


async def completions(c, url, **body):
    async with c.post(url + "/v1/completions", json=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


# ---------------------------------------------------------------------------------------


def test_stream_token_ids_exact_sequence():
    async def body(sim, url, c):
        prompt = list(range(1, 101))
        st, ct, raw = await completions(
            c, url, prompt=prompt, max_tokens=7, stream=True, model="sim-model", stream_options={"include_usage": True}
        )
        assert st == 200 and ct.startswith("text/event-stream")
        ev = parse_sse(raw)
        assert len(ev) == 7 + 2 and ev[-1] == "[DONE]"
        ids = {e["id"] for e in ev[:-1]}
        assert len(ids) == 1 and ids.pop().startswith("cmpl-")
        for i, e in enumerate(ev[:7]):
            assert e["object"] == "text_completion" and e["model"] == "sim-model"
            assert isinstance(e["created"], int)
            assert "usage" not in e
            (ch,) = e["choices"]
            assert ch["index"] == 0 and ch["text"] and ch["logprobs"] is None
            assert ch["finish_reason"] == ("length" if i == 6 else None)
        u = ev[7]
        assert u["choices"] == [] and u["object"] == "text_completion"
        assert u["usage"] == {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}
        # Without include_usage: tokens then [DONE], nothing else.
        st, _, raw = await completions(c, url, prompt=prompt, max_tokens=3, stream=True)
        ev = parse_sse(raw)
        assert len(ev) == 4 and ev[-1] == "[DONE]" and all(e["choices"] for e in ev[:3])
        # max_tokens=1: a single chunk that is also the last one.
        st, _, raw = await completions(
            c, url, prompt=prompt, max_tokens=1, stream=True, stream_options={"include_usage": True}
        )
        ev = parse_sse(raw)
        assert [e["choices"][0]["finish_reason"] for e in ev[:1]] == ["length"]
        assert ev[1]["usage"]["completion_tokens"] == 1 and ev[2] == "[DONE]"
        m = await metrics(c, url)
        assert m["vllm:prompt_tokens_total"] == 300
        assert m["vllm:generation_tokens_total"] == 11
        assert m["vllm:request_success_total"] == 3

    run(with_sim(SimConfig(**FAST), body))


def test_non_stream_text_prompt_and_continuous_usage():
    async def body(sim, url, c):
        st, ct, raw = await completions(c, url, prompt="the  quick\nbrown fox", max_tokens=5)
        assert st == 200 and ct.startswith("application/json")
        r = orjson.loads(raw)
        assert r["object"] == "text_completion" and r["model"] == "sim-model"
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["choices"][0]["text"] == " tok" * 5
        assert r["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
        # A batch of one is accepted, bigger batches are not.
        st, _, raw = await completions(c, url, prompt=[[5, 6, 7]], max_tokens=2)
        assert st == 200 and orjson.loads(raw)["usage"]["prompt_tokens"] == 3
        st, _, raw = await completions(c, url, prompt=["a b"], max_tokens=2)
        assert st == 200 and orjson.loads(raw)["usage"]["prompt_tokens"] == 2
        st, _, raw = await completions(c, url, prompt=[[1], [2]], max_tokens=2)
        assert st == 400
        # Continuous usage: every token chunk carries the running totals.
        st, _, raw = await completions(
            c,
            url,
            prompt=list(range(10)),
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        ev = parse_sse(raw)
        assert len(ev) == 8
        for i, e in enumerate(ev[:6], start=1):
            assert e["usage"] == {"prompt_tokens": 10, "completion_tokens": i, "total_tokens": 10 + i}
        assert ev[6]["choices"] == [] and ev[6]["usage"]["completion_tokens"] == 6
        # Default max_tokens is 16.
        st, _, raw = await completions(c, url, prompt=[1, 2])
        assert orjson.loads(raw)["usage"]["completion_tokens"] == 16

    run(with_sim(SimConfig(**FAST), body))


def test_prefix_cache_hits_and_ttft():
    rng = np.random.default_rng(1)
    shared = rng.integers(0, 32000, 1024).tolist()
    a = shared + rng.integers(0, 32000, 100).tolist()
    b = shared + [(a[1024] + 1) % 32000] + rng.integers(0, 32000, 99).tolist()

    async def ttft(c, url, prompt):
        t0 = time.perf_counter()
        async with c.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "stream": True}) as r:
            await r.content.readuntil(b"\n\n")
            t = time.perf_counter() - t0
            await r.read()
        return t

    async def body(sim, url, c):
        st, _, _ = await completions(c, url, prompt=a, max_tokens=1)
        m0 = await metrics(c, url)
        assert m0["vllm:prefix_cache_hits_total"] == 0
        assert m0["vllm:prefix_cache_queries_total"] == 1124
        st, _, _ = await completions(c, url, prompt=b, max_tokens=1)
        m1 = await metrics(c, url)
        assert m1["vllm:prefix_cache_hits_total"] - m0["vllm:prefix_cache_hits_total"] == 1024
        assert m1["vllm:prefix_cache_queries_total"] == 2248
        assert 0 < m1["vllm:kv_cache_usage_perc"] <= 1
        # Fully cached repeat: vLLM still recomputes the last block -> hits = 4096 - 16.
        p = rng.integers(0, 32000, 4096).tolist()
        t1 = await ttft(c, url, p)  # uncached: 4096 * 100 us = 410 ms
        m2 = await metrics(c, url)
        t2 = await ttft(c, url, p)  # cached: 16 * 100 us
        m3 = await metrics(c, url)
        assert m3["vllm:prefix_cache_hits_total"] - m2["vllm:prefix_cache_hits_total"] == 4080
        assert t1 > 0.4 and t2 < t1 - 0.25, (t1, t2)

    run(with_sim(SimConfig(ttft_base_ms=1, prefill_us_per_token=100, itl_base_ms=1), body))


def test_prefix_cache_disabled_and_lru_eviction():
    async def body(sim, url, c):
        await completions(c, url, prompt=list(range(64)), max_tokens=1)
        await completions(c, url, prompt=list(range(64)), max_tokens=1)
        m = await metrics(c, url)
        assert m["vllm:prefix_cache_hits_total"] == 0
        assert m["vllm:kv_cache_usage_perc"] == 0

    run(with_sim(SimConfig(prefix_cache_tokens=0, **FAST), body))

    async def body2(sim, url, c):
        # Capacity 4 blocks of 16: the second prompt (4 new blocks) evicts the first.
        await completions(c, url, prompt=list(range(65)), max_tokens=1)
        await completions(c, url, prompt=list(range(100, 165)), max_tokens=1)
        await completions(c, url, prompt=list(range(65)), max_tokens=1)
        m = await metrics(c, url)
        assert m["vllm:prefix_cache_hits_total"] == 0
        assert m["vllm:kv_cache_usage_perc"] == 1.0
        await completions(c, url, prompt=list(range(65)), max_tokens=1)
        m = await metrics(c, url)
        assert m["vllm:prefix_cache_hits_total"] == 64

    run(with_sim(SimConfig(prefix_cache_tokens=64, **FAST), body2))


def test_prompt_block_hashes_are_prefix_chained():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 32000, 160).astype(np.int64)
    y = x.copy()
    y[50] += 1  # block 3
    hx, hy = prompt_block_hashes(x, 16), prompt_block_hashes(y, 16)
    assert len(hx) == 10 and len(set(hx)) == 10
    assert hx[:3] == hy[:3] and all(a != b for a, b in zip(hx[3:], hy[3:]))
    assert prompt_block_hashes(x[:15], 16) == []
    assert prompt_block_hashes(x[:40], 16) == hx[:2]
    # Same block content at another position is a different key (it is a prefix hash).
    z = np.concatenate([x[16:32], x[:16]])
    assert prompt_block_hashes(z, 16)[1] != hx[1]


def test_errors_like_vllm():
    async def body(sim, url, c):
        # Out-of-vocabulary id, streaming: 200, an error event, [DONE].
        for bad in (32000, -1):
            st, ct, raw = await completions(c, url, prompt=[1, bad, 2], max_tokens=3, stream=True)
            assert st == 200 and ct.startswith("text/event-stream")
            ev = parse_sse(raw)
            assert len(ev) == 2 and ev[1] == "[DONE]"
            assert ev[0]["error"]["code"] == 400
            assert ev[0]["error"]["type"] == "BadRequestError"
            assert str(bad) in ev[0]["error"]["message"]
        # Non-streaming: HTTP 400 JSON.
        st, ct, raw = await completions(c, url, prompt=[1, 32000], max_tokens=3)
        assert st == 400 and ct.startswith("application/json")
        assert orjson.loads(raw)["error"]["type"] == "BadRequestError"
        # Prompt longer than max_model_len: 400 JSON even when streaming.
        for stream in (False, True):
            st, ct, raw = await completions(c, url, prompt=list(range(200)), max_tokens=1, stream=stream)
            assert st == 400 and ct.startswith("application/json")
            e = orjson.loads(raw)["error"]
            assert e["code"] == 400 and e["type"] == "BadRequestError"
            assert "maximum context length is 128" in e["message"]
        # Bad bodies.
        async with c.post(url + "/v1/completions", data=b"{not json") as r:
            assert r.status == 400 and "error" in await r.json()
        for bad_body in (
            {"max_tokens": 3},
            {"prompt": []},
            {"prompt": 5},
            {"prompt": [1, "x"]},
            {"prompt": [1], "max_tokens": 0},
            {"prompt": [1], "max_tokens": "3"},
            [1, 2],
        ):
            async with c.post(url + "/v1/completions", json=bad_body) as r:
                assert r.status == 400, bad_body
                assert (await r.json())["error"]["code"] == 400
        # The server is still fine.
        st, _, _ = await completions(c, url, prompt=[1, 2], max_tokens=2)
        assert st == 200

    run(with_sim(SimConfig(max_model_len=128, **FAST), body))


def test_models_health_and_isolated_registries():
    async def body():
        s1, s2 = SimServer(SimConfig(model="m1", **FAST)), SimServer(SimConfig(model="m2"))
        u1, u2 = await s1.start(), await s2.start()
        try:
            async with aiohttp.ClientSession() as c:
                async with c.get(u1 + "/health") as r:
                    assert r.status == 200 and await r.read() == b""
                async with c.get(u2 + "/v1/models") as r:
                    d = await r.json()
                    assert d["object"] == "list" and d["data"][0]["id"] == "m2"
                await completions(c, u1, prompt=[1, 2, 3], max_tokens=2)
                m1, m2 = await metrics(c, u1), await metrics(c, u2)
                assert m1["vllm:prompt_tokens_total"] == 3
                assert m2["vllm:prompt_tokens_total"] == 0
                async with c.get(u1 + "/metrics") as r:
                    assert 'model_name="m1"' in await r.text()
        finally:
            await s1.stop()
            await s2.stop()

    run(body())


def test_running_waiting_gauges_with_max_num_seqs():
    cfg = SimConfig(max_num_seqs=2, ttft_base_ms=1, prefill_us_per_token=0, itl_base_ms=20, itl_per_running_us=0)

    async def body(sim, url, c):
        reqs = [
            asyncio.create_task(
                completions(
                    c, url, prompt=[1, 2, 3], max_tokens=25, stream=True, stream_options={"include_usage": True}
                )
            )
            for _ in range(5)
        ]
        for _ in range(100):  # until all 5 arrived (each runs ~0.5 s, so no one finished)
            await asyncio.sleep(0.02)
            m = await metrics(c, url)
            if m["vllm:num_requests_waiting"] == 3:
                break
        assert m["vllm:num_requests_running"] == 2
        assert m["vllm:num_requests_waiting"] == 3
        assert sim.num_requests_running == 2 and sim.num_requests_waiting == 3
        results = await asyncio.gather(*reqs)
        for st, _, raw in results:
            assert st == 200 and parse_sse(raw)[-2]["usage"]["completion_tokens"] == 25
        m = await metrics(c, url)
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        assert m["vllm:request_success_total"] == 5

    run(with_sim(cfg, body))


def test_decode_steps_follow_absolute_deadlines():
    cfg = SimConfig(ttft_base_ms=5, prefill_us_per_token=0, itl_base_ms=10, itl_per_running_us=0)

    async def body(sim, url, c):
        times, off, off0 = [], [], run_delay_ns() / 1e9
        async with c.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 41, "stream": True}) as r:
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                n = buf.count(b"\n\n")
                times += [time.perf_counter()] * (n - len(times))
                off += [run_delay_ns() / 1e9] * (n - len(off))
        gaps = np.diff(times[:41])
        # 40 steps of 10 ms; absolute deadlines keep the mean close despite jitter (a step late
        # by a wake-up's latency is not carried into the next). Off by at most 15 ms over the
        # 400, plus the time the machine kept this thread (sim and client) off the CPU until the
        # last token (a stall can delay either end's stamp)
        off_cpu = off[40] - off0
        assert abs(gaps.sum() - 0.4) <= 0.015 + off_cpu, (gaps, off_cpu)

    run(with_sim(cfg, body))


async def _disconnect_then_ok(sim, url, c):
    async with c.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 10_000, "stream": True}) as r:
        await r.content.readuntil(b"\n\n")
        await r.content.readuntil(b"\n\n")
        r.close()  # drop the connection mid-stream
    for _ in range(100):
        await asyncio.sleep(0.02)
        if sim.num_requests_running == 0:
            break
    assert sim.num_requests_running == 0
    assert not sim._decoding and not sim._joining
    st, _, raw = await completions(
        c, url, prompt=[1, 2], max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    assert st == 200 and parse_sse(raw)[-2]["usage"]["completion_tokens"] == 3
    m = await metrics(c, url)
    assert m["vllm:request_success_total"] == 1


def test_disconnect_mid_stream():
    run(with_sim(SimConfig(**FAST), _disconnect_then_ok))


def test_disconnect_mid_stream_without_handler_cancellation():
    # When the app is mounted in a runner that does not cancel handlers, the engine must
    # notice the closed transport itself.
    async def body():
        sim = SimServer(SimConfig(**FAST))
        runner = web.AppRunner(sim.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as c:
                await _disconnect_then_ok(sim, url, c)
        finally:
            await runner.cleanup()

    run(body())


def test_stop_with_requests_in_flight():
    async def body():
        sim = SimServer(SimConfig(max_num_seqs=1, **FAST))
        url = await sim.start()
        async with aiohttp.ClientSession() as c:
            tasks = [
                asyncio.create_task(completions(c, url, prompt=[1], max_tokens=100_000, stream=True)) for _ in range(3)
            ]
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            await sim.stop()
            assert time.perf_counter() - t0 < 5
            await asyncio.gather(*tasks, return_exceptions=True)

    run(body())


@pytest.mark.timeout(120)
def test_light_load_200_streams():
    n, plen, out = 200, 8192, 50
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 32000, plen).tolist() for _ in range(n)]

    took = []

    async def one(c, url, p):
        t0 = time.perf_counter()
        async with c.post(
            url + "/v1/completions",
            json={"prompt": p, "max_tokens": out, "stream": True, "stream_options": {"include_usage": True}},
        ) as r:
            assert r.status == 200
            ev = parse_sse(await r.read())
        took.append(time.perf_counter() - t0)
        assert len(ev) == out + 2 and ev[-1] == "[DONE]"
        assert ev[out - 1]["choices"][0]["finish_reason"] == "length"
        return ev[-2]["usage"]

    async def body(sim, url, c):
        t0 = time.perf_counter()
        usages = await asyncio.gather(*(one(c, url, p) for p in prompts))
        dt = time.perf_counter() - t0
        assert all(u == {"prompt_tokens": plen, "completion_tokens": out, "total_tokens": plen + out} for u in usages)
        m = await metrics(c, url)
        assert m["vllm:generation_tokens_total"] == n * out
        assert m["vllm:request_success_total"] == n
        assert m["vllm:num_requests_running"] == 0
        # the streams are served together, in one batch (ideal: ~0.05 s TTFT + 49 steps of ~14 ms),
        # not one after another: on average many are in flight at once, however slow the machine
        # (a stall stretches every stream in flight and the whole run alike)
        in_flight = sum(took) / dt
        assert len(took) == n and in_flight > 20, (in_flight, dt)

    run(with_sim(SimConfig(), body), timeout=110)


def test_main_cli_records_requests(tmp_path):
    port = free_port()
    rec = tmp_path / "rec.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from replayer.sim import main; sys.exit(main())",
            "--port",
            str(port),
            "--model",
            "cli-model",
            "--ttft-base-ms",
            "1",
            "--itl-base-ms",
            "1",
            "--record-requests",
            str(rec),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:

        async def body():
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as c:
                for _ in range(200):
                    try:
                        async with c.get(url + "/health") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.05)
                st, _, raw = await completions(c, url, prompt=[4, 5, 6], max_tokens=2, model="cli-model")
                assert st == 200
                async with c.get(url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "cli-model"

        run(body(), timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert b"serving at" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    (line,) = rec.read_bytes().splitlines()
    r = orjson.loads(line)
    assert r["prompt"] == [4, 5, 6] and r["prompt_tokens"] == 3 and r["max_tokens"] == 2
    assert r["stream"] is False and r["model"] == "cli-model" and r["endpoint"] == "/v1/completions"
    assert set(r) == {
        "arrival_ns",
        "endpoint",
        "prompt",
        "prompt_tokens",
        "max_tokens",
        "min_tokens",
        "ignore_eos",
        "stream",
        "model",
        "include_usage",
        "request_id",
    }
    assert r["request_id"] is None  # (its X-Request-Id header: none sent here)


def test_record_requests_in_memory():
    async def body(sim, url, c):
        for i in range(3):
            await completions(
                c,
                url,
                prompt=[i, 1],
                max_tokens=1,
                min_tokens=1,
                ignore_eos=True,
                stream=True,
                stream_options={"include_usage": True},
            )
        assert len(sim.records) == 2 and sim.records_dropped == 1
        r = sim.records[1]
        assert r.prompt == [1, 1] and r.prompt_tokens == 2 and r.min_tokens == 1
        assert r.ignore_eos is True and r.stream and r.include_usage
        assert sim.records[0].arrival_ns < r.arrival_ns

    run(with_sim(SimConfig(record_requests=True, record_limit=2, **FAST), body))


def test_headers_before_first_token_and_http10():
    async def body(sim, url, c):
        t0 = time.perf_counter()
        async with c.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "stream": True}) as r:
            t_headers = time.perf_counter() - t0
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            await r.content.readuntil(b"\n\n")
            t_first = time.perf_counter() - t0
            await r.read()
        assert t_headers < 0.2 and t_first >= 0.3, (t_headers, t_first)
        # HTTP/1.0 has no chunked encoding: the engine must write raw SSE bytes.
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = orjson.dumps({"prompt": [1, 2], "max_tokens": 4, "stream": True})
        writer.write(
            b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload)
        )
        raw = await reader.read()  # HTTP/1.0: the server closes at the end
        writer.close()
        head, _, sse = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
        ev = parse_sse(sse)
        assert len(ev) == 5 and ev[3]["choices"][0]["finish_reason"] == "length"

    run(with_sim(SimConfig(ttft_base_ms=300, prefill_us_per_token=0, itl_base_ms=1), body))


def test_multi_token_chunks_with_and_without_continuous_usage():
    """``tokens_per_chunk``: one chunk per decode step carrying K tokens; with continuous usage
    the running completion_tokens rises by K per chunk (vLLM's shape), the last chunk holds
    the rest."""

    async def body(sim, url, c):
        st, _, raw = await completions(
            c,
            url,
            prompt=list(range(10)),
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        ev = parse_sse(raw)
        chunks = [e for e in ev[:-1] if e["choices"]]
        assert [e["usage"]["completion_tokens"] for e in chunks] == [1, 4, 7, 8]
        assert [e["choices"][0]["text"] for e in chunks] == [" tok", " tok" * 3, " tok" * 3, " tok"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 8 and ev[-1] == "[DONE]"
        # without continuous usage: the same chunks, usage only at the end
        st, _, raw = await completions(
            c, url, prompt=list(range(10)), max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
        ev = parse_sse(raw)
        assert [e["choices"][0]["text"].count("tok") for e in ev if e != "[DONE]" and e["choices"]] == [1, 3, 3, 1]
        assert all("usage" not in e for e in ev[:4]) and ev[4]["usage"]["completion_tokens"] == 8
        m = await metrics(c, url)
        assert m["vllm:generation_tokens_total"] == 16

    run(with_sim(SimConfig(tokens_per_chunk=3, **FAST), body))
