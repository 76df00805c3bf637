"""Agentic trace formats (Weka/SemiAnalysis, GitHub Copilot coding agent 2026, TraceLab): the
samples in tests/data (written from the published schemas) read and validated, problems naming
file, record and field, conversion to canonical Parquet, and Copilot-style prompts whose shared
prefix is the reported cached tokens, checked against the embedded simulator's prefix cache."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replayer.trace import TraceError, read_trace

DATA = Path(__file__).parent / "data"
WEKA, COPILOT, TRACELAB = DATA / "weka_sample.jsonl", DATA / "copilot_sample.jsonl", DATA / "tracelab_sample.jsonl"


def _rows(t, session):
    return [i for i in range(len(t)) if t.session_id[i] == session]


def test_weka_sample_sessions_turns_waits_and_local_ids():
    t = read_trace(WEKA)
    assert t.metadata["format"] == "weka" and t.block_size == 64
    assert t.metadata["hash_id_scope"] == "local"
    assert "1 subagents replayed as sessions of their own" in t.metadata["notes"]
    a, b = _rows(t, "trace_0001"), _rows(t, "trace_0002")
    assert [t.turn[i] for i in a] == [0, 1, 2] and [t.turn[i] for i in b] == [0, 1]
    assert [int(t.timestamp_ns[i]) for i in a] == [0, 2_500_000_000, 6_000_000_000]
    assert [float(t.think_time_s[i]) for i in a][1] == 0.5 and np.isnan(t.think_time_s[a[0]])
    assert [int(t.input_length[i]) for i in a] == [150, 260, 320]
    # within a session the given ids keep their sharing: [1,2,3] / [1,2,4,5,6] / [1,2,4,5,7]
    h = [list(t.hash_ids(i)) for i in a]
    assert h[1][:2] == h[0][:2] and h[1][2] != h[0][2] and h[2][:4] == h[1][:4] and h[2][4] != h[1][4]
    # local scope: id 1 of one session is not id 1 of the other
    assert t.hash_ids(b[0])[0] != h[0][0] and not set(t.hash_ids(b[1])) & set(np.concatenate(h))
    assert all(0 <= int(x) < 2**62 for x in t.hash_values)

    # the subagent: a session of its own, inner t relative to its marker (3.0 s), first call
    # waiting for the parent's call before the marker; it shares its record's blocks
    sa = _rows(t, "trace_0001::sa:a1")
    assert [int(t.timestamp_ns[i]) for i in sa] == [3_200_000_000, 3_800_000_000]
    assert [t.request_id[i] for i in sa] == ["trace_0001::sa:a1#0", "trace_0001::sa:a1#1"]
    assert [t.parent_request_id[i] for i in sa] == ["trace_0001#1", "trace_0001::sa:a1#0"]
    assert list(t.hash_ids(sa[0])[:2]) == h[0][:2] and t.hash_ids(sa[1])[2] == t.hash_ids(sa[0])[2]
    assert [t.parent_request_id[i] for i in a] == [None, "trace_0001#0", "trace_0001#1"]


def test_weka_single_object_file_and_global_scope(tmp_path):
    rec = {
        "id": "one",
        "block_size": 64,
        "hash_id_scope": "global",
        "requests": [{"t": 0, "type": "n", "in": 64, "out": 2, "hash_ids": [7]}],
    }
    p = tmp_path / "trace_0001.json"
    p.write_text(json.dumps(rec))
    t = read_trace(p)
    assert t.metadata["format"] == "weka" and list(t.hash_ids(0)) == [7]  # global ids are kept


def test_copilot_sample_waits_from_tool_batches_and_idle():
    t = read_trace(COPILOT)
    assert t.metadata["format"] == "copilot" and t.block_size == 64
    a = _rows(t, "c0ffee01")
    assert [int(t.input_length[i]) for i in a] == [1000, 1300, 1500, 1700]
    assert [int(t.output_length[i]) for i in a] == [10, 5, 8, 6]
    waits = [float(t.think_time_s[i]) for i in a]
    assert np.isnan(waits[0])
    assert waits[1:] == pytest.approx([1.5, 0.7, 26.1])  # tool batch m1, tool batch m2, user idle
    b = _rows(t, "c0ffee02")
    assert int(t.output_length[b[1]]) == 1  # completion 0 (cancelled) sent as 1, noted
    assert "1 calls with completion 0" in t.metadata["notes"]


def _shared_blocks(x, y):
    n = 0
    for p, q in zip(x, y):
        if p != q:
            break
        n += 1
    return n


def test_copilot_prompts_share_exactly_the_cached_blocks():
    t = read_trace(COPILOT)
    a = _rows(t, "c0ffee01")
    cached = [0, 990, 1290, 700]
    for k in range(1, len(a)):
        prev, cur = list(t.hash_ids(a[k - 1])), list(t.hash_ids(a[k]))
        assert _shared_blocks(prev, cur) == cached[k] // 64  # 15, 20, 10 blocks
    # sessions never share a block
    b = _rows(t, "c0ffee02")
    assert not set(np.concatenate([t.hash_ids(i) for i in a])) & set(np.concatenate([t.hash_ids(i) for i in b]))


def test_tracelab_sample_prefix_and_waits():
    t = read_trace(TRACELAB)
    assert t.metadata["format"] == "tracelab"
    a = _rows(t, "claude:5b1f0c2a")
    assert [int(t.timestamp_ns[i]) for i in a] == [0, 2_100_000_000]  # round 1 arrives at its tool_result
    assert float(t.think_time_s[a[1]]) == pytest.approx(0.6)  # 02.100 - the round-0 end at 01.500
    assert _shared_blocks(list(t.hash_ids(a[0])), list(t.hash_ids(a[1]))) == 900 // 64


def test_gzip_shards_are_read(tmp_path):
    p = tmp_path / "shard-0000.jsonl.gz"
    with gzip.open(p, "wb") as f:
        f.write(COPILOT.read_bytes())
    t = read_trace(p)
    assert t.metadata["format"] == "copilot" and len(t) == 6


@pytest.mark.parametrize(
    "fmt,lines,want",
    [
        (
            "weka",
            [
                '{"id": "a", "block_size": 64, "requests": [{"t": 0, "type": "n", "in": 64, "out": 1, "hash_ids": [1]}]}',
                '{"id": "b", "block_size": 64, "requests": [{"t": 0, "type": "n", "in": 64, "out": 1, "hash_ids": [1]},'
                ' {"t": 1, "type": "n", "in": "many", "out": 1, "hash_ids": [1]}]}',
            ],
            "row 2: requests[1].in: expected a whole number",
        ),
        (
            "weka",
            [
                '{"id": "a", "block_size": 64, "requests": [{"t": 0, "type": "n", "in": 200, "out": 1, "hash_ids": [1]}]}'
            ],
            "row 1: requests[0].hash_ids: expected 4 hash ids",
        ),
        (
            "weka",
            ['{"id": "a", "block_size": 64, "requests": []}', '{"id": "b", "block_size": 16, "requests": []}'],
            "row 2: block_size: 16 differs from 64",
        ),
        (
            "copilot",
            [
                '{"session_id": "s", "turns": [{"llm_calls": [{"timestamp": "2026-06-01T00:00:00Z", '
                '"duration_ms": 1, "tokens": {"prompt": 10, "completion": 1, "cached": 11}}]}]}'
            ],
            "row 1: turns[0].llm_calls[0].tokens.cached: cached 11 is more than prompt 10",
        ),
        (
            "copilot",
            [
                '{"session_id": "s", "turns": [{"llm_calls": [{"timestamp": "yesterday", '
                '"duration_ms": 1, "tokens": {"prompt": 10, "completion": 1, "cached": 0}}]}]}'
            ],
            "row 1: turns[0].llm_calls[0].timestamp: not an ISO-8601 date-time",
        ),
        (
            "tracelab",
            [
                '{"session_id": "s", "round_index": 0, "input_tokens_total": 10, "prefix_tokens": 3, '
                '"newly_append_tokens": 5, "output_tokens": 1, "timing_events": '
                '[{"event_type": "user_message", "timestamp": "2026-05-04T09:00:00Z"}]}'
            ],
            "row 1: input_tokens_total: prefix_tokens 3 + newly_append_tokens 5 = 8 != input_tokens_total 10",
        ),
        (
            "tracelab",
            [
                '{"session_id": "s", "round_index": 0, "input_tokens_total": 10, "prefix_tokens": 0, '
                '"newly_append_tokens": 10, "output_tokens": 1}'
            ],
            "row 1: timing_events: missing",
        ),
    ],
)
def test_problems_name_file_record_and_field(tmp_path, fmt, lines, want):
    p = tmp_path / f"bad_{fmt}.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as e:
        read_trace(p, fmt=fmt)
    assert f"{p}: {want}" in str(e.value), str(e.value)


def test_convert_writes_canonical_parquet(tmp_path):
    out = tmp_path / "copilot.parquet"
    r = subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "convert", str(COPILOT), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    src, back = read_trace(COPILOT), read_trace(out)
    assert back.metadata["format"] == "parquet" and back.metadata["hash_id_scope"] == "local"
    assert back.block_size == 64 and back.session_id == src.session_id and back.turn == src.turn
    assert np.array_equal(back.timestamp_ns, src.timestamp_ns)
    assert np.array_equal(back.hash_values, src.hash_values)
    assert np.allclose(back.think_time_s, src.think_time_s, equal_nan=True)


def test_copilot_prefix_equals_cached_tokens_on_the_simulator():
    """Send the Copilot sample's calls in trace order to the embedded simulator (16-token KV
    blocks): the prompt tokens it serves from its prefix cache are, per call, the reported cached
    tokens rounded down to 64-token blocks, and the replayer's expected-hit model agrees."""
    import aiohttp

    from replayer.observe import TargetScraper
    from replayer.payload import PayloadBuilder, PrefixCacheModel, PromptBuilder
    from replayer.sim import SimConfig, SimServer

    t = read_trace(COPILOT)
    cached = {
        ("c0ffee01", 0): 0,
        ("c0ffee01", 1): 990,
        ("c0ffee01", 2): 1290,
        ("c0ffee01", 3): 700,
        ("c0ffee02", 0): 0,
        ("c0ffee02", 1): 450,
    }
    want = [cached[(t.session_id[i], t.turn[i])] // 64 * 64 for i in range(len(t))]
    model = PrefixCacheModel(block_size=64, kv_block_size=16)
    expected = [model.observe(t.hash_ids(i), int(t.input_length[i])) for i in range(len(t))]
    prompts = PromptBuilder(seed=0, block_size=64)
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
                for i in range(len(t)):
                    body = payload.body(prompts.prompt_json(t.hash_ids(i), int(t.input_length[i])), 1)
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
    assert got == want == expected
    assert sum(got) == 960 + 1280 + 640 + 448


def test_a_first_record_over_a_mebibyte_is_still_detected(tmp_path):
    reqs = [{"t": i * 0.5, "type": "n", "in": 64 * 40, "out": 1, "hash_ids": list(range(1, 41))} for i in range(6000)]
    p = tmp_path / "big.jsonl"
    p.write_text(json.dumps({"id": "big", "block_size": 64, "hash_id_scope": "local", "requests": reqs}) + "\n")
    assert p.stat().st_size > 1 << 20
    t = read_trace(p)
    assert t.metadata["format"] == "weka" and len(t) == 6000
