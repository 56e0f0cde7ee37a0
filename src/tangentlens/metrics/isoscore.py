"""IsoScore (Rudman et al. 2022) and IsoScore* (Rudman & Eickhoff 2024): uniformity of variance.

Both score the eigenvalues ``λ`` (d,) of a covariance matrix:

1. ``λ̂ = √d · λ / ‖λ‖₂`` (normalised so that ``‖λ̂‖₂ = √d``; isotropy is ``λ̂ = 1``);
2. isotropy defect ``δ = ‖λ̂ − 1‖₂ / √(2(d − √d))`` (in ``[0, 1]``);
3. fraction of dimensions used ``φ = (d − δ²(d − √d))² / d²`` (in ``[1/d, 1]``);
4. score ``(d·φ − 1) / (d − 1)`` — identical to METHODS.md's ``((d − δ²(d − √d))² − d)/(d(d − 1))``.

Since ``δ²(d − √d) = d − Σλ̂``, the score equals ``(PR − 1)/(d − 1)`` with the participation ratio
``PR = (Σλ)² / Σλ²``: 1 for isotropic data, 0 when all variance lies on one direction.

Reference code followed (IsoScore 2.0.1 on PyPI, ``IsoScore/IsoScore.py``, and the I-STAR
repository ``bcbi-edu/p_eickhoff_isoscore``): the original IsoScore centres and rotates the points
to PCA space and takes the variances there (``np.cov``, ddof = 1); v2 takes the singular values of
``torch.cov(points.T)`` — the same numbers, the covariance eigenvalues. We take ``|eigvalsh|`` of
the symmetrised covariance in float64 (singular values of a symmetric matrix).

IsoScore* replaces the sample covariance ``C`` (ddof = 1, as ``torch.cov``) by the shrinkage
estimate ``Σ_ζ = (1 − ζ)·C + ζ·C0`` before step 1 (RDA-style shrinkage):

* ``C0`` — the shrinkage covariance: in the reference, the sample covariance (``np.cov``) of a
  larger pool of points from the same distribution (up to 250 000 training-set activations,
  recomputed each epoch); the reference README says to use the identity when no such pool
  exists. Note the identity is not scale-free: it only makes sense for data of unit scale.
* ``ζ`` (zeta) in ``[0, 1]`` — ``ζ = 0`` gives IsoScore, ``ζ = 1`` the IsoScore of ``C0``. Default
  0.2: the reference's default (``run_model.py``, ``run_model.sh``); its analysis code
  (``analysis.py``) scores representations with ``ζ = 0.75``.

With ``n < d`` points the sample covariance has rank ``< d`` and plain IsoScore is biased low;
that is what the shrinkage is for.
"""

from __future__ import annotations

import math

import torch

from tangentlens.checks import check_fraction, check_matrix, check_square, to_float64
from tangentlens.metrics.geometry import covariance
from tangentlens.typing import ArrayLike, Moment

__all__ = [
    "isoscore",
    "isoscore_from_covariance",
    "isoscore_from_eigenvalues",
    "isoscore_from_moments",
    "isoscore_star",
    "isoscore_star_from_covariance",
]

#: Relative tolerances for accepting a matrix as a covariance (asymmetry, negative eigenvalues).
_SYM_TOL = 1e-8
_PSD_TOL = 1e-8


def isoscore_from_eigenvalues(eigenvalues: ArrayLike) -> float:
    """IsoScore from covariance eigenvalues ``λ`` (d,), ``d ≥ 2``, ``λ ≥ 0`` not all zero."""
    lam = to_float64(torch.as_tensor(eigenvalues)).flatten()
    d = lam.shape[0]
    if d < 2:
        raise ValueError(f"IsoScore needs dimension d ≥ 2, got d = {d}")
    if not bool(torch.isfinite(lam).all()) or bool((lam < 0).any()):
        raise ValueError("eigenvalues must be finite and ≥ 0")
    norm = torch.linalg.vector_norm(lam)
    if norm == 0:
        raise ValueError("the covariance is zero (no variance): IsoScore is undefined")
    lam_hat = math.sqrt(d) * lam / norm
    defect = float(torch.linalg.vector_norm(lam_hat - 1)) / math.sqrt(2 * (d - math.sqrt(d)))
    phi = (d - defect**2 * (d - math.sqrt(d))) ** 2 / d**2
    return (d * phi - 1) / (d - 1)


