"""Seeded bootstrap confidence intervals over sequences for ratio statistics.

The headline numbers are ratios of pooled sums, ``Σ numerator / Σ denominator`` (e.g. the energy
fraction ``Σ‖GQ‖² / Σ‖G‖²``). Tokens of one sequence are not independent, so the resampling unit
is the sequence: given per-sequence sums, each replicate draws sequences with replacement and
recomputes the pooled ratio; the interval is the percentile interval of the replicates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int

from tangentlens.metrics._validate import check_count, check_fraction, to_float64
from tangentlens.typing import ArrayLike

__all__ = ["RatioInterval", "bootstrap_ratio", "group_sums"]


@dataclass(frozen=True)
class RatioInterval:
    """The pooled ratio and its bootstrap percentile interval at ``level``."""

    value: float
    ci_low: float
    ci_high: float
    level: float
    replicates: int


def group_sums(
    values: ArrayLike, groups: Int[torch.Tensor, " n"]
) -> tuple[Float[torch.Tensor, " g"], Int[torch.Tensor, " g"]]:
    """Sums of ``values`` (n,) per group id (n,) — e.g. per sequence — and the group ids, in
    ascending id order (only groups that occur)."""
    v = to_float64(torch.as_tensor(values)).cpu()
    g = torch.as_tensor(groups).long().cpu()
    if v.shape != g.shape or v.ndim != 1:
        raise ValueError(
            f"values and groups must be (n,) vectors, got {tuple(v.shape)}, {tuple(g.shape)}"
        )
    ids, where = torch.unique(g, return_inverse=True)
    return torch.zeros(ids.numel(), dtype=torch.float64).index_add_(0, where, v), ids


def bootstrap_ratio(
    numerators: ArrayLike,
    denominators: ArrayLike,
    *,
    replicates: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> RatioInterval:
    """Pooled ratio ``Σ num / Σ den`` over groups (per-group sums, (g,) each, g ≥ 2) with a
    percentile interval from ``replicates`` resamples of the groups (seeded)."""
    num = to_float64(torch.as_tensor(numerators)).cpu().numpy()
    den = to_float64(torch.as_tensor(denominators)).cpu().numpy()
    if num.ndim != 1 or num.shape != den.shape or num.shape[0] < 2:
        raise ValueError(
            "numerators and denominators must be (g,) per-group sums with g ≥ 2 groups, got "
            f"{num.shape} and {den.shape}"
        )
    if not (np.isfinite(num).all() and np.isfinite(den).all()):
        raise ValueError("numerators / denominators contain NaN or inf")
    if not den.sum() > 0:
        raise ValueError("the denominators sum to zero: the ratio is undefined")
    replicates = check_count(replicates, "replicates", minimum=10)
    level = check_fraction(level, "level", low_open=True, high_open=True)
    seed = check_count(seed, "seed", minimum=0)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB007]))
    draws = rng.integers(0, num.shape[0], size=(replicates, num.shape[0]))
    counts = np.apply_along_axis(np.bincount, 1, draws, minlength=num.shape[0])  # (R, g)
    ratios = (counts @ num) / np.maximum(counts @ den, np.finfo(np.float64).tiny)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return RatioInterval(
        value=float(num.sum() / den.sum()),
        ci_low=float(low),
        ci_high=float(high),
        level=level,
        replicates=replicates,
    )
