"""Global geometry of a point cloud ``H`` (n × d): cosine anisotropy, drift, spectral anisotropy.

Definitions (METHODS.md §2–3):

* cosine anisotropy (Godey et al. 2024) — mean cosine over distinct pairs, uncentred, computed
  exactly in O(n·d) from the sum of unit rows: ``(‖Σ ûᵢ‖² − n) / (n(n − 1))``;
* drift — ``‖mean(H)‖`` and ``‖mean(H)‖ / mean‖hᵢ‖``;
* centred anisotropy (Razzhigaev et al. 2023) — ``σ₁² / Σ σᵢ²`` of the centred matrix
  ``X − mean(X)``: the largest covariance eigenvalue over the trace, as the authors' own code
  computes it (``llm_microscope.calculate_anisotropy_torch``); ``1/d`` isotropic, ``1`` one
  direction. The paper's text reads "top singular value over the sum of singular values":
  that reading, ``σ₁ / Σ σᵢ``, has its own name, the centred *singular* anisotropy
  (``1/d`` isotropic too, but smaller than σ₁²/Σσ² whenever one direction dominates);
* Pearson and Spearman correlation (e.g. drift against cosine anisotropy across layers).

Every reduction accumulates in float64, a row chunk at a time, so memory stays bounded for
large ``n`` whatever the input dtype. ``*_from_sums`` / ``*_from_moments`` give the same numbers
from streaming accumulators (sums over tokens, kept in float64 by the capture code).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from numbers import Real

import torch
from jaxtyping import Float

from tangentlens.checks import (
    CHUNK_ROWS,
    check_count,
    check_matrix,
    check_square,
    check_vector,
    to_float64,
)
from tangentlens.typing import ArrayLike, Moment

__all__ = [
    "Correlation",
    "centred_anisotropy",
    "centred_anisotropy_from_moments",
    "centred_scatter",
    "centred_singular_anisotropy",
    "centred_singular_anisotropy_from_moments",
    "correlations",
    "cosine_anisotropy",
    "cosine_anisotropy_from_sums",
    "cosine_anisotropy_sampled",
    "covariance",
    "drift_norm",
    "drift_norm_from_sums",
    "relative_drift",
    "relative_drift_from_sums",
    "unit_row_sum",
]

Vector = Float[torch.Tensor, "d"]


def _row_chunks(H: torch.Tensor) -> Iterator[torch.Tensor]:
    """Consecutive row blocks of ``H`` converted to float64."""
    for start in range(0, H.shape[0], CHUNK_ROWS):
        yield to_float64(H[start : start + CHUNK_ROWS])


# --------------------------------------------------------------------------- cosine anisotropy


def unit_row_sum(H: ArrayLike) -> Vector:
    """``Σᵢ hᵢ/‖hᵢ‖`` in float64, shape ``(d,)`` — the accumulator of the exact cosine.

    Raises ``ValueError`` on zero rows (their direction is undefined).
    """
    X = check_matrix(H, "H")
    total = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    n_zero = 0
    for chunk in _row_chunks(X):
        norms = torch.linalg.vector_norm(chunk, dim=1)
        n_zero += int((norms == 0).sum())
        if n_zero == 0:
            total += norms.reciprocal() @ chunk
    if n_zero:
        raise ValueError(
            f"H has {n_zero} zero rows; cosine similarity needs nonzero rows "
            "(drop them, e.g. with the token mask, before the metric)"
        )
    return total


def cosine_anisotropy_from_sums(sum_unit: ArrayLike, n: int) -> float:
    """Mean pairwise cosine over distinct pairs from ``sum_unit = Σᵢ ûᵢ`` (d,) and ``n ≥ 2``.

    ``(‖sum_unit‖² − n) / (n(n − 1))``. Since ``‖Σ ûᵢ‖ ≤ n`` the value lies in ``[−1/(n−1), 1]``.
    """
    n = check_count(n, "n", minimum=2)
    s = to_float64(check_vector(sum_unit, "sum_unit"))
    sq = float(s @ s)
    if sq > n * n * (1.0 + 1e-9):
        raise ValueError(
            f"‖sum_unit‖² = {sq:.6g} exceeds n² = {n * n}: sum_unit must be a sum of n unit vectors"
        )
    return (sq - n) / (n * (n - 1))


def cosine_anisotropy(H: ArrayLike) -> float:
    """Exact mean cosine similarity over all distinct pairs of rows of ``H`` (n × d), O(n·d).

    Uncentred, rows not otherwise normalised. ``n ≥ 2``; zero rows raise ``ValueError``.
    """
    X = check_matrix(H, "H", min_rows=2)
    return cosine_anisotropy_from_sums(unit_row_sum(X), X.shape[0])


def cosine_anisotropy_sampled(H: ArrayLike, n_pairs: int, seed: int) -> float:
    """Monte-Carlo mean cosine over ``n_pairs`` random pairs ``(i, j)``, ``i ≠ j`` (for comparison).

    Pairs are drawn uniformly with replacement from the ordered distinct pairs, from a local
    ``torch.Generator`` seeded with ``seed``; the standard error is ``sd(cos)/√n_pairs``.
    """
    X = check_matrix(H, "H", min_rows=2)
    n_pairs = check_count(n_pairs, "n_pairs", minimum=1)
    seed = check_count(seed, "seed", minimum=0)
    n = X.shape[0]
    norms = torch.cat([torch.linalg.vector_norm(c, dim=1) for c in _row_chunks(X)])
    if bool((norms == 0).any()):
        raise ValueError(f"H has {int((norms == 0).sum())} zero rows; cosine needs nonzero rows")
    gen = torch.Generator().manual_seed(seed)
    i = torch.randint(0, n, (n_pairs,), generator=gen)
    j = torch.randint(0, n - 1, (n_pairs,), generator=gen)
    j = j + (j >= i).to(j.dtype)  # skip the diagonal: uniform over j ≠ i
    i, j = i.to(X.device), j.to(X.device)
    total = 0.0
    for start in range(0, n_pairs, CHUNK_ROWS):
        a, b = i[start : start + CHUNK_ROWS], j[start : start + CHUNK_ROWS]
        dots = (to_float64(X[a]) * to_float64(X[b])).sum(dim=1)
        total += float((dots / (norms[a] * norms[b])).sum())
    return total / n_pairs


# ----------------------------------------------------------------------------------- drift


def _check_sum_norms(sum_norms: object) -> float:
    if isinstance(sum_norms, torch.Tensor) and sum_norms.numel() == 1:
        sum_norms = float(sum_norms)
    if isinstance(sum_norms, bool) or not isinstance(sum_norms, Real):
        raise ValueError(f"sum_norms must be a finite number ≥ 0, got {sum_norms!r}")
    v = float(sum_norms)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"sum_norms must be a finite number ≥ 0, got {v}")
    return v


def drift_norm_from_sums(sum: ArrayLike, sum_norms: float | None, n: int) -> float:
    """``‖sum / n‖`` from ``sum = Σᵢ hᵢ`` (d,). ``sum_norms`` is not needed for the absolute drift;
    it is accepted (and validated when given) so both drift functions take the same accumulators.
    """
    n = check_count(n, "n", minimum=1)
    s = to_float64(check_vector(sum, "sum"))
    if sum_norms is not None:
        _check_sum_norms(sum_norms)
    return float(torch.linalg.vector_norm(s)) / n


def relative_drift_from_sums(sum: ArrayLike, sum_norms: float, n: int) -> float:
    """``‖sum/n‖ / (sum_norms/n)`` with ``sum = Σᵢ hᵢ`` (d,), ``sum_norms = Σᵢ ‖hᵢ‖``.

    In ``[0, 1]``: 1 when all rows point the same way, 0 when they cancel.
    """
    n = check_count(n, "n", minimum=1)
    s = to_float64(check_vector(sum, "sum"))
    total = _check_sum_norms(sum_norms)
    if total == 0:
        raise ValueError("sum_norms is 0 (all rows are zero): relative drift is undefined")
    return float(torch.linalg.vector_norm(s)) / total


def _sums(X: torch.Tensor) -> tuple[Vector, float]:
    s = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    sum_norms = 0.0
    for chunk in _row_chunks(X):
        s += chunk.sum(dim=0)
        sum_norms += float(torch.linalg.vector_norm(chunk, dim=1).sum())
    return s, sum_norms


def drift_norm(H: ArrayLike) -> float:
    """``‖mean(H)‖`` — the norm of the mean row of ``H`` (n × d)."""
    X = check_matrix(H, "H")
    s, _ = _sums(X)
    return drift_norm_from_sums(s, None, X.shape[0])


def relative_drift(H: ArrayLike) -> float:
    """``‖mean(H)‖ / mean‖hᵢ‖`` for ``H`` (n × d); all-zero ``H`` raises ``ValueError``."""
    X = check_matrix(H, "H")
    s, sum_norms = _sums(X)
    return relative_drift_from_sums(s, sum_norms, X.shape[0])


# ----------------------------------------------------------------------------- correlations


@dataclass(frozen=True)
class Correlation:
    """Pearson and Spearman (average ranks for ties) correlation of two length-``n`` series."""

    pearson: float
    spearman: float
    n: int


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks, tied values sharing the mean of the ranks they span."""
    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    last = torch.cumsum(counts, dim=0).to(torch.float64)  # rank of each group's last member
    return (last - (counts.to(torch.float64) - 1) / 2)[inverse]


