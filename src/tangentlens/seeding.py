"""Local random generators keyed by tuples of integers; the global RNG is never touched.

``seeded_generator(seed, step, layer, …)`` hashes the key with numpy's ``SeedSequence`` into a
63-bit seed for a fresh ``torch.Generator``, so every stream (a control draw, a sequence's MLM
mask, an initialisation) is reproducible on its own, whatever else was drawn before.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["seeded_generator"]


def seeded_generator(*key: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from the non-negative integers ``key``."""
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in key):
        raise ValueError(f"seed keys must be integers ≥ 0, got {list(key)}")
    state = np.random.SeedSequence([int(v) for v in key]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & (2**63 - 1))
