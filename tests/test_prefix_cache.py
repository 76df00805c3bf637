"""replayer.payload.prefix_cache: expected prefix-cache hits of a trace from its hash ids."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from replayer.payload import PrefixCacheModel
from replayer.payload.prefix_cache import chain_keys, chain_keys_py, expected_hits
from replayer.trace import read_trace

SLICE_10MIN = Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet"


def test_chain_keys_vectorised_equal_python():
    rows = [[1, 2, 3], [1, 2], [], [7], [1, 2, 3, 4, 5], [2, 1]]
    offs = np.cumsum([0] + [len(r) for r in rows])
    vals = np.array([h for r in rows for h in r], dtype=np.int64)
    keys = chain_keys(offs, vals).tolist()
    assert keys == [k for r in rows for k in chain_keys_py(r)]
    # chains: equal prefixes share keys, order matters
    a, b, c = chain_keys_py([1, 2, 3]), chain_keys_py([1, 2, 9]), chain_keys_py([2, 1])
    assert a[:2] == b[:2] and a[2] != b[2] and c[0] != a[0] and c[1] != a[1]
    # a row that starts mid-array (offsets not from 0)
    assert chain_keys(offs[3:6], vals).tolist() == chain_keys_py([7]) + chain_keys_py([1, 2, 3, 4, 5])


def test_hand_built_infinite_cache():
    m = PrefixCacheModel(block_size=512, kv_block_size=16)
    assert m.observe([0, 1], 1000) == 0  # cold
    assert m.observe([0, 1], 1000) == 992  # capped at 999, whole 16-blocks: 992
    assert m.observe([0, 1, 2], 1536) == 992  # block (0,1) was only sent as 488 tokens
    assert m.observe([0, 5], 600) == 512  # chain breaks at the 2nd id
    assert m.observe([5], 100) == 0  # same id at another position: other chain
    assert m.observe([0, 1, 2], 1536) == 1535 // 16 * 16  # everything seen: capped at input-1
    assert m.observe([0], 300) == 288  # a partial block of a cached full block
    assert m.query_tokens == 1000 * 2 + 1536 * 2 + 600 + 100 + 300
    assert m.hit_tokens == 992 + 992 + 512 + 1520 + 288


def test_partial_block_supplies_only_sent_tokens():
    # B15 shape: row 1 sends block 11 only partly (188 tokens); row 2 has it whole.
    m = PrefixCacheModel(block_size=512, kv_block_size=16)
    assert m.observe([10, 11], 700) == 0
    assert m.observe([10, 11], 1024) == 688  # 512 + 188 = 700 -> 688 (whole KV blocks)
    assert m.observe([10, 11, 12], 1100) == 1024  # now block 11 was sent whole


def test_kv_block_rounding_and_last_token_flag():
    m = PrefixCacheModel(block_size=512, kv_block_size=128)
    m.observe([1], 512)
    assert m.observe([1], 512) == 384  # 511 -> 384 (vLLM CPU, 128-token blocks)
    m2 = PrefixCacheModel(block_size=512, kv_block_size=128, last_token_recomputed=False)
    m2.observe([1], 512)
    assert m2.observe([1], 512) == 512


def test_lru_eviction():
    m = PrefixCacheModel(block_size=512, kv_block_size=16, capacity_tokens=2 * 512)  # 2 blocks
    m.observe([1], 512)  # cache: (1)
    m.observe([2], 512)  # cache: (1), (2)
    assert m.observe([1], 512) == 496  # hit; (1) becomes most recent
    m.observe([3], 512)  # evicts (2), the least recently used
    assert len(m) == 2
    assert m.observe([2], 512) == 0  # (2) was evicted; now cached again, evicts (1)
    assert m.observe([3], 512) == 496
    assert m.observe([1], 512) == 0
    # a chain whose first block was evicted does not hit on a surviving later block
    m = PrefixCacheModel(block_size=512, kv_block_size=16, capacity_tokens=3 * 512)
    m.observe([1, 2], 1024)  # (1), (1,2)
    m.observe([7], 512)  # (1), (1,2), (7)
    m.observe([8], 512)  # evicts (1)
    assert m.observe([1, 2], 1024) == 0
    m0 = PrefixCacheModel(capacity_tokens=0)
    m0.observe([1], 512)
    assert m0.observe([1], 512) == 0 and len(m0) == 0


def test_expected_hits_matches_model_and_batches():
    rows = [([0, 1], 1000), ([0, 1], 1000), ([0, 2, 3], 1200), ([0, 2], 700)]

    class Batch:
        def __init__(self, rs):
            self.input_length = np.array([r[1] for r in rs])
            self.hash_offsets = np.cumsum([0] + [len(r[0]) for r in rs])
            self.hash_values = np.array([h for r in rs for h in r[0]], dtype=np.int64)
            self.block_size = 512

    m = PrefixCacheModel()
    want = [m.observe(h, n) for h, n in rows]
    assert expected_hits(Batch(rows)).tolist() == want
    assert expected_hits([Batch(rows[:1]), Batch(rows[1:])]).tolist() == want
    assert expected_hits(Batch(rows), chunk_rows=1).tolist() == want
    assert want == [0, 992, 512, 688]


@pytest.mark.skipif(not SLICE_10MIN.exists(), reason="trace slice not present")
def test_mooncake_10min_plausible_hit_ratio():
    trace = read_trace(SLICE_10MIN)
    t = time.perf_counter()
    hits = expected_hits(trace, kv_block_size=16)
    dt = time.perf_counter() - t
    il = trace.input_length
    assert hits.shape == il.shape and (hits >= 0).all() and (hits < il).all()
    assert (hits % 16 == 0).all()
    ratio = hits.sum() / il.sum()
    lru = expected_hits(trace, kv_block_size=16, capacity_tokens=1_000_000)
    r_lru = lru.sum() / il.sum()
    blocks = int(trace.hash_offsets[-1])
    print(
        f"\nMooncake 10 min: {len(trace)} rows, {blocks} blocks, infinite-cache hit ratio "
        f"{ratio:.3f}, LRU 1M tokens {r_lru:.3f}, {dt * 1e6 / len(trace):.1f} us/row"
    )
    assert 0.2 < ratio < 0.95  # conversation trace: heavy prefix reuse, but not everything
    assert (lru <= hits).all() and r_lru <= ratio


@pytest.mark.skipif(not SLICE_10MIN.exists(), reason="trace slice not present")
def test_model_agrees_with_simulator_cache():
    """Send the first rows of the Mooncake slice one by one to the embedded simulator (which hashes
    the actual token ids in 16-token KV blocks): its prefix_cache_hits must equal the model's."""
    import asyncio

    import aiohttp

    from replayer.observe import TargetScraper
    from replayer.payload import PayloadBuilder, PromptBuilder
    from replayer.sim import SimConfig, SimServer

    n = 40
    trace = read_trace(SLICE_10MIN).head(n)
    want = expected_hits(trace, kv_block_size=16)
    prompts = PromptBuilder(seed=0, block_size=trace.block_size)
    payload = PayloadBuilder("sim-model", stream=False)

    async def main():
        sim = SimServer(
            SimConfig(
                ttft_base_ms=0.0, prefill_us_per_token=0.0, itl_base_ms=0.0, itl_per_running_us=0.0, kv_block_size=16
            )
        )
        url = await sim.start()
        try:
            async with aiohttp.ClientSession() as s:
                sc = TargetScraper(url + "/metrics", session=s)
                await sc.scrape_once()
                got = []
                for i in range(n):
                    body = payload.body(prompts.prompt_json(trace.hash_ids(i), int(trace.input_length[i])), 1)
                    async with s.post(
                        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        assert r.status == 200, await r.text()
                        await r.read()
                    before = sc.deltas().get("prefix_cache_hits", 0)
                    await sc.scrape_once()
                    got.append(sc.deltas()["prefix_cache_hits"] - before)
                return got
        finally:
            await sim.stop()

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert got == want.tolist()
    assert sum(got) > 0


def test_shards_expect_the_hits_of_one_process():
    # shards replay one trace against one server: each shard's model also sees the rows the other
    # shards send (in trace order), so per row it expects what a single process would
    from replayer.config import load_config
    from replayer.payload import PayloadBuilder, Prompts, RequestFactory
    from replayer.plan import Timeline, iter_schedule
    from replayer.trace import open_trace

    trace = str(Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet")

    def hits(shard: str, skip=None, batch_rows: int = 97) -> dict:
        cfg = load_config({"trace": trace, "shard": shard})
        i, n = cfg.shard_index
        source = open_trace(trace)
        factory = RequestFactory(Prompts(source.block_size), PayloadBuilder("m"), Timeline(1.0))
        out = {}
        for sb in iter_schedule(lambda: source.batches(batch_rows), shard=i, shards=n, max_requests=600, skip=skip):
            for j in range(len(sb.idx)):
                req = factory.prepare(sb, j)
                out[req.row] = req.expected_hits
        return out

    one = hits("0/1")
    assert sum(one.values()) > 0
    for n in (2, 3):
        merged: dict = {}
        for k in range(n):
            merged.update(hits(f"{k}/{n}"))
        assert merged == one
    # a resumed run that skips the rows already sent still expects what the whole run would (the
    # daemon reads 65,536-row batches: rows skipped in a batch it sends from are seen)
    resumed = hits("0/1", skip=lambda loop, rows: rows < 250, batch_rows=65_536)
    assert resumed == {r: h for r, h in one.items() if r >= 250}


def test_run_config_defaults_are_the_models():
    # RunConfig keeps them as literals (config imports no numpy); they must be the model's
    from replayer.config import RunConfig
    from replayer.payload.prefix_cache import DEFAULT_CAPACITY_TOKENS, DEFAULT_KV_BLOCK_SIZE

    fields = RunConfig.model_fields
    assert fields["kv_block_size"].default == DEFAULT_KV_BLOCK_SIZE
    assert fields["expected_cache_tokens"].default == DEFAULT_CAPACITY_TOKENS


def test_trace_inspect_and_a_replay_expect_the_same_hits(tmp_path, capsys):
    # one model: `replayer trace inspect` and a replay of the whole 10-minute slice (against the
    # embedded simulator) report the same expected prefix-cache hit tokens. Outputs are cut to one
    # token and times to a hundredth so the run is short; prompts, hash ids and order are the slice's.
    import json
    import subprocess
    import sys

    from replayer.cli import main as cli_main
    from replayer.trace import write_parquet
    from replayer.trace.tools import scale_trace

    fast = tmp_path / "slice_fast.parquet"
    write_parquet(scale_trace(read_trace(SLICE_10MIN), time_factor=0.01, output_factor=1e-9), fast, time_unit="ns")
    assert cli_main(["trace", "inspect", str(SLICE_10MIN), "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert cli_main(["trace", "inspect", str(fast), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["expected_prefix_hit_tokens"] == inspected["expected_prefix_hit_tokens"]
    results = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(fast),
            "--speedup",
            "1",
            "--results",
            str(results),
            "--admin-port",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((results / "summary.json").read_text())
    assert summary["sent"] == 1750 and summary["completed"] == 1750
    assert summary["expected_prefix_hit_tokens"] == inspected["expected_prefix_hit_tokens"] > 0


def test_request_factory_defaults_are_run_config_defaults():
    # RequestFactory takes its settings one by one (not the config): its defaults must be the run's
    import inspect

    from replayer.config import RunConfig
    from replayer.payload import RequestFactory

    params = inspect.signature(RequestFactory).parameters
    for name in ("image_size", "image_format", "image_token_rule", "image_cache_mb", "session_header", "endpoint"):
        assert params[name].default == RunConfig.model_fields[name].default, name
