"""Cosine anisotropy and drift of the mean (Godey et al. 2024; METHODS.md §3), per site, from the
streamed sums of every kept token: ``cosine_anisotropy`` (exact mean pairwise cosine),
``drift_norm`` (‖mean‖), ``relative_drift`` (‖mean‖ / mean ‖h‖). Across the sites of a step:
``drift_cosine_pearson`` / ``drift_cosine_spearman`` (site "-"; needs ≥ 3 sites)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tangentlens.metrics import (
    correlations,
    cosine_anisotropy_from_sums,
    drift_norm_from_sums,
    relative_drift_from_sums,
)
from tangentlens.probes.base import Needs, StepData, make_row

__all__ = ["NAME", "CosineDriftConfig", "needs", "rows"]

NAME = "cosine_drift"


@dataclass(frozen=True)
class CosineDriftConfig:
    """No settings: the metrics are exact functions of the streamed sums."""


def needs(config: CosineDriftConfig) -> Needs:
    return Needs()


def rows(data: StepData, config: CosineDriftConfig) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    drifts, cosines = [], []
    for site, stats in data.statistics.sites.items():
        h = stats.h
        cosine = cosine_anisotropy_from_sums(h.sum_unit, h.n_nonzero)
        drift = drift_norm_from_sums(h.sum, None, h.count)
        relative = relative_drift_from_sums(h.sum, float(h.sum_norms), h.count)
        drifts.append(relative)
        cosines.append(cosine)
        for metric, value in (
            ("cosine_anisotropy", cosine),
            ("drift_norm", drift),
            ("relative_drift", relative),
        ):
            out.append(make_row(data, NAME, metric, value, site=site, n_tokens=h.count))
    if len(drifts) >= 3:
        corr = correlations(np.array(drifts), np.array(cosines))
        out.append(make_row(data, NAME, "drift_cosine_pearson", corr.pearson))
        out.append(make_row(data, NAME, "drift_cosine_spearman", corr.spearman))
    return out
