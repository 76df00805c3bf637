"""The prompt builders of each pass (loop) and the expected prefix-cache model they feed.

The same builder every pass, or with ``--loop-salt`` one whose seed is salted by the pass number
(fresh prefixes each pass, and a fresh expected cache: they cannot hit the previous pass's
blocks). ``replayer.payload.prepare`` builds each request's prompt with them.
"""

from __future__ import annotations

from replayer.payload.prefix_cache import DEFAULT_CAPACITY_TOKENS, DEFAULT_KV_BLOCK_SIZE, PrefixCacheModel
from replayer.payload.prompts import (
    DEFAULT_VOCAB_RANGE,
    PromptBuilder,
    salted_seed,
    vocab_from_range,
    vocab_from_tokenizer,
)
from replayer.payload.textprompts import TextPromptBuilder

__all__ = ["Prompts"]


class Prompts:
    """Prompt builders per loop: the same builder every loop, or with ``loop_salt`` a builder
    whose seed is salted by the loop number (fresh prefixes each loop). Keeps the last two.

    Token ids from ``tokenizer`` (a local path: its non-special ids) or else ``vocab_range``
    (``--vocab-range``); ``kv_block_size`` and ``cache_tokens`` configure the expected
    prefix-cache model (``--kv-block-size``, ``--expected-cache-tokens``)."""

    def __init__(
        self,
        block_size: int,
        *,
        seed: int = 0,
        loop_salt: bool = False,
        vocab_range: tuple[int, int] = DEFAULT_VOCAB_RANGE,
        tokenizer: str | None = None,
        kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
        cache_tokens: int | None = DEFAULT_CAPACITY_TOKENS,
    ) -> None:
        self.vocab = vocab_from_tokenizer(tokenizer) if tokenizer else vocab_from_range(*vocab_range)
        self.seed = seed
        self.salt = loop_salt
        self.block_size = block_size
        self._by_loop: dict[int, PromptBuilder] = {}
        self._cache_by_loop: dict[int, PrefixCacheModel] = {}
        self._text: dict[int, TextPromptBuilder] = {}
        self.tokenizer = tokenizer
        self.kv_block_size = kv_block_size
        self.cache_tokens = cache_tokens

    def expected_cache(self, loop: int) -> PrefixCacheModel:
        """The expected prefix-cache model: one for the run, or one per loop with ``loop_salt``
        (fresh prefixes cannot hit the previous loop's blocks)."""
        key = loop if self.salt else 0
        m = self._cache_by_loop.get(key)
        if m is None:
            m = PrefixCacheModel(
                block_size=self.block_size, kv_block_size=self.kv_block_size, capacity_tokens=self.cache_tokens
            )
            self._cache_by_loop = {key: m}
        return m

    def text_for_loop(self, loop: int) -> TextPromptBuilder:
        """Text prompts (``--prompt-mode text``, chat): the same seed and blocks, of the tokenizer's
        round-trip-safe vocabulary, fitted to the server's count (``replayer.payload.textprompts``)."""
        b = self.for_loop(loop)
        t = self._text.get(id(b))
        if t is None:
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer: pass --tokenizer PATH")
            t = TextPromptBuilder(b, self.tokenizer)
            self._text = {id(b): t}
        return t

    def for_loop(self, loop: int) -> PromptBuilder:
        key = loop if self.salt else 0
        b = self._by_loop.get(key)
        if b is None:
            b = PromptBuilder(seed=salted_seed(self.seed, key), block_size=self.block_size, vocab=self.vocab)
            self._by_loop[key] = b
            for old in sorted(self._by_loop)[:-2]:
                del self._by_loop[old]
        return b
