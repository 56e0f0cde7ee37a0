"""Token frequency and geometry: how widely a token type's occurrences spread around the type's
centroid (METHODS.md §1.6).

For a token type ``t`` seen ``n_t`` times over the **whole** capture stream, with occurrences
``h₁ … h_{n_t}`` (rows of ``H``) and centroid ``c_t = Σᵢ hᵢ / n_t``, the per-type *spread* is the
Bessel-corrected mean squared distance to the centroid::

    s²_t = Σᵢ ‖hᵢ − c_t‖² / (n_t − 1) = (Σᵢ ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1),

computed exactly, in float64, from the streamed per-type sums (``count``, ``Σh``, ``Σ‖h‖²``, as
:class:`tangentlens.capture.TypeSums` keeps them), with no sample involved. It is the sum over
coordinates of the unbiased per-coordinate variances, so ``E[s²_t] = tr Σ_t`` for every ``n_t ≥ 2``
(``Σ_t`` the covariance of the type's occurrences); types seen once have no spread (NaN).

Why Bessel: the centroid contains the occurrence being measured, so the plain mean ``Σ‖hᵢ − c_t‖²
/ n_t`` has expectation ``(n_t − 1)/n_t · tr Σ_t``. Rare types then look tighter than they are and
``corr(log f, distance)`` is pushed up even when frequency and geometry are unrelated (2000
Zipf-distributed types, all with the same isotropic spread at d = 768: Pearson ≈ +0.85, Spearman
≈ +0.99 with the ÷ n estimator, ≈ 0 with ÷ (n − 1)). Leave-one-out centroids are not used: they
inflate the squared distance by ``n_t/(n_t − 1)``, the opposite bias.

The headline (:func:`frequency_distance_correlation`) is the Pearson and Spearman correlation,
across the types with ``n_t ≥ min_count`` (``min_count ≥ 2``), of log-frequency ``log f_t`` with
``s²_t``. Pearson is taken on the squared spread ``s²_t`` itself, not on ``√s²_t``: ``s²_t`` is
unbiased at every count, so with equal spread its mean does not depend on frequency, whereas
``√s²_t`` falls short of ``√tr Σ_t`` by a relative ``≈ 1/(4k_t)`` (Jensen; ``k_t`` below), again
more for rare types. The Spearman correlation is the same for both (ranks).

Caveat on the Spearman: ranks compare medians, not means. ``s²_t`` is right-skewed (for Gaussian
clouds ``(n_t − 1) s²_t / σ²`` is ``χ²`` with ``k_t ≈ d_eff (n_t − 1)`` degrees of freedom,
``d_eff = (tr Σ)² / tr Σ²``), and its median, ``≈ (1 − 2/(9k_t))³`` times its mean, is lower for
rare types; its noise also grows as the count falls. With equal spread the Spearman therefore
keeps a small positive shift that shrinks with ``k_t``: on 3000 Zipf types (40 000 tokens,
``min_count = 2``, 300 simulated seeds) about +0.056 at ``d_eff = 16``, +0.016 at 256 and +0.010 at
768 (+0.003 without any skew), against +0.75 and +0.99 for the ``÷ n`` spread; the Pearson on
``s²_t`` stays at +0.002 at every width. A larger ``min_count`` shrinks the shift further.
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from tangentlens.checks import check_count
from tangentlens.metrics._validate import as_tensor, to_float64
from tangentlens.metrics.geometry import Correlation, correlations
from tangentlens.typing import ArrayLike

__all__ = [
    "centroid_spread_from_sums",
    "centroids_from_sums",
    "frequency_distance_correlation",
]

PerType = Float[torch.Tensor, " vocab"]


def _counts(count: ArrayLike) -> torch.Tensor:
    c = to_float64(as_tensor(count, "count"))
    if c.ndim != 1 or not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ValueError("count must be a 1-D vector of non-negative occurrence counts per type")
    if bool((c != c.round()).any()):
        raise ValueError("count must hold whole numbers of occurrences per type")
    return c


def centroids_from_sums(count: ArrayLike, sum: ArrayLike) -> Float[torch.Tensor, "vocab d"]:
    """Per-type centroids ``sum / count`` (vocab × d) in float64; rows of unseen types are NaN."""
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    c = c.to(s.device)
    return s / c[:, None]


def centroid_spread_from_sums(count: ArrayLike, sum: ArrayLike, sum_sq_norms: ArrayLike) -> PerType:
    """Bessel-corrected mean squared distance to the type's centroid, per type (float64).

    ``s²_t = (Σ‖hᵢ‖² − n_t ‖c_t‖²) / (n_t − 1)`` from the streamed sums ``count`` (vocab,),
    ``sum`` = ``Σh`` (vocab × d) and ``sum_sq_norms`` = ``Σ‖h‖²`` (vocab,) — i.e. the sum over
    coordinates of the ``ddof = 1`` variances of the type's occurrences. Unbiased for ``tr Σ_t``
    at every count; NaN for types seen fewer than 2 times. Tiny negative values left by rounding
    (a type whose occurrences are all the same vector) are clamped to 0.
    """
    c = _counts(count)
    s = to_float64(as_tensor(sum, "sum"))
    if s.ndim != 2 or s.shape[0] != c.shape[0]:
        raise ValueError(f"sum must be (vocab, d) with vocab = {c.shape[0]}, got {tuple(s.shape)}")
    sq = to_float64(as_tensor(sum_sq_norms, "sum_sq_norms")).to(s.device)
    if sq.shape != c.shape:
        raise ValueError(f"sum_sq_norms must have shape {tuple(c.shape)}, got {tuple(sq.shape)}")
    c = c.to(s.device)
    seen = c >= 2
    n = torch.where(seen, c, torch.ones_like(c))  # no 0/0 for unseen types
    scatter = sq - s.pow(2).sum(dim=1) / n  # Σ‖h − c‖² = Σ‖h‖² − ‖Σh‖²/n
    spread = scatter.clamp(min=0) / (n - 1).clamp(min=1)
    return torch.where(seen, spread, torch.full_like(spread, float("nan")))


def frequency_distance_correlation(
    log_frequency: ArrayLike,
    spread: ArrayLike,
    count: ArrayLike,
    min_count: int = 2,
) -> Correlation:
    """Pearson and Spearman correlation, across types with ``count ≥ min_count`` (≥ 2), of
    log-frequency (vocab,) with a per-type spread (vocab,), e.g. the Bessel-corrected squared
    centroid distance of :func:`centroid_spread_from_sums`. Types whose log-frequency or spread
    is not finite are left out; ``Correlation.n`` is the number of types used."""
    min_count = check_count(min_count, "min_count", minimum=2)
    c = _counts(count)
    lf = to_float64(as_tensor(log_frequency, "log_frequency")).cpu()
    values = to_float64(as_tensor(spread, "spread")).cpu()
    c = c.cpu()
    if lf.shape != c.shape or values.shape != c.shape:
        raise ValueError(
            "log_frequency, spread and count must all be (vocab,) vectors, got "
            f"{tuple(lf.shape)}, {tuple(values.shape)}, {tuple(c.shape)}"
        )
    keep = (c >= min_count) & torch.isfinite(values) & torch.isfinite(lf)
    if int(keep.sum()) < 3:
        raise ValueError(
            f"only {int(keep.sum())} token types have ≥ {min_count} occurrences and finite "
            "values; a correlation needs at least 3"
        )
    return correlations(lf[keep], values[keep])
