"""Token frequency and geometry (Bernas et al. 2026; METHODS.md §1.6), per site:

* ``freq_distance_pearson`` / ``freq_distance_spearman`` — Pearson / Spearman correlation, across
  the token types seen at least ``min_count`` (≥ 2) times in the capture stream, of the type's
  log-frequency ``log f_t`` (analysis corpus table) with its Bessel-corrected mean squared
  distance to its centroid::

      s²_t = Σᵢ ‖hᵢ − c_t‖² / (n_t − 1) = (Σᵢ ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1),   c_t = Σᵢ hᵢ / n_t,

  exact from the streamed per-type sums over every kept token (``n_t`` = the type's count over
  the whole stream, no sample). The Pearson is taken on ``s²_t`` (unbiased at every count), not
  on its square root; the Spearman is the same either way. ``n_tokens`` of these rows is the
  number of types correlated. Omitted where every occurrence of a type is the same vector (e.g.
  at the embedding). See :mod:`tangentlens.metrics.frequency` for why ``n_t − 1`` (the ``÷ n_t``
  spread makes rare types look tight and manufactures a positive correlation) and for the small
  positive shift the Spearman keeps at low effective width;
* ``curvature_visibility`` per frequency bin (ours) — pooled outside/inside variance of the
  ``k``-nearest-neighbour patches of sampled (reservoir) anchors, grouped by the anchor token's
  bin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Int

from tangentlens.capture import TypeSums
from tangentlens.metrics import (
    centroid_spread_from_sums,
    frequency_distance_correlation,
    local_spectra,
    pooled_visibility,
)
from tangentlens.metrics.twonn import remove_duplicate_rows
from tangentlens.probes.base import Capture, Needs, make_row
from tangentlens.probes.configs import PROBE_NEEDS, FrequencyGeometryConfig

__all__ = ["NAME", "FrequencyGeometryConfig", "needs", "rows", "tracked_types"]

NAME = "frequency_geometry"

#: Relative RMS spread below which a type's occurrences count as one vector (rounding only).
_SAME_VECTOR_TOL = 1e-6


def needs(config: FrequencyGeometryConfig) -> Needs:
    return PROBE_NEEDS[NAME]


def tracked_types(
    config: FrequencyGeometryConfig, counts: Int[np.ndarray, " vocab"]
) -> Int[np.ndarray, " n_types"]:
    """The type ids whose per-type sums the probe reads: those counted at least ``min_count``
    times in the analysis data (``counts``, the frequency table; a type seen fewer times there
    is seen fewer times in any capture of that data)."""
    return np.flatnonzero(np.asarray(counts) >= config.min_count)


def rows(data: Capture, config: FrequencyGeometryConfig) -> list[dict[str, Any]]:
    if data.frequencies is None:
        raise ValueError("the frequency_geometry probe needs the analysis corpus frequency table")
    log_frequency = torch.from_numpy(data.frequencies.log_frequency())
    out: list[dict[str, Any]] = []
    for site, stats in data.statistics.sites.items():
        types = stats.types
        if types is not None:
            out += _correlation_rows(data, site, types, log_frequency, config.min_count)
        if stats.reservoir is None:
            continue
        sample = stats.reservoir.columns()
        first = remove_duplicate_rows(sample["H"])
        points = sample["H"][first]  # distinct rows: repeated vectors have no patch
        if "bin" in sample and points.shape[0] >= config.k:
            spectra = local_spectra(
                points,
                k=config.k,
                tangent_dim=min(config.tangent_dim, points.shape[1] - 1),
                n_anchors=config.n_anchors,
                seed=config.seed,
            )
            anchor_bins = sample["bin"][first][spectra.anchors]
            binned = anchor_bins >= 0
            n_bins = len(stats.h_bins)
            trimmed = type(spectra)(
                spectra.anchors[binned], spectra.inside[binned], spectra.outside[binned]
            )
            visibility = pooled_visibility(trimmed, anchor_bins[binned], n_bins)
            for b in range(n_bins):
                out.append(
                    make_row(
                        data,
                        NAME,
                        "curvature_visibility",
                        float(visibility[b]),
                        site=site,
                        freq_bin=str(b),
                        n_tokens=int((anchor_bins == b).sum()),
                    )
                )
    return out


def _correlation_rows(
    data: Capture,
    site: str,
    types: TypeSums,
    log_frequency: torch.Tensor,
    min_count: int,
) -> list[dict[str, Any]]:
    """The ``freq_distance_*`` rows of one site from its streamed per-type sums (of the tracked
    types only; ``log_frequency`` covers the vocabulary)."""
    counts = types.count.double().cpu()
    spread = centroid_spread_from_sums(types.count, types.sum, types.sum_sq_norms).cpu()
    kept = counts >= min_count
    # relative RMS spread: below _SAME_VECTOR_TOL every occurrence of a type is one vector
    mean_sq_norm = types.sum_sq_norms.double().cpu()[kept] / counts[kept]
    relative = (spread[kept] / mean_sq_norm).sqrt().nan_to_num(0)
    if not relative.numel() or float(relative.max()) <= _SAME_VECTOR_TOL:
        return []
    corr = frequency_distance_correlation(log_frequency[types.ids], spread, counts, min_count)
    common = {"site": site, "n_tokens": corr.n}
    return [
        make_row(data, NAME, "freq_distance_pearson", corr.pearson, **common),
        make_row(data, NAME, "freq_distance_spearman", corr.spearman, **common),
    ]
