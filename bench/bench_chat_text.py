"""CPU per 1k requests of building chat prompt texts: exact (issue 35) vs decoded (the text mode
before it), interleaved, on W1chat's rows (the committed 10-minute Mooncake slice sent as chat).

    .venv/bin/python bench/bench_chat_text.py [--rows 300] [--rounds 3] [--tokenizer DIR]

* ``decoded``: the prompt's token ids (the run's vocabulary, every non-special id) decoded in one
  piece, as ``--prompt-mode text`` built chat prompts before: the server's count drifts.
* ``exact``: ``TextPromptBuilder.prompt_text(chat=True)``: the blocks of the round-trip-safe
  vocabulary as text, the chat template rendered and the whole prompt encoded to check the
  count (the length corrected when it is off), so the server counts exactly ``input_length``.

Both run where a replay runs them: in the text prefetch child, off the event loop. Default
tokenizer: the shipped GPT-2 BPE with a ChatML template (a temporary folder); ``--tokenizer``
takes a folder of your own. Prints CPU seconds per 1k requests (``time.process_time``: other
processes on a loaded machine do not count) per round, the median, and the share of exact rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import pyarrow.parquet as pq  # noqa: E402

from replayer.core.tokenizerfiles import tokenizer_file  # noqa: E402
from replayer.payload.prompts import PromptBuilder, vocab_from_tokenizer  # noqa: E402
from replayer.payload.textprompts import TextPromptBuilder  # noqa: E402

SLICE = os.path.join(ROOT, "traces", "mooncake_conversation_10min.parquet")
CHATML = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _gpt2_chatml(tmp: str) -> str:
    shutil.copy(tokenizer_file("builtin:gpt2"), os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": CHATML}, f)
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300, help="first rows of the slice (1,750: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", default=None)
    a = ap.parse_args()
    rows = pq.read_table(SLICE).to_pylist()[: a.rows]
    with tempfile.TemporaryDirectory() as tmp:
        spec = a.tokenizer or _gpt2_chatml(tmp)
        vocab = vocab_from_tokenizer(spec)
        t0 = time.process_time()
        exact = TextPromptBuilder(PromptBuilder(seed=0, vocab=vocab), spec)
        setup = time.process_time() - t0
        exact.overhead(True)
        decoded = PromptBuilder(seed=0, vocab=vocab)
        tok = exact.tokenizer

        def run_decoded() -> None:
            for r in rows:
                tok.decode(decoded.prompt_ids(r["hash_ids"], r["input_length"]).tolist(), skip_special_tokens=False)

        def run_exact() -> None:
            for r in rows:
                exact.prompt_text(r["hash_ids"], r["input_length"], chat=True)

        res: dict[str, list[float]] = {"decoded": [], "exact": []}
        for _ in range(a.rounds):
            for name, fn in (("decoded", run_decoded), ("exact", run_exact)):
                t = time.process_time()
                fn()
                res[name].append((time.process_time() - t) / len(rows) * 1000)
        hit = sum(
            exact.count(exact.prompt_text(r["hash_ids"], r["input_length"], True), True) == r["input_length"]
            for r in rows
        )
        tokens = sum(r["input_length"] for r in rows)
        print(f"{len(rows)} rows, {tokens / len(rows):,.0f} prompt tokens a row on average; tokenizer {spec}")
        print(f"safe vocabulary found in {setup:.2f} s CPU: {exact.safe.ids.size if exact.safe is not None else 0} ids")
        for name, v in res.items():
            print(
                f"{name:8s} CPU s per 1k requests: "
                + ", ".join(f"{x:.2f}" for x in v)
                + f"  (median {statistics.median(v):.2f})"
            )
        print(f"exact rows (server count == input_length): {hit}/{len(rows)}")


if __name__ == "__main__":
    main()