def _pearson(x: torch.Tensor, y: torch.Tensor, what: str) -> float:
    xc, yc = x - x.mean(), y - y.mean()
    nx, ny = torch.linalg.vector_norm(xc), torch.linalg.vector_norm(yc)
    if nx == 0 or ny == 0:
        raise ValueError(f"{what} of a constant series is undefined; x and y must both vary")
    return max(-1.0, min(1.0, float((xc / nx) @ (yc / ny))))


def correlations(x: ArrayLike, y: ArrayLike) -> Correlation:
    """Pearson and Spearman correlation of 1-D ``x`` and ``y`` of equal length ``n ≥ 2``."""
    xv = to_float64(check_vector(x, "x", min_length=2))
    yv = to_float64(check_vector(y, "y", min_length=2))
    if xv.shape != yv.shape:
        raise ValueError(f"x and y must have the same length, got {xv.shape[0]} and {yv.shape[0]}")
    yv = yv.to(xv.device)
    return Correlation(
        pearson=_pearson(xv, yv, "Pearson correlation"),
        spearman=_pearson(_average_ranks(xv), _average_ranks(yv), "Spearman correlation"),
        n=int(xv.shape[0]),
    )


# ------------------------------------------------------------------- spectral anisotropy


def centred_scatter(H: ArrayLike) -> tuple[Vector, Moment]:
    """Mean ``(d,)`` and centred scatter ``Σᵢ (hᵢ − m)(hᵢ − m)ᵀ`` ``(d, d)`` of ``H``, float64.

    Two passes (mean first, then centred row chunks), so a large mean costs no precision.
    """
    X = check_matrix(H, "H")
    d = X.shape[1]
    mean = torch.zeros(d, dtype=torch.float64, device=X.device)
    for chunk in _row_chunks(X):
        mean += chunk.sum(dim=0)
    mean /= X.shape[0]
    scatter = torch.zeros(d, d, dtype=torch.float64, device=X.device)
    for chunk in _row_chunks(X):
        c = chunk - mean
        scatter.addmm_(c.T, c)
    return mean, scatter


