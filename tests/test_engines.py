"""Engine dialects end to end (issue 49): a replay against the simulator speaking each engine's
dialect names the engine and reads its ``/metrics`` into the canonical values (unknowns null);
a wrong ``--model`` is a start-up error naming the served models; the payload follows the
engine's capabilities; token ids to a text-only engine stop the run before anything is sent."""

from __future__ import annotations

import asyncio
import json

import orjson
import pyarrow.parquet as pq
import pytest

from replayer.config import load_config
from replayer.core.engines import ENGINES, engine_caps
from replayer.payload import PayloadBuilder
from replayer.run import run_replay
from replayer.run.readiness import StartupError
from replayer.sim import SimConfig, SimServer

FAST = dict(ttft_base_ms=1.0, prefill_us_per_token=0.0, itl_base_ms=1.0, itl_per_running_us=0.0)


def _trace(tmp_path) -> str:
    """Four requests, the last three sharing the first's first prompt block (512 tokens)."""
    p = tmp_path / "t.jsonl"
    rows = [{"timestamp": 20 * i, "input_length": 1024, "output_length": 3, "hash_ids": [1, 10 + i]} for i in range(4)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def _replay(tmp_path, sim_cfg: SimConfig, **settings) -> dict:
    async def main() -> dict:
        sim = SimServer(sim_cfg)
        url = await sim.start()
        try:
            cfg = load_config(
                {
                    "trace": _trace(tmp_path),
                    "target": url,
                    "results": str(tmp_path / "r"),
                    "admin_port": 0,
                    "quiet": True,
                    "scrape_interval_s": 0.05,
                    "warm_connections": 1,
                    **settings,
                }
            )
            return await asyncio.wait_for(run_replay(cfg), 60)
        finally:
            await sim.stop()

    return asyncio.run(main())


#: (engine, exports prefix-cache hits, exports KV usage)
EXPORTS = {
    "vllm": (True, True),
    "sglang": (True, True),
    "tgi": (False, False),
    "trtllm": (True, True),
    "dynamo": (True, True),
    "llamacpp": (False, True),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_replay_reads_the_dialect_of_the_engine_it_detects(tmp_path, engine):
    text = not engine_caps(engine).token_ids  # (TGI: text prompts, counted by the same tokenizer)
    tok = {"tokenizer": "builtin:gpt2"} if text else {}
    s = _replay(tmp_path, SimConfig(engine=engine, **tok, **FAST), **({"prompt_mode": "text", **tok} if text else {}))
    hits_known, kv_known = EXPORTS[engine]
    assert s["engine"] == engine and s["completed"] == 4
    tm = s["target_metrics"]
    assert tm["engine"] == engine and tm["scrapes"] >= 1
    assert abs(tm["deltas"]["prompt_tokens"] - 4 * 1024) <= (40 if text else 0)  # (text: re-tokenized)
    assert tm["deltas"]["generation_tokens"] == 4 * 3
    assert s["expected_prefix_hit_tokens"] == 3 * 512
    if hits_known:  # the sim hits the shared blocks, as the trace expects
        assert s["server_prefix_cache_hit_tokens"] == 3 * 512 == tm["deltas"]["prefix_cache_hits"]
        assert tm["deltas"]["prefix_cache_queries"] == 4 * 1024  # (counted, or the prompt tokens)
    else:  # unknown: null, never 0
        assert s["server_prefix_cache_hit_tokens"] is None and tm["deltas"]["prefix_cache_hits"] is None
        assert "prefix_cache_hits" in tm["unknown"]
    kv = tm["latest"]["kv_cache_usage_perc"]
    assert (kv is not None and 0 < kv <= 1) if kv_known else kv is None
    assert tm["latest"]["num_requests_running"] == 0 and tm["latest"]["num_requests_waiting"] == 0
    samples = pq.read_table(tmp_path / "r" / "target_metrics.parquet").to_pylist()
    canon = {r["canonical"] for r in samples}
    assert {"num_requests_running", "num_requests_waiting", "prompt_tokens"} <= canon
    assert ("kv_cache_usage_perc" in canon or "kv_total_blocks" in canon) == kv_known


def test_engine_is_forced_by_the_flag(tmp_path):
    """``--engine`` is taken as given: a SGLang page read as llama.cpp's finds none of its names."""
    s = _replay(tmp_path, SimConfig(engine="sglang", **FAST), engine="llamacpp")
    assert s["engine"] == "llamacpp" and s["target_metrics"]["deltas"].get("prompt_tokens") is None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_model_the_target_does_not_serve_is_a_startup_error_naming_the_served_ones(tmp_path, engine):
    with pytest.raises(StartupError, match=r"does not serve the model 'nope'; it serves: sim-model"):
        _replay(tmp_path, SimConfig(engine=engine, **FAST), model="nope")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.parquet"))


def test_token_ids_to_a_text_only_engine_stop_the_run_before_anything_is_sent(tmp_path):
    with pytest.raises(StartupError, match="text prompts only.*--prompt-mode text and a --tokenizer"):
        _replay(tmp_path, SimConfig(engine="tgi", record_requests=True, **FAST), engine="tgi")


def test_the_simulator_answers_404_for_a_model_it_does_not_serve():
    async def main():
        import aiohttp

        sim = SimServer(SimConfig(**FAST))
        url = await sim.start()
        try:
            async with aiohttp.ClientSession() as c:
                body = {"model": "other", "prompt": [1, 2, 3], "max_tokens": 2}
                async with c.post(url + "/v1/completions", json=body) as r:
                    return r.status, await r.json()
        finally:
            await sim.stop()

    status, body = asyncio.run(main())
    assert status == 404 and body["error"]["code"] == 404 and "`other` does not exist" in body["error"]["message"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_payload_carries_the_engines_exact_length_fields(engine):
    caps = engine_caps(engine)
    b = orjson.loads(PayloadBuilder("m", engine=engine).body(b"[1,2]", 5))
    assert b["max_tokens"] == 5
    assert ("min_tokens" in b) == caps.min_tokens
    assert b["stream_options"].get("continuous_usage_stats", False) == caps.continuous_usage
    for k, v in caps.exact_length.items():
        assert b[k] == v
    plain = orjson.loads(PayloadBuilder("m", engine=engine, vllm_extensions=False).body(b"[1,2]", 5))
    assert set(plain) == {"model", "stream", "stream_options", "max_tokens", "prompt"}


def test_a_wrong_model_against_the_embedded_simulator_is_exit_2_naming_the_served_one(tmp_path):
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "replayer", "run", _trace(tmp_path), "--model", "nope", "--admin-port", "0"]
        + ["--results", str(tmp_path / "r"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "does not serve the model 'nope'; it serves: sim-model" in p.stderr


@pytest.mark.parametrize("engine", ["vllm", "tgi", "llamacpp"])
def test_an_error_inside_a_stream_is_a_failed_request_in_each_engines_shape(engine):
    """Out-of-vocabulary token ids make the simulator answer 200 and then an error inside the
    stream, in the engine's shape: vLLM's ``data: {"error": {...}}``, llama.cpp's SSE ``error:``
    field (no ``data:``, no ``[DONE]``: its message kept all the same); TGI refuses token ids at
    once (422, its ``error``/``error_type`` body)."""
    from replayer.core import PreparedRequest, now_ns
    from replayer.http import Client

    async def main():
        sim = SimServer(SimConfig(engine=engine, vocab_size=100, **FAST))
        url = await sim.start()
        try:
            async with Client(url, t0_ns=now_ns()) as c:
                body = PayloadBuilder("sim-model", engine=engine).body(b"[1,2,500]", 3)
                req = PreparedRequest(
                    index=0, row=0, due_ns=0, body=body, input_length=3, output_length=3, prompt_len=3, max_tokens=3
                )
                return await c.send(req, req.new_result(0))
        finally:
            await sim.stop()

    res = asyncio.run(main())
    assert res.outcome != "success" and res.completion_tokens in (None, 0)
    if engine in ("vllm", "llamacpp"):  # (llama.cpp's in a field the SSE grammar drops: kept)
        assert "Token id 500 is out of vocabulary" in (res.error or "") and res.error_kind == "stream_error"
    if engine == "tgi":
        assert res.http_status == 422 and "`prompt` must be a string" in (res.error or "")
