"""Subspace tools vs scipy, PCA vs numpy, semi-NMF on planted non-negative factorisations."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from tangentlens.dictionaries import PCA, SemiNMF, principal_angles, projector, seminmf, span_basis
from tangentlens.dictionaries.base import ConceptDictionary
from tangentlens.testing import emulated_accelerator


def _random_basis(d, r, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, r)))
    return q


def test_span_basis_is_orthonormal_and_spans_the_rows():
    rng = np.random.default_rng(0)
    D = rng.normal(size=(5, 30))
    D[4] = D[0] + 2 * D[1]  # rank 4
    Q = span_basis(D)
    assert Q.shape == (30, 4) and Q.dtype == torch.float64
    torch.testing.assert_close(Q.T @ Q, torch.eye(4, dtype=torch.float64))
    P = projector(Q).numpy()
    np.testing.assert_allclose(D @ P, D, atol=1e-12)  # every row lies in the span
    with pytest.raises(ValueError, match="all zero"):
        span_basis(np.zeros((3, 4)))


def test_principal_angles_match_scipy_including_tiny_angles():
    d = 40
    A = _random_basis(d, 6, 1)
    B = _random_basis(d, 4, 2)
    ref = np.sort(scipy.linalg.subspace_angles(A, B))
    np.testing.assert_allclose(principal_angles(A, B).numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(principal_angles(B, A).numpy(), ref, atol=1e-12)
    # a rotation by 1e-9 rad is resolved (cosines alone would return 0)
    e = np.eye(d)
    tilted = np.stack([e[0], np.cos(1e-9) * e[1] + np.sin(1e-9) * e[2]], axis=1)
    angles = principal_angles(e[:, :2], tilted).numpy()
    np.testing.assert_allclose(angles, [0, 1e-9], atol=1e-15, rtol=1e-6)
    orthogonal = principal_angles(e[:, :2], e[:, 2:4]).numpy()
    np.testing.assert_allclose(orthogonal, [np.pi / 2] * 2, atol=1e-12)
    with pytest.raises(ValueError, match="orthonormal"):
        principal_angles(2 * e[:, :2], e[:, :2])
    with pytest.raises(ValueError, match="same space"):
        principal_angles(e[:, :2], np.eye(5)[:, :2])


def test_pca_matches_numpy_svd_and_streamed_moments():
    rng = np.random.default_rng(3)
    H = rng.normal(size=(500, 12)) * np.linspace(3, 0.1, 12) + 5.0
    pca = PCA(3).fit(H)
    Hc = H - H.mean(axis=0)
    _, s, vt = np.linalg.svd(Hc, full_matrices=False)
    ref = span_basis(vt[:3])
    np.testing.assert_allclose(principal_angles(pca.basis(), ref).numpy(), 0, atol=1e-7)
    np.testing.assert_allclose(pca.explained_variance_.numpy(), s[:3] ** 2 / 499, rtol=1e-10)
    np.testing.assert_allclose(
        pca.explained_variance_ratio_.numpy(), s[:3] ** 2 / (s**2).sum(), rtol=1e-10
    )
    X = torch.from_numpy(H)
    streamed = PCA.from_moments(3, 500, X.sum(0), X.T @ X)
    torch.testing.assert_close(streamed.components_, pca.components_, rtol=1e-6, atol=1e-8)
    Z = pca.encode(H)
    np.testing.assert_allclose(pca.decode(Z).numpy(), H - Hc + Hc @ vt[:3].T @ vt[:3], atol=1e-9)
    assert isinstance(pca, ConceptDictionary) and pca.effective_rank_ == 3


def _planted(n=3000, d=40, k=5, seed=0, noise=0.0):
    gen = torch.Generator().manual_seed(seed)
    Z = torch.rand(n, k, generator=gen, dtype=torch.float64) ** 3  # sparse-ish, non-negative
    D = torch.randn(k, d, generator=gen, dtype=torch.float64)
    H = Z @ D + noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return H, D


def test_seminmf_recovers_a_planted_span():
    H, D = _planted()
    model = SemiNMF(5, seed=1, tol=1e-10, max_iter=3000, dtype="float64").fit(H)
    angles = principal_angles(model.basis(), span_basis(D))
    assert float(angles.max()) < 1e-4
    assert model.svd_bound_ <= model.relative_error_ < 1e-4
    assert model.converged_


@pytest.mark.parametrize("solver", ["hals", "mu"])
def test_seminmf_objective_decreases_monotonically(solver):
    H, _ = _planted(noise=0.1, n=1000, seed=5)
    model = SemiNMF(5, solver=solver, seed=1, tol=1e-9, max_iter=200, dtype="float64").fit(H)
    objective = np.array(model.objective_)
    assert len(objective) > 10 and (np.diff(objective) <= 1e-12).all()
    assert model.relative_error_**2 <= objective[-1] + 1e-12  # the last D update helps too
    assert model.relative_error_ >= model.svd_bound_


def test_seminmf_never_beats_the_svd_bound_on_noisy_data_and_is_deterministic():
    H, _ = _planted(noise=0.3, seed=2)
    first = SemiNMF(5, seed=3).fit(H)
    again = SemiNMF(5, seed=3).fit(H)
    assert torch.equal(first.components_, again.components_)
    assert first.svd_bound_ <= first.relative_error_ <= first.svd_bound_ * 1.02
    Hc = H - 0  # semi-NMF is uncentred: the bound is the uncentred truncated SVD
    s = np.linalg.svd(Hc.numpy(), compute_uv=False)
    assert first.svd_bound_ == pytest.approx(np.sqrt((s[5:] ** 2).sum() / (s**2).sum()), rel=1e-6)
    Z = first.encode(H)
    assert float(Z.min()) >= 0
    recon = float((first.decode(Z).double() - H).norm() / H.norm())
    assert recon == pytest.approx(first.relative_error_, rel=1e-2)


def test_seminmf_hals_reaches_a_lower_or_equal_objective_than_mu_in_fewer_iterations():
    H, _ = _planted(noise=0.2, seed=4, n=2000, d=30, k=6)
    hals = SemiNMF(6, solver="hals", seed=0, tol=1e-7, max_iter=2000).fit(H)
    mu = SemiNMF(6, solver="mu", seed=0, tol=1e-7, max_iter=2000).fit(H)
    assert hals.relative_error_ <= mu.relative_error_ * (1 + 1e-4)
    assert hals.n_iter_ < mu.n_iter_


def test_dictionary_bad_input():
    H = torch.randn(50, 8)
    for rank in (0, 2.5, True):
        with pytest.raises(ValueError, match="rank must be an integer"):
            SemiNMF(rank)
    for rank in (8, 9):
        with pytest.raises(ValueError, match=r"rank must be an integer in \[1, 7\]"):
            SemiNMF(rank).fit(H)
    with pytest.raises(ValueError, match="at least 6 samples"):
        SemiNMF(6).fit(torch.randn(4, 8))
    with pytest.raises(ValueError, match="NaN"):
        SemiNMF(2).fit(torch.full((10, 8), float("nan")))
    with pytest.raises(ValueError, match="solver must be one of"):
        SemiNMF(2, solver="als")
    with pytest.raises(ValueError, match="not fitted"):
        SemiNMF(2).basis()
    with pytest.raises(ValueError, match="rank"):
        PCA(8).fit(H)
    with pytest.raises(ValueError, match="zero variance"):
        PCA(2).fit(torch.ones(10, 8))
    # a collapsed dictionary: two of three directions coincide
    model = SemiNMF(3, seed=0).fit(H)
    model.components_ = torch.stack(
        [model.components_[0], model.components_[0], model.components_[1]]
    )
    assert model.effective_rank_ == 2
    with pytest.raises(ValueError, match="collapsed"):
        model.basis()


def _hals_reference(Z: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """The textbook HALS sweep over the columns of Z (n × k), one exact NNLS update each."""
    Z = Z.clone()
    for j in range(Z.shape[1]):
        if B[j, j] > 0:
            Z[:, j] = (Z[:, j] + (A[:, j] - Z @ B[:, j]) / B[j, j]).clamp(min=0)
    return Z


@pytest.mark.parametrize("xp", [np, torch], ids=["numpy", "torch"])
def test_hals_sweep_is_the_textbook_coordinate_descent(xp):
    """The in-place sweep on transposed codes equals column-by-column exact updates (float64),
    a dead direction (B[j, j] = 0) keeping its codes; the least-squares directions with a
    singular Gram (a dead code) equal torch's pseudo-inverse solution."""
    gen = torch.Generator().manual_seed(0)
    H = torch.randn(200, 12, generator=gen, dtype=torch.float64)
    D = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    D[2] = 0  # a dead direction
    Z = torch.rand(200, 4, generator=gen, dtype=torch.float64)
    A, B = H @ D.T, D @ D.T
    expected = _hals_reference(Z, A, B)
    to = (lambda t: t.numpy()) if xp is np else (lambda t: t)
    Zt = to(Z.T.contiguous())
    seminmf._hals_sweep(xp, Zt, to(A.T.contiguous()), to(B))
    got = torch.as_tensor(Zt).T
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert torch.equal(got[:, 2], Z[:, 2]) and not torch.equal(got, Z)
    assert (got >= 0).all() and (got == 0).any()  # the clamp acted

    Zt[1] = 0  # a dead code: ZᵀZ is singular
    codes = torch.as_tensor(Zt).T
    gram = codes.T @ codes
    directions = seminmf._directions(xp, to(gram), Zt, to(H))
    reference = torch.linalg.pinv(gram, hermitian=True) @ codes.T @ H
    torch.testing.assert_close(torch.as_tensor(directions), reference, rtol=0, atol=1e-10)


