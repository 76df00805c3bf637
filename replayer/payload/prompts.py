"""Hash-id prefix expansion: ``hash_ids`` + ``input_length`` -> the exact prompt token ids.

Specification (reproducible by any tool; see docs/explanations/prompts.md):

* Vocabulary ``V``: a sorted array of allowed token ids — by default the range ``[lo, hi)`` of
  ``--vocab-range`` (default ``1000:30000``), or with ``--tokenizer`` every non-special id of that
  tokenizer.
* ``f`` is the SplitMix64 finalizer on unsigned 64-bit integers (Steele, Lea, Flood, "Fast
  splittable pseudorandom number generators", OOPSLA 2014; constants as in Java's SplittableRandom):
  ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``,
  all mod 2**64 (``replayer.core.hashing``). ``G = 0x9E3779B97F4A7C15``.
* Block key of hash id ``h`` (an unsigned 64-bit integer) under seed ``s``: ``k = f(f(s) ^ h)``.
* Token ``j`` (0-based) of the block: ``V[f(k + (j + 1) * G) mod len(V)]`` for ``j`` in
  ``0 .. block_size-1``: the block is always built at full size, whatever row uses it.
* Prompt of a row: the blocks of its ``hash_ids`` in order, cut to exactly ``input_length`` ids
  (so a partial last block is a prefix of the full block of that id; case B15).

Rows sharing their first k hash ids therefore share exactly their first k*block_size tokens, in
every process and on every machine (no use of Python's salted ``hash()``).

For speed the builder keeps each block pre-serialised as JSON text with every id right-aligned to
the same width (JSON allows the leading spaces), so a partial block is a byte slice and a whole
prompt body is a ``b"".join`` of cached pieces. The cache is an LRU bounded in bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from replayer.core.hashing import (
    GAMMA,
    MASK64 as _MASK,
    mix64,
    mix64_array as _mix,
    mix64_inplace as _mix_inplace,
    mix64_steps,
)
from replayer.core.tokenizerfiles import tokenizer_file

DEFAULT_VOCAB_RANGE = (1000, 30000)


def salted_seed(seed: int, salt: int) -> int:
    """The prompt seed of salt ``salt`` (0: ``seed`` itself): fresh prefixes, i.e. no block in
    common with another salt's prompts. ``--loop-salt`` salts by the loop number;
    ``replayer sweep`` by the point's index, so one point cannot hit another's prefix cache."""
    return mix64(seed ^ mix64(salt + 1)) if salt else seed


def block_key(seed: int, hash_id: int) -> int:
    """The 64-bit key of ``hash_id``'s block under ``seed``: ``f(f(seed) ^ hash_id)``."""
    return mix64(mix64(seed) ^ (hash_id & _MASK))


def vocab_from_range(lo: int, hi: int) -> np.ndarray:
    """Allowed ids ``lo .. hi-1`` as a sorted int64 array. Raises ValueError if empty or negative."""
    if lo < 0 or hi <= lo:
        raise ValueError(f"vocabulary range must satisfy 0 <= lo < hi, got {lo}:{hi}")
    return np.arange(lo, hi, dtype=np.int64)


def vocab_from_tokenizer(path: str) -> np.ndarray:
    """Sorted non-special token ids of a local tokenizer (``tokenizer.json``, a folder holding
    one, or a shipped ``builtin:NAME``: ``replayer.core.tokenizerfiles``; never downloaded). Raises FileNotFoundError / ValueError with the path on failure."""
    import os

    from tokenizers import Tokenizer

    file = tokenizer_file(path)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"--tokenizer {path}: no tokenizer.json found")
    tok = Tokenizer.from_file(file)
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    ids = np.array(sorted(set(tok.get_vocab(with_added_tokens=True).values()) - special), dtype=np.int64)
    if ids.size == 0:
        raise ValueError(f"--tokenizer {path}: no non-special token ids")
    return ids


