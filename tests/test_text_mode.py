"""--prompt-mode text: blocks decoded with a local tokenizer; the server re-tokenizes; drift reported."""

import json
import subprocess
import sys

import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

from replayer.config import ConfigError, load_config
from replayer.payload import PayloadBuilder
from replayer.prompts import PromptBuilder, TextPromptBuilder, vocab_from_tokenizer


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
    assert 0 not in vocab and 1 not in vocab           # special ids never used
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
    trace = mooncake_slice(10)
    url, received = sim_process()
    res = tmp_path / "r"
    p = subprocess.run([sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--speedup", "20",
                        "--prompt-mode", "text", "--tokenizer", tpath, "--results", str(res),
                        "--admin-port", "0", "--quiet"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["failed"] == 0 and s["completed"] > 0
    assert s["prompt_token_drift_total"] == 0 and s["prompt_token_mismatches"] == 0
    got = [orjson.loads(line) for line in received.read_text().splitlines()]
    assert all(isinstance(g["prompt"], str) for g in got)
