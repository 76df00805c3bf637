"""The prefix-cache hits a trace implies, from its ``hash_ids`` alone (pure, no I/O).

Model. Rows are taken in trace order. Row ``i`` has hash ids ``h[0..n-1]`` (one per
``block_size``-token block; the last block holds ``input_length - (n-1)*block_size`` tokens) and
``input_length`` tokens. Block ``j`` of the row is identified by its whole prefix chain
``h[0..j]`` (two rows share block j's tokens only if they share every id up to j), represented by
a chained 64-bit key: ``k[-1] = 0``, ``k[j] = mix64((k[j-1] ^ h[j]) + GAMMA)`` with
``replayer.core.hashing.mix64`` (the SplitMix64 finalizer) and ``GAMMA = 0x9E3779B97F4A7C15``; a
collision needs two different chains to meet on 64 bits (~2**-64 per pair).

For each row, the expected cached (hit) tokens are::

    matched = tokens of the leading blocks whose chain key an EARLIER row already sent
              (a block an earlier row sent only partly, as its short last block, supplies only
              the tokens that row sent, and the chain stops there)
    hits    = min(matched, input_length - 1 if last_token_recomputed else input_length)
    hits    = hits - hits % kv_block_size                        # whole server KV blocks only

``kv_block_size`` is the server's KV-cache block (vLLM GPU default 16, vLLM CPU 128): a server
only reuses whole KV blocks, and ``block_size`` (512) is a multiple of it in practice.
A row whose prompt the server frames (a chat template's ``head`` tokens before the blocks and
``tail`` tokens after them, the generation prompt) sends only ``input_length - head - tail``
tokens of its blocks: the model keeps those, and a hit covers the head too (every such row has
the same head), so a later row extending this one's last block matches up to the tail.
``last_token_recomputed`` (default True): vLLM always recomputes at least the last prompt token,
since the forward pass must produce that position's logits to sample the first output token; so a
fully cached prompt reports ``input_length - 1`` tokens rounded down to a KV block as hits
(vLLM ``KVCacheManager.get_computed_blocks`` looks up at most ``num_tokens - 1`` tokens).
Set it False for servers that count the whole prompt.

The row's own blocks are inserted after its lookup (a row never hits itself). With
``capacity_tokens`` the cache is an LRU of chain keys holding ``capacity_tokens // block_size``
blocks (each key counts as a full block, even when only partly sent): a lookup refreshes the
matched keys, the row's keys are then inserted/refreshed, and the least recently used keys are
evicted. Without it the cache is infinite. Concurrency is ignored: a row sees every earlier row
as fully prefilled (an upper bound when requests overlap in time).

Which rows the model sees (:func:`modelled`): those whose prompt is the blocks of their hash ids.
Pooling requests (embeddings, score, rerank: the input is cut into documents) and turns that grow
their session's conversation (synthesised hash ids) are left out: they have no expected hits.
``replayer trace inspect`` and a replay use this same model, rule and defaults
(``DEFAULT_KV_BLOCK_SIZE``, ``DEFAULT_CAPACITY_TOKENS``), so they report the same expected hits
(a chat replay's differ by its template's head and tail, which ``trace inspect`` does not know).

These expected hits are what ``vllm:prefix_cache_hits_total`` should grow by over a replay
(``replayer.observe.target_metrics``), and ``vllm:prefix_cache_queries_total`` by the sum of
``input_length``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from replayer.core.endpoints import CHAT, COMPLETIONS, POOLING
from replayer.core.hashing import GAMMA, MASK64 as _MASK, mix64, mix64_array

__all__ = [
    "PrefixCacheModel",
    "chain_keys",
    "expected_hits",
    "modelled",
    "DEFAULT_KV_BLOCK_SIZE",
    "DEFAULT_CAPACITY_TOKENS",
]

#: vLLM's KV-cache block on GPU (``--kv-block-size``; ``RunConfig`` holds the same defaults as
#: literals, to keep ``replayer.config`` free of numpy: tests/test_prefix_cache.py checks they agree).
DEFAULT_KV_BLOCK_SIZE = 16
#: LRU capacity of the model in tokens (``--expected-cache-tokens``): larger than any server's KV
#: cache, and it bounds the model's memory on long traces (~125k keys of 512-token blocks).
DEFAULT_CAPACITY_TOKENS = 64_000_000


def modelled(kind: str, session: object, hash_ids_synthetic: bool) -> bool:
    """Whether a row of endpoint ``kind`` (``replayer.payload.body``'s paths) is seen by the model: its
    prompt is its hash ids' blocks (not a pooling request, not a turn that grows its session)."""
    if kind in POOLING:
        return False
    return not (session is not None and hash_ids_synthetic and kind in (COMPLETIONS, CHAT))


_G = np.uint64(GAMMA)


def chain_keys_py(hash_ids: Sequence[int] | np.ndarray) -> list[int]:
    """Chained prefix keys of one row (Python ints in [0, 2**64)); see the module docstring."""
    out = []
    k = 0
    for h in hash_ids:
        k = mix64(((k ^ (int(h) & _MASK)) + GAMMA) & _MASK)
        out.append(k)
    return out


def chain_keys(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Chained prefix keys of many rows at once, vectorised across rows.

    ``offsets`` int64[n+1], ``values`` int64[m] (the Arrow list layout of ``Trace.hash_offsets``/
    ``hash_values``; ``offsets`` may start above 0). Returns uint64[offsets[-1] - offsets[0]]:
    element ``offsets[i] - offsets[0] + j`` is the key of row i's block j. One numpy pass per
    block position (the longest row's length), over the rows that long.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    base = int(offsets[0])
    starts = offsets[:-1] - base
    lens = np.diff(offsets)
    vals = np.asarray(values[base : int(offsets[-1])]).astype(np.int64, copy=False).view(np.uint64)
    out = np.empty(vals.size, dtype=np.uint64)
    if vals.size == 0:
        return out
    order = np.argsort(-lens, kind="stable")  # longest first: rows with len > j are a prefix
    s_starts = starts[order]
    s_lens = lens[order]
    neg = -s_lens  # ascending
    k = np.zeros(order.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(s_lens[0])):
            m = int(np.searchsorted(neg, -j, side="left"))  # rows with len > j
            idx = s_starts[:m] + j
            kj = mix64_array((k[:m] ^ vals[idx]) + _G)
            k[:m] = kj
            out[idx] = kj
    return out


class PrefixCacheModel:
    """Expected prefix-cache hits, one row at a time (see the module docstring).

    ``block_size``: tokens per hash id (512 for Mooncake). ``kv_block_size``: the server's KV block
    (hits are whole KV blocks). ``capacity_tokens``: LRU capacity (None = infinite).
    ``last_token_recomputed``: cap hits at ``input_length - 1`` (vLLM). Totals so far:
    ``query_tokens`` (sum of input_length) and ``hit_tokens``. Raises ValueError for bad sizes.
    """

    __slots__ = (
        "block_size",
        "kv_block_size",
        "capacity_blocks",
        "last_token_recomputed",
        "query_tokens",
        "hit_tokens",
        "rows",
        "_cache",
    )

    def __init__(
        self,
        block_size: int = 512,
        kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
        capacity_tokens: int | None = None,
        *,
        last_token_recomputed: bool = True,
    ) -> None:
        if block_size < 1 or kv_block_size < 1:
            raise ValueError(f"block_size and kv_block_size must be >= 1, got {block_size}, {kv_block_size}")
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.block_size = block_size
        self.kv_block_size = kv_block_size
        self.capacity_blocks = None if capacity_tokens is None else capacity_tokens // block_size
        self.last_token_recomputed = last_token_recomputed
        self.query_tokens = 0
        self.hit_tokens = 0
        self.rows = 0
        # chain key -> most tokens of that block any row has sent (block_size when sent whole)
        self._cache: dict[int, int] = {} if capacity_tokens is None else OrderedDict()

    def __len__(self) -> int:
        """Blocks (chain keys) currently cached."""
        return len(self._cache)

    def observe(self, hash_ids: Sequence[int] | np.ndarray, input_length: int, head: int = 0, tail: int = 0) -> int:
        """Hit tokens of the next row (``hash_ids`` in block order, ``input_length`` tokens);
        then the row's blocks are cached. ``head``/``tail``: tokens the server counts before and
        after the blocks' content (a chat template's prefix and generation prompt): the content
        is then ``input_length - head - tail`` tokens, and a hit covers the head too."""
        return self.observe_keys(chain_keys_py(hash_ids), input_length, head, tail)

    def observe_keys(self, keys: Sequence[int], input_length: int, head: int = 0, tail: int = 0) -> int:
        """``observe`` with the row's chain keys already computed (``chain_keys``), as ints."""
        content = input_length
        if head or tail:
            content = max(1, input_length - head - tail)
            keys = keys[: -(-content // self.block_size)]
        if self.capacity_blocks is None:
            matched = self._infinite(keys, content)
        else:
            matched = self._lru(keys, content)
        if matched and head:
            matched += head
        cap = input_length - 1 if self.last_token_recomputed else input_length
        hits = matched if matched < cap else max(cap, 0)
        hits -= hits % self.kv_block_size
        self.query_tokens += input_length
        self.hit_tokens += hits
        self.rows += 1
        return hits

    def _infinite(self, keys: Sequence[int], input_length: int) -> int:
        """Matched tokens; caches the row. In an infinite cache a chain key is present only if
        every shorter key of its chain was sent whole before, so after the first miss (or partly
        sent block) every later key of the row is new: they are inserted in one ``update``."""
        bs = self.block_size
        cache = self._cache
        get = cache.get
        nk = len(keys)
        matched = 0
        left = input_length
        j = 0
        while j < nk:
            k = keys[j]
            seen = get(k)
            if seen is None:
                break
            n = bs if left > bs else left
            j += 1
            if seen < n:
                matched += seen
                cache[k] = n
                break
            matched += n
            left -= n
        if j < nk:
            cache.update(dict.fromkeys(keys[j:], bs))
            last = input_length - (nk - 1) * bs
            if last < bs:
                cache[keys[-1]] = last
        return matched

    def _lru(self, keys: Sequence[int], input_length: int) -> int:
        """Matched tokens; refreshes/inserts the row's keys and evicts beyond capacity."""
        bs = self.block_size
        cache: OrderedDict[int, int] = self._cache  # type: ignore[assignment]
        get = cache.get
        move = cache.move_to_end
        matched = 0
        left = input_length
        for k in keys:
            seen = get(k)
            if seen is None:
                break
            move(k)
            n = bs if left > bs else left
            if seen < n:
                matched += seen
                break
            matched += n
            left -= n
        left = input_length
        for k in keys:
            n = bs if left > bs else left
            left -= n
            seen = get(k)
            if seen is None or seen < n:
                cache[k] = n
            move(k)
        over = len(cache) - self.capacity_blocks  # type: ignore[operator]
        if over > 0:
            pop = cache.popitem
            for _ in range(over):
                pop(last=False)
        return matched

    @property
    def hit_ratio(self) -> float | None:
        """hit_tokens / query_tokens so far (None before the first row)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else None


def expected_hits(
    trace: object | Iterable[object],
    *,
    block_size: int | None = None,
    kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
    capacity_tokens: int | None = None,
    last_token_recomputed: bool = True,
    model: PrefixCacheModel | None = None,
    chunk_rows: int = 65_536,
) -> np.ndarray:
    """Expected hit tokens of every row, in order: int64[n_rows].

    ``trace``: a ``replayer.trace.Trace`` or an iterable of trace batches (objects with
    ``input_length``, ``hash_offsets``, ``hash_values`` and optionally ``block_size``), taken in
    order. ``block_size`` defaults to the trace's. Pass ``model`` to continue an existing
    model (its settings then apply). Keys are computed ``chunk_rows`` rows at a time.
    """
    batches: Iterable[Any] = [trace] if hasattr(trace, "hash_offsets") else trace  # type: ignore[assignment]
    out: list[np.ndarray] = []
    for b in batches:
        if model is None:
            bs = block_size or int(getattr(b, "block_size", 512))
            model = PrefixCacheModel(bs, kv_block_size, capacity_tokens, last_token_recomputed=last_token_recomputed)
        offs = np.asarray(b.hash_offsets, dtype=np.int64)
        vals = b.hash_values
        il = np.asarray(b.input_length, dtype=np.int64)
        n = il.size
        observe = model.observe_keys
        for a in range(0, n, chunk_rows):
            z = min(n, a + chunk_rows)
            keys = chain_keys(offs[a : z + 1], vals).tolist()
            rel = (offs[a : z + 1] - offs[a]).tolist()
            out.append(
                np.fromiter(
                    (observe(keys[rel[i] : rel[i + 1]], x) for i, x in enumerate(il[a:z].tolist())),
                    dtype=np.int64,
                    count=z - a,
                )
            )
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)
