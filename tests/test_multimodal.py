"""Multimodal replay: image columns and readers, deterministic images, server-counted image tokens
(case B35), mismatch counting, chat bodies with images against the simulator, refusal for
token-id endpoints."""

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from PIL import Image
from test_text_mode import word_tokenizer

from replayer.core import RequestResult
from replayer.core.result import to_table
from replayer.http import StreamAccumulator
from replayer.payload.image_tokens import parse_rule, qwen2_vl_tokens
from replayer.payload.images import ImageParts, image_bytes, image_pixels
from replayer.results import summarize
from replayer.trace import TraceError, read_trace, write_parquet

DATA = Path(__file__).parent / "data"

_CHILD = (
    "import hashlib, sys; from replayer.payload.images import image_bytes; "
    "print(hashlib.sha256(image_bytes(7, sys.argv[1], 333, 250, sys.argv[2])).hexdigest())"
)


def _child_digest(image_id: str, fmt: str) -> str:
    p = subprocess.run([sys.executable, "-c", _CHILD, image_id, fmt], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_same_id_same_bytes_in_two_processes_and_other_ids_differ(fmt):
    here = hashlib.sha256(image_bytes(7, "img_00001", 333, 250, fmt)).hexdigest()
    assert _child_digest("img_00001", fmt) == here  # another interpreter, same bytes
    assert _child_digest("img_00002", fmt) != here  # another id, another image
    assert hashlib.sha256(image_bytes(8, "img_00001", 333, 250, fmt)).hexdigest() != here  # another seed


def test_images_have_structure_and_decode_to_their_size():
    px = image_pixels(0, "a", 320, 200)
    assert px.shape == (200, 320, 3) and px.dtype == np.uint8
    assert px.std() > 30  # not a flat colour
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 1000  # nor a handful of colours
    assert not np.array_equal(px, image_pixels(0, "b", 320, 200))
    with Image.open(io.BytesIO(image_bytes(0, "a", 320, 200, "png"))) as im:
        assert im.size == (320, 200)
        assert np.array_equal(np.asarray(im.convert("RGB")), px)  # PNG: lossless
    with Image.open(io.BytesIO(image_bytes(0, "c", 97, 1, "png"))) as im:  # odd sizes, one row
        assert np.array_equal(np.asarray(im.convert("RGB")), image_pixels(0, "c", 97, 1))


def test_image_cache_is_bounded_and_counts_hits():
    parts = ImageParts("png", cache_bytes=1)  # room for one part only
    a1, _ = parts.part(0, "a", 64, 64)
    a2, _ = parts.part(0, "a", 64, 64)
    assert a1 == a2 and parts.hits == 1 and parts.built == 1
    parts.part(0, "b", 64, 64)
    parts.part(0, "a", 64, 64)  # evicted by b: built again, same bytes
    assert parts.built == 3 and len(parts._cache) == 1
    assert a1.startswith(b'{"type":"image_url","image_url":{"url":"data:image/png;base64,')


def test_image_token_rules():
    assert qwen2_vl_tokens(1024, 1024) == 37 * 37
    assert qwen2_vl_tokens(448, 336) == 16 * 12
    assert qwen2_vl_tokens(10, 10) == 4  # raised to min_pixels (56x56)
    assert qwen2_vl_tokens(8192, 8192) * 28 * 28 <= 12_845_056  # capped at max_pixels
    assert parse_rule("llava")(1024, 768) == 576
    assert parse_rule("fixed:7")(1, 1) == 7
    assert parse_rule("none") is None
    with pytest.raises(ValueError, match="qwen2-vl"):
        parse_rule("fixed:-1")


def test_azure_lmm_2025_sample_reads():
    t = read_trace(DATA / "azure_lmm_2025_sample.csv")
    assert t.metadata["format"] == "azure" and "Azure LMM inference trace 2025" in t.metadata["source"]
    assert t.num_images == [1, 0, 2, 1, 3]
    assert list(t.input_length) == [1510, 734, 2966, 1102, 4377] and t.image_ids is None
    assert t.hash_ids_synthetic


def test_azure_lmm_bad_num_images_names_file_row_and_field(tmp_path):
    bad = tmp_path / "lmm.csv"
    bad.write_text(
        "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
        "2024-10-15 00:00:00.0418690,-1,1510,47\n"
        "2024-10-15 00:00:00.2211760,999,734,212\n"
    )
    with pytest.raises(TraceError) as e:
        read_trace(bad)
    text = str(e.value)
    assert f"{bad}: row 2: num_images: num_images -1 is not allowed" in text
    assert f"{bad}: row 3: num_images: num_images 999: at most 64 per row" in text


def test_servegen_sample_reads():
    t = read_trace(DATA / "servegen_mm_sample.jsonl")
    assert t.metadata["format"] == "servegen" and t.block_size == 16
    assert t.image_ids == [["img_00001"], ["img_00002"], ["img_00001"], [], ["img_00003", "img_00002"]]
    assert list(t.timestamp_ns) == [0] * 5 and list(t.output_length) == [128] * 5
    assert t.request_id == ["0", "1", "2", "3", "4"]
    assert [len(t.hash_ids(i)) for i in range(5)] == [28, 27, 27, 3, 19]  # ceil(input_length / 16)


def test_image_column_rules(tmp_path):
    rows = [
        {
            "timestamp": 0,
            "input_length": 4,
            "output_length": 1,
            "hash_ids": [1],
            "image_ids": ["a", "b"],
            "image_sizes": ["64x64"],
        },  # one size short
        {
            "timestamp": 1,
            "input_length": 4,
            "output_length": 1,
            "hash_ids": [2],
            "image_ids": ["a"],
            "num_images": 2,
        },  # counts disagree
        {
            "timestamp": 2,
            "input_length": 4,
            "output_length": 1,
            "hash_ids": [3],
            "image_ids": ["a"],
            "image_sizes": ["9000x10"],
        },  # out of bounds
        {
            "timestamp": 3,
            "input_length": 4,
            "output_length": 1,
            "hash_ids": [4],
            "image_ids": ["a"],
            "image_sizes": ["big"],
        },
        {"timestamp": 4, "input_length": 4, "output_length": 1, "hash_ids": [5], "image_ids": "a"},
        {
            "timestamp": 5,
            "input_length": 4,
            "output_length": 1,
            "hash_ids": [6],
            "image_ids": [7, "b"],
            "image_sizes": [[32, 16], "16X8"],
            "image_tokens": 5,
        },
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError) as e:
        read_trace(p)
    text = str(e.value)
    assert "row 1: image_sizes: 1 image_sizes for 2 images: give one size per image" in text
    assert "row 2: num_images: num_images 2 != 1 image_ids: they must agree" in text
    assert "row 3: image_sizes: image_sizes[0]: image size 9000x10 out of bounds" in text
    assert "row 4: image_sizes: image_sizes[0]: image size 'big' is not WxH" in text
    assert "row 5: image_ids: expected a list" in text
    assert "row 6" not in text
    p.write_text(json.dumps(rows[-1]) + "\n")
    t = read_trace(p)
    assert t.image_ids == [["7", "b"]] and t.image_sizes == [["32x16", "16x8"]] and t.image_tokens == [5]
    out = tmp_path / "t.parquet"
    write_parquet(t, out)
    back = read_trace(out)
    assert back.image_ids == t.image_ids and back.image_sizes == t.image_sizes and back.image_tokens == [5]


# -- B35: the server counts the tokens -------------------------------------------------------

U1 = (
    b'data: {"choices":[],"usage":{"prompt_tokens":542,"completion_tokens":3,"total_tokens":545,'
    b'"prompt_tokens_details":{"cached_tokens":0,"image_tokens":512}}}\n\n'
)
U2 = (
    b'data: {"choices":[],"usage":{"prompt_tokens":542,"completion_tokens":3,"total_tokens":545,'
    b'"prompt_tokens_details":null}}\n\n'
)


def _accumulate(usage_event: bytes | None) -> StreamAccumulator:
    acc = StreamAccumulator()
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'] * 2
    events.append(b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"length"}]}\n\n')
    for i, ev in enumerate(events + ([usage_event] if usage_event else []) + [b"data: [DONE]\n\n"]):
        acc.on_event(ev[6:-2], 1000 + i)  # the event's data (after "data: ")
    acc.finish()
    return acc


