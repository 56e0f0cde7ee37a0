"""Local random generators keyed by tuples of integers; the global RNG is never touched.

``seeded_generator(seed, step, layer, …)`` hashes the key with numpy's ``SeedSequence`` into a
63-bit seed for a fresh ``torch.Generator``, so every stream (a control draw, a sequence's MLM
mask, an initialisation) is reproducible on its own, whatever else was drawn before.
:func:`seeded_generators` gives the generators of ``(*prefix, 0)``, ``(*prefix, 1)``, … at once:
the same seeds, with the ``SeedSequence`` hash computed for all of them in one vectorised pass.

Generators live on the CPU by default. ``device=`` gives the device's own generator, seeded the
same way, for draws made where they are used (an accelerator cannot draw from a CPU generator):
the same key gives the same numbers on every device of that type, and other numbers than the
CPU's (CUDA's Philox is not the CPU's Mersenne twister) — statistically the same draws.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

__all__ = ["device_generators", "seeded_generator", "seeded_generators"]

#: Generators that stand for a device type's own (:func:`device_generators`).
_STAND_INS: dict[str, Callable[[], torch.Generator]] = {}


@contextlib.contextmanager
def device_generators(device_type: str, make: Callable[[], torch.Generator]) -> Iterator[None]:
    """Within the block, a generator for a ``device_type`` device comes from ``make()`` (how
    :func:`tangentlens.testing.emulated_accelerator` gives its device generators)."""
    before = _STAND_INS.get(device_type)
    _STAND_INS[device_type] = make
    try:
        yield
    finally:
        if before is None:
            del _STAND_INS[device_type]
        else:
            _STAND_INS[device_type] = before


def _new_generator(device: torch.device | str | None) -> torch.Generator:
    """A fresh generator for ``device`` (None: the CPU)."""
    if device is None or torch.device(device).type == "cpu":
        return torch.Generator()
    make = _STAND_INS.get(torch.device(device).type)
    return make() if make is not None else torch.Generator(device=device)


# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_MASK32 = 0xFFFFFFFF


def _check_key(key: tuple[int, ...]) -> None:
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in key):
        raise ValueError(f"seed keys must be integers ≥ 0, got {list(key)}")


def _generator(state: int, device: torch.device | str | None = None) -> torch.Generator:
    return _new_generator(device).manual_seed(state & (2**63 - 1))


def seeded_generator(*key: int, device: torch.device | str | None = None) -> torch.Generator:
    """A ``torch.Generator`` (on the CPU, or ``device``'s own) seeded from the non-negative
    integers ``key``."""
    _check_key(key)
    state = np.random.SeedSequence([int(v) for v in key]).generate_state(1, dtype=np.uint64)[0]
    return _generator(int(state), device)


def _words(value: int) -> list[int]:
    """``value`` as SeedSequence reads an integer: 32-bit words, least significant first."""
    words = [value & _MASK32]
    while value > _MASK32:
        value >>= 32
        words.append(value & _MASK32)
    return words


def seeded_generators(
    *prefix: int, count: int, device: torch.device | str | None = None
) -> list[torch.Generator]:
    """``[seeded_generator(*prefix, j, device=device) for j in range(count)]``, the same
    generators, with
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
    return [_generator(int(s), device) for s in states.tolist()]


def _hash(value: np.ndarray, const: int, mult: int) -> tuple[np.ndarray, int]:
    """SeedSequence's hash step of uint32 words: xor with the running constant, advance it by
    ``mult``, multiply, fold the high half in; returns the words and the next constant."""
    const_next = (const * mult) & _MASK32
    value = (value ^ np.uint32(const)) * np.uint32(const_next)
    return value ^ (value >> np.uint32(16)), const_next
