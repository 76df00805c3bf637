"""SplitMix64: the one 64-bit mixing function behind prompts, prefix keys, trace tools and the simulator.

``mix64`` is the SplitMix64 finalizer on unsigned 64-bit integers (Steele, Lea, Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014; constants as in Java's SplittableRandom):
``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``,
all mod 2**64 (array arithmetic on uint64 wraps without a warning). ``GAMMA = 0x9E3779B97F4A7C15`` is its golden-ratio increment.

Three forms, bit-identical: :func:`mix64` (one Python int), :func:`mix64_array` (a new uint64
array), :func:`mix64_inplace` (into a uint64 array, with a scratch array: no temporaries), plus
:func:`mix64_steps`, the pure-Python run ``mix64(key + j * GAMMA)`` for ``j = 1 .. n`` with the
finalizer inlined (a short run is cheaper without numpy's per-call cost). Every output that
depends on them (prompt token ids, prefix-cache keys, rehashed trace ids) is part of a
reproducible specification: changing a constant here changes every prompt.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["GAMMA", "MASK64", "mix64", "mix64_array", "mix64_inplace", "mix64_steps"]

GAMMA = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_U_C1 = np.uint64(_C1)
_U_C2 = np.uint64(_C2)
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)

U64Array = npt.NDArray[np.uint64]


def mix64(x: int) -> int:
    """SplitMix64 finalizer of one Python int (taken mod 2**64); pure Python, ~1 us."""
    z = x & MASK64
    z = ((z ^ (z >> 30)) * _C1) & MASK64
    z = ((z ^ (z >> 27)) * _C2) & MASK64
    return z ^ (z >> 31)


def mix64_array(z: U64Array) -> U64Array:
    """SplitMix64 finalizer of every element of a uint64 array, as a new array (wraps mod 2**64)."""
    z = z ^ (z >> _U30)
    z = z * _U_C1
    z = z ^ (z >> _U27)
    z = z * _U_C2
    return z ^ (z >> _U31)


def mix64_inplace(z: U64Array, tmp: U64Array) -> None:
    """:func:`mix64_array` into ``z`` itself (``tmp``: scratch of the same shape and dtype)."""
    np.right_shift(z, _U30, out=tmp)
    z ^= tmp
    z *= _U_C1
    np.right_shift(z, _U27, out=tmp)
    z ^= tmp
    z *= _U_C2
    np.right_shift(z, _U31, out=tmp)
    z ^= tmp


def mix64_steps(key: int, n: int) -> list[int]:
    """``[mix64(key + j * GAMMA) for j in 1 .. n]`` (mod 2**64), the finalizer inlined."""
    m, g = MASK64, GAMMA
    out = []
    for j in range(1, n + 1):
        z = (key + j * g) & m
        z = ((z ^ (z >> 30)) * _C1) & m
        z = ((z ^ (z >> 27)) * _C2) & m
        out.append(z ^ (z >> 31))
    return out
