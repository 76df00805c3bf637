"""Tests for the simulator's chat, embeddings, score and rerank endpoints (replayer.sim,
replayer.sim.pooling): a real SimServer on 127.0.0.1 driven by aiohttp."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from faultserver import run_delay_ns  # noqa: E402
from test_sim import FAST, run, with_sim  # noqa: E402  (the same harness as the sim tests)

from replayer.sim import SimConfig, parser as sim_parser  # noqa: E402
from replayer.sim.pooling import text_score  # noqa: E402


def parse_sse(raw: bytes) -> list:
    assert raw.endswith(b"\n\n"), raw[-50:]
    out = []
    for ev in raw.split(b"\n\n")[:-1]:
        assert ev.startswith(b"data: "), ev
        data = ev[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


async def post(c, url, path, body):
    async with c.post(url + path, json=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def ok(c, url, path, body) -> dict:
    st, ct, raw = await post(c, url, path, body)
    assert st == 200, raw
    assert ct.startswith("application/json")
    return orjson.loads(raw)


async def bad(c, url, path, body) -> str:
    st, _, raw = await post(c, url, path, body)
    assert st == 400, (body, raw)
    e = orjson.loads(raw)["error"]
    assert e["code"] == 400 and e["type"] == "BadRequestError"
    return e["message"]


async def metrics(c, url) -> dict:
    """(name, finished_reason or None) -> value."""
    async with c.get(url + "/metrics") as r:
        text = await r.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("finished_reason"))] = s.value
    return out


PROMPT = "vllm:prompt_tokens_total", None
GEN = "vllm:generation_tokens_total", None
STOP = "vllm:request_success_total", "stop"
LENGTH = "vllm:request_success_total", "length"


# ---------------------------------------------------------------------------------------
# Chat


MESSAGES = [
    {"role": "system", "content": "you are a helpful bot"},  # 5 words
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "hello there"},  # 2
            {"type": "text", "text": " how  are\nyou "},
        ],
    },  # 3
    {"role": "assistant", "content": None},  # 0
]


def test_chat_stream_event_sequence():
    async def body(sim, url, c):
        st, ct, raw = await post(
            c,
            url,
            "/v1/chat/completions",
            {
                "model": "sim-model",
                "messages": MESSAGES,
                "max_completion_tokens": 4,
                "max_tokens": 99,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert st == 200 and ct.startswith("text/event-stream")
        ev = parse_sse(raw)
        assert len(ev) == 1 + 4 + 1 + 1 and ev[-1] == "[DONE]"
        role, toks, usage = ev[0], ev[1:5], ev[5]
        assert role["id"].startswith("chatcmpl-") and len(role["id"]) == 9 + 32
        assert role["object"] == "chat.completion.chunk" and role["model"] == "sim-model"
        assert role["choices"] == [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]
        assert "usage" not in role
        for i, t in enumerate(toks):
            assert t["id"] == role["id"] and t["object"] == "chat.completion.chunk"
            (ch,) = t["choices"]
            assert ch["delta"] == {"content": " tok"} and ch["index"] == 0
            assert ch["finish_reason"] == ("length" if i == 3 else None)
            assert ("stop_reason" in ch) == (i == 3)
            assert "usage" not in t
        assert usage["choices"] == [] and usage["id"] == role["id"]
        assert usage["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
        m = await metrics(c, url)
        assert m[PROMPT] == 10 and m[GEN] == 4 and m[LENGTH] == 1 and m[STOP] == 0
        (rec,) = sim.records
        assert rec.endpoint == "/v1/chat/completions" and rec.prompt == MESSAGES
        assert rec.prompt_tokens == 10 and rec.max_tokens == 4 and rec.stream

        # Continuous usage: every chunk, the role chunk with 0 completion tokens.
        st, _, raw = await post(
            c,
            url,
            "/v1/chat/completions",
            {
                "messages": MESSAGES[:1],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        ev = parse_sse(raw)
        assert [e["usage"]["completion_tokens"] for e in ev[:-1]] == [0, 1, 2, 3, 3]
        assert all(e["usage"]["prompt_tokens"] == 5 for e in ev[:-1])
        assert ev[-2]["choices"] == [] and ev[0]["model"] == "sim-model"

        # max_tokens=1 and no usage: role, one final token chunk, [DONE].
        st, _, raw = await post(
            c,
            url,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 1, "stream": True},
        )
        ev = parse_sse(raw)
        assert len(ev) == 3 and ev[0]["choices"][0]["delta"]["role"] == "assistant"
        assert ev[1]["choices"][0]["finish_reason"] == "length" and ev[2] == "[DONE]"

    run(with_sim(SimConfig(record_requests=True, record_limit=1, **FAST), body))


def test_chat_non_stream_prefix_cache_and_errors():
    async def body(sim, url, c):
        words = " ".join(f"w{i}" for i in range(40))
        req = {"messages": [{"role": "user", "content": words}], "max_tokens": 3}
        d = await ok(c, url, "/v1/chat/completions", req)
        assert d["id"].startswith("chatcmpl-") and d["object"] == "chat.completion"
        (ch,) = d["choices"]
        assert ch["message"]["role"] == "assistant"
        assert ch["message"]["content"] == " tok" * 3
        assert ch["finish_reason"] == "length" and ch["index"] == 0
        assert d["usage"] == {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}
        await ok(c, url, "/v1/chat/completions", req)
        m = await metrics(c, url)
        # 40 words = 2 full 16-token blocks; the second request hits both.
        assert m[("vllm:prefix_cache_hits_total", None)] == 32
        assert m[PROMPT] == 80 and m[GEN] == 6

        chat = "/v1/chat/completions"
        for b in (
            {},
            {"messages": []},
            {"messages": "hi"},
            {"messages": [{"content": "x"}]},
            {"messages": [{"role": "user", "content": 5}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            {"messages": [{"role": "user", "content": "  "}]},
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "2"},
            [1],
        ):
            await bad(c, url, chat, b)
        msg = await bad(
            c, url, chat, {"messages": [{"role": "user", "content": words}], "max_tokens": 30, "stream": True}
        )
        assert "maximum context length is 64" in msg and "70 tokens" in msg

    run(with_sim(SimConfig(max_model_len=64, **FAST), body))


def test_reset_prefix_cache_empties_the_cache():
    """``POST /reset_prefix_cache`` (vLLM's endpoint): a prompt sent again after it hits nothing."""

    async def body(sim, url, c):
        req = {"prompt": list(range(1000, 1040)), "max_tokens": 1}  # 2 full 16-token blocks
        hits = ("vllm:prefix_cache_hits_total", None)
        await ok(c, url, "/v1/completions", req)
        await ok(c, url, "/v1/completions", req)
        assert (await metrics(c, url))[hits] == 32  # the second hit both blocks
        async with c.post(url + "/reset_prefix_cache") as r:
            assert r.status == 200 and await r.read() == b""
        await ok(c, url, "/v1/completions", req)
        assert (await metrics(c, url))[hits] == 32  # nothing cached any more
        await ok(c, url, "/v1/completions", req)
        assert (await metrics(c, url))[hits] == 64  # (and it caches again)

    run(with_sim(SimConfig(**FAST), body))


# ---------------------------------------------------------------------------------------
# Embeddings


def test_embeddings_inputs_usage_and_formats():
    async def body(sim, url, c):
        m0 = await metrics(c, url)
        d = await ok(c, url, "/v1/embeddings", {"input": "one two three", "model": "e"})
        assert d["id"].startswith("embd-") and d["object"] == "list" and d["model"] == "e"
        assert d["usage"] == {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}
        (e,) = d["data"]
        assert e["index"] == 0 and e["object"] == "embedding" and len(e["embedding"]) == 16
        assert abs(np.linalg.norm(e["embedding"]) - 1) < 1e-5
        # Deterministic per input; different inputs differ.
        d2 = await ok(c, url, "/v1/embeddings", {"input": ["one two three", "four"]})
        assert d2["data"][0]["embedding"] == e["embedding"]
        assert d2["data"][1]["embedding"] != e["embedding"]
        assert [x["index"] for x in d2["data"]] == [0, 1] and d2["usage"]["prompt_tokens"] == 4
        assert d2["model"] == "sim-model"
        # One token-id input; a batch of token-id inputs.
        d3 = await ok(c, url, "/v1/embeddings", {"input": [1, 2, 3, 4, 5]})
        assert len(d3["data"]) == 1 and d3["usage"]["prompt_tokens"] == 5
        d4 = await ok(c, url, "/v1/embeddings", {"input": [[1, 2], [3, 4, 5], [31999]]})
        assert len(d4["data"]) == 3 and d4["usage"]["total_tokens"] == 6
        # base64 = little-endian float32 of the same vector; dimensions cut + renormalise.
        d5 = await ok(c, url, "/v1/embeddings", {"input": "one two three", "encoding_format": "base64"})
        v = np.frombuffer(base64.b64decode(d5["data"][0]["embedding"]), dtype="<f4")
        assert v.tolist() == e["embedding"]
        d6 = await ok(c, url, "/v1/embeddings", {"input": "one two three", "dimensions": 4})
        v4 = np.array(d6["data"][0]["embedding"])
        assert len(v4) == 4 and abs(np.linalg.norm(v4) - 1) < 1e-5
        full = np.array(e["embedding"][:4])
        assert np.allclose(v4, full / np.linalg.norm(full), atol=1e-6)

        m = await metrics(c, url)
        assert m[PROMPT] - m0[PROMPT] == 3 + 4 + 5 + 6 + 3 + 3
        assert m[STOP] - m0[STOP] == 6 and m[LENGTH] == 0 and m[GEN] == 0
        assert m[("vllm:prefix_cache_queries_total", None)] == 0
        assert [r.endpoint for r in sim.records] == ["/v1/embeddings"] * 6
        assert sim.records[3].prompt == [[1, 2], [3, 4, 5], [31999]]
        assert sim.records[3].prompt_tokens == 6 and sim.records[3].max_tokens is None

        emb = "/v1/embeddings"
        assert "out of vocabulary" in await bad(c, url, emb, {"input": [1, 32000]})
        assert "-1" in await bad(c, url, emb, {"input": [[1], [-1, 2]]})
        for b in (
            {},
            {"input": []},
            {"input": 3},
            {"input": [1, "a"]},
            {"input": [[1], "a"]},
            {"input": [1.5]},
            {"input": [True]},
            {"input": ""},
            {"input": [[]]},
            {"input": "a", "encoding_format": "int8"},
            {"input": "a", "dimensions": 0},
            {"input": "a", "dimensions": 17},
            {"input": list(range(65))},
        ):
            await bad(c, url, emb, b)
        async with c.post(url + emb, data=b"{nope") as r:
            assert r.status == 400
        m2 = await metrics(c, url)
        assert m2[PROMPT] == m[PROMPT]  # rejected requests count nothing

    run(with_sim(SimConfig(max_model_len=64, record_requests=True, **FAST), body))


def test_pooling_latency_and_max_num_seqs():
    cfg = SimConfig(ttft_base_ms=100, prefill_us_per_token=1000.0, max_num_seqs=1)

    async def until(cond):
        for _ in range(6000):  # 30 s at most
            if cond():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("condition not reached in 30 s")

    async def body(sim, url, c):
        t0, off0 = time.perf_counter(), run_delay_ns()
        await ok(c, url, "/v1/embeddings", {"input": " ".join(["w"] * 100)})  # 100+100 ms
        dt, off_cpu = time.perf_counter() - t0, (run_delay_ns() - off0) / 1e9
        # the planned wait (not a multiple of it), later only by the time the machine kept this
        # thread (client and server) off the CPU
        assert 0.19 <= dt < 0.25 + off_cpu, (dt, off_cpu)
        # max_num_seqs=1: a second request waits while the first (~1.1 s) runs, then runs itself
        t0 = time.perf_counter()
        first = asyncio.create_task(ok(c, url, "/v1/rerank", {"query": "q", "documents": [" ".join(["w"] * 1000)]}))
        await until(lambda: sim.num_requests_running == 1)
        second = asyncio.create_task(ok(c, url, "/v1/rerank", {"query": "q", "documents": ["d"]}))
        await until(lambda: sim.num_requests_waiting == 1 or second.done())
        assert not first.done() and sim.num_requests_running == 1 and sim.num_requests_waiting == 1
        await asyncio.gather(first, second)
        assert time.perf_counter() - t0 >= 1.1 + 0.1
        assert sim.num_requests_running == 0

    run(with_sim(cfg, body))


# ---------------------------------------------------------------------------------------
# Score and rerank

Q = "what is the capital"  # q = 4
DOCS = ["paris is the capital of france", "berlin", "a b c"]  # d = 6, 1, 3


@pytest.mark.parametrize(
    "mode,inflate,want_tokens,want_usage",
    [
        ("per_document", 0, 3 * 4 + 10, 3 * 4 + 10),
        ("once", 0, 4 + 10, 4 + 10),
        ("per_document", 5, 22, 22 + 15),
        ("once", 7, 14, 14 + 21),
    ],
)
def test_score_and_rerank_usage_modes(mode, inflate, want_tokens, want_usage):
    async def body(sim, url, c):
        m0 = await metrics(c, url)
        d = await ok(c, url, "/v1/score", {"model": "s", "text_1": Q, "text_2": DOCS})
        assert d["id"].startswith("score-") and d["object"] == "list" and d["model"] == "s"
        assert d["usage"] == {"prompt_tokens": want_usage, "total_tokens": want_usage, "completion_tokens": 0}
        assert [x["index"] for x in d["data"]] == [0, 1, 2]
        assert all(x["object"] == "score" and 0 < x["score"] < 1 for x in d["data"])
        assert [x["score"] for x in d["data"]] == [text_score(Q, t) for t in DOCS]
        r = await ok(c, url, "/v1/rerank", {"query": Q, "documents": DOCS})
        assert r["id"].startswith("rerank-") and r["model"] == "sim-model"
        assert r["usage"] == {"total_tokens": want_usage}
        assert set(r) == {"id", "model", "usage", "results"}
        m = await metrics(c, url)
        # /metrics counts what the engine processed; the inflation is only in the usage.
        assert m[PROMPT] - m0[PROMPT] == 2 * want_tokens
        assert m[STOP] - m0[STOP] == 2
        # Honest expectations: inflation makes usage exceed both of them.
        if inflate:
            assert want_usage > 3 * 4 + 10 and want_usage > 4 + 10

    run(with_sim(SimConfig(score_usage=mode, score_usage_inflate_tokens=inflate, **FAST), body))


def test_score_pairing_rules_and_errors():
    async def body(sim, url, c):
        # 1:1
        d = await ok(c, url, "/score", {"text_1": "a b", "text_2": "c"})
        assert len(d["data"]) == 1 and d["usage"]["prompt_tokens"] == 3
        assert d["data"][0]["score"] == text_score("a b", "c")
        # N:N pairwise (list of one text_1 is 1:N).
        d = await ok(c, url, "/v1/score", {"text_1": ["a", "b c"], "text_2": ["d e f", "g"]})
        assert [x["score"] for x in d["data"]] == [text_score("a", "d e f"), text_score("b c", "g")]
        assert d["usage"]["prompt_tokens"] == (1 + 3) + (2 + 1)
        d = await ok(c, url, "/v1/score", {"text_1": ["q"], "text_2": ["x", "y", "z w"]})
        assert len(d["data"]) == 3 and d["usage"]["prompt_tokens"] == 3 * 1 + 4
        # queries/documents aliases.
        d = await ok(c, url, "/v1/score", {"queries": "q", "documents": ["x", "y"]})
        assert len(d["data"]) == 2 and d["usage"]["prompt_tokens"] == 4
        assert sim.records[-1].prompt == {"text_1": "q", "text_2": ["x", "y"]}
        sc = "/v1/score"
        assert "1:1, 1:N or N:N" in await bad(c, url, sc, {"text_1": ["a", "b"], "text_2": ["c"]})
        assert "1:1, 1:N or N:N" in await bad(c, url, sc, {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
        for b in (
            {"text_2": "x"},
            {"text_1": "x"},
            {"text_1": [], "text_2": "x"},
            {"text_1": "x", "text_2": []},
            {"text_1": 1, "text_2": "x"},
            {"text_1": "x", "text_2": ["a", 2]},
            "x",
            {"text_1": "a b c d e", "text_2": "f g h i j k"},
        ):  # 11 > max_model_len
            await bad(c, url, sc, b)

    run(with_sim(SimConfig(max_model_len=10, record_requests=True, **FAST), body))


def test_rerank_order_top_n_and_paths():
    docs = [f"document number {i} about things" for i in range(8)]

    async def body(sim, url, c):
        full = await ok(c, url, "/v1/rerank", {"query": "things", "documents": docs})
        res = full["results"]
        assert sorted(x["index"] for x in res) == list(range(8))
        scores = [x["relevance_score"] for x in res]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == 8
        for x in res:
            assert x["document"] == {"text": docs[x["index"]]}
            assert x["relevance_score"] == text_score("things", docs[x["index"]])
        assert full["usage"] == {"total_tokens": 8 * 1 + 8 * 5}
        for path in ("/rerank", "/v2/rerank"):
            r = await ok(c, url, path, {"query": "things", "top_n": 3, "documents": [{"text": t} for t in docs]})
            assert r["results"] == res[:3]
            assert r["usage"] == full["usage"]  # usage covers every document
        r = await ok(c, url, "/v1/rerank", {"query": "things", "documents": docs, "top_n": 0})
        assert r["results"] == res
        rr = "/v1/rerank"
        for b in (
            {"documents": ["a"]},
            {"query": "q"},
            {"query": "q", "documents": []},
            {"query": 1, "documents": ["a"]},
            {"query": "q", "documents": [{"x": 1}]},
            {"query": "q", "documents": ["a"], "top_n": "2"},
        ):
            await bad(c, url, rr, b)

    run(with_sim(SimConfig(**FAST), body))


def test_cli_flags():
    a = sim_parser().parse_args(["--score-usage", "once", "--inflate-score-usage", "3", "--embedding-dim", "8"])
    assert (a.score_usage, a.score_usage_inflate_tokens, a.embedding_dim) == ("once", 3, 8)
    d = sim_parser().parse_args([])
    assert (d.score_usage, d.score_usage_inflate_tokens, d.embedding_dim) == ("per_document", 0, 16)
    with pytest.raises(SystemExit):
        sim_parser().parse_args(["--score-usage", "twice"])
    for bad_cfg in (dict(embedding_dim=0), dict(score_usage="x"), dict(score_usage_inflate_tokens=-1)):
        with pytest.raises(ValueError):
            SimConfig(**bad_cfg)
