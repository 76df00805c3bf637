"""Opt-in: a real vLLM on CPU (../shared/tools/vllm_cpu_target.sh start; tiny-llama on 127.0.0.1:8000).

Runs when REPLAYER_VLLM=1 (`.ci/run` then installs and starts the server) or when a vLLM already
answers at $REPLAYER_VLLM_URL (default http://127.0.0.1:8000). Skipped otherwise.
"""

import json
import os
import subprocess
import sys
import urllib.request

import pyarrow.parquet as pq
import pytest
from conftest import SHARED

URL = os.environ.get("REPLAYER_VLLM_URL", "http://127.0.0.1:8000")
TOKENIZER = os.environ.get(
    "REPLAYER_VLLM_TOKENIZER", os.path.join(os.environ.get("VLLM_WORKDIR", ".vllm-cpu"), "tiny-llama")
)


def _vllm_up() -> bool:
    try:
        with urllib.request.urlopen(URL + "/v1/models", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (os.environ.get("REPLAYER_VLLM") == "1" or _vllm_up()),
        reason="no real vLLM (set REPLAYER_VLLM=1 or start one on 127.0.0.1:8000)",
    ),
]


def _short_rows(tmp_path, n: int, gap_ms: int):
    """The first ``n`` rows of the real trace short enough for a 2-core CPU engine (input <= 8k,
    output <= 200 tokens), ``gap_ms`` apart in trace time."""
    out = tmp_path / "rows.jsonl"
    k = 0
    with open(SHARED / "traces" / "mooncake_conversation.jsonl") as src, open(out, "w") as dst:
        for line in src:
            r = json.loads(line)
            if r["input_length"] <= 8000 and r["output_length"] <= 200:
                r["timestamp"] = k * gap_ms
                dst.write(json.dumps(r) + "\n")
                k += 1
                if k == n:
                    break
    return out


def test_main_job_command_against_real_vllm(tmp_path):
    """The README's run command with --target: token-exact prompts and outputs on a real engine."""
    trace = _short_rows(tmp_path, 12, gap_ms=1000)
    res = tmp_path / "res"
    args = [
        sys.executable,
        "-m",
        "replayer",
        "run",
        str(trace),
        "--target",
        URL,
        "--model",
        "tiny-llama",
        "--speedup",
        "10",
        "--results",
        str(res),
        "--admin-port",
        "0",
        "--vocab-range",
        "3:32000",
    ]
    if os.path.isdir(TOKENIZER):
        args += ["--tokenizer", TOKENIZER]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["completed"] == 12 and s["failed"] == 0
    assert s["prompt_token_mismatches"] == 0 and s["completion_token_mismatches"] == 0
    for r in pq.read_table(res / "requests.parquet").to_pylist():
        assert r["prompt_tokens"] == r["input_length"] and r["completion_tokens"] == r["output_length"]
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0
    print(
        json.dumps({k: s[k] for k in ("duration", "completed", "mean_ttft_ms", "mean_tpot_ms", "dispatch_lag_p99_ms")})
    )


def _non_overlapping_rows(tmp_path, n: int, gap_ms: int = 3000):
    """Rows of the real trace that share prefixes (first hash id 0), short enough for a CPU engine,
    re-timed ``gap_ms`` apart so no two requests overlap."""
    rows = []
    with open(SHARED / "traces" / "mooncake_conversation.jsonl") as src:
        for line in src:
            r = json.loads(line)
            if r["hash_ids"][0] == 0 and r["input_length"] <= 6000 and r["output_length"] <= 64:
                rows.append(r)
            if len(rows) == n:
                break
    out = tmp_path / "spaced.jsonl"
    with open(out, "w") as f:
        for k, r in enumerate(rows):
            r["timestamp"] = k * gap_ms
            f.write(json.dumps(r) + "\n")
    return out


# a seed of its own per test run: prompts no earlier run sent, so the server's cache holds none of
# them (a fixed seed made a second run against the same server see the first run's blocks)
SEED = int.from_bytes(os.urandom(4), "little")


def test_prefix_cache_hits_match_the_trace_on_real_vllm(tmp_path):
    """Issue 4: every server prompt_tokens == input_length and the server's prefix-cache hits
    equal the hits the trace implies, to vLLM's 128-token CPU KV block."""
    trace = _non_overlapping_rows(tmp_path, 10)
    res = tmp_path / "res"
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
            "tiny-llama",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--kv-block-size",
            "128",
            "--scrape-interval",
            "1",
            "--seed",
            str(SEED),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    assert s["completed"] == len(rows) == 10
    assert all(r["prompt_tokens"] == r["input_length"] for r in rows)
    expected = s["expected_prefix_hit_tokens"]
    actual = s["server_prefix_cache_hit_tokens"]
    print(
        json.dumps(
            {
                "expected_hits": expected,
                "server_hits": actual,
                "queries": s["target_metrics"]["deltas"].get("prefix_cache_queries"),
            }
        )
    )
    assert expected > 0
    assert actual == expected