def _b35_result(acc: StreamAccumulator, expected: int | None) -> RequestResult:
    r = RequestResult(
        row=0,
        input_length=30,
        output_length=3,
        outcome="success",
        sent_ns=0,
        end_ns=10**6,
        images=2,
        image_bytes=1000,
        expected_image_tokens=expected,
        endpoint="/v1/chat/completions",
    )
    r.prompt_tokens, r.completion_tokens, r.image_tokens = acc.prompt_tokens, acc.completion_tokens, acc.image_tokens
    if acc.image_tokens is not None and acc.prompt_tokens is not None:
        r.text_tokens = acc.prompt_tokens - acc.image_tokens
    r.usage_source = "server" if acc.usage_seen else "none"
    return r


def test_b35_usage_with_and_without_details():
    u1, u2, u3 = _accumulate(U1), _accumulate(U2), _accumulate(None)
    assert (u1.prompt_tokens, u1.image_tokens) == (542, 512)
    assert (u2.prompt_tokens, u2.image_tokens) == (542, None)  # unknown, not 0 and not 542
    assert (u3.prompt_tokens, u3.image_tokens) == (None, None)
    # vLLM 0.32 reports the placeholder tokens per modality instead
    vllm = _accumulate(U1.replace(b'"image_tokens":512', b'"multimodal_tokens":{"image":512}'))
    assert (vllm.prompt_tokens, vllm.image_tokens) == (542, 512)
    text_only = _accumulate(U1.replace(b'"image_tokens":512', b'"multimodal_tokens":null,"cached_tokens":0'))
    assert text_only.image_tokens is None
    # the client's estimate: 30 text tokens + one placeholder per image = 32 (fixed:1 per image)
    s1 = summarize(to_table([_b35_result(u1, 2)]))
    assert s1["total_input_tokens"] == 542 and s1["image_tokens_server"] == 512
    assert s1["text_tokens_server"] == 30 and s1["image_tokens_expected"] == 2
    assert s1["image_token_mismatches"] == 1  # 512 != 2: counted, never replaced
    assert s1["prompt_token_mismatches"] == 0  # text 30 == input_length 30
    s2 = summarize(to_table([_b35_result(u2, 2)]))
    assert s2["total_input_tokens"] == 542
    assert s2["image_tokens_server"] is None and s2["text_tokens_server"] is None
    assert s2["image_tokens_unknown"] == 1 and s2["image_token_mismatches"] == 0
    s3 = summarize(to_table([_b35_result(u3, 2)]))
    assert s3["total_input_tokens"] is None and s3["usage_missing"] == 1
    assert s3["image_tokens_server"] is None and s3["image_tokens_expected"] == 2
    both = summarize(to_table([_b35_result(u1, 512), _b35_result(u2, 512)]))
    assert both["total_input_tokens"] == 1084 and both["image_tokens_server"] == 512
    assert both["image_token_mismatches"] == 0 and both["image_tokens_reported"] == 1


