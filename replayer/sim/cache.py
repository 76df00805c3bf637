"""Prefix cache of the simulator: chained 64-bit block hashes of a prompt
(:func:`prompt_block_hashes`) and the LRU of block keys (``PrefixCache``)."""

from __future__ import annotations

import collections

import numpy as np

from replayer.core.hashing import GAMMA, mix64_inplace

# ---------------------------------------------------------------------------------------
# Prefix hashing

_POS_KEYS = np.zeros(0, dtype=np.uint64)


def _pos_keys(n: int) -> np.ndarray:
    """Per-position keys (position * golden ratio, mod 2**64); grown by doubling, shared."""
    global _POS_KEYS
    if len(_POS_KEYS) < n:
        size = max(n, 2 * len(_POS_KEYS), 1 << 14)
        _POS_KEYS = np.arange(size, dtype=np.uint64) * np.uint64(GAMMA)
    return _POS_KEYS


def prompt_block_hashes(ids: np.ndarray, block_size: int) -> list[int]:
    """Chained 64-bit content hashes of the full ``block_size`` blocks of a prompt.

    ``ids``: 1-D int64 array of token ids (any values). Returns ``len(ids) // block_size``
    Python ints; element i depends on tokens ``0 .. (i+1)*block_size - 1`` and their positions,
    so equal keys mean equal prefixes (up to a ~2**-64 chance per pair).
    """
    nb = len(ids) // block_size
    if nb == 0:
        return []
    n = nb * block_size
    with np.errstate(over="ignore"):
        z = ids[:n].view(np.uint64) ^ _pos_keys(n)[:n]  # new array; input untouched
        mix64_inplace(z, np.empty_like(z))
        h = z.reshape(nb, block_size).sum(axis=1, dtype=np.uint64)
        np.cumsum(h, out=h)
    return h.tolist()


class PrefixCache:
    """LRU of prefix-block keys, capacity in blocks (0 = disabled)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()

    def lookup_and_insert(self, keys: list[int]) -> int:
        """Return the number of leading keys already cached; insert/refresh all keys."""
        if self.capacity == 0:
            return 0
        lru = self._lru
        move = lru.move_to_end
        hits = 0
        leading = True
        for k in keys:
            if k in lru:
                move(k)
                if leading:
                    hits += 1
            else:
                leading = False
                lru[k] = None
        over = len(lru) - self.capacity
        popitem = lru.popitem
        for _ in range(over):
            popitem(last=False)
        return hits

    def reset(self) -> None:
        """Forget every cached block (vLLM's ``POST /reset_prefix_cache``)."""
        self._lru.clear()

    def usage(self) -> float:
        return len(self._lru) / self.capacity if self.capacity else 0.0
