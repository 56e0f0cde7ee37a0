"""Fit policies: which checkpoints' activations a step's tangent proxy is fitted on.

* ``frozen_early`` — fit once on the activations pooled over the first ``early_fraction`` of the
  selected steps (default 30 %, at least one step) and hold that proxy fixed for every step, as
  Bernas et al. do;
* ``per_checkpoint`` — fit at each step on that step's own activations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tangentlens.metrics._validate import check_choice, check_fraction

__all__ = ["FIT_POLICIES", "fit_windows"]

FIT_POLICIES: tuple[str, ...] = ("frozen_early", "per_checkpoint")


def fit_windows(
    steps: Sequence[int], policy: str, early_fraction: float = 0.3
) -> dict[int, tuple[int, ...]]:
    """For each step (ascending, distinct), the steps whose pooled activations fit its proxy."""
    policy = check_choice(policy, "policy", FIT_POLICIES)
    fraction = check_fraction(early_fraction, "early_fraction", low_open=True)
    ordered = list(steps)
    if not ordered:
        raise ValueError("no steps selected: a fit policy needs at least one step")
    if ordered != sorted(set(ordered)):
        raise ValueError(f"steps must be distinct and ascending, got {ordered}")
    if policy == "per_checkpoint":
        return {step: (step,) for step in ordered}
    window = tuple(ordered[: max(1, math.ceil(fraction * len(ordered)))])
    return dict.fromkeys(ordered, window)