# -- against the simulator -------------------------------------------------------------------

SIZES = ["448x336", "224x224"]


def _image_trace(path: Path, n: int = 8) -> list[list[str]]:
    ids = []
    with open(path, "w") as f:
        for i in range(n):
            row_ids = [f"img{i % 3}"] if i % 2 else [f"img{i % 3}", "shared"]
            ids.append(row_ids)
            f.write(
                json.dumps(
                    {
                        "timestamp": i * 50,
                        "input_length": 40,
                        "output_length": 3,
                        "hash_ids": [i],
                        "image_ids": row_ids,
                        "image_sizes": SIZES[: len(row_ids)],
                    }
                )
                + "\n"
            )
    return ids


def _run(trace, tok, res, *extra, target=None):
    args = [
        sys.executable,
        "-m",
        "replayer",
        "run",
        str(trace),
        "--speedup",
        "4",
        "--results",
        str(res),
        "--admin-port",
        "0",
        "--quiet",
        *extra,
    ]
    if target:
        args += ["--target", target]
    return subprocess.run(args, capture_output=True, text=True, timeout=180)


CHAT = ("--endpoint", "/v1/chat/completions", "--prompt-mode", "text")


def test_chat_images_against_the_simulator_rule_counts_agree(tmp_path, sim_process):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    trace = tmp_path / "mm.jsonl"
    ids = _image_trace(trace)
    url, received = sim_process()
    p = _run(trace, tok, tmp_path / "r", *CHAT, "--tokenizer", tok, target=url)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    per_row = [sum(qwen2_vl_tokens(*map(int, SIZES[k].split("x"))) for k in range(len(r))) for r in ids]
    assert s["completed"] == 8 and s["images_sent"] == sum(map(len, ids))
    assert s["image_tokens_server"] == s["image_tokens_expected"] == sum(per_row)
    assert s["image_token_mismatches"] == 0 and s["image_tokens_unknown"] == 0
    assert s["prompt_token_mismatches"] == 0 and s["total_input_tokens"] == 8 * 40 + sum(per_row)
    distinct = len({(i, SIZES[k]) for r in ids for k, i in enumerate(r)})
    assert s["expected_image_cache_hits"] == s["images_sent"] - distinct
    got = [orjson.loads(line) for line in received.read_text().splitlines()]
    content = got[0]["prompt"][0]["content"]
    assert content[0]["type"] == "text" and len(content[0]["text"].split()) == 40
    assert [c["type"] for c in content[1:]] == ["image_url"] * len(ids[0])
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    metrics = subprocess.run(["curl", "-s", url + "/metrics"], capture_output=True, text=True).stdout
    queries = float(next(x.split()[-1] for x in metrics.splitlines() if x.startswith("vllm:mm_cache_queries_total")))
    hits = float(next(x.split()[-1] for x in metrics.splitlines() if x.startswith("vllm:mm_cache_hits_total")))
    assert queries == s["images_sent"] and hits == s["expected_image_cache_hits"]
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "r" / "requests.parquet").sort_by("row").to_pylist()
    assert [r["image_tokens"] for r in t] == per_row == [r["expected_image_tokens"] for r in t]
    assert [r["text_tokens"] for r in t] == [40] * 8 and all(r["image_bytes"] > 0 for r in t)


