"""Issue 35: text and chat prompts the server re-tokenizes to exactly the trace's input_length,
the chat template's tokens counted, prefix sharing kept as the token-id path keeps it.

Three offline tokenizers, none downloaded:
* ``tiny-llama``: the byte-level BPE (vocab 32000, ``<s>``/``</s>``/``<pad>``) and chat template
  that ``../shared/tools/make_tiny_model.py`` builds for the real-vLLM target, trained here the same
  way (the same ``tokenizers`` calls on the same standard-library sources);
* ``gpt2-chatml``: the shipped GPT-2 byte-level BPE (``builtin:gpt2``) with a ChatML template and
  ``<|endoftext|>`` as BOS;
* ``sp-llama2``: a SentencePiece-style BPE built here with ``tokenizers`` (Metaspace ``▁``
  pre-tokenizer and decoder, byte fallback with the 256 ``<0xNN>`` pieces) with Llama 2's
  ``[INST]`` template (BOS, content trimmed).
"""

import glob
import json
import os
import subprocess
import sys

import jinja2
import numpy as np
import orjson
import pytest
from conftest import SHORT_OUTPUT, slice_rows
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from replayer.core.tokenizerfiles import tokenizer_file
from replayer.payload import PromptBuilder
from replayer.payload.prompts import vocab_from_tokenizer
from replayer.payload.textprompts import TextPromptBuilder

TINY_TEMPLATE = (  # make_tiny_model.py's
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CHATML = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA2 = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "[INST] {{ message['content'] | trim }} [/INST]{% else %} {{ message['content'] | trim }} {{ eos_token }}"
    "{% endif %}{% endfor %}"
)


def _corpus():
    return sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:400]


