"""Seeded generators: ``seeded_generators`` (the SeedSequence hash vectorised over the last key
word) gives exactly ``seeded_generator``'s seeds, hence the same draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tangentlens.seeding import seeded_generator, seeded_generators

PREFIXES = [
    (),
    (0,),
    (5, 1200),
    (1, 2, 3),  # with the last word: exactly the pool's four words
    (1, 2, 3, 4, 5, 6),  # more words than the pool: the tail mixing
    (2**32,),  # a two-word integer
    (2**64 - 1, 0, 2**40 + 7),  # multi-word integers in the middle
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_vectorised_seeds_equal_numpy_seedsequence(prefix):
    generators = seeded_generators(*prefix, count=40)
    assert len(generators) == 40
    for j, generator in enumerate(generators):
        state = np.random.SeedSequence([*prefix, j]).generate_state(1, dtype=np.uint64)[0]
        assert generator.initial_seed() == int(state) & (2**63 - 1)
        assert generator.initial_seed() == seeded_generator(*prefix, j).initial_seed()


def test_random_prefixes_and_the_draws_themselves():
    rng = np.random.default_rng(0)
    for _ in range(50):
        prefix = tuple(int(v) for v in rng.integers(0, 2**62, size=int(rng.integers(0, 6))))
        seeds = [g.initial_seed() for g in seeded_generators(*prefix, count=7)]
        assert seeds == [seeded_generator(*prefix, j).initial_seed() for j in range(7)]
    a = torch.randn(5, generator=seeded_generators(3, 9, count=3)[2], dtype=torch.float64)
    assert torch.equal(a, torch.randn(5, generator=seeded_generator(3, 9, 2), dtype=torch.float64))


def test_bad_keys_and_counts():
    assert seeded_generators(1, count=0) == []
    with pytest.raises(ValueError, match="seed keys must be integers ≥ 0"):
        seeded_generators(1, -2, count=3)
    with pytest.raises(ValueError, match="count must be an integer"):
        seeded_generators(1, count=-1)
    with pytest.raises(ValueError, match="count must be an integer"):
        seeded_generators(1, count=True)