def test_every_image_token_mismatch_is_counted(tmp_path, sim_process):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    trace = tmp_path / "mm.jsonl"
    _image_trace(trace)
    url, _ = sim_process("--image-token-rule", "llava")  # the server counts 576 per image
    p = _run(trace, tok, tmp_path / "r", *CHAT, "--tokenizer", tok, target=url)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["image_token_mismatches"] == 8  # every request, none replaced
    assert s["image_tokens_server"] == 576 * s["images_sent"] != s["image_tokens_expected"]
    assert s["prompt_token_mismatches"] == 0  # the text is still exact
    url2, _ = sim_process("--no-prompt-tokens-details")  # vLLM without --enable-prompt-tokens-details
    p = _run(trace, tok, tmp_path / "r2", *CHAT, "--tokenizer", tok, target=url2)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert s["image_tokens_server"] is None and s["image_tokens_unknown"] == 8
    assert s["image_token_mismatches"] == 0 and s["total_input_tokens"] > 8 * 40


def test_images_to_a_token_id_endpoint_are_refused_before_the_run(tmp_path, sim_process):
    trace = tmp_path / "mm.jsonl"
    _image_trace(trace)
    url, received = sim_process()
    p = _run(trace, None, tmp_path / "r", target=url)
    assert p.returncode == 2
    assert "8 rows carry images" in p.stderr and "/v1/completions" in p.stderr
    assert "--endpoint /v1/chat/completions --prompt-mode text --tokenizer PATH" in p.stderr
    assert not received.exists() or received.read_text() == ""  # nothing was sent


def test_azure_lmm_counts_replay_each_image_new(tmp_path, sim_process):
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    url, received = sim_process()
    p = _run(
        DATA / "azure_lmm_2025_sample.csv",
        tok,
        tmp_path / "r",
        *CHAT,
        "--tokenizer",
        tok,
        "--image-size",
        "224x224",
        "--speedup",
        "50",
        target=url,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["completed"] == 5 and s["image_requests"] == 4 and s["images_sent"] == 7
    assert s["image_tokens_server"] == s["image_tokens_expected"] == 7 * 64  # 224x224 -> 8x8 merged patches
    assert s["expected_image_cache_hits"] == 0 and s["image_token_mismatches"] == 0
    contents = [orjson.loads(line)["prompt"][0]["content"] for line in received.read_text().splitlines()]
    assert sum(isinstance(c, str) for c in contents) == 1  # the row with NumImages 0: plain text
    urls = [
        c["image_url"]["url"]
        for content in contents
        if isinstance(content, list)
        for c in content
        if c["type"] == "image_url"
    ]
    assert len(urls) == 7 == len(set(urls))  # a count only: every image a new one


def test_prefetch_builds_upcoming_rows_images_into_the_cache(tmp_path):
    import time

    from replayer.payload.imageprefetch import ImagePrefetch
    from replayer.plan.schedule import ScheduleBatch

    p = tmp_path / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": k,
                    "input_length": 4,
                    "output_length": 1,
                    "hash_ids": [k],
                    "image_ids": [f"i{k}"],
                    "image_sizes": ["96x64"],
                }
            )
            + "\n"
            for k in range(6)
        )
    )
    t = read_trace(p)
    sb = ScheduleBatch(
        loop=0, batch=t, idx=np.arange(6), trace_ns=np.zeros(6, np.int64), rows=np.arange(6), first_index=0
    )
    parts = ImageParts("png")
    pre = ImagePrefetch(parts, "512x512", lookahead_rows=3)
    parts.part(5, "i0", 96, 64)  # row 0, prepared now
    pre.at(sb, 0, 5)
    deadline = time.monotonic() + 60  # a bound for a slow machine, not a timing assertion
    while pre.built < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pre.built == 3  # rows 1..3: at most 3 rows ahead
    time.sleep(0.2)
    assert pre.built == 3 and ("i4" not in {k[1] for k in parts._cache})
    before = parts.built
    assert parts.part(5, "i1", 96, 64)[0] == content_part_of(5, "i1")  # from the cache, same bytes
    assert parts.built == before and parts.hits == 1


def content_part_of(seed, image_id):
    from replayer.payload.images import content_part

    return content_part(image_bytes(seed, image_id, 96, 64, "png"), "png")