def test_chat_sessions_against_real_vllm(tmp_path):
    """Issue 8: a sessionized slice sent to /v1/chat/completions as text (the tiny model's own
    tokenizer and chat template): every turn after its predecessor, every output to length, the
    server's prompt_tokens recorded and the drift against input_length reported."""
    if not os.path.isdir(TOKENIZER):
        pytest.skip(f"no tokenizer at {TOKENIZER}")
    src = _short_rows(tmp_path, 40, gap_ms=200)
    trace = tmp_path / "sessions.parquet"
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "trace", "sessionize", str(src), "-o", str(trace)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    res = tmp_path / "res"
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
            "tiny-llama",
            "--endpoint",
            "/v1/chat/completions",
            "--prompt-mode",
            "text",
            "--tokenizer",
            TOKENIZER,
            "--max-requests",
            "12",
            "--speedup",
            "2",
            "--results",
            str(res),
            "--admin-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    rows = sorted(pq.read_table(res / "requests.parquet").to_pylist(), key=lambda r: r["row"])
    assert s["completed"] == len(rows) == 12 and s["failed"] == 0
    for r in rows:
        assert r["endpoint"] == "/v1/chat/completions"
        assert r["completion_tokens"] == r["output_length"] and r["ttft_ms"] > 0
        assert r["prompt_tokens"] is not None and r["prompt_tokens"] > 0
    by_session = {}
    for r in rows:
        by_session.setdefault(r["session_id"], []).append(r)
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:]):
            assert cur["sent_ns"] >= prev["end_ns"]
    assert s["prompt_token_drift_total"] is not None
    print(
        json.dumps(
            {
                "sessions": s["sessions"],
                "drift_total": s["prompt_token_drift_total"],
                "drift_max_abs": s["prompt_token_drift_max_abs"],
                "mean_ttft_ms": s["mean_ttft_ms"],
            }
        )
    )


POOLING_URL = os.environ.get("REPLAYER_VLLM_POOLING_URL", "http://127.0.0.1:8001")