def covariance(H: ArrayLike, ddof: int = 1) -> Moment:
    """Sample covariance ``(d, d)`` of the rows of ``H`` in float64, divided by ``n − ddof``."""
    X = check_matrix(H, "H")
    ddof = check_count(ddof, "ddof", minimum=0)
    if X.shape[0] <= ddof:
        raise ValueError(
            f"covariance with ddof={ddof} needs more than {ddof} rows, got {X.shape[0]}"
        )
    _, scatter = centred_scatter(X)
    return scatter / (X.shape[0] - ddof)


def _centred_spectrum(scatter: Moment) -> torch.Tensor:
    """Eigenvalues ``σᵢ²`` (ascending) of a symmetric PSD centred scatter matrix, those at
    rounding level set to 0 (they are zero variances; their square roots would not be small)."""
    sym = (scatter + scatter.T) / 2
    if not float(torch.diagonal(sym).sum()) > 0:
        raise ValueError(
            "the centred data have zero variance (all rows equal): anisotropy undefined"
        )
    values = torch.linalg.eigvalsh(sym)
    noise = values.shape[0] * torch.finfo(values.dtype).eps * float(values[-1])
    return torch.where(values > noise, values, torch.zeros_like(values))


def _centred_scatter_of(X: torch.Tensor) -> Moment:
    """A matrix with the centred scatter's nonzero spectrum: the d × d scatter, or the smaller
    n × n Gram matrix of the centred rows when ``n < d``."""
    if X.shape[0] < X.shape[1]:
        Xc = to_float64(X) - to_float64(X).mean(dim=0)
        return Xc @ Xc.T
    return centred_scatter(X)[1]


