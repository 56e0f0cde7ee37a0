"""TwoNN: exact neighbours, both fits against independent references, planted manifolds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from skdim.id import TwoNN

import tangentlens.metrics.twonn as twonn_module
from tangentlens.metrics.twonn import (
    remove_duplicate_rows,
    two_nearest_distances,
    twonn_dimension,
    twonn_estimate,
    twonn_fit_facco,
)


def _embed(Z: np.ndarray, d: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    """Isometric embedding of the rows of Z into R^d by a random orthonormal frame."""
    Q = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, Z.shape[1])))[0]
    return (Z @ Q.T).astype(dtype)


def _sphere(n: int, seed: int) -> np.ndarray:
    """n uniform points on the unit 5-sphere S⁵ ⊂ R⁶ (a curved 5-manifold)."""
    s = np.random.default_rng(seed).standard_normal((n, 6))
    return s / np.linalg.norm(s, axis=1, keepdims=True)


def _brute_two_nn(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    D = cdist(X.astype(np.float64), X.astype(np.float64))
    np.fill_diagonal(D, np.inf)
    D.sort(axis=1)
    return D[:, 0], D[:, 1]


def _razzhigaev_reference(X: np.ndarray, reduction_factor: int = 5) -> float:
    """The llm-microscope ``intrinsic_dimension`` steps in numpy (float64 brute force)."""
    eps = 1e-8
    E = X.astype(np.float64)
    E = E - E.mean(axis=0)
    E = E / np.linalg.norm(E, axis=1).mean()
    r1, r2 = _brute_two_nn(E)
    bad = r1 < eps
    r1, r2 = np.where(bad, eps, r1), np.where(bad, eps, r2)
    mu = np.where(bad, -1.0, r2 / r1)
    mu = np.sort(mu)
    useless = int((mu <= 1 + eps).sum())
    mu = mu[useless:]
    n = mu.shape[0]
    f_emp = np.arange(1 + useless, n + 1 + useless) / (n + useless)
    k = min(n // reduction_factor, n - 1)
    x, y = np.log(mu[:k]), -np.log(1 - f_emp[:k])
    return float((x * y).sum() / (x * x).sum())


# ------------------------------------------------------------------------ exact neighbours


@pytest.mark.parametrize(("n", "d", "block"), [(300, 20, 64), (257, 7, 2048), (50, 3, 7)])
def test_two_nearest_distances_equal_brute_force(n: int, d: int, block: int) -> None:
    X = np.random.default_rng(n).standard_normal((n, d)) * 3 + 10
    r1, r2 = two_nearest_distances(X, block_size=block)
    b1, b2 = _brute_two_nn(X)
    np.testing.assert_allclose(r1.numpy(), b1, rtol=1e-12)
    np.testing.assert_allclose(r2.numpy(), b2, rtol=1e-12)


def test_two_nearest_distances_keep_ties_of_a_lattice() -> None:
    # Integer grid: most points have r₁ = r₂ = 1 exactly (ties must survive as μ = 1).
    g = np.stack(np.meshgrid(np.arange(9), np.arange(9), np.arange(5)), -1).reshape(-1, 3)
    r1, r2 = two_nearest_distances(g.astype(np.float32))
    assert torch.equal(r1, torch.ones_like(r1))
    assert torch.equal(r2, torch.ones_like(r2))


def test_near_ties_below_float32_resolution_fall_back_to_float64(monkeypatch) -> None:
    # 300 points ~1e-6 apart on a short segment, plus 50 points spread over the unit cube: after
    # centring and scaling, the segment's squared distances (~1e-12) are far below float32
    # resolution (~1e-7), so those points must be redone in float64.
    calls: list[int] = []
    original = twonn_module._brute_force

    def counting(X: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
        calls.append(len(rows))
        return original(X, rows, k)

    monkeypatch.setattr(twonn_module, "_brute_force", counting)
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3e-4, 300)
    X = np.concatenate([np.stack([t, 2 * t, 0.5 + 0 * t], 1), rng.uniform(-1, 1, (50, 3))])
    r1, r2 = two_nearest_distances(X)
    b1, b2 = _brute_two_nn(X)
    assert sum(calls) >= 300
    np.testing.assert_allclose(r1.numpy(), b1, rtol=1e-9)
    np.testing.assert_allclose(r2.numpy(), b2, rtol=1e-9)


def test_remove_duplicate_rows_keeps_first_occurrences_in_order() -> None:
    X = torch.tensor([[1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [-0.0, 1.0], [3.0, 3.0]])
    assert remove_duplicate_rows(X).tolist() == [0, 1, 4]


# ------------------------------------------------------------------------ the two fits


@pytest.mark.parametrize(
    ("n", "d", "k", "dtype"),
    [
        (300, 40, 5, np.float64),
        (1000, 10, 3, np.float64),
        (2500, 60, 12, np.float64),
        (1200, 50, 8, np.float32),
    ],
)
def test_facco_equals_scikit_dimension(n: int, d: int, k: int, dtype: type) -> None:
    # d ≤ 25 goes through skdim's neighbour search, d > 25 through its distance matrix.
    rng = np.random.default_rng(n + k)
    X = (_embed(rng.standard_normal((n, k)), d, seed=k) + rng.uniform(-3, 3, d)).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = TwoNN().fit(X).dimension_
    assert twonn_dimension(X, "facco") == pytest.approx(ref, rel=1e-6)


def test_facco_fit_by_hand() -> None:
    # μ = e^1, e^2, e^3, e^4 (N = 4, discard 0.25 → keep 3): x = 1, 2, 3;
    # y = −log(1 − i/4) = log(4/3), log 2, log 4; slope = Σxy / Σx².
    mu = np.exp([4.0, 1.0, 3.0, 2.0])
    y = np.log([4 / 3, 2, 4])
    expected = (1 * y[0] + 2 * y[1] + 3 * y[2]) / (1 + 4 + 9)
    assert twonn_fit_facco(mu, discard_fraction=0.25) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize(("n", "k"), [(600, 4), (1001, 8), (1500, 20)])
def test_razzhigaev_equals_reference_steps(n: int, k: int) -> None:
    rng = np.random.default_rng(k)
    X = _embed(rng.standard_normal((n, k)), 64, seed=n, dtype=np.float64) + 3.0
    assert twonn_dimension(X, "razzhigaev") == pytest.approx(_razzhigaev_reference(X), rel=1e-10)


def test_razzhigaev_drops_ties_but_keeps_their_ranks() -> None:
    # On a lattice most μ are exactly 1: the reference drops them but counts them in F_emp.
    g = np.stack(np.meshgrid(np.arange(12), np.arange(12), np.arange(12)), -1).reshape(-1, 3)
    X = (
        g
        + np.random.default_rng(1).normal(0, 0.01, g.shape) * (np.arange(len(g)) % 3 == 0)[:, None]
    )
    assert twonn_dimension(X, "razzhigaev") == pytest.approx(_razzhigaev_reference(X), rel=1e-10)


# -------------------------------------------------------------------- planted manifolds
# Tolerances: over 12 seeds these configurations gave facco 5.07 ± 0.06 (linear) and
# 4.94 ± 0.05 (sphere), razzhigaev 5.07 ± 0.05 and 4.98 ± 0.05, all within ±3.3 % — so 5 % sits
# more than 3 standard deviations from the mean of every case.


@pytest.mark.parametrize("manifold", ["linear", "sphere"])
def test_facco_recovers_planted_5d_manifold_in_768d(manifold: str) -> None:
    n = 16000
    Z = np.random.default_rng(7).standard_normal((n, 5)) if manifold == "linear" else _sphere(n, 7)
    X = _embed(Z, 768, seed=3)
    est = twonn_estimate(X, "facco", batch_size=2000, seed=0)
    assert len(est.batch_dimensions) == 8
    assert abs(est.dimension - 5) / 5 < 0.05


@pytest.mark.parametrize("manifold", ["linear", "sphere"])
def test_razzhigaev_recovers_planted_5d_manifold(manifold: str) -> None:
    # The 20 % fit is noisier: more points, in a 48-d ambient space to keep the test fast.
    n = 48000
    Z = np.random.default_rng(8).standard_normal((n, 5)) if manifold == "linear" else _sphere(n, 8)
    X = _embed(Z, 48, seed=4)
    est = twonn_estimate(X, "razzhigaev", batch_size=4000, seed=0)
    assert abs(est.dimension - 5) / 5 < 0.05


# ----------------------------------------------------------------- batches and duplicates


def test_batches_are_seeded_shuffles_averaged() -> None:
    X = torch.from_numpy(_embed(np.random.default_rng(0).standard_normal((3100, 4)), 32, seed=1))
    est = twonn_estimate(X, "facco", batch_size=1000, seed=5)
    assert est.batch_sizes == (1034, 1033, 1033)
    assert est.dimension == pytest.approx(np.mean(est.batch_dimensions), rel=1e-15)
    # Rebuild the batches from the documented generator and estimate each directly.
    perm = torch.randperm(3100, generator=torch.Generator().manual_seed(5))
    direct = [twonn_dimension(X[idx]) for idx in torch.tensor_split(perm, 3)]
    np.testing.assert_allclose(est.batch_dimensions, direct, rtol=1e-12)
    assert twonn_estimate(X, "facco", batch_size=1000, seed=5) == est
    assert twonn_estimate(X, "facco", batch_size=1000, seed=6).dimension != est.dimension


def test_exact_duplicates_are_removed_first() -> None:
    base = np.random.default_rng(2).standard_normal((500, 6))
    X = np.concatenate([base, base[:100], base[:10]])
    with_dups = twonn_estimate(X, "facco")
    assert (with_dups.n_rows, with_dups.n_distinct) == (610, 500)
    assert with_dups.dimension == twonn_dimension(base, "facco")
    assert twonn_dimension(X, "razzhigaev") == twonn_dimension(base, "razzhigaev")
    batched = twonn_estimate(X, "facco", batch_size=250, seed=0)
    assert batched.n_distinct == 500 and sum(batched.batch_sizes) == 500


# -------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fit": "mle"}, "fit must be one of"),
        ({"discard_fraction": 0.0}, "discard_fraction"),
        ({"discard_fraction": 1.0}, "discard_fraction"),
        ({"fit": "razzhigaev", "fit_fraction": 0.0}, "fit_fraction"),
        ({"fit": "razzhigaev", "fit_fraction": 1.5}, "fit_fraction"),
        ({"batch_size": 2}, "batch_size"),
        ({"batch_size": 1000}, "needs at least 1000 distinct rows"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_options_raise(kwargs: dict, match: str) -> None:
    X = np.random.default_rng(0).standard_normal((200, 4))
    with pytest.raises(ValueError, match=match):
        twonn_dimension(X, **kwargs)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="2-D"):
        twonn_dimension(np.zeros(10))
    with pytest.raises(ValueError, match="NaN or inf"):
        twonn_dimension(np.array([[0.0, 1.0], [np.nan, 2.0], [3.0, 1.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="at least 3 rows"):
        twonn_dimension(np.eye(2))
    with pytest.raises(ValueError, match="at least 3 distinct rows"):
        twonn_dimension(np.array([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="fit needs ≥ 2"):
        twonn_dimension(np.random.default_rng(0).standard_normal((8, 3)), "razzhigaev")
    with pytest.raises(ValueError, match="fit needs ≥ 2"):
        twonn_dimension(np.random.default_rng(0).standard_normal((3, 3)), discard_fraction=0.5)


def test_all_ratios_tied_raise() -> None:
    # Evenly spaced points on a line: interior μ = 1 exactly; the Razzhigaev fit has nothing left.
    X = np.stack([np.arange(40.0), np.zeros(40)], axis=1)
    with pytest.raises(ValueError):
        twonn_dimension(X, "razzhigaev")


def test_duplicate_rows_are_found_alike_on_the_device_path() -> None:
    """The device path (a sorting torch.unique) keeps the first occurrences numpy's byte-wise
    unique keeps on the CPU, −0.0 and 0.0 counted as one value."""
    from tangentlens.testing import emulated_accelerator

    g = torch.Generator().manual_seed(3)
    X = torch.randint(0, 3, (200, 2), generator=g).float()
    X[5] = torch.tensor([-0.0, 1.0])
    X[9] = torch.tensor([0.0, 1.0])
    expected = remove_duplicate_rows(X)
    with emulated_accelerator() as accelerator:
        found = remove_duplicate_rows(X.to(accelerator.device))
        assert found.device == accelerator.device
        assert found.tolist() == expected.tolist()
    assert len(expected) == 9 and 9 not in expected.tolist()
