"""--prompt-mode text: blocks decoded with a local tokenizer; the server re-tokenizes; drift reported."""

import json
import subprocess
import sys

import orjson
import pytest
from conftest import SHORT_OUTPUT
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from replayer.config import ConfigError, load_config
from replayer.payload import PayloadBuilder, PromptBuilder
from replayer.payload.prompts import vocab_from_tokenizer
from replayer.payload.textprompts import TextPromptBuilder


def word_tokenizer(path, n=3000):
    """A word-level tokenizer (w0..wN-1 plus two specials): decode joins words with spaces, so a
    server counting whitespace-separated words re-tokenizes it exactly."""
    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(n)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path))
    return str(path)


def test_text_prompt_blocks_and_prefixes(tmp_path):
    tpath = word_tokenizer(tmp_path / "tokenizer.json")
    vocab = vocab_from_tokenizer(tpath)
    assert 0 not in vocab and 1 not in vocab  # special ids never used
    b = PromptBuilder(vocab=vocab)
    t = TextPromptBuilder(b, tpath)
    a = t.prompt_text([1, 2], 700)
    c = t.prompt_text([1, 3], 1000)
    assert len(a.split()) == 700 and len(c.split()) == 1000
    assert a.split()[:512] == c.split()[:512] and a.split()[512:700] != c.split()[512:700]
    body = orjson.loads(PayloadBuilder("m").text_body(a, 5))
    assert body["prompt"] == a and body["max_tokens"] == 5
    chat = orjson.loads(PayloadBuilder("m", chat=True).text_body(a, 5))
    assert chat["messages"] == [{"role": "user", "content": a}] and "prompt" not in chat


def test_chat_needs_text_mode(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="chat"):
        load_config({"trace": str(trace), "endpoint": "/v1/chat/completions"})
    with pytest.raises(ConfigError, match="tokenizer"):
        load_config({"trace": str(trace), "prompt_mode": "text"})


def test_text_mode_replay_reports_no_drift_with_an_exact_tokenizer(tmp_path, mooncake_slice, sim_process):
    tpath = word_tokenizer(tmp_path / "tokenizer.json")
    trace = mooncake_slice(10, max_output=SHORT_OUTPUT)
    url, received = sim_process()
    res = tmp_path / "r"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "replayer",
            "run",
            str(trace),
            "--target",
            url,
            "--speedup",
            "20",
            "--prompt-mode",
            "text",
            "--tokenizer",
            tpath,
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["failed"] == 0 and s["completed"] > 0
    assert s["prompt_token_drift_total"] == 0 and s["prompt_token_mismatches"] == 0
    got = [orjson.loads(line) for line in received.read_text().splitlines()]
    assert all(isinstance(g["prompt"], str) for g in got)


def _text_trace(tmp_path, n=6):
    from replayer.trace import read_trace

    p = tmp_path / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": k, "input_length": 700 + k, "output_length": 3, "hash_ids": [k % 2, 100 + k]})
            + "\n"
            for k in range(n)
        )
    )
    return read_trace(p)


def _batch(t, n):
    import numpy as np

    from replayer.plan.schedule import ScheduleBatch

    return ScheduleBatch(
        loop=0, batch=t, idx=np.arange(n), trace_ns=np.zeros(n, np.int64), rows=np.arange(n), first_index=0
    )


