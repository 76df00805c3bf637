"""Workload kinds (issue 8) against the simulator: chat, embeddings, score and rerank with their
usage audits, endpoints mixed in one trace, sessions with think time and parent chains, and
prefix growth for traces without hash ids."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from faultserver import FaultServer, Plan
from test_text_mode import word_tokenizer

from replayer.core import PreparedRequest, now_ns
from replayer.core.endpoints import EMBEDDINGS, RERANK
from replayer.http import Client
from replayer.payload import PayloadBuilder

BS = 16  # tokens per hash id in these traces


def _write(path, rows: list[dict], block_size: int = BS):
    cols = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r)}
    table = pa.table(cols)
    table = table.replace_schema_metadata({"replayer.block_size": str(block_size), "replayer.time_unit": "ms"})
    pq.write_table(table, path)
    return path


def _hash(n_tokens: int, base: int) -> list[int]:
    return [base + j for j in range(-(-n_tokens // BS))]


def _run(tmp_path, trace, url, *args, ok=True):
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            "--block-size",
            str(BS),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if not ok:
        return p
    assert p.returncode == 0, p.stderr[-3000:]
    rows = sorted(pq.read_table(res / "requests.parquet").to_pylist(), key=lambda r: r["row"])
    return rows, json.loads((res / "summary.json").read_text())


def _received(rec):
    return [orjson.loads(line) for line in rec.read_text().splitlines()]


def _rerank_rows(n=6, q=8, docs=(5, 7, 3)):
    total = q + sum(docs)
    return [
        {
            "timestamp": 10 * i,
            "input_length": total,
            "output_length": 1,
            "hash_ids": _hash(total, 100 * i),
            "endpoint": "rerank",
            "query_length": q,
            "document_lengths": list(docs),
        }
        for i in range(n)
    ]


def test_a_mixed_endpoint_trace_sends_each_row_to_its_api_with_exact_usage(tmp_path, sim_process):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    url, rec = sim_process()
    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 5, "endpoint": "completions"},
        {"timestamp": 5, "input_length": 40, "output_length": 6, "endpoint": "/v1/chat/completions"},
        {
            "timestamp": 10,
            "input_length": 30,
            "output_length": 1,
            "endpoint": "embeddings",
            "document_lengths": [10, 12, 8],
        },
        {
            "timestamp": 15,
            "input_length": 20,
            "output_length": 1,
            "endpoint": "score",
            "query_length": 6,
            "document_lengths": [9, 5],
        },
        {
            "timestamp": 20,
            "input_length": 20,
            "output_length": 1,
            "endpoint": "rerank",
            "query_length": 4,
            "document_lengths": [6, 6, 4],
        },
    ]
    for i, r in enumerate(rows):
        r["hash_ids"] = _hash(r["input_length"], 1000 * i)
    trace = _write(tmp_path / "mixed.parquet", rows)
    got, summary = _run(tmp_path, trace, url, "--tokenizer", tok)
    assert [r["outcome"] for r in got] == ["success"] * 5, [r["error"] for r in got]
    assert [r["endpoint"] for r in got] == [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/score",
        "/v1/rerank",
    ]
    comp, chat, emb, score, rerank = got
    assert comp["prompt_tokens"] == 40 and comp["completion_tokens"] == 5 and comp["ttft_ms"] > 0
    assert chat["prompt_tokens"] == 40 and chat["completion_tokens"] == 6 and chat["n_chunks"] >= 6
    assert emb["prompt_tokens"] == 30 and emb["n_documents"] == 3 and emb["usage_audit"] == "ok"
    assert emb["e2e_ms"] > 0 and emb["ttft_ms"] is None
    # the simulator's default is a cross-encoder: the query is counted per document
    assert (score["expected_prompt_tokens_once"], score["expected_prompt_tokens_per_document"]) == (20, 26)
    assert score["prompt_tokens"] == 26 and score["usage_audit"] == "ok"
    assert (rerank["expected_prompt_tokens_once"], rerank["expected_prompt_tokens_per_document"]) == (20, 28)
    assert rerank["prompt_tokens"] == 28 and rerank["usage_audit"] == "ok"
    seen = {r["endpoint"]: r for r in _received(rec)}
    assert isinstance(seen["/v1/completions"]["prompt"], list)  # token ids
    msgs = seen["/v1/chat/completions"]["prompt"]
    assert msgs[0]["role"] == "user" and len(msgs[0]["content"].split()) == 40
    assert [len(x) for x in seen["/v1/embeddings"]["prompt"]] == [10, 12, 8]  # token-id batch
    s = seen["/v1/score"]["prompt"]
    assert len(s["text_1"].split()) == 6 and [len(d.split()) for d in s["text_2"]] == [9, 5]
    rr = seen["/v1/rerank"]["prompt"]
    assert len(rr["query"].split()) == 4 and [len(d.split()) for d in rr["documents"]] == [6, 6, 4]
    assert summary["completed"] == 5 and summary["prompt_token_mismatches"] == 0
    assert summary["usage_audit"]["/v1/rerank"] == {"ok": 1, "inflated": 0, "missing": 0}
    assert summary["endpoints"]["/v1/embeddings"]["completed"] == 1


def test_rerank_usage_in_both_modes_and_the_inflated_one_is_flagged(tmp_path, sim_process):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    trace = _write(tmp_path / "rerank.parquet", _rerank_rows())
    once = q_once = 8 + 15
    per_doc = 3 * 8 + 15
    for mode, expect in (("once", once), ("per_document", per_doc)):
        url, _ = sim_process("--score-usage", mode)
        got, s = _run(tmp_path / mode, trace, url, "--tokenizer", tok)
        assert all(r["prompt_tokens"] == expect and r["usage_audit"] == "ok" for r in got), mode
        assert s["usage_inflated"] == 0
    url, _ = sim_process("--score-usage", "once", "--inflate-score-usage", "7")
    got, s = _run(tmp_path / "inflated", trace, url, "--tokenizer", tok)
    assert all(r["outcome"] == "success" for r in got)
    assert all(r["prompt_tokens"] == q_once + 3 * 7 and r["usage_audit"] == "inflated" for r in got)
    assert s["usage_inflated"] == 6 and s["usage_audit"]["/v1/rerank"]["inflated"] == 6
    # an allowance of special tokens per document above the inflation clears the flag
    got, s = _run(tmp_path / "slack", trace, url, "--tokenizer", tok, "--usage-slack-tokens", "7")
    assert all(r["usage_audit"] == "ok" for r in got)


def test_text_only_endpoints_without_a_tokenizer_are_refused_before_anything_is_sent(tmp_path, sim_process):
    url, rec = sim_process()
    trace = _write(tmp_path / "rerank.parquet", _rerank_rows(2))
    p = _run(tmp_path, trace, url, ok=False)
    assert p.returncode != 0
    assert "/v1/rerank" in p.stderr and "--tokenizer" in p.stderr
    assert not rec.exists() or rec.read_text() == ""


def test_a_pooling_response_without_usage_is_a_recorded_error(tmp_path):
    bodies = [
        b'{"object":"list","data":[{"index":0,"embedding":[0.1]}]}',
        b'{"object":"list","data":[],"usage":{"total_tokens":"many"}}',
        b'{"object":"list","data":[],"usage":{"prompt_tokens":12,"total_tokens":12}}',
    ]
    plans = [Plan(body=b, content_type="application/json") for b in bodies]
    body = PayloadBuilder("m").embeddings_body([b"[1,2,3]", b"[4,5,6,7,8,9,10,11,12]"])

    async def main():
        async with FaultServer(plans) as srv:
            async with Client(srv.url, t0_ns=now_ns()) as c:
                out = []
                for i in range(3):
                    req = PreparedRequest(
                        index=i,
                        row=i,
                        due_ns=0,
                        body=body,
                        input_length=12,
                        output_length=1,
                        prompt_len=12,
                        max_tokens=0,
                        path=EMBEDDINGS,
                        endpoint=EMBEDDINGS,
                        n_documents=2,
                    )
                    out.append(await c.send(req, req.new_result(0)))
                return out, None

    results, seen = asyncio.run(main())
    a, b, c = results
    assert (a.outcome, a.error_kind, a.usage_audit) == ("failed", "usage", "missing")
    assert (b.outcome, b.error_kind, b.usage_audit) == ("failed", "usage", "missing")
    assert (c.outcome, c.usage_audit, c.prompt_tokens) == ("success", "ok", 12)
    assert c.e2e_ms is not None and c.e2e_ms > 0


def test_rerank_request_path_and_body(tmp_path):
    body = PayloadBuilder("m").rerank_body("q w1", ["a", "b c"])
    assert orjson.loads(body) == {"model": "m", "query": "q w1", "documents": ["a", "b c"]}
    score = orjson.loads(PayloadBuilder("m").score_body("q", ["d"]))
    assert score == {"model": "m", "text_1": "q", "text_2": ["d"]}
    assert RERANK == "/v1/rerank"


# -- sessions from trace columns --------------------------------------------------------------------
def test_think_time_and_parent_chains(tmp_path, sim_process):
    url, _ = sim_process("--itl-base-ms", "5", "--ttft-base-ms", "5")
    rows = []
    # session a: 3 turns 10 ms apart in the trace, 300 ms think time before turns 2 and 3
    for t in range(3):
        rows.append(
            {
                "timestamp": 10 * t,
                "input_length": 16,
                "output_length": 4,
                "hash_ids": [t],
                "session_id": "a",
                "turn": t,
                "think_time_s": 0.3 if t else None,
                "request_id": f"a{t}",
                "parent_request_id": None,
            }
        )
    trace = _write(
        tmp_path / "think.parquet",
        [{k: v for k, v in r.items() if k not in ("request_id", "parent_request_id")} for r in rows],
    )
    got, s = _run(tmp_path / "think", trace, url)
    for prev, cur in zip(got, got[1:]):
        # released at the predecessor's end + the think time, counted once: the release comes
        # 300 ms plus one event-loop step after the end's stamp. A think time counted from the
        # due time (10 ms apart) comes before that, one counted twice 300 ms later; the upper
        # bound leaves the step 300 ms, far more than a busy machine holds the replayer's loop
        release_ns = cur["due_ns"] + cur["session_wait_ms"] * 1e6
        assert 300 <= (release_ns - prev["end_ns"]) / 1e6 < 600, (release_ns - prev["end_ns"]) / 1e6
        assert cur["sent_ns"] - prev["end_ns"] >= 300e6
        # the dispatch lag counts from the release (sent = release + lag: the think time is not lag)
        assert cur["turn"] == prev["turn"] + 1 and cur["dispatch_lag_ms"] >= 0
        assert abs(release_ns + cur["dispatch_lag_ms"] * 1e6 - cur["sent_ns"]) <= 1e3
    # parent chains: two children of one slow parent go together after it; a grandchild after its parent
    chain = [
        {"timestamp": 0, "input_length": 16, "output_length": 30, "hash_ids": [1], "request_id": "p"},
        {
            "timestamp": 5,
            "input_length": 16,
            "output_length": 2,
            "hash_ids": [2],
            "request_id": "c1",
            "parent_request_id": "p",
        },
        {
            "timestamp": 6,
            "input_length": 16,
            "output_length": 2,
            "hash_ids": [3],
            "request_id": "c2",
            "parent_request_id": "p",
        },
        {
            "timestamp": 7,
            "input_length": 16,
            "output_length": 2,
            "hash_ids": [4],
            "request_id": "g",
            "parent_request_id": "c1",
        },
    ]
    trace = _write(tmp_path / "chain.parquet", chain)
    got, s = _run(tmp_path / "chain", trace, url)
    p, c1, c2, g = got
    assert all(r["outcome"] == "success" for r in got)
    assert c1["sent_ns"] >= p["end_ns"] and c2["sent_ns"] >= p["end_ns"]
    # released together, by the parent's end (the same release time, whenever each was sent)
    assert abs((c1["due_ns"] + c1["session_wait_ms"] * 1e6) - (c2["due_ns"] + c2["session_wait_ms"] * 1e6)) <= 1e3
    assert g["sent_ns"] >= c1["end_ns"]
    assert {r["session_id"] for r in got} == {"p"}  # the chain's root names the session


def test_sessions_without_hash_ids_grow_their_prompt_from_the_previous_turn(tmp_path, sim_process):
    url, rec = sim_process()
    src = tmp_path / "azure_like.jsonl"
    with open(src, "w") as f:
        for t, (n_in, n_out) in enumerate([(20, 7), (40, 5), (60, 3)]):
            f.write(json.dumps({"ts": 1000 * t, "n_in": n_in, "n_out": n_out, "sid": "x"}) + "\n")
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(src),
            "--format",
            "jsonl",
            "--map",
            "timestamp=ts,input_length=n_in,output_length=n_out,session_id=sid,hash_ids=",
            "--time-unit",
            "ms",
            "--target",
            url,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            "--speedup",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    prompts = [r["prompt"] for r in _received(rec)]
    assert [len(x) for x in prompts] == [20, 40, 60]
    # turn 2 = turn 1's prompt + a 7-token stand-in answer + 13 new tokens; turn 3 starts with turn 2 + 5
    assert prompts[1][:20] == prompts[0] and prompts[2][:40] == prompts[1]
    assert prompts[1][20:27] != prompts[2][40:47]  # answers differ per turn


def test_the_endpoint_check_reads_no_rows_of_a_trace_without_the_column(tmp_path):
    from pathlib import Path

    from replayer.config import load_config
    from replayer.run.inputs import may_have_endpoints as _may_have_endpoints
    from replayer.trace import open_trace

    slice_ = Path(__file__).resolve().parents[1] / "traces" / "mooncake_conversation_10min.parquet"
    cfg = load_config({"trace": str(slice_)})
    assert _may_have_endpoints(open_trace(str(slice_)), cfg) is False
    mixed = _write(tmp_path / "r.parquet", _rerank_rows(1))
    assert _may_have_endpoints(open_trace(str(mixed)), load_config({"trace": str(mixed)})) is True