@pytest.mark.parametrize("solver", ["hals", "mu"])
def test_the_accelerator_path_fits_as_the_cpu_path(solver):
    """The fit's loop in torch on an (emulated) accelerator and in numpy on the CPU give the
    same float64 fit and codes, on the accelerator."""
    H, _ = _planted(noise=0.3, seed=2)
    cpu = SemiNMF(5, solver=solver, seed=3, dtype="float64").fit(H)
    with emulated_accelerator() as device:
        accelerator = SemiNMF(5, solver=solver, seed=3, dtype="float64").fit(H.to(device.device))
        codes = accelerator.encode(H.to(device.device))
        assert accelerator.components_.device == codes.device == device.device
        fitted = device.transfers.matrices()
        components, codes = accelerator.components_.cpu(), codes.cpu()
    assert fitted == []  # the fit and the encoding moved no matrix to the host
    assert accelerator.n_iter_ == cpu.n_iter_ > 10
    torch.testing.assert_close(components, cpu.components_, rtol=0, atol=1e-9)
    assert accelerator.relative_error_ == pytest.approx(cpu.relative_error_, abs=1e-12)
    torch.testing.assert_close(codes, cpu.encode(H), rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_the_float32_accelerator_loop_ends_as_close_as_float32_allows(seed):
    """In float32 (the default working precision) the torch loop and numpy's sum in other
    orders, so the fits stop a few iterations apart: on 2000 × 48 correlated rows at rank 8
    their relative errors agree within 3e-4 (relative) and their spans within 0.11°
    (measured; asserted 1e-3 and 0.5°)."""
    gen = torch.Generator().manual_seed(seed)
    H = torch.randn(2000, 48, generator=gen) @ torch.randn(48, 48, generator=gen)
    H = (H * torch.linspace(0.1, 2, 48)) - (H * torch.linspace(0.1, 2, 48)).mean(0)
    cpu = SemiNMF(8, seed=seed).fit(H)
    with emulated_accelerator() as device:
        accelerator = SemiNMF(8, seed=seed).fit(H.to(device.device))
        basis = accelerator.basis().cpu()
    assert accelerator.relative_error_ == pytest.approx(cpu.relative_error_, rel=1e-3)
    assert float(principal_angles(basis, cpu.basis()).max()) < math.radians(0.5)


def _fit_syncs(max_iter: int, solver: str) -> tuple[int, int]:
    """(host syncs, iterations) of a semi-NMF fit of noisy planted rows on the emulated
    accelerator, ``tol`` small enough that it runs ``max_iter`` iterations."""
    H, _ = _planted(n=300, d=12, k=4, seed=5, noise=0.5)
    with emulated_accelerator() as device:
        X = H.to(device.device)
        start = len(device.transfers.syncs)
        model = SemiNMF(4, solver=solver, seed=1, tol=1e-14, max_iter=max_iter, dtype="float64")
        model.fit(X)
        return len(device.transfers.syncs) - start, model.n_iter_


@pytest.mark.parametrize("solver", ["hals", "mu"])
def test_a_device_fit_waits_on_the_host_at_most_once_per_ten_iterations(solver):
    """The device loop reads its objective (the stopping test) once per block of 10
    iterations, in one transfer: 50 more iterations add at most 5 syncs (before: about 5 per
    iteration). The fit's own set-up waits 9 times whatever its length — the input's finiteness,
    its norm, the initial rows' index, the initial codes' and directions' pseudo-inverses (3),
    the SVD bound (2), the final error — and 10 iterations read one block."""
    short, short_iterations = _fit_syncs(10, solver)
    long, long_iterations = _fit_syncs(60, solver)
    assert (short_iterations, long_iterations) == (10, 60)
    assert long - short <= 5
    assert short <= 9 + 1