def _wait(cond):
    import time

    deadline = time.monotonic() + 60  # a bound for a slow machine, not a timing assertion
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_text_prefetch_decodes_upcoming_rows_in_a_child_to_the_same_text(tmp_path):
    from replayer.payload.textprefetch import TextPrefetch

    tpath = word_tokenizer(tmp_path / "tokenizer.json")
    vocab = vocab_from_tokenizer(tpath)
    text = TextPromptBuilder(PromptBuilder(seed=3, vocab=vocab), tpath)
    t = _text_trace(tmp_path)
    sb = _batch(t, 6)

    def wants(sb, k):  # item 2 is not a text row
        return None if k == 2 else (sb.batch.hash_ids(k), int(sb.batch.input_length[k]), False, 0)

    pre = TextPrefetch(tpath, 512, vocab, wants, lookahead_rows=3)
    pre.at(sb, 0, 3)
    _wait(lambda: pre.decoded >= 2)
    assert pre.decoded == 2  # items 1 and 3: at most 3 ahead, 2 skipped
    assert pre.take(sb, 0) is None
    got = pre.take(sb, 1)
    assert got == text.prompt_text(t.hash_ids(1), 701) and len(got.split()) == 701
    assert pre.take(sb, 1) is None and pre.take(sb, 2) is None  # taken once; 2 never decoded
    pre.at(sb, 4, 3)  # item 3 prepared without it: dropped
    _wait(lambda: pre.decoded >= 3)
    assert pre.take(sb, 5) == text.prompt_text(t.hash_ids(5), 705)
    assert pre.taken == 2 and not pre._texts


def test_prepared_text_bodies_are_the_same_with_the_prefetch(tmp_path):
    from replayer.payload import Prompts, RequestFactory
    from replayer.plan import Timeline

    tpath = word_tokenizer(tmp_path / "tokenizer.json")
    t = _text_trace(tmp_path, 8)
    sb = _batch(t, 8)
    factory = RequestFactory(
        Prompts(512, seed=9, tokenizer=tpath),
        PayloadBuilder("m", chat=True),
        Timeline(1.0),
        endpoint="/v1/chat/completions",
    )
    first = factory.prepare(sb, 0)  # starts the prefetch (decoded here)
    pre = factory._text_prefetch
    _wait(lambda: pre.decoded >= 7)
    bodies = [first.body] + [factory.prepare(sb, j).body for j in range(1, 8)]
    assert pre.taken == 7
    inline = Prompts(512, seed=9, tokenizer=tpath).text_for_loop(0)
    for j, body in enumerate(bodies):
        content = orjson.loads(body)["messages"][0]["content"]
        assert content == inline.prompt_text(t.hash_ids(j), 700 + j)


def test_warm_up_makes_the_first_rows_texts_and_images_before_the_run(tmp_path):
    """Before the anchor, the first rows' prompt texts are decoded by the child and their images
    built: preparation then takes every one of them (the first request included) instead of
    starting the children and making them in the lead window, late."""
    from replayer.payload import Prompts, RequestFactory
    from replayer.plan import Timeline
    from replayer.trace import read_trace

    tpath = word_tokenizer(tmp_path / "tokenizer.json")
    p = tmp_path / "mm.jsonl"
    p.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": k,
                    "input_length": 700 + k,
                    "output_length": 3,
                    "hash_ids": [k % 2, 100 + k],
                    "num_images": 1,
                }
            )
            + "\n"
            for k in range(8)
        )
    )
    t = read_trace(p)
    sb = _batch(t, 8)
    factory = RequestFactory(
        Prompts(512, seed=9, tokenizer=tpath),
        PayloadBuilder("m", chat=True),
        Timeline(1.0),
        endpoint="/v1/chat/completions",
        image_size="64x64",
    )
    assert factory.warm_up(sb, n=8) == (8, 8)
    assert factory._image_src.built == 8
    bodies = [factory.prepare(sb, j).body for j in range(8)]
    assert factory._text_prefetch.taken == 8  # no text decoded in preparation
    assert factory._image_src.hits == 8 and factory._image_src.built == 8  # no image built in it
    inline = Prompts(512, seed=9, tokenizer=tpath).text_for_loop(0)
    for j, body in enumerate(bodies):
        parts = orjson.loads(body)["messages"][0]["content"]
        assert [q["text"] for q in parts if q["type"] == "text"] == [inline.prompt_text(t.hash_ids(j), 700 + j)]
        assert sum(q["type"] == "image_url" for q in parts) == 1
    empty = RequestFactory(Prompts(512, seed=9), PayloadBuilder("m"), Timeline(1.0))
    assert empty.warm_up(_batch(_text_trace(tmp_path), 6)) == (0, 0)  # token ids, no images: nothing to make
