"""Update alignment across training (METHODS.md §1.7): does what changes between consecutive
checkpoints s → s′ fall in the tangent proxy?

Updates are rows ``Δ`` (m × d): the change of the token-embedding matrix ``W_E(s′) − W_E(s)``,
or the change of each token type's mean activation at a site. Their energy in a subspace is
scored exactly like gradient energy, from ``M = ΔᵀΔ`` (:func:`update_alignment`).
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from tangentlens.checks import as_tensor, check_count, check_matrix, to_float64
from tangentlens.metrics.attribution import EnergyComparison, compare_energy
from tangentlens.metrics.frequency import centroids_from_sums
from tangentlens.typing import ArrayLike

__all__ = ["centroid_shift", "update_alignment"]


def centroid_shift(
    count_before: ArrayLike,
    sum_before: ArrayLike,
    count_after: ArrayLike,
    sum_after: ArrayLike,
    min_count: int = 1,
) -> Float[torch.Tensor, "m d"]:
    """Change of the mean activation of every token type seen ``≥ min_count`` times at both
    steps: rows ``c_t(s′) − c_t(s)`` (m × d, float64), types in id order."""
    min_count = check_count(min_count, "min_count", minimum=1)
    before = centroids_from_sums(count_before, sum_before)
    after = centroids_from_sums(count_after, sum_after)
    if before.shape != after.shape:
        raise ValueError(
            f"the two steps' sums differ in shape: {tuple(before.shape)} and {tuple(after.shape)}"
        )
    cb = to_float64(as_tensor(count_before, "count_before"))
    ca = to_float64(as_tensor(count_after, "count_after"))
    both = (cb >= min_count) & (ca >= min_count)
    if not bool(both.any()):
        raise ValueError(f"no token type is seen ≥ {min_count} times at both steps")
    return after[both] - before[both]


def update_alignment(
    delta: ArrayLike, proxy: ArrayLike, controls: torch.Tensor, excluded: ArrayLike | None
) -> EnergyComparison:
    """Energy of the update rows ``delta`` (m × d) in the proxy (d × k) against the control
    frames (draws × d × k) drawn outside ``excluded`` (d × r or None): :func:`compare_energy` on
    ``ΔᵀΔ``."""
    D = to_float64(check_matrix(delta, "delta"))
    return compare_energy(D.T @ D, proxy, controls, excluded)