class PromptBuilder:
    """Builds prompts from hash ids per the module specification.

    ``vocab``: sorted int64 array of allowed ids (default: ``DEFAULT_VOCAB_RANGE``).
    ``cache_bytes``: bound on the serialised-block LRU cache. 64 MB (~21k blocks of 512 ids)
    keeps nearly as many block uses hits as a cache holding a whole 10-minute Mooncake slice
    (~108 MB), and a miss costs only ~7.5 us: more memory would buy milliseconds of CPU.
    """

    def __init__(
        self, *, seed: int = 0, block_size: int = 512, vocab: np.ndarray | None = None, cache_bytes: int = 64 << 20
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.seed = seed
        self.block_size = block_size
        self.vocab = vocab if vocab is not None else vocab_from_range(*DEFAULT_VOCAB_RANGE)
        self._seed_mix = mix64(seed)
        self._steps = np.arange(1, block_size + 1, dtype=np.uint64) * np.uint64(GAMMA)
        self.width = len(str(int(self.vocab.max())))
        self._stride = self.width + 1  # bytes per serialised id, comma included
        # one fixed-width JSON text per vocabulary entry, as a 1-D array of (width+1)-byte items
        self._table = self._text_table(self.vocab, self.width).view(f"V{self._stride}").ravel()
        self._table_bytes = self._table.tobytes()  # the same, for slicing one id's text in Python
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_cap = max(1, cache_bytes // (block_size * self._stride))
        self.cache_hits = 0
        self.cache_misses = 0

    # -- token ids ---------------------------------------------------------------------------
    def _block_index(self, hash_ids: Sequence[int]) -> np.ndarray:
        """Indexes into ``vocab`` of the full blocks of ``hash_ids``: shape (len, block_size).

        Vectorised over all the blocks at once (numpy's per-call overhead dominates a block),
        in place: each step of the mix would otherwise allocate a new (len, block_size) array."""
        keys = np.array([int(h) & _MASK for h in hash_ids], dtype=np.uint64)
        keys ^= np.uint64(self._seed_mix)
        z = _mix(keys)[:, None] + self._steps[None, :]
        _mix_inplace(z, np.empty_like(z))
        z %= np.uint64(self.vocab.size)
        return z.astype(np.intp)

    def block_ids(self, hash_id: int) -> np.ndarray:
        """The full block (``block_size`` int64 token ids) of ``hash_id``."""
        ids: np.ndarray = self.vocab[self._block_index([hash_id])[0]]
        return ids

    def prompt_ids(self, hash_ids: Sequence[int], input_length: int) -> np.ndarray:
        """The prompt as an int64 array of exactly ``input_length`` ids.

        Raises ValueError when ``hash_ids`` cannot cover ``input_length`` tokens."""
        self._check(hash_ids, input_length)
        blocks = [self.block_ids(h) for h in hash_ids]
        return np.concatenate(blocks)[:input_length] if blocks else np.empty(0, np.int64)

    # -- JSON ---------------------------------------------------------------------------------
    @staticmethod
    def _text_table(vocab: np.ndarray, width: int) -> np.ndarray:
        """Row i: vocab[i] as JSON number text right-aligned in ``width`` chars, then ','.

        Leading zeros become spaces (JSON whitespace); the last digit always stays."""
        pow10 = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
        out = np.empty((vocab.size, width + 1), dtype=np.uint8)
        out[:, :-1] = (vocab[:, None] // pow10) % 10 + 48
        out[:, :-2][vocab[:, None] < pow10[:-1]] = 32
        out[:, -1] = 44
        return out

    def blocks_json(self, hash_ids: Sequence[int]) -> list[bytes]:
        """Serialised full blocks of ``hash_ids`` (each id followed by ','), via the LRU cache;
        the misses are generated together."""
        cache = self._cache
        out: list[bytes | None] = []
        missing: list[int] = []
        size = self.block_size * self._stride
        for h in hash_ids:
            b = cache.get(h)
            if b is not None and len(b) < size:
                b = None  # only the first ids of this block were made (``prompt_json``'s tail)
            if b is None:
                missing.append(h)
            else:
                cache.move_to_end(h)
            out.append(b)
        self.cache_hits += len(out) - len(missing)
        if missing:
            self.cache_misses += len(missing)
            # one gather for every missing block, then one bytes object cut per block (a gather
            # per block costs ~2x as much)
            whole = np.take(self._table, self._block_index(missing)).tobytes()
            made = {h: whole[k * size : (k + 1) * size] for k, h in enumerate(missing)}
            cache.update(made)
            while len(cache) > self._cache_cap:
                cache.popitem(last=False)
            out = [made[h] if b is None else b for h, b in zip(hash_ids, out)]
        return out  # type: ignore[return-value]

    def prompt_json(self, hash_ids: Sequence[int], input_length: int) -> bytes:
        """The prompt as a JSON array text (``b"[...]"``) of exactly ``input_length`` ids."""
        self._check(hash_ids, input_length)
        ids = [int(h) for h in hash_ids]
        bs = self.block_size
        tail = input_length - (len(ids) - 1) * bs  # ids of the last block sent (1 .. bs)
        if tail < bs:
            # a partial last block the cache lacks whole, with every other block cached (a
            # one-block prompt of a new hash id: a tiny request): only its first ``tail`` ids
            # are made (or taken from a short entry that holds them)
            cache = self._cache
            last = ids[-1]
            got = cache.get(last)
            if (got is None or len(got) < bs * self._stride) and all(h in cache for h in ids[:-1]):
                blocks = self.blocks_json(ids[:-1]) if len(ids) > 1 else []
                if got is not None and len(got) >= tail * self._stride:
                    self.cache_hits += 1
                    cache.move_to_end(last)
                else:
                    got = self._tail_json(last, tail)
                blocks.append(got[: tail * self._stride - 1])  # drop the trailing comma
                return b"".join((b"[", *blocks, b"]"))
        parts = [b"["]
        left = input_length
        for blk in self.blocks_json(ids):
            if left > bs:
                parts.append(blk)
                left -= bs
            else:
                parts.append(blk[: left * self._stride - 1])  # drop the trailing comma
                break
        parts.append(b"]")
        return b"".join(parts)

    #: a tail of at most this many ids is made in pure Python (numpy's per-call overhead is more)
    _TAIL_PY = 48

    def _tail_json(self, hash_id: int, n: int) -> bytes:
        """The first ``n`` serialised ids (each followed by ',') of ``hash_id``'s block: the same
        bytes as the full block's start (id j depends on the block key and j alone). Cached as a
        short entry (``blocks_json`` makes the whole block when a row needs it)."""
        self.cache_misses += 1
        if n <= self._TAIL_PY:  # pure Python: each id's text sliced from the table's bytes
            v, w, tb = self.vocab.size, self._stride, self._table_bytes
            key = mix64(self._seed_mix ^ (hash_id & _MASK))
            starts = [z % v * w for z in mix64_steps(key, n)]
            out = b"".join([tb[i : i + w] for i in starts])
        else:
            keys = np.array([hash_id & _MASK], dtype=np.uint64)
            keys ^= np.uint64(self._seed_mix)
            z = _mix(keys)[:, None] + self._steps[None, :n]
            _mix_inplace(z, np.empty_like(z))
            z %= np.uint64(self.vocab.size)
            out = np.take(self._table, z[0].astype(np.intp)).tobytes()
        cache = self._cache
        cache[hash_id] = out
        cache.move_to_end(hash_id)
        while len(cache) > self._cache_cap:
            cache.popitem(last=False)
        return out

    def _check(self, hash_ids: Sequence[int], input_length: int) -> None:
        n = len(hash_ids)
        if input_length < 1 or n * self.block_size < input_length or (n - 1) * self.block_size >= input_length:
            raise ValueError(
                f"{n} hash ids of {self.block_size} tokens cannot make exactly "
                f"{input_length} tokens (need ceil({input_length}/{self.block_size}) ids)"
            )
