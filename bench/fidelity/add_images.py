"""Turn a fidelity slice into a multimodal one (bench/fidelity/run.sh W1mm / W1chat).

Adds to every row of SLICE/slice.mooncake.jsonl (in place; the harness scores against
slice.truth.jsonl, which is left alone) a synthetic image column, seeded: 40 % of rows no image,
45 % one, 15 % two; ids drawn from a pool of 500 with Zipf-like weights (so images repeat, as in
ServeGen's image captioning trace), each id with one size of 512x512, 1024x768, 1024x1024. Writes
SLICE/tokenizer.json, a word-level tokenizer (30,000 single-token words) that the harness server's
whitespace count reproduces exactly, for chat text (decoded ahead in replayer's text-prefetch child
process, the same in W1chat and W1mm). ``--no-images`` writes the tokenizer only (the text-chat
baseline).
Run with replayer's venv: ``.venv/bin/python bench/fidelity/add_images.py SLICE [--no-images]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

SIZES = ("512x512", "1024x768", "1024x1024")


def main(slice_dir: str, images: bool = True) -> None:
    d = Path(slice_dir)
    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(30_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # no decoder: tokens joined with spaces (4x faster
    #                                                      to decode than a WordPiece decoder: 19 vs 80 ms for 14k)
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(d / "tokenizer.json"))
    if not images:
        return
    rng = np.random.default_rng(7)
    weights = 1.0 / np.arange(1, 501) ** 0.8
    weights /= weights.sum()
    src = d / "slice.mooncake.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    n_images = 0
    for r in rows:
        k = int(rng.choice(3, p=[0.40, 0.45, 0.15]))
        ids = [int(x) for x in rng.choice(500, size=k, p=weights)]
        r["image_ids"] = [f"img{x}" for x in ids]
        r["image_sizes"] = [SIZES[x % 3] for x in ids]
        n_images += k
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    distinct = len({(i, s) for r in rows for i, s in zip(r["image_ids"], r["image_sizes"])})
    print(f"{len(rows)} rows, {n_images} images, {distinct} distinct", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], images="--no-images" not in sys.argv[2:])
