"""Make ``replayer/core/tokenizers/gpt2/tokenizer.json`` (``--tokenizer builtin:gpt2``): GPT-2's
tokenizer as a Hugging Face ``tokenizer.json``, from the BPE ranks OpenAI ships in the
``openai-whisper`` package (``whisper/assets/gpt2.tiktoken``, MIT; 20250625:
sha256 306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930), and check it.

Byte-level BPE: 50,256 tokens (a token's rank is its id) and ``<|endoftext|>`` (50256, special).
The ranks hold no merges: each token's merge is the split BPE makes of its bytes with the ranks
below its own (as ``transformers``' TikTokenConverter derives it); pre-tokenizer, decoder and
post-processor are Hugging Face's GPT-2 settings. The check encodes texts with the result and with
``tiktoken`` on the same ranks and GPT-2's pattern (they must agree on every id) and compares the
decoding of random ids.

    pip download --no-deps --no-binary :all: openai-whisper==20250625 && tar xzf openai_whisper-*.tar.gz
    pip install tiktoken  # (the check only)
    python bench/make_gpt2_tokenizer.py openai_whisper-20250625/whisper/assets/gpt2.tiktoken \
        replayer/core/tokenizers/gpt2/tokenizer.json
"""

import base64
import glob
import os
import random
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (its vocab.json's alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(path: str) -> dict[bytes, int]:
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """``token``'s bytes merged by BPE with the ranks below ``max_rank`` only."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts = [*parts[:i], parts[i] + parts[i + 1], *parts[i + 2 :]]


def build(ranks: dict[bytes, int]) -> Tokenizer:
    enc = bytes_to_unicode()

    def u(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {u(t): r for t, r in ranks.items()}
    merges = []
    for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(t) > 1:
            a, b = split(ranks, t, r)  # (exactly two parts, or the ranks are not BPE's)
            merges.append((u(a), u(b)))
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=True)])
    assert tok.token_to_id("<|endoftext|>") == 50256
    return tok


def check(ranks: dict[bytes, int], tok: Tokenizer) -> None:
    import tiktoken

    ref = tiktoken.Encoding(
        "gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )
    rng = random.Random(0)
    texts = [
        open(f, encoding="utf-8", errors="replace").read()
        for f in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True))[:1500]
    ]
    for _ in range(3000):
        pick = (rng.randint(32, 126), rng.randint(0xA0, 0x2FFF), rng.randint(0x4E00, 0x9FFF), 10, 32)
        texts.append("".join(chr(rng.choice(pick)) for _ in range(rng.randint(1, 200))))
    ids = sum(len(t) for t in texts)
    bad = [t[:60] for t in texts if ref.encode_ordinary(t) != tok.encode(t, add_special_tokens=False).ids]
    for _ in range(2000):
        x = [rng.randrange(50256) for _ in range(50)]
        if ref.decode_bytes(x).decode("utf-8", errors="replace") != tok.decode(x):
            bad.append(f"decode {x[:5]}...")
    print(f"{len(texts)} texts ({ids:,} characters) and 2,000 id lists: {len(bad)} differ from tiktoken")
    assert not bad, bad[:5]


if __name__ == "__main__":
    ranks = load_ranks(sys.argv[1])
    tok = build(ranks)
    check(ranks, tok)
    tok.save(sys.argv[2], pretty=False)
