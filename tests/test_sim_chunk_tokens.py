"""Issue 17, "Per-chunk token counts": the replayer's client against the embedded simulator
sending K tokens per chunk (as speculative decoding / MTP do). With the default body (vLLM
extensions on: ``stream_options.continuous_usage_stats``) every chunk's token count comes from
the running usage, so ITL is token-weighted right: a gap ending in a k-token chunk adds k samples
of gap/k. Without it (``--no-vllm-extensions``) which chunk carried how many tokens is unknown,
so ITL is left out (TPOT, from the server's N, stays)."""

from __future__ import annotations

import asyncio
import statistics

import orjson
import pytest

from replayer.core import PreparedRequest, RequestResult, now_ns
from replayer.http import Client
from replayer.payload import PayloadBuilder
from replayer.sim import SimConfig, SimServer

N = 10  # output tokens: 1 (first) + 3 + 3 + 3
K = 3


def _send(vllm_extensions: bool) -> tuple[RequestResult, list[dict]]:
    async def main():
        sim = SimServer(
            SimConfig(
                model="m",
                tokens_per_chunk=K,
                ttft_base_ms=5.0,
                prefill_us_per_token=0.0,
                itl_base_ms=30.0,
                itl_per_running_us=0.0,
                record_requests=True,
            )
        )
        url = await sim.start()
        try:
            body = PayloadBuilder("m", vllm_extensions=vllm_extensions).body(orjson.dumps(list(range(1000, 1016))), N)
            req = PreparedRequest(
                index=0, row=0, due_ns=0, body=body, input_length=16, output_length=N, prompt_len=16, max_tokens=N
            )
            res = RequestResult(row=0, input_length=16, output_length=N, prompt_len_sent=16, max_tokens=N)
            async with Client(url, t0_ns=now_ns()) as c:
                return await c.send(req, res), orjson.loads(body)
        finally:
            await sim.stop()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_continuous_usage_is_asked_for_and_multi_token_chunks_weight_itl():
    r, body = _send(vllm_extensions=True)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert r.outcome == "success" and r.completion_tokens == N and r.n_chunks == 4
    itl = r.itl_ms
    # 3 gaps, each ending in a 3-token chunk: 3 samples of gap/3 each
    assert len(itl) == N - 1
    for g in range(3):
        assert itl[3 * g] == itl[3 * g + 1] == itl[3 * g + 2]
    assert sum(itl) == pytest.approx(r.e2e_ms - r.ttft_ms, rel=1e-4)
    assert statistics.mean(itl) == pytest.approx(r.tpot_ms, rel=1e-4)


def test_without_vllm_extensions_chunk_counts_are_unknown_so_itl_is_left_out():
    r, body = _send(vllm_extensions=False)
    assert body["stream_options"] == {"include_usage": True}
    assert r.outcome == "success" and r.completion_tokens == N and r.n_chunks == 4
    assert r.itl_ms == []  # 4 chunks for 10 tokens: which carried how many is not known
    assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / (N - 1))
