"""The one SplitMix64 (replayer.core.hashing): pinned values, and every form equal to the scalar one.

The pinned values were computed by the four separate copies this module replaced (prompts,
prefix_cache, tracetools, the simulator's cache, trace.agentic): prompts, prefix keys, rehashed trace ids and
the simulator's block keys must stay bit-identical."""

import numpy as np
from hypothesis import given, strategies as st

from replayer.core.hashing import GAMMA, MASK64, mix64, mix64_array, mix64_inplace, mix64_steps
from replayer.payload.prefix_cache import chain_keys, chain_keys_py
from replayer.sim import prompt_block_hashes
from replayer.trace.agentic import salt_ids
from replayer.trace.tools import prefix_chain

PINNED = {
    0: 0x0,
    1: 0x5692161D100B05E5,
    MASK64: 0xB4D055FCF2CBBD7B,
    GAMMA: 0xE220A8397B1DCDAF,
    123456789: 0xF21C87D4233FFD60,
}


def test_mix64_pinned_values():
    for x, y in PINNED.items():
        assert mix64(x) == y
    assert mix64(MASK64 + 2) == mix64(1)  # taken mod 2**64


def test_array_forms_pinned():
    xs = np.array(list(PINNED), dtype=np.uint64)
    want = np.array(list(PINNED.values()), dtype=np.uint64)
    assert mix64_array(xs).tolist() == want.tolist()
    assert xs.tolist() == list(PINNED)  # input untouched
    z = xs.copy()
    mix64_inplace(z, np.empty_like(z))
    assert z.tolist() == want.tolist()


def test_steps_pinned():
    assert mix64_steps(5, 3) == [0x63033B0CA389C35A, 0xC097314D939736F8, 0x3B92D3F0106BC147]
    assert mix64_steps(5, 0) == []


@given(st.lists(st.integers(0, MASK64), min_size=1, max_size=40), st.integers(0, MASK64))
def test_every_form_equals_the_scalar(xs, key):
    arr = np.array(xs, dtype=np.uint64)
    assert mix64_array(arr).tolist() == [mix64(x) for x in xs]
    tmp = np.empty_like(arr)
    mix64_inplace(arr, tmp)
    assert arr.tolist() == [mix64(x) for x in xs]
    assert mix64_steps(key, 7) == [mix64(key + j * GAMMA) for j in range(1, 8)]


def test_callers_pinned():
    """Outputs of the callers, as computed before they shared this module."""
    assert prompt_block_hashes(np.arange(1000, 1032, dtype=np.int64), 16) == [
        16047637026499238492,
        16558214777434454508,
    ]
    assert chain_keys_py([1, 2, 3]) == [10451216379200822465, 13608149317741381227, 15020427595393229491]
    assert chain_keys(np.array([0, 3]), np.array([1, 2, 3])).tolist() == chain_keys_py([1, 2, 3])
    assert prefix_chain(np.array([0, 3, 5]), np.array([1, 2, 3, 1, 9])).tolist() == [
        4922461756044938104,
        8261106594766421335,
        5966783535737962542,
        4922461756044938104,
        17531770685786046823,
    ]
    ids = np.array([0, 1, -1, 2**62, 123456789, -(2**63)], dtype=np.int64)
    assert salt_ids(ids, 99).tolist() == [
        1593456917116945961,
        243321680435763400,
        4543380895191925280,
        2514866482844361359,
        1392260634254724408,
        3733480549510740953,
    ]