def _config(folder, template, **specials):
    (folder / "tokenizer_config.json").write_text(json.dumps({**specials, "chat_template": template}))


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory):
    """The three tokenizer folders (module docstring)."""
    root = tmp_path_factory.mktemp("tokenizers")
    tiny = root / "tiny-llama"
    tiny.mkdir()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(
        _corpus(),
        trainers.BpeTrainer(
            vocab_size=32000,
            special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.save(str(tiny / "tokenizer.json"))
    _config(tiny, TINY_TEMPLATE, bos_token="<s>", eos_token="</s>", pad_token="<pad>")

    gpt2 = root / "gpt2-chatml"
    gpt2.mkdir()
    (gpt2 / "tokenizer.json").write_bytes(open(tokenizer_file("builtin:gpt2"), "rb").read())
    _config(gpt2, CHATML, bos_token="<|endoftext|>", eos_token="<|endoftext|>")

    sp = root / "sp-llama2"
    sp.mkdir()
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
    )
    tok.train(
        _corpus()[:150],
        trainers.BpeTrainer(
            vocab_size=8000,
            special_tokens=["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))],
            show_progress=False,
        ),
    )
    tok.save(str(sp / "tokenizer.json"))
    _config(sp, LLAMA2, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    return root


NAMES = ("tiny-llama", "gpt2-chatml", "sp-llama2")
#: rows of the committed 10-minute slice: all 367 of at most 2,000 tokens and every 50th longer one
#: (~400 rows, 0.9M tokens; all 1,750 rows, 24M tokens, take minutes per tokenizer on a small machine)
_ALL = slice_rows()
ROWS = [r for r in _ALL if r["input_length"] <= 2000] + [r for r in _ALL if r["input_length"] > 2000][::50]
_TOKENIZERS: dict = {}


def _server_count(folder, messages) -> list[int]:
    """What a server prefills for ``messages``: the template rendered as transformers renders it
    (written out here, apart from the replayer's code), encoded without added special tokens."""
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(cfg["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=cfg.get("bos_token"), eos_token=cfg.get("eos_token")
    )
    tok = _TOKENIZERS.get(folder) or _TOKENIZERS.setdefault(folder, Tokenizer.from_file(str(folder / "tokenizer.json")))
    return tok.encode(text, add_special_tokens=False).ids


def _check_rows(folder, rows) -> tuple[int, list]:
    """Build every row's chat prompt with the tokenizer in ``folder`` and check it as the server
    would (the module's main assertions, shared by the default and the every-row test). Returns
    (rows checked, failures): a failure is (row index, timestamp, input_length, server count) for a
    count that is not input_length, or the same with ``"content"`` for a content that is not the
    token-id path's blocks. Prefix sharing is asserted on consecutive rows (only the previous
    row's ids are held, so the whole slice fits in memory)."""
    spec = str(folder)
    text = TextPromptBuilder(PromptBuilder(seed=5, vocab=vocab_from_tokenizer(spec)), spec)
    assert text.exact and text.counter.has_template and text.safe.ids.size > 1000
    over = text.overhead(True)
    assert over > 0  # the template's tokens
    heads = set()
    bad: list = []
    prev = None
    checked = 0
    for i, row in enumerate(rows):
        n, hashes = row["input_length"], row["hash_ids"]
        content = text.prompt_text(hashes, n, chat=True)
        ids = _server_count(folder, [{"role": "user", "content": content}])
        if len(ids) != n:
            bad.append((i, row["timestamp"], n, len(ids)))
            prev = None
            continue
        m = n - over
        want = text.content_builder.prompt_ids(hashes[: -(-m // 512)], m).tolist()
        start = next((k for k in range(len(ids)) if ids[k : k + 8] == want[:8]), None)
        if start is None or ids[start : start + m] != want:
            bad.append((i, row["timestamp"], n, len(ids), "content"))
            prev = None
            continue
        heads.add(tuple(ids[:start]))
        assert len(heads) == 1, (folder.name, i)  # the same template prefix everywhere
        # prefix sharing: two rows sharing k leading hash ids share at least the prefix + k blocks
        if prev is not None:
            hp, a = prev
            k = 0
            while k < min(len(hp), len(hashes)) and hp[k] == hashes[k]:
                k += 1
            q = start + k * 512
            if k and min(len(a), len(ids)) > q:
                assert a[:q] == ids[:q], (folder.name, i)
                checked += 1
        prev = (hashes, ids)
    return checked, bad


@pytest.mark.parametrize("name", NAMES)
def test_chat_prompts_count_exactly_input_length_with_the_template(tokenizers_dir, name):
    """Every row: the server's count of the chat prompt (template included) is input_length; the
    content is the token-id path's blocks (of the round-trip-safe vocabulary) token for token,
    after a template prefix that is the same for every row, so rows sharing k hash ids share the
    template prefix and k x 512 tokens, as token ids do."""
    checked, bad = _check_rows(tokenizers_dir / name, ROWS)
    assert bad == []
    assert checked > 10


@pytest.mark.slow_exact
@pytest.mark.timeout(3600)  # ~3-5 min per tokenizer on a loaded 2-core host, past the suite's 300 s
@pytest.mark.skipif(
    os.environ.get("REPLAYER_EXACT_ALL") != "1", reason="every row takes minutes (REPLAYER_EXACT_ALL=1)"
)
@pytest.mark.parametrize("name", NAMES)
def test_every_row_of_the_slice_counts_exactly(tokenizers_dir, name):
    """All 1,750 rows of the committed slice (24M tokens), not the default test's sample: the same
    checks, every failing row listed (index, timestamp, input_length, the server's count)."""
    checked, bad = _check_rows(tokenizers_dir / name, _ALL)
    print(f"{name}: {len(_ALL)} rows, {len(bad)} mismatches, {checked} consecutive pairs sharing a prefix")
    assert bad == []
    assert checked > 100


def test_completions_text_counts_exactly_with_the_shipped_gpt2():
    """``--prompt-mode text`` on completions, builtin:gpt2 (no template: none is said, none
    counted): the text encodes to exactly input_length, the token-id path's ids of the safe
    vocabulary."""
    text = TextPromptBuilder(PromptBuilder(seed=1, vocab=vocab_from_tokenizer("builtin:gpt2")), "builtin:gpt2")
    assert not text.counter.has_template and text.overhead(False) == 0
    for row in ROWS[:80]:
        n, hashes = row["input_length"], row["hash_ids"]
        got = text.tokenizer.encode(text.prompt_text(hashes, n), add_special_tokens=True).ids
        assert got == text.content_builder.prompt_ids(hashes, n).tolist()


def test_multi_turn_chat_counts_the_template_over_the_whole_conversation(tokenizers_dir):
    """A session without hash-id prefixes (prefix growth): each turn sends the conversation so far,
    and the template over all of it counts exactly the turn's input_length."""
    from replayer.payload import PayloadBuilder, Prompts, RequestFactory
    from replayer.plan import Timeline
    from replayer.plan.schedule import ScheduleBatch
    from replayer.trace import read_trace

    folder = tokenizers_dir / "gpt2-chatml"
    trace = tokenizers_dir / "azure.jsonl"
    lengths = [(700, 40), (1500, 60), (2600, 30)]
    trace.write_text(
        "".join(
            json.dumps({"timestamp": k, "input_length": n, "output_length": o, "session_id": "s", "turn": k}) + "\n"
            for k, (n, o) in enumerate(lengths)
        )
    )
    t = read_trace(trace, mapping="hash_ids=", time_unit="ms")
    assert t.hash_ids_synthetic
    sb = ScheduleBatch(
        loop=0, batch=t, idx=np.arange(3), trace_ns=np.zeros(3, np.int64), rows=np.arange(3), first_index=0
    )
    factory = RequestFactory(
        Prompts(512, tokenizer=str(folder)),
        PayloadBuilder("m", chat=True),
        Timeline(1.0),
        endpoint="/v1/chat/completions",
    )
    for j, (n, _) in enumerate(lengths):
        messages = orjson.loads(factory.prepare(sb, j).body)["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * j + ["user"]
        assert len(_server_count(folder, messages)) == n


def test_chat_replay_against_the_simulator_with_the_tokenizer_is_exact(tokenizers_dir, mooncake_slice, tmp_path):
    """The loop closed without a GPU: a chat replay (tiny-llama's tokenizer and template) against
    the embedded simulator counting as vLLM does has no prompt-token mismatch, and the same
    expected and server prefix-cache hits as the token-id replay of the same rows."""
    trace = mooncake_slice(20, max_output=SHORT_OUTPUT)
    folder = str(tokenizers_dir / "tiny-llama")
    out = {}
    for mode, extra in (
        ("chat", ["--endpoint", "/v1/chat/completions", "--prompt-mode", "text", "--tokenizer", folder]),
        ("ids", ["--vocab-range", "3:32000"]),
    ):
        res = tmp_path / mode
        p = subprocess.run(
            [sys.executable, "-m", "replayer", "run", str(trace), "--speedup", "10", "--results", str(res)]
            + ["--admin-port", "0", "--quiet", *extra],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        out[mode] = json.loads((res / "summary.json").read_text())
    chat, ids = out["chat"], out["ids"]
    assert chat["completed"] == ids["completed"] > 10 and chat["failed"] == 0
    assert chat["prompt_token_mismatches"] == 0 and chat["prompt_token_drift_total"] == 0
    assert chat["expected_prefix_hit_tokens"] == ids["expected_prefix_hit_tokens"] > 0
    # the embedded simulator's own totals (its whole life is the run): a run's deltas start at its
    # first scrape, which a simulator busy encoding 800k tokens on two shared cores answers late
    server = {k: v["target_metrics"]["latest"] for k, v in out.items()}
    assert (
        server["chat"]["prompt_tokens"]
        == server["ids"]["prompt_tokens"]
        == sum(json.loads(line)["input_length"] for line in trace.read_text().splitlines())
    )
    assert (
        server["chat"]["prefix_cache_hits"] == server["ids"]["prefix_cache_hits"] == ids["expected_prefix_hit_tokens"]
    )


QWEN_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_image_chat_rows_count_their_text_exactly_against_the_simulator(tmp_path, sim_process):
    """Multimodal chat rows (a Qwen2-VL-like template rendering content parts, one placeholder
    token per image): the server's text tokens (prompt tokens less image tokens) are exactly
    input_length, the images' tokens being the server's own count."""
    folder = tmp_path / "vl"
    folder.mkdir()
    tok = Tokenizer.from_file(tokenizer_file("builtin:gpt2"))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"])
    tok.save(str(folder / "tokenizer.json"))
    _config(folder, QWEN_LIKE, eos_token="<|im_end|>")
    trace = tmp_path / "mm.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": 100 * k,
                    "input_length": 600 + 37 * k,
                    "output_length": 3,
                    "hash_ids": [k % 2, 10 + k],
                    "num_images": 1 + k % 2,
                }
            )
            + "\n"
            for k in range(6)
        )
    )
    url, _ = sim_process("--tokenizer", str(folder))
    res = tmp_path / "r"
    p = subprocess.run(
        [sys.executable, "-m", "replayer", "run", str(trace), "--target", url, "--results", str(res)]
        + ["--admin-port", "0", "--quiet", "--endpoint", "/v1/chat/completions", "--prompt-mode", "text"]
        + ["--tokenizer", str(folder), "--image-size", "64x64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((res / "summary.json").read_text())
    assert s["completed"] == 6 and s["images_sent"] == 9
    assert s["prompt_token_mismatches"] == 0 and s["image_token_mismatches"] == 0
    import pyarrow.parquet as pq

    for r in pq.read_table(res / "requests.parquet").to_pylist():
        assert r["text_tokens"] == r["input_length"] and r["prompt_tokens"] == r["input_length"] + r["image_tokens"]


def test_a_template_that_glues_the_content_to_its_tail_is_corrected_by_encoding(tmp_path):
    """A template whose text follows the content without a separator (the last word and ``ok``
    merge): the junction check catches it and the whole prompt is encoded and its length
    corrected, so the count is still input_length (a residual only when no length gives it)."""
    folder = tmp_path / "glued"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(open(tokenizer_file("builtin:gpt2"), "rb").read())
    _config(folder, "{% for m in messages %}{{ m['content'] | trim }}{% endfor %}ok")
    text = TextPromptBuilder(PromptBuilder(seed=2, vocab=vocab_from_tokenizer(str(folder))), str(folder))
    exact = 0
    for row in ROWS[:60]:
        n = row["input_length"]
        content = text.prompt_text(row["hash_ids"], n, chat=True)
        got = len(_server_count(folder, [{"role": "user", "content": content}]))
        assert abs(got - n) <= 1
        exact += got == n
    assert exact >= 55


def test_a_tokenizer_without_a_template_is_said_once_and_counts_the_text(tmp_path, caplog):
    """No chat template in the folder: one warning at the first chat prompt (the server's own
    template tokens come on top, reported as drift), the text itself still exact."""
    import logging

    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(open(tokenizer_file("builtin:gpt2"), "rb").read())
    text = TextPromptBuilder(PromptBuilder(seed=4, vocab=vocab_from_tokenizer(str(folder))), str(folder))
    with caplog.at_level(logging.WARNING, logger="replayer.payload.textprompts"):
        for row in ROWS[:3]:
            content = text.prompt_text(row["hash_ids"], row["input_length"], chat=True)
            assert len(text.tokenizer.encode(content, add_special_tokens=False).ids) == row["input_length"]
    said = [r.getMessage() for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(said) == 1 and str(folder) in said[0]
