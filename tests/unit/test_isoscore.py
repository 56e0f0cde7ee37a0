"""IsoScore and IsoScore* against the reference algorithm, closed forms and invariances."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tangentlens.metrics.isoscore import (
    isoscore,
    isoscore_from_covariance,
    isoscore_from_eigenvalues,
    isoscore_from_moments,
    isoscore_star,
    isoscore_star_from_covariance,
)


def _reference_isoscore(points: np.ndarray) -> float:
    """Rudman et al.'s IsoScore.py steps 2–7 in numpy (their input is d × m; ours is m × d)."""
    P = points.T  # (d, m) as in the reference
    d = P.shape[0]
    # Step 2: PCA — centre and rotate onto the principal axes.
    centred = P.T - P.T.mean(axis=0)
    _, _, Vt = np.linalg.svd(centred, full_matrices=False)
    pca = (centred @ Vt.T).T
    # Step 3: the diagonal of the covariance in PCA space.
    cov_diag = np.diag(np.cov(pca))
    # Step 4: normalise to norm √d.
    normalised = cov_diag * np.sqrt(d) / np.linalg.norm(cov_diag)
    # Step 5: isotropy defect.
    defect = np.linalg.norm(normalised - np.ones(d)) / np.sqrt(2 * (d - np.sqrt(d)))
    # Steps 6–7.
    return float(((d - defect**2 * (d - np.sqrt(d))) ** 2 - d) / (d * (d - 1)))


def _reference_isoscore_star(points: np.ndarray, C0: np.ndarray, zeta: float) -> float:
    """I-STAR's isoscore_star in numpy: shrink torch.cov-style covariance, singular values."""
    d = points.shape[1]
    cov = (1 - zeta) * np.cov(points.T) + zeta * C0
    pcs = np.linalg.svd(cov, compute_uv=False)
    pcs_norm = pcs * np.sqrt(d) / np.linalg.norm(pcs)
    defect = np.linalg.norm(pcs_norm - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    return float(((d - defect**2 * (d - np.sqrt(d))) ** 2 - d) / (d * (d - 1)))


def _anisotropic(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) * np.logspace(0, -1.2, d) + rng.standard_normal(d) * 3


def _orthogonal(d: int, seed: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))[0]


# ------------------------------------------------------------------------- known answers


def test_isotropic_scores_one() -> None:
    # Exactly isotropic sample: centred orthonormal design, covariance ∝ I.
    A = np.random.default_rng(0).standard_normal((300, 12))
    U = np.linalg.qr(A - A.mean(axis=0))[0]
    assert isoscore(U * 7 + 2) == pytest.approx(1.0, abs=1e-12)
    assert isoscore_from_covariance(np.eye(12) * 3.5) == pytest.approx(1.0, abs=1e-14)
    # A large Gaussian sample comes close (finite-sample spread of eigenvalues ≈ √(d/n)).
    g = torch.randn(40000, 12, generator=torch.Generator().manual_seed(0))
    assert isoscore(g) > 0.99


def test_rank_one_scores_zero() -> None:
    t = np.random.default_rng(1).standard_normal((500, 1))
    line = t @ np.random.default_rng(2).standard_normal((1, 9)) + 4.0
    assert isoscore(line) == pytest.approx(0.0, abs=1e-12)
    assert isoscore_from_eigenvalues([5.0, 0, 0, 0]) == pytest.approx(0.0, abs=1e-15)


def test_hand_computed_two_dimensional_case() -> None:
    # λ = (3, 1), d = 2: ‖λ‖ = √10, λ̂ = √2·(3, 1)/√10 = (3, 1)/√5 = (1.341641, 0.447214).
    # ‖λ̂ − 1‖² = 0.341641² + 0.552786² = 0.116718 + 0.305573 = 0.422291.
    # δ² = 0.422291 / (2(2 − √2)) = 0.422291 / 1.171573 = 0.360445.
    # d − δ²(d − √d) = 2 − 0.360445 · 0.585786 = 2 − 0.211146 = 1.788854 (= 4/√5).
    # φ = 1.788854² / 4 = 3.2 / 4 = 0.8; score = (2 · 0.8 − 1) / (2 − 1) = 0.6.
    assert isoscore_from_eigenvalues([3.0, 1.0]) == pytest.approx(0.6, abs=1e-14)
    assert isoscore_from_covariance(np.array([[2.0, 1.0], [1.0, 2.0]])) == pytest.approx(0.6)
    # Same from points: a centred orthonormal design scaled to covariance diag(3, 1).
    A = np.random.default_rng(3).standard_normal((50, 2))
    U = np.linalg.qr(A - A.mean(axis=0))[0] * np.sqrt(49)
    assert isoscore(U * np.sqrt([3.0, 1.0])) == pytest.approx(0.6, abs=1e-12)


def test_equals_participation_ratio_closed_form() -> None:
    # δ²(d − √d) = d − Σλ̂, so IsoScore = (PR − 1)/(d − 1) with PR = (Σλ)²/Σλ².
    lam = np.random.default_rng(4).exponential(size=17) ** 3
    pr = lam.sum() ** 2 / (lam**2).sum()
    assert isoscore_from_eigenvalues(lam) == pytest.approx((pr - 1) / 16, rel=1e-12)


