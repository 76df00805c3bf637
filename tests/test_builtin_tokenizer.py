"""The shipped tokenizer (``--tokenizer builtin:gpt2``): GPT-2's real BPE, found by name, and the
chat journey with it against the simulator, offline and without a tokenizer of one's own."""

import json
import os
import subprocess
import sys

import orjson
import pytest
from conftest import SHORT_OUTPUT
from tokenizers import Tokenizer

from replayer.config import ConfigError, load_config
from replayer.core.tokenizerfiles import tokenizer_file
from replayer.payload import PromptBuilder
from replayer.payload.prompts import vocab_from_tokenizer
from replayer.payload.textprompts import TextPromptBuilder
from replayer.trace import read_trace


def test_builtin_gpt2_is_gpt2s_tokenizer_and_ships_its_license():
    path = tokenizer_file("builtin:gpt2")
    tok = Tokenizer.from_file(path)
    assert tok.get_vocab_size() == 50257 and tok.token_to_id("<|endoftext|>") == 50256
    # GPT-2's well-known ids ("Hello world" = 15496 995; Ġ marks a leading space)
    assert tok.encode("Hello world").ids == [15496, 995]
    assert tok.encode("hello world, it's GPT-2!").tokens == [
        "hello",
        "Ġworld",
        ",",
        "Ġit",
        "'s",
        "ĠG",
        "PT",
        "-",
        "2",
        "!",
    ]
    assert tok.decode(tok.encode("naïve café 東京").ids) == "naïve café 東京"  # byte-level: any text round-trips
    vocab = vocab_from_tokenizer("builtin:gpt2")
    assert vocab.size == 50256 and vocab[-1] == 50255  # every id but the special one
    license_text = open(os.path.join(os.path.dirname(path), "LICENSE")).read()
    assert "MIT License" in license_text and "OpenAI" in license_text
    assert os.path.getsize(path) < 3_000_000  # (a small package)


def test_an_unknown_builtin_name_is_refused_with_the_names_there_are(tmp_path):
    with pytest.raises(ConfigError, match=r"no builtin tokenizer 'llama' \(there is builtin:gpt2\)"):
        load_config({"request_rate": 1, "tokenizer": "builtin:llama"})
    with pytest.raises(ConfigError, match="no tokenizer.json there"):
        load_config({"request_rate": 1, "tokenizer": str(tmp_path)})
    assert load_config({"request_rate": 1, "tokenizer": "builtin:gpt2"}).tokenizer == "builtin:gpt2"


def test_a_chat_replay_with_the_builtin_tokenizer_against_the_simulator(tmp_path, mooncake_slice, sim_process):
    """The docs' chat journey, with the shipped tokenizer: every request goes as chat messages
    whose text is exactly its token ids decoded by GPT-2 (the same text on every run), and the
    server's re-tokenizing is reported as drift."""
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
            "--endpoint",
            "/v1/chat/completions",
            "--prompt-mode",
            "text",
            "--tokenizer",
            "builtin:gpt2",
            "--results",
            str(res),
            "--admin-port",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((res / "summary.json").read_text())
    t = read_trace(trace)
    assert s["completed"] == len(t) > 0 and s["failed"] == 0
    assert s["prompt_token_drift_total"] is not None  # (the simulator counts words, not GPT-2 tokens)
    got = [orjson.loads(line) for line in received.read_text().splitlines()]
    assert {g["endpoint"] for g in got} == {"/v1/chat/completions"}
    texts = sorted(g["prompt"][0]["content"] for g in got)
    builder = TextPromptBuilder(PromptBuilder(seed=0, vocab=vocab_from_tokenizer("builtin:gpt2")), "builtin:gpt2")
    rows = range(len(t))
    expected = sorted(
        builder.prompt_text(t.hash_values[t.hash_offsets[i] : t.hash_offsets[i + 1]], int(t.input_length[i]))
        for i in rows
    )
    assert texts == expected
