"""Secrets redacted where they stand as values, never inside other words (issue 47): a control
token "tok" leaves "tokens" whole, and a secret under 8 characters is warned about at start."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

from conftest import SHORT_OUTPUT

from replayer.observe import setup_logging
from replayer.observe.logs import short_secrets


def _logged(secret: str, *messages: str, fmt: str = "text") -> str:
    stream = io.StringIO()
    setup_logging(fmt, "info", secrets=(secret,), stream=stream)
    try:
        for m in messages:
            logging.getLogger("replayer.test").info(m)
    finally:
        setup_logging("text", "warning", stream=io.StringIO())
    return stream.getvalue()


def test_a_secret_is_redacted_as_a_value_and_never_inside_a_word():
    out = _logged(
        "tok",
        "prompt_tokens 42, vllm:generation_tokens_total, tokenizer gpt2, stoke",
        "Authorization: Bearer tok",
        "target http://user:tok@127.0.0.1:8000/v1",
        "config {'control_token': 'tok', 'x': \"tok\"} --control-token=tok",
    )
    assert "[redacted]ens" not in out and "s[redacted]" not in out
    assert "prompt_tokens 42, vllm:generation_tokens_total, tokenizer gpt2, stoke" in out
    assert "Authorization: Bearer [redacted]" in out
    assert "http://user:[redacted]@127.0.0.1:8000/v1" in out
    assert "{'control_token': '[redacted]', 'x': \"[redacted]\"} --control-token=[redacted]" in out


def test_a_url_encoded_secret_and_a_json_line_are_redacted_too():
    secret = "sk-a/b+c=d_0123456789"
    out = _logged(secret, f"key {secret}; as a query: ?k=sk-a%2Fb%2Bc%3Dd_0123456789&x=1", fmt="json")
    assert secret not in out and "sk-a%2F" not in out
    assert json.loads(out)["msg"] == "key [redacted]; as a query: ?k=[redacted]&x=1"


def test_a_secret_under_8_characters_is_named():
    assert short_secrets({"a": "tok", "b": "long-enough-1", "c": None}) == ["a"]


def test_a_run_with_a_short_control_token_warns_and_keeps_its_words(tmp_path, mooncake_slice, sim_process):
    trace = mooncake_slice(5, max_output=SHORT_OUTPUT)
    url, _ = sim_process()
    p = subprocess.run(
        [
            sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--speedup", "20",
            "--results", str(tmp_path / "r"), "--admin-port", "0", "--log-level", "debug",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "REPLAYER_CONTROL_TOKEN": "tok"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the control token (--control-token-file or $REPLAYER_CONTROL_TOKEN) is under 8 characters" in p.stderr
    assert "[redacted]ens" not in p.stderr + p.stdout and "tokens" in p.stderr + p.stdout