def _pooling_up() -> bool:
    try:
        with urllib.request.urlopen(POOLING_URL + "/v1/models", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(
    not _pooling_up(),
    reason="no vLLM pooling runner at $REPLAYER_VLLM_POOLING_URL "
    "(vllm_cpu_target.sh start --runner pooling with VLLM_PORT=8001)",
)
def test_embeddings_batches_against_real_vllm_pooling_runner(tmp_path):
    """Issue 8: token-id embedding batches (split by document_lengths) on vLLM's pooling runner;
    the server's usage equals the token ids sent, so every response is audited ok."""
    import pyarrow as pa

    rows = []
    for i in range(6):
        docs = [40 + i, 30, 50 - i]
        n = sum(docs)
        rows.append(
            {
                "timestamp": 200 * i,
                "input_length": n,
                "output_length": 1,
                "hash_ids": list(range(100 * i, 100 * i + -(-n // 16))),
                "endpoint": "embeddings",
                "document_lengths": docs,
            }
        )
    table = pa.table({k: [r[k] for r in rows] for k in rows[0]})
    table = table.replace_schema_metadata({"replayer.block_size": "16", "replayer.time_unit": "ms"})
    trace = tmp_path / "emb.parquet"
    pq.write_table(table, trace)
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            POOLING_URL,
            "--model",
            "tiny-llama",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--vocab-range",
            "3:32000",
            "--block-size",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    got = pq.read_table(res / "requests.parquet").to_pylist()
    assert s["completed"] == 6 and s["failed"] == 0
    for r in got:
        assert r["endpoint"] == "/v1/embeddings" and r["n_documents"] == 3
        assert r["prompt_tokens"] == r["input_length"] and r["usage_audit"] == "ok" and r["e2e_ms"] > 0
    print(json.dumps({"usage_audit": s["usage_audit"], "e2el_ms": s["endpoints"]["/v1/embeddings"]["e2el_ms"]}))


VLM_URL = os.environ.get("REPLAYER_VLLM_VLM_URL", "http://127.0.0.1:8002")
VLM_MODEL = os.environ.get(
    "REPLAYER_VLLM_VLM_MODEL",
    os.path.join(
        os.environ.get("VLM_DIR", os.path.join(os.environ.get("VLLM_WORKDIR", ".vllm-cpu"), "vlm")), "tiny-qwen2-vl"
    ),
)


def _vlm_up() -> bool:
    try:
        with urllib.request.urlopen(VLM_URL + "/v1/models", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(
    not _vlm_up(),
    reason="no multimodal vLLM at $REPLAYER_VLLM_VLM_URL (tests/vlm_target/vlm_target.sh install, then start)",
)
def test_images_against_real_vllm_qwen2_vl(tmp_path):
    """Issue 22: chat requests with images on a real vLLM serving a tiny random-weight Qwen2-VL.
    The server's prompt tokens include the image tokens, which it reports per request
    (``multimodal_tokens.image``) and which equal replayer's ``qwen2-vl`` rule; repeated image
    ids hit its multimodal cache, and a repeated prompt with its image hits its prefix cache."""
    from replayer.payload.image_tokens import qwen2_vl_tokens

    rows = [(7, ["a"]), (8, ["b"]), (7, ["a"]), (9, ["a", "b"]), (10, ["c"]), (11, ["b"])]
    sizes = {"a": "224x224", "b": "448x336", "c": "336x336"}
    trace = tmp_path / "mm.jsonl"
    with open(trace, "w") as f:
        for k, (h, ids) in enumerate(rows):
            f.write(
                json.dumps(
                    {
                        "timestamp": 1500 * k,
                        "input_length": 200,
                        "output_length": 8,
                        "hash_ids": [h],
                        "image_ids": ids,
                        "image_sizes": [sizes[i] for i in ids],
                    }
                )
                + "\n"
            )
    res = tmp_path / "res"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            VLM_URL,
            "--model",
            "tiny-qwen2-vl",
            "--endpoint",
            "/v1/chat/completions",
            "--prompt-mode",
            "text",
            "--tokenizer",
            VLM_MODEL,
            "--image-token-rule",
            "qwen2-vl",
            "--results",
            str(res),
            "--admin-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    per_row = [sum(qwen2_vl_tokens(*map(int, sizes[i].split("x"))) for i in ids) for _, ids in rows]
    assert s["completed"] == 6 and s["failed"] == 0 and s["images_sent"] == 7
    assert s["image_tokens_reported"] == 6 and s["image_tokens_unknown"] == 0
    assert s["image_tokens_server"] == s["image_tokens_expected"] == sum(per_row)
    assert s["image_token_mismatches"] == 0
    got = sorted(pq.read_table(res / "requests.parquet").to_pylist(), key=lambda r: r["row"])
    for r, want in zip(got, per_row):
        assert r["image_tokens"] == r["expected_image_tokens"] == want
        # the text re-tokenized (drift) plus the chat template: near input_length, never the images'
        assert 150 <= r["text_tokens"] <= 260 and r["prompt_tokens"] == r["text_tokens"] + want
        assert r["completion_tokens"] == 8
    assert s["expected_image_cache_hits"] == 4  # a twice again, b twice again
    assert s["server_image_cache_hits"] >= 1  # vLLM's multimodal cache saw the reuse
    assert s["server_prefix_cache_hit_tokens"] > 0  # row 2 repeats row 0, image included
    print(
        json.dumps(
            {
                k: s.get(k)
                for k in (
                    "image_tokens_server",
                    "image_tokens_expected",
                    "server_image_cache_hits",
                    "expected_image_cache_hits",
                    "server_prefix_cache_hit_tokens",
                    "prompt_token_drift_total",
                    "mean_ttft_ms",
                )
            }
        )
    )


def test_chat_prompts_are_exact_on_real_vllm(tmp_path):
    """Issue 35: a chat replay of 40 rows (text fitted through the tiny model's own tokenizer and
    chat template): the server counts exactly input_length on every request, and its prefix-cache
    hits equal the expected ones (the template's head and tail counted), to the 128-token CPU KV
    block."""
    if not os.path.isdir(TOKENIZER):
        pytest.skip(f"no tokenizer at {TOKENIZER}")
    trace = _non_overlapping_rows(tmp_path, 40, gap_ms=2000)
    res = tmp_path / "res"
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
            "tiny-llama",
            "--endpoint",
            "/v1/chat/completions",
            "--prompt-mode",
            "text",
            "--tokenizer",
            TOKENIZER,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--kv-block-size",
            "128",
            "--scrape-interval",
            "1",
            "--seed",
            str(SEED + 35),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    rows = pq.read_table(res / "requests.parquet").to_pylist()
    print(
        json.dumps(
            {
                "mismatches": s["prompt_token_mismatches"],
                "drift_total": s["prompt_token_drift_total"],
                "drift_max_abs": s["prompt_token_drift_max_abs"],
                "expected_hits": s["expected_prefix_hit_tokens"],
                "server_hits": s["server_prefix_cache_hit_tokens"],
            }
        )
    )
    assert s["completed"] == len(rows) == 40 and s["failed"] == 0
    assert s["prompt_token_mismatches"] == 0 and s["prompt_token_drift_total"] == 0
    assert all(r["prompt_tokens"] == r["input_length"] for r in rows)
    assert s["expected_prefix_hit_tokens"] > 0
    assert s["server_prefix_cache_hit_tokens"] == s["expected_prefix_hit_tokens"]