def isoscore_from_moments(trace: torch.Tensor, squared: torch.Tensor, d: int) -> torch.Tensor:
    """IsoScore of symmetric PSD d × d matrices from their traces ``tr M = Σλ`` and squared
    Frobenius norms ``‖M‖²_F = Σλ²`` (any matching shapes, float64): ``(PR − 1)/(d − 1)`` with
    ``PR = (tr M)² / ‖M‖²_F`` — the score without an eigen-decomposition (module docstring).
    Raises when a norm is not positive (a zero matrix)."""
    if not bool((squared > 0).all()):
        raise ValueError("the covariance is zero (no variance): IsoScore is undefined")
    return (trace.pow(2) / squared - 1) / (d - 1)


def _covariance_eigenvalues(C: ArrayLike, name: str, size: int | None = None) -> torch.Tensor:
    """``|eigenvalues|`` of a symmetric PSD ``C`` (d, d) in float64, validated."""
    M = to_float64(check_square(C, name, size=size))
    scale = float(M.abs().max())
    if float((M - M.T).abs().max()) > _SYM_TOL * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric (a covariance matrix)")
    eig = torch.linalg.eigvalsh((M + M.T) / 2)
    if float(eig[0]) < -_PSD_TOL * max(float(eig.abs().max()), 1e-300):
        raise ValueError(
            f"{name} must be positive semi-definite (a covariance); its smallest eigenvalue is "
            f"{float(eig[0]):.3g}"
        )
    return eig.abs()


def isoscore_from_covariance(C: ArrayLike) -> float:
    """IsoScore of a covariance matrix ``C`` (d, d) — e.g. from accumulated moments."""
    return isoscore_from_eigenvalues(_covariance_eigenvalues(C, "C"))


def isoscore(X: ArrayLike) -> float:
    """IsoScore of the rows of ``X`` (n × d, n ≥ 2, d ≥ 2): 1 isotropic, 0 one direction."""
    Xt = check_matrix(X, "X", min_rows=2, min_cols=2)
    return isoscore_from_covariance(covariance(Xt, ddof=1))


def _shrunk(C: ArrayLike, C0: ArrayLike, zeta: float) -> Moment:
    zeta = check_fraction(zeta, "zeta")
    M = to_float64(check_square(C, "C"))
    M0 = to_float64(check_square(C0, "C0", size=M.shape[0])).to(M.device)
    _covariance_eigenvalues(M0, "C0")  # C0 must itself be a covariance
    return (1 - zeta) * M + zeta * M0


def isoscore_star_from_covariance(C: ArrayLike, C0: ArrayLike, zeta: float = 0.2) -> float:
    """IsoScore* of ``(1 − ζ)·C + ζ·C0`` for a sample covariance ``C`` (d, d; ddof = 1 to match
    the reference) and a shrinkage covariance ``C0`` (d, d); ``zeta`` in ``[0, 1]``."""
    return isoscore_from_covariance(_shrunk(C, C0, zeta))


def isoscore_star(X: ArrayLike, C0: ArrayLike, zeta: float = 0.2) -> float:
    """IsoScore* of the rows of ``X`` (n × d, n ≥ 2): IsoScore of ``(1 − ζ)·cov(X) + ζ·C0``.

    ``C0`` (d, d) is the shrinkage covariance (the covariance of a larger pool of points, or the
    identity — see the module docstring); ``zeta`` in ``[0, 1]``, default 0.2 as the reference.
    """
    Xt = check_matrix(X, "X", min_rows=2, min_cols=2)
    return isoscore_star_from_covariance(covariance(Xt, ddof=1), C0, zeta)
