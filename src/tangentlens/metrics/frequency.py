"""Token frequency and geometry: how far occurrences sit from their type's centroid
(METHODS.md §1.6).

For token type ``t`` with occurrences ``hᵢ`` (rows of ``H`` whose token is ``t``), the centroid is
``c_t = mean hᵢ``. Reported per type: the mean distance ``mean ‖hᵢ − c_t‖`` (from rows, e.g. the
capture's reservoir sample, with centroids from the full stream's per-type sums) and the exact
root-mean-square distance ``√(Σ‖hᵢ‖²/n_t − ‖c_t‖²)`` from the streamed sums alone. The headline is
the Pearson and Spearman correlation, across types, of log-frequency with mean distance (the
seeds report about −0.5 in decoders). Types seen fewer than ``min_count`` times are left out (a
single occurrence is its own centroid).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int

from tangentlens.metrics._validate import as_tensor, check_count, check_matrix, to_float64
from tangentlens.metrics.geometry import Correlation, correlations
from tangentlens.typing import ArrayLike

__all__ = [
    "centroid_distance_sums",
    "centroids_from_sums",
    "frequency_distance_correlation",
    "rms_centroid_distance_from_sums",
]

PerType = Float[torch.Tensor, " vocab"]


def _counts(count: ArrayLike) -> torch.Tensor:
    c = as_tensor(count, "count").to(torch.float64)
    if c.ndim != 1 or bool((c < 0).any()):
        raise ValueError("count must be a 1-D vector of non-negative occurrence counts per type")
    return c


def centroids_from_sums(count: ArrayLike, sum: ArrayLike) -> Float[torch.Tensor, "vocab d"]:
    """Per-type centroids ``sum / count`` (vocab × d) in float64; rows of unseen types are NaN."""
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    return s / c[:, None]


def rms_centroid_distance_from_sums(
    count: ArrayLike, sum: ArrayLike, sum_sq_norms: ArrayLike
) -> PerType:
    """Exact ``√(mean ‖hᵢ − c_t‖²)`` per type from streamed sums (NaN for unseen types)."""
    c = _counts(count)
    centroids = centroids_from_sums(c, sum)
    sq = to_float64(as_tensor(sum_sq_norms, "sum_sq_norms"))
    if sq.shape != c.shape:
        raise ValueError(f"sum_sq_norms must have shape {tuple(c.shape)}, got {tuple(sq.shape)}")
    variance = sq / c - centroids.pow(2).sum(dim=1)
    return variance.clamp(min=0).sqrt()


def centroid_distance_sums(
    H: ArrayLike, tokens: Int[torch.Tensor, " n"], centroids: ArrayLike
) -> tuple[PerType, PerType]:
    """Per type: the sum of ``‖hᵢ − c_t‖`` over the given rows, and their number.

    ``H`` (n × d) rows with token ids ``tokens`` (n,); ``centroids`` (vocab × d), e.g. from
    :func:`centroids_from_sums` over the whole stream. Rows of a type without a centroid raise.
    """
    X = to_float64(check_matrix(H, "H"))
    C = to_float64(as_tensor(centroids, "centroids"))
    ids = torch.as_tensor(tokens).to(X.device)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"tokens must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.long()
    if ids.shape != (X.shape[0],):
        raise ValueError(f"tokens must have shape ({X.shape[0]},), got {tuple(ids.shape)}")
    if C.ndim != 2 or C.shape[1] != X.shape[1]:
        raise ValueError(f"centroids must be (vocab, {X.shape[1]}), got {tuple(C.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= C.shape[0]):
        raise ValueError(f"token ids must lie in [0, {C.shape[0]})")
    rows = C[ids]
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("some rows belong to a type without a centroid (count 0)")
    distance = torch.linalg.vector_norm(X - rows, dim=1)
    sums = torch.zeros(C.shape[0], dtype=torch.float64).index_add_(0, ids.cpu(), distance.cpu())
    counts = torch.zeros(C.shape[0], dtype=torch.float64).index_add_(
        0, ids.cpu(), torch.ones_like(distance.cpu())
    )
    return sums, counts


def frequency_distance_correlation(
    log_frequency: ArrayLike,
    distance: ArrayLike,
    count: ArrayLike,
    min_count: int = 2,
) -> Correlation:
    """Pearson and Spearman correlation, across types with ``count ≥ min_count``, of
    log-frequency (vocab,) with a per-type distance (vocab,; e.g. mean centroid distance)."""
    c = _counts(count)
    lf = to_float64(as_tensor(log_frequency, "log_frequency"))
    dist = to_float64(as_tensor(distance, "distance"))
    if lf.shape != c.shape or dist.shape != c.shape:
        raise ValueError(
            "log_frequency, distance and count must all be (vocab,) vectors, got "
            f"{tuple(lf.shape)}, {tuple(dist.shape)}, {tuple(c.shape)}"
        )
    keep = (c >= check_count(min_count, "min_count", minimum=1)) & torch.isfinite(dist)
    keep &= torch.isfinite(lf)
    if int(keep.sum()) < 3:
        raise ValueError(
            f"only {int(keep.sum())} token types have ≥ {min_count} occurrences and finite "
            "values; a correlation needs at least 3"
        )
    return correlations(lf[keep], dist[keep])
