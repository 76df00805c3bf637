"""Where a ``--tokenizer`` value's ``tokenizer.json`` is: a file, a Hugging Face folder holding
one, or ``builtin:NAME``, a tokenizer the package ships (``replayer/core/tokenizers/``), so the
text, chat and image journeys work offline without one of the user's own.

Shipped: ``builtin:gpt2``, GPT-2's byte-level BPE (50,257 ids, ``<|endoftext|>`` special), made
from the ranks OpenAI ships in ``openai-whisper`` (MIT; ``tokenizers/gpt2/LICENSE``) by
``bench/make_gpt2_tokenizer.py``, which checks it against tiktoken id for id.
"""

from __future__ import annotations

import os

__all__ = ["BUILTIN", "BUILTIN_PREFIX", "tokenizer_file", "tokenizer_problem"]

BUILTIN_PREFIX = "builtin:"
#: the shipped tokenizers: name -> what it is
BUILTIN = {"gpt2": "GPT-2's byte-level BPE, 50,257 ids (MIT, from OpenAI's openai-whisper)"}
_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizers")


def tokenizer_file(spec: str) -> str:
    """The ``tokenizer.json`` of ``spec``: ``builtin:NAME`` -> the shipped file, a folder -> its
    ``tokenizer.json``, anything else -> itself (whether it exists is the caller's check).
    Raises ValueError for an unknown builtin name (naming the ones there are)."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN:
            raise ValueError(
                f"no builtin tokenizer {name!r} (there is {', '.join(BUILTIN_PREFIX + n for n in BUILTIN)})"
            )
        return os.path.join(_HERE, name, "tokenizer.json")
    return os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec


def tokenizer_problem(spec: str) -> str | None:
    """Why ``spec`` names no tokenizer file (None when it does): an unknown builtin name, a
    missing path, a folder without ``tokenizer.json``."""
    try:
        file = tokenizer_file(spec)
    except ValueError as e:
        return str(e)
    if not os.path.exists(spec) and not spec.startswith(BUILTIN_PREFIX):
        return (
            f"no such file or folder: {spec} (or a builtin tokenizer: {', '.join(BUILTIN_PREFIX + n for n in BUILTIN)})"
        )
    if not os.path.isfile(file):
        return f"{spec}: no tokenizer.json there"
    return None
