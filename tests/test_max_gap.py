"""``max_gap_ms``, the longest wait between two streamed token-carrying events: measured by the
client against the embedded simulator streaming K tokens per chunk, with and without the
running usage that ITL needs (the gap is known either way), and null for a whole body."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from replayer.core import PreparedRequest, RequestResult, now_ns
from replayer.http import Client
from replayer.payload import PayloadBuilder
from replayer.sim import SimConfig, SimServer

N = 10  # output tokens: 1 (first) + 3 + 3 + 3
K = 3
ITL_MS = 30.0  # the simulator's gap between two decode steps


def _send(vllm_extensions: bool, stream: bool = True) -> RequestResult:
    async def main():
        cfg = SimConfig(
            tokens_per_chunk=K,
            ttft_base_ms=5.0,
            prefill_us_per_token=0.0,
            itl_base_ms=ITL_MS,
            itl_per_running_us=0.0,
            model="m",
        )
        sim = SimServer(cfg)
        url = await sim.start()
        try:
            body = PayloadBuilder("m", vllm_extensions=vllm_extensions, stream=stream).body(
                orjson.dumps(list(range(1000, 1016))), N
            )
            req = PreparedRequest(
                index=0, row=0, due_ns=0, body=body, input_length=16, output_length=N, prompt_len=16, max_tokens=N
            )
            res = req.new_result(shard=0)
            async with Client(url, t0_ns=now_ns()) as c:
                return await c.send(req, res)
        finally:
            await sim.stop()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_the_longest_gap_is_the_largest_chunk_gap_that_itl_spreads_over_its_tokens():
    r = _send(vllm_extensions=True)
    assert r.outcome == "success" and r.n_chunks == 4
    # each gap ends in a 3-token chunk: ITL holds 3 samples of gap/3, so the longest gap is 3x its largest
    assert r.max_gap_ms == pytest.approx(K * max(r.itl_ms), rel=1e-6)
    assert ITL_MS * 0.8 <= r.max_gap_ms <= r.e2e_ms - r.ttft_ms


def test_the_longest_gap_is_known_without_the_token_counts_itl_needs():
    r = _send(vllm_extensions=False)
    assert r.outcome == "success" and r.itl_ms == []  # which chunk carried how many tokens is unknown
    assert r.max_gap_ms is not None and ITL_MS * 0.8 <= r.max_gap_ms <= r.e2e_ms - r.ttft_ms


def test_a_whole_body_has_no_gap():
    r = _send(vllm_extensions=True, stream=False)
    assert r.outcome == "success" and r.max_gap_ms is None
