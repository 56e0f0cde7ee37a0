"""Token frequency and geometry (Bernas et al. 2026; METHODS.md §1.6), per site:

* ``freq_distance_pearson`` / ``freq_distance_spearman`` — correlation, across token types seen
  at least ``min_count`` times, of log-frequency with the mean distance of the type's sampled
  occurrences to its centroid (centroids from every kept token); ``freq_rms_distance_spearman``
  the same with the exact RMS distance from the streamed sums;
  (omitted where every occurrence of a type is the same vector, e.g. at the embedding);
* ``curvature_visibility`` per frequency bin (ours) — pooled outside/inside variance of the
  ``k``-nearest-neighbour patches of sampled anchors, grouped by the anchor token's bin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tangentlens.metrics import (
    centroid_distance_sums,
    centroids_from_sums,
    frequency_distance_correlation,
    local_spectra,
    pooled_visibility,
    rms_centroid_distance_from_sums,
)
from tangentlens.metrics.twonn import remove_duplicate_rows
from tangentlens.probes.base import Needs, StepData, make_row

__all__ = ["NAME", "FrequencyGeometryConfig", "needs", "rows"]

NAME = "frequency_geometry"

#: Relative RMS spread below which a type's occurrences count as one vector (rounding only).
_SAME_VECTOR_TOL = 1e-6


@dataclass(frozen=True)
class FrequencyGeometryConfig:
    """``min_count`` occurrences for a type to enter the correlation; curvature patches of
    ``k`` neighbours, tangent dimension ``tangent_dim``, ``n_anchors`` anchors."""

    min_count: int = 5
    k: int = 32
    tangent_dim: int = 8
    n_anchors: int = 1024
    seed: int = 0


def needs(config: FrequencyGeometryConfig) -> Needs:
    return Needs(bins=True, type_sums=True, reservoir=True)


def rows(data: StepData, config: FrequencyGeometryConfig) -> list[dict[str, Any]]:
    if data.frequencies is None:
        raise ValueError("the frequency_geometry probe needs the analysis corpus frequency table")
    log_frequency = torch.from_numpy(data.frequencies.log_frequency())
    out: list[dict[str, Any]] = []
    for site, stats in data.statistics.sites.items():
        if stats.types is None or stats.reservoir is None:
            continue
        types = stats.types
        sample = stats.reservoir.columns()
        centroids = centroids_from_sums(types.count, types.sum)
        dist_sum, n = centroid_distance_sums(sample["H"], sample["token"], centroids)
        counts = types.count.double()
        rms = rms_centroid_distance_from_sums(types.count, types.sum, types.sum_sq_norms)
        norm = (types.sum_sq_norms / counts).sqrt()  # RMS norm per type, the distance's scale
        spread = (rms / norm)[counts >= config.min_count].nan_to_num(0)
        if spread.numel() and float(spread.max()) > _SAME_VECTOR_TOL:
            corr = frequency_distance_correlation(
                log_frequency, dist_sum / n, counts, config.min_count
            )
            corr_rms = frequency_distance_correlation(log_frequency, rms, counts, config.min_count)
            common = {"site": site, "n_tokens": corr.n}
            out.append(make_row(data, NAME, "freq_distance_pearson", corr.pearson, **common))
            out.append(make_row(data, NAME, "freq_distance_spearman", corr.spearman, **common))
            out.append(
                make_row(data, NAME, "freq_rms_distance_spearman", corr_rms.spearman, **common)
            )
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
