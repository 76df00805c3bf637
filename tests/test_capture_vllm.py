"""Opt-in (REPLAYER_VLLM=1, or a vLLM at $REPLAYER_VLLM_URL): chat through `replayer record` to a real
vLLM on CPU. The captured input_length equals vLLM's prompt tokens (its /tokenize applies the chat
template), and replaying the capture as token ids reproduces the prefix-cache hits the chat traffic
had (vLLM's counter deltas, within one 128-token CPU KV block per request).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from test_capture import capture_rows, post
from test_capture_roundtrip import start_record, stop_record
from test_vllm import URL, pytestmark  # noqa: F401  (the same opt-in marks)

KV_BLOCK = 128  # vLLM's KV block on CPU


def prefix_counters() -> tuple[float, float]:
    text = urllib.request.urlopen(URL + "/metrics", timeout=10).read().decode()
    vals = {"hits": 0.0, "queries": 0.0}
    for line in text.splitlines():
        for k in vals:
            if line.startswith(f"vllm:prefix_cache_{k}_total"):
                vals[k] += float(line.rsplit(" ", 1)[1])
    return vals["hits"], vals["queries"]


def test_chat_capture_matches_vllm_and_replays_its_prefix_hits(tmp_path):
    model = json.loads(urllib.request.urlopen(URL + "/v1/models", timeout=10).read())["data"][0]["id"]
    out = tmp_path / "cap"
    rec, proxy = start_record(out, URL, "--block-size", str(KV_BLOCK))
    system = " ".join(f"rule {i}: answer briefly and plainly." for i in range(60))  # ~600 tokens, shared
    convs = [[f"Tell me about topic {c}, part {t}." for t in range(3)] for c in range(2)]
    usage = {}
    hits0, _ = prefix_counters()
    try:
        for c, turns in enumerate(convs):  # one request at a time: nothing overlaps
            msgs = [{"role": "system", "content": system}]
            for t, q in enumerate(turns):
                msgs.append({"role": "user", "content": q})
                status, _, body = post(
                    proxy + "/v1/chat/completions",
                    {"model": model, "messages": msgs, "max_tokens": 8, "temperature": 0},
                    {"X-Request-Id": f"c{c}-t{t}", "X-Session-Id": f"s{c}"},
                )
                assert status == 200, body
                ans = orjson.loads(body)
                usage[f"c{c}-t{t}"] = ans["usage"]["prompt_tokens"]
                msgs.append({"role": "assistant", "content": ans["choices"][0]["message"]["content"]})
    finally:
        stop_record(rec)
    chat_hits = prefix_counters()[0] - hits0
    rows = sorted(capture_rows(out), key=lambda r: r["timestamp"])
    assert len(rows) == 6
    for r in rows:
        assert r["input_length"] == usage[r["request_id"]] == r["hashed_tokens"]
        assert r["tokenized_by"] == "upstream" and len(r["hash_ids"]) == -(-r["input_length"] // KV_BLOCK)

    # replay the capture as token ids (completions), one request at a time
    table = pq.read_table(next(out.glob("trace-*.parquet")))
    table = table.drop_columns(["endpoint", "model"])
    ts = pa.array([i * 20_000_000_000 for i in range(table.num_rows)], pa.int64())  # 20 s apart: no overlap
    table = table.set_column(table.column_names.index("timestamp"), "timestamp", ts)
    trace = tmp_path / "capture-as-ids.parquet"
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata}), trace)
    res = tmp_path / "replay"
    hits1, _ = prefix_counters()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            URL,
            "--model",
            model,
            "--speedup",
            "10",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
            "--vocab-range",
            "3:32000",
            "--kv-block-size",
            str(KV_BLOCK),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    replay_hits = prefix_counters()[0] - hits1
    print(json.dumps({"chat_hits": chat_hits, "replay_hits": replay_hits, "rows": len(rows)}))
    assert abs(replay_hits - chat_hits) <= KV_BLOCK * len(rows)
