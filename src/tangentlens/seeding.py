"""Local random generators keyed by tuples of integers; the global RNG is never touched.

``seeded_generator(seed, step, layer, …)`` hashes the key with numpy's ``SeedSequence`` into a
63-bit seed for a fresh ``torch.Generator``, so every stream (a control draw, a sequence's MLM
mask, an initialisation) is reproducible on its own, whatever else was drawn before.
:func:`seeded_generators` gives the generators of ``(*prefix, 0)``, ``(*prefix, 1)``, … at once:
the same seeds, with the ``SeedSequence`` hash computed for all of them in one vectorised pass.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["seeded_generator", "seeded_generators"]

# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_MASK32 = 0xFFFFFFFF


def _check_key(key: tuple[int, ...]) -> None:
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in key):
        raise ValueError(f"seed keys must be integers ≥ 0, got {list(key)}")


def _generator(state: int) -> torch.Generator:
    return torch.Generator().manual_seed(state & (2**63 - 1))


def seeded_generator(*key: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from the non-negative integers ``key``."""
    _check_key(key)
    state = np.random.SeedSequence([int(v) for v in key]).generate_state(1, dtype=np.uint64)[0]
    return _generator(int(state))


def _words(value: int) -> list[int]:
    """``value`` as SeedSequence reads an integer: 32-bit words, least significant first."""
    words = [value & _MASK32]
    while value > _MASK32:
        value >>= 32
        words.append(value & _MASK32)
    return words


def seeded_generators(*prefix: int, count: int) -> list[torch.Generator]:
    """``[seeded_generator(*prefix, j) for j in range(count)]``, the same generators, with
    numpy's ``SeedSequence`` hash of the keys evaluated for every ``j`` at once (uint32 array
    arithmetic; the running hash constants do not depend on the key's values)."""
    _check_key(prefix)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MASK32 + 1:
        raise ValueError(f"count must be an integer in [0, 2³²], got {count!r}")
    if not count:
        return []
    u32 = np.uint32
    last = np.arange(count, dtype=np.uint64).astype(u32)  # j < 2³²: one word each
    entropy = [np.full(count, w, dtype=u32) for v in prefix for w in _words(int(v))] + [last]
    hash_a = [_INIT_A]  # the running constant of the entropy mixing

    def hashmix(value: np.ndarray) -> np.ndarray:
        value, hash_a[0] = _hash(value, hash_a[0], _MULT_A)
        return value

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = u32(_MIX_MULT_L) * x - u32(_MIX_MULT_R) * y
        return result ^ (result >> u32(16))

    zeros = np.zeros(count, dtype=u32)
    pool = [hashmix(entropy[i] if i < len(entropy) else zeros) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in entropy[_POOL_SIZE:]:
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(word))
    # generate_state(1, uint64): two words from the pool, little-endian
    low, hash_b = _hash(pool[0], _INIT_B, _MULT_B)
    high, _ = _hash(pool[1], hash_b, _MULT_B)
    states = low.astype(np.uint64) | (high.astype(np.uint64) << np.uint64(32))
    return [_generator(int(s)) for s in states.tolist()]


def _hash(value: np.ndarray, const: int, mult: int) -> tuple[np.ndarray, int]:
    """SeedSequence's hash step of uint32 words: xor with the running constant, advance it by
    ``mult``, multiply, fold the high half in; returns the words and the next constant."""
    const_next = (const * mult) & _MASK32
    value = (value ^ np.uint32(const)) * np.uint32(const_next)
    return value ^ (value >> np.uint32(16)), const_next