def _moments_scatter(n: int, sum: ArrayLike, second_moment: ArrayLike) -> Moment:
    n = check_count(n, "n", minimum=2)
    s = to_float64(check_vector(sum, "sum"))
    M = to_float64(check_square(second_moment, "second_moment", size=s.shape[0]))
    return M - torch.outer(s, s.to(M.device)) / n


def _variance_share(values: torch.Tensor) -> float:
    return float(values[-1] / values.sum())


def _singular_share(values: torch.Tensor) -> float:
    root = values.sqrt()
    return float(root[-1] / root.sum())


def centred_anisotropy(H: ArrayLike) -> float:
    """``σ₁² / Σσᵢ²`` of the centred ``H`` (n × d), rows not normalised, ``n ≥ 2``: the largest
    eigenvalue of the covariance over its trace (Razzhigaev et al. 2023, as their
    ``llm_microscope.calculate_anisotropy_torch`` computes it; METHODS.md §2). ``1/d`` for
    isotropic data, ``1`` when all variance lies along one direction. For the paper text's
    ``σ₁/Σσᵢ`` see :func:`centred_singular_anisotropy`.
    """
    X = check_matrix(H, "H", min_rows=2)
    return _variance_share(_centred_spectrum(_centred_scatter_of(X)))


def centred_singular_anisotropy(H: ArrayLike) -> float:
    """``σ₁ / Σσᵢ`` (singular values, not variances) of the centred ``H`` (n × d), ``n ≥ 2``: the
    reading of Razzhigaev et al.'s text ("the ratio of the top singular value to the sum of all
    singular values"). ``1/d`` isotropic, ``1`` one direction; ≤ :func:`centred_anisotropy`
    whenever the top direction holds more than its share."""
    X = check_matrix(H, "H", min_rows=2)
    return _singular_share(_centred_spectrum(_centred_scatter_of(X)))


def centred_anisotropy_from_moments(n: int, sum: ArrayLike, second_moment: ArrayLike) -> float:
    """:func:`centred_anisotropy` (``σ₁²/Σσᵢ²``) from streaming moments.

    Args:
        n: number of rows accumulated (≥ 2).
        sum: ``Σᵢ hᵢ``, shape ``(d,)``.
        second_moment: uncentred ``Σᵢ hᵢhᵢᵀ``, shape ``(d, d)``, accumulated in float64.

    The centred scatter is ``second_moment − sum sumᵀ / n``, which cancels: the result's relative
    error is about ``10 ε ‖mean‖² / tr(cov)`` (ε = 2.2e-16), e.g. 1e-12 when the drift is 100× the
    spread, 1e-8 at 10 000×. :func:`centred_anisotropy` (two passes) has no such loss.
    """
    return _variance_share(_centred_spectrum(_moments_scatter(n, sum, second_moment)))


def centred_singular_anisotropy_from_moments(
    n: int, sum: ArrayLike, second_moment: ArrayLike
) -> float:
    """:func:`centred_singular_anisotropy` (``σ₁/Σσᵢ``) from streaming moments (arguments and
    precision as :func:`centred_anisotropy_from_moments`)."""
    return _singular_share(_centred_spectrum(_moments_scatter(n, sum, second_moment)))