def test_from_moments_equals_the_eigenvalue_score() -> None:
    """Trace and Frobenius norm give the eigenvalue path's IsoScore (batched); isotropic → 1,
    one direction → 0, a zero matrix is refused."""
    A = torch.randn(3, 9, 9, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    M = A @ A.transpose(1, 2)
    M[1] = torch.eye(9, dtype=torch.float64)
    M[2] = torch.outer(A[2, 0], A[2, 0])
    got = isoscore_from_moments(torch.diagonal(M, dim1=1, dim2=2).sum(1), M.pow(2).sum((1, 2)), 9)
    assert float(got[0]) == pytest.approx(isoscore_from_covariance(M[0]), rel=1e-12)
    assert float(got[1]) == pytest.approx(1.0, abs=1e-14)
    assert float(got[2]) == pytest.approx(0.0, abs=1e-14)
    with pytest.raises(ValueError, match="covariance is zero"):
        isoscore_from_moments(torch.zeros(1, dtype=torch.float64), torch.zeros(1), 9)


# ------------------------------------------------------------- the reference algorithms


@pytest.mark.parametrize(("n", "d"), [(500, 10), (200, 50), (80, 3)])
def test_isoscore_equals_reference_steps(n: int, d: int) -> None:
    X = _anisotropic(n, d, seed=n)
    assert isoscore(X) == pytest.approx(_reference_isoscore(X), rel=1e-10)
    assert isoscore(torch.tensor(X).float()) == pytest.approx(_reference_isoscore(X), rel=1e-5)


@pytest.mark.parametrize(("n", "d", "zeta"), [(40, 64, 0.2), (300, 16, 0.75), (30, 8, 0.5)])
def test_isoscore_star_equals_reference_steps(n: int, d: int, zeta: float) -> None:
    X = _anisotropic(n, d, seed=d)
    pool = _anisotropic(5000, d, seed=d + 1)
    C0 = np.cov(pool.T)
    expected = _reference_isoscore_star(X, C0, zeta)
    assert isoscore_star(X, C0, zeta) == pytest.approx(expected, rel=1e-10)
    assert isoscore_star(X, np.eye(d), zeta) == pytest.approx(
        _reference_isoscore_star(X, np.eye(d), zeta), rel=1e-10
    )


def test_isoscore_star_limits() -> None:
    X = _anisotropic(100, 20, seed=5)
    C0 = np.cov(_anisotropic(2000, 20, seed=6).T)
    assert isoscore_star(X, C0, 0.0) == pytest.approx(isoscore(X), rel=1e-12)
    assert isoscore_star(X, C0, 1.0) == pytest.approx(isoscore_from_covariance(C0), rel=1e-12)
    # Shrinking a rank-deficient sample (n < d) towards the identity raises the score.
    few = _anisotropic(10, 20, seed=7)
    assert isoscore_star(few, np.eye(20) * np.trace(np.cov(few.T)) / 20, 0.5) > isoscore(few)


# ---------------------------------------------------------------- invariances and paths


def test_invariant_to_rotation_scaling_and_translation() -> None:
    X = _anisotropic(400, 15, seed=8)
    R = _orthogonal(15, 9)
    base = isoscore(X)
    assert isoscore(X @ R.T) == pytest.approx(base, rel=1e-11)
    assert isoscore(X * 1e-3) == pytest.approx(base, rel=1e-11)
    assert isoscore(X - 100.0) == pytest.approx(base, rel=1e-11)
    # IsoScore*: rotate the target with the data, scale both together.
    C0 = np.cov(_anisotropic(1000, 15, seed=10).T)
    star = isoscore_star(X, C0, 0.3)
    assert isoscore_star(X @ R.T, R @ C0 @ R.T, 0.3) == pytest.approx(star, rel=1e-11)
    assert isoscore_star(5 * X, 25 * C0, 0.3) == pytest.approx(star, rel=1e-11)
    # …but not the data alone: a non-identity target is not rotation invariant.
    assert isoscore_star(X @ R.T, C0, 0.3) != pytest.approx(star, rel=1e-6)


def test_covariance_path_equals_direct() -> None:
    X = _anisotropic(600, 24, seed=11)
    C = np.cov(X.T)
    assert isoscore_from_covariance(C) == pytest.approx(isoscore(X), rel=1e-12)
    assert isoscore_from_covariance(torch.tensor(C)) == pytest.approx(isoscore(X), rel=1e-12)
    C0 = np.diag(np.linspace(1, 2, 24))
    assert isoscore_star_from_covariance(C, C0, 0.4) == pytest.approx(
        isoscore_star(X, C0, 0.4), rel=1e-12
    )


# -------------------------------------------------------------------------- validation


def test_validation() -> None:
    X = _anisotropic(50, 4, seed=12)
    with pytest.raises(ValueError, match="at least 2 columns"):
        isoscore(X[:, :1])
    with pytest.raises(ValueError, match="at least 2 rows"):
        isoscore(X[:1])
    with pytest.raises(ValueError, match="NaN or inf"):
        isoscore(np.where(np.eye(50, 4) > 0, np.nan, X))
    with pytest.raises(ValueError, match="no variance"):
        isoscore(np.ones((5, 3)))
    with pytest.raises(ValueError, match="symmetric"):
        isoscore_from_covariance(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="positive semi-definite"):
        isoscore_from_covariance(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="square"):
        isoscore_from_covariance(np.ones((2, 3)))
    with pytest.raises(ValueError, match="zeta"):
        isoscore_star(X, np.eye(4), 1.5)
    with pytest.raises(ValueError, match="C0 must be 4 × 4"):
        isoscore_star(X, np.eye(3), 0.2)
    with pytest.raises(ValueError, match="C0 must be positive semi-definite"):
        isoscore_star(X, -np.eye(4), 0.2)
    with pytest.raises(ValueError, match="d ≥ 2"):
        isoscore_from_eigenvalues([1.0])
    assert math.isfinite(isoscore_star(X, np.zeros((4, 4)), 0.5))
