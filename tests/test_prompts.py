"""Prompt expansion: exact lengths, shared prefixes, determinism, the spec in the docstring."""

import subprocess
import sys

import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from replayer.payload import PayloadBuilder, PromptBuilder
from replayer.payload.prompts import GAMMA, block_key, mix64, vocab_from_range

M = (1 << 64) - 1


def reference_block(seed: int, h: int, vocab: np.ndarray, block_size: int) -> list[int]:
    """The specification in plain Python ints (what another tool would write)."""
    k = mix64(mix64(seed) ^ h)
    return [int(vocab[mix64((k + (j + 1) * GAMMA) & M) % len(vocab)]) for j in range(block_size)]


def test_mix64_known_values():
    # SplitMix64 reference: the first output of a generator seeded with 0 is f(GAMMA)
    assert mix64(GAMMA) == 0xE220A8397B1DCDAF
    assert block_key(0, 0) == mix64(mix64(0) ^ 0)


def test_blocks_follow_the_written_specification():
    p = PromptBuilder(seed=7, block_size=64)
    for h in (0, 1, 12345, 2**63 + 5):
        assert p.block_ids(h).tolist() == reference_block(7, h, p.vocab, 64)


def test_b01_prompt_is_token_list_of_exact_length():
    p = PromptBuilder()
    body = PayloadBuilder("m").body(p.prompt_json([0, 1], 1000), 16)
    obj = orjson.loads(body)
    assert isinstance(obj["prompt"], list) and len(obj["prompt"]) == 1000
    assert obj["prompt"][:512] == p.block_ids(0).tolist()
    assert obj["prompt"][512:] == p.block_ids(1)[:488].tolist()
    assert obj["max_tokens"] == obj["min_tokens"] == 16 and obj["ignore_eos"] is True
    assert obj["stream"] is True
    assert obj["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_no_vllm_extensions_switch():
    obj = orjson.loads(PayloadBuilder("m", vllm_extensions=False).body(b"[1,2]", 5))
    assert "ignore_eos" not in obj and "min_tokens" not in obj and obj["max_tokens"] == 5
    assert obj["stream_options"] == {"include_usage": True}  # continuous_usage_stats is vLLM's too


def test_b15_partial_tail_is_prefix_of_full_block():
    p = PromptBuilder()
    r1 = orjson.loads(p.prompt_json([10, 11], 700))  # 11 first seen as a partial block
    r2 = orjson.loads(p.prompt_json([10, 11], 1024))
    assert len(r1) == 700 and len(r2) == 1024
    assert r2[:700] == r1
    fresh = PromptBuilder()
    assert orjson.loads(fresh.prompt_json([10, 11], 1024)) == r2  # content independent of first use


@pytest.mark.parametrize("n", [512, 513, 1024, 1, 511])
def test_lengths_around_block_boundaries(n):
    p = PromptBuilder()
    ids = list(range(-(-n // 512)))
    assert len(orjson.loads(p.prompt_json(ids, n))) == n


@pytest.mark.parametrize("ids,n", [([1, 2], 20), ([1], 513), ([], 5)])
def test_impossible_lengths_refused(ids, n):
    with pytest.raises(ValueError, match="hash ids"):
        PromptBuilder().prompt_json(ids, n)


@settings(max_examples=60, deadline=None)
@given(
    shared=st.integers(0, 4),
    a_extra=st.integers(1, 3),
    b_extra=st.integers(1, 3),
    tail_a=st.integers(1, 512),
    tail_b=st.integers(1, 512),
    seed=st.integers(0, 2**64 - 1),
)
def test_shared_prefix_exact(shared, a_extra, b_extra, tail_a, tail_b, seed):
    p = PromptBuilder(seed=seed, cache_bytes=4096)  # tiny cache: exercises eviction too
    a = list(range(shared)) + [1000 + i for i in range(a_extra)]
    b = list(range(shared)) + [2000 + i for i in range(b_extra)]
    la, lb = (len(a) - 1) * 512 + tail_a, (len(b) - 1) * 512 + tail_b
    pa, pb = orjson.loads(p.prompt_json(a, la)), orjson.loads(p.prompt_json(b, lb))
    assert len(pa) == la and len(pb) == lb
    k = shared * 512
    assert pa[:k] == pb[:k]
    m = min(len(pa), len(pb))
    if m > k:
        assert pa[k:m] != pb[k:m]
    assert pa == p.prompt_ids(a, la).tolist()


def test_vocabulary_range_respected():
    p = PromptBuilder(vocab=vocab_from_range(5, 9))
    ids = p.prompt_ids(list(range(8)), 4096)
    assert ids.min() >= 5 and ids.max() <= 8 and set(ids.tolist()) == {5, 6, 7, 8}


def test_same_bodies_in_another_process():
    code = (
        "from replayer.payload.prompts import PromptBuilder;import sys;"
        "sys.stdout.buffer.write(PromptBuilder(seed=3).prompt_json([5,6,7],1300))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, check=True, env={"PYTHONHASHSEED": str(s), "PATH": ""}
        ).stdout
        for s in (1, 2)
    }
    assert len(outs) == 1
    assert outs.pop() == PromptBuilder(seed=3).prompt_json([5, 6, 7], 1300)


def test_request_bodies_byte_identical_across_processes():
    """Two processes (different hash seeds) build byte-identical bodies for the same trace + seed."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet"
    code = (
        "import hashlib,sys;from replayer.trace import read_trace;from replayer.payload.prompts import PromptBuilder;"
        "from replayer.payload.body import PayloadBuilder;t=read_trace(sys.argv[1]);p=PromptBuilder(seed=42);"
        "b=PayloadBuilder('m');h=hashlib.sha256()\n"
        "for i in range(200): h.update(b.body(p.prompt_json(t.hash_ids(i),int(t.input_length[i])),"
        "int(t.output_length[i])))\n"
        "print(h.hexdigest())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code, str(trace)],
            capture_output=True,
            check=True,
            text=True,
            env={"PYTHONHASHSEED": str(s), "PATH": ""},
        ).stdout
        for s in (1, 2)
    }
    assert len(outs) == 1 and len(outs.pop().strip()) == 64


def test_salted_seeds_give_fresh_prefixes():
    """``salted_seed`` (--loop-salt per loop, ``replayer sweep`` per point): salt 0 is the seed
    itself; other salts share no block with it or each other, and ``Prompts`` uses them per loop."""
    from replayer.payload import Prompts
    from replayer.payload.prompts import salted_seed

    vocab = vocab_from_range(1000, 30000)
    assert salted_seed(7, 0) == 7
    seeds = [salted_seed(7, k) for k in range(4)]
    assert len(set(seeds)) == 4
    blocks = [tuple(PromptBuilder(seed=s, block_size=16, vocab=vocab).block_ids(3).tolist()) for s in seeds]
    assert len(set(blocks)) == 4
    prompts = Prompts(16, seed=7, loop_salt=True)
    assert [tuple(prompts.for_loop(k).block_ids(3).tolist()) for k in range(4)] == blocks


@pytest.mark.parametrize("tail", [1, 16, 48, 49, 100, 127])
def test_tail_made_alone_is_the_full_blocks_start(tail):
    # a one-block prompt of a new hash id makes only the ids it sends (a short cache entry); the
    # bytes are those of the full block, and a later row needing more of the block gets them all
    vocab = vocab_from_range(1000, 30000)
    p = PromptBuilder(seed=5, block_size=128, vocab=vocab)
    for h in (7, (1 << 64) - 3):
        got = orjson.loads(p.prompt_json([h], tail))
        assert got == reference_block(5, h, vocab, 128)[:tail]
        assert orjson.loads(p.prompt_json([h], 128)) == reference_block(5, h, vocab, 128)
        assert orjson.loads(p.prompt_json([h, 9], 140)) == (
            reference_block(5, h, vocab, 128) + reference_block(5, 9, vocab, 128)[:12]
        )
    q = PromptBuilder(seed=5, block_size=128, vocab=vocab)
    q.prompt_json([3], tail)
    assert orjson.loads(q.prompt_json([3], min(tail + 5, 128))) == reference_block(5, 3, vocab, 128)[: tail + 5]
    assert orjson.loads(q.prompt_json([4, 3], 128 + tail)) == (
        reference_block(5, 4, vocab, 128) + reference_block(5, 3, vocab, 128)[:tail]
    )
