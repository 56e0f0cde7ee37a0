"""Tests that kill the mutants `make mutate` found surviving in metrics/geometry.py.

Each test names the behaviour it pins; the mutants it kills are the ones the existing tests let
through: error messages naming the wrong argument, the multi-chunk accumulation paths (the other
tests never exceed CHUNK_ROWS rows), the tensor form of ``sum_norms``, tolerance and clamp bounds,
and the pair sampler's uniformity.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tangentlens.metrics import geometry
from tangentlens.metrics.geometry import (
    centred_anisotropy,
    centred_anisotropy_from_moments,
    centred_scatter,
    centred_singular_anisotropy,
    correlations,
    cosine_anisotropy,
    cosine_anisotropy_from_sums,
    cosine_anisotropy_sampled,
    covariance,
    drift_norm,
    drift_norm_from_sums,
    relative_drift,
    relative_drift_from_sums,
    unit_row_sum,
)


def _cloud(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) + rng.standard_normal(d)


# ------------------------------------------------------------- messages name the argument


@pytest.mark.parametrize(
    "fn",
    [
        unit_row_sum,
        cosine_anisotropy,
        cosine_anisotropy_sampled,
        drift_norm,
        relative_drift,
        centred_scatter,
        covariance,
        centred_anisotropy,
        centred_singular_anisotropy,
    ],
)
def test_matrix_errors_name_the_argument_h(fn) -> None:
    args = (10, 0) if fn is cosine_anisotropy_sampled else ()
    with pytest.raises(ValueError, match=r"^H must be 2-D"):
        fn(np.ones(4), *args)


def test_vector_and_count_errors_name_their_argument() -> None:
    with pytest.raises(ValueError, match=r"^sum_unit must be 1-D"):
        cosine_anisotropy_from_sums(np.ones((2, 2)), 2)
    with pytest.raises(ValueError, match=r"^n_pairs must be"):
        cosine_anisotropy_sampled(np.eye(3), 0, 0)
    with pytest.raises(ValueError, match=r"^seed must be"):
        cosine_anisotropy_sampled(np.eye(3), 5, -1)
    for fn in (drift_norm_from_sums, relative_drift_from_sums):
        with pytest.raises(ValueError, match=r"^sum must be 1-D"):
            fn(np.ones((2, 2)), 1.0, 3)
    with pytest.raises(ValueError, match=r"^n must be an integer ≥ 1"):
        relative_drift_from_sums(np.ones(3), 1.0, 0)
    with pytest.raises(ValueError, match=r"^ddof must be"):
        covariance(np.eye(3), ddof=-1)
    with pytest.raises(ValueError, match=r"got 2$"):  # rows, not columns
        covariance(np.ones((2, 3)), ddof=2)
    with pytest.raises(ValueError, match=r"^n must be an integer ≥ 2"):
        centred_anisotropy_from_moments(1, np.ones(3), np.eye(3))
    with pytest.raises(ValueError, match=r"^sum must be 1-D"):
        centred_anisotropy_from_moments(4, np.ones((3, 1)), np.eye(3))
    with pytest.raises(ValueError, match=r"^second_moment must be 3 × 3"):
        centred_anisotropy_from_moments(4, np.ones(3), np.eye(4))


def test_zero_row_and_other_messages_are_exact() -> None:
    with pytest.raises(
        ValueError, match=r"^H has 1 zero rows; cosine similarity needs nonzero rows"
    ):
        unit_row_sum(np.array([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]]))
    with pytest.raises(ValueError, match=r"before the metric\)$"):
        unit_row_sum(np.array([[1.0, 2.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"^H has 1 zero rows; cosine needs"):
        cosine_anisotropy_sampled(np.array([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]]), 10, 0)
    with pytest.raises(ValueError, match=r"exceeds n² = 4:"):
        cosine_anisotropy_from_sums(np.array([3.0, 0.0]), 2)
    with pytest.raises(ValueError, match=r"^sum_norms must be a finite number ≥ 0, got 'a'"):
        relative_drift_from_sums(np.ones(3), "a", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^sum_norms is 0 \(all rows are zero\)"):
        relative_drift_from_sums(np.zeros(3), 0.0, 3)
    with pytest.raises(ValueError, match=r"^the centred data have zero variance"):
        centred_anisotropy(np.ones((4, 3)))


# ------------------------------------------------------------------ row-count validation


def test_row_and_count_minimums_are_exact() -> None:
    two = np.array([[1.0, 2.0, 0.5], [2.0, 1.0, -0.5]])
    assert centred_singular_anisotropy(two) == pytest.approx(1.0)  # 2 rows are enough…
    for fn in (centred_anisotropy, centred_singular_anisotropy, cosine_anisotropy):
        with pytest.raises(ValueError, match=r"^H needs at least 2 rows"):  # …1 is not
            fn(two[:1])
    with pytest.raises(ValueError, match=r"^H needs at least 2 rows"):
        cosine_anisotropy_sampled(two[:1], 10, 0)
    assert cosine_anisotropy_sampled(two, 1, 0) == pytest.approx(cosine_anisotropy(two))
    v = np.array([3.0, 4.0])
    assert drift_norm_from_sums(v, None, 1) == pytest.approx(5.0)  # n = 1 is allowed
    assert relative_drift_from_sums(v, 5.0, 1) == pytest.approx(1.0)


def test_correlations_length_checks_are_per_argument() -> None:
    pair = correlations(np.array([1.0, 2.0]), np.array([1.0, 3.0]))
    assert (pair.pearson, pair.spearman, pair.n) == pytest.approx((1.0, 1.0, 2))
    with pytest.raises(ValueError, match=r"^x needs at least 2 entries"):
        correlations(np.ones(1), np.arange(2.0))
    with pytest.raises(ValueError, match=r"^y needs at least 2 entries"):
        correlations(np.arange(2.0), np.ones(1))
    with pytest.raises(ValueError, match=r"^y must be 1-D"):
        correlations(np.arange(2.0), np.ones((2, 1)))
    with pytest.raises(ValueError, match=r"^Pearson correlation of a constant series"):
        correlations(np.arange(5.0), np.ones(5))  # y constant (x constant is tested elsewhere)


def test_correlations_are_clamped_to_unit_interval() -> None:
    # For this seed the unclamped dot products round to ±1.0000000000000002.
    x = np.random.default_rng(4).standard_normal(7)
    assert correlations(x, x).pearson == 1.0
    assert correlations(x, -x).pearson == -1.0


# -------------------------------------------------------------- sum_norms input handling


def test_sum_norms_accepts_a_one_element_tensor_and_rejects_bool() -> None:
    s = np.array([3.0, 4.0])
    assert relative_drift_from_sums(s, torch.tensor(10.0), 2) == pytest.approx(0.5)
    assert relative_drift_from_sums(s, torch.tensor([10.0]), 2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"^sum_norms must be"):
        relative_drift_from_sums(s, torch.tensor([5.0, 5.0]), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^sum_norms must be"):
        relative_drift_from_sums(s, True, 2)  # type: ignore[arg-type]


def test_from_sums_tolerance_is_tight() -> None:
    # ‖s‖² = 1.0005 n²: beyond the 1e-9 rounding allowance, so not a sum of n unit vectors.
    with pytest.raises(ValueError, match="exceeds n²"):
        cosine_anisotropy_from_sums(np.array([2.001, 0.0]), 2)


def test_small_but_nonzero_variance_is_not_zero_variance() -> None:
    H = _cloud(50, 4, seed=1) * 1e-3  # trace of the scatter ≈ 2e-4 < 1
    assert 0.25 <= centred_anisotropy(H) <= 1.0


# ------------------------------------------------------------------ multi-chunk reductions


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunk rows 3 at a time, so every reduction below runs over several chunks."""
    monkeypatch.setattr(geometry, "CHUNK_ROWS", 3)


def test_unit_row_sum_direct_and_over_chunks(small_chunks) -> None:
    H = _cloud(11, 5, seed=2)
    expected = (H / np.linalg.norm(H, axis=1, keepdims=True)).sum(axis=0)
    np.testing.assert_allclose(unit_row_sum(H).numpy(), expected, rtol=1e-12)
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    assert cosine_anisotropy(H) == pytest.approx(((U @ U.T).sum() - 11) / (11 * 10), abs=1e-13)


def test_zero_row_in_an_early_chunk_is_still_reported(small_chunks) -> None:
    H = _cloud(10, 4, seed=3)
    H[1] = 0.0
    with pytest.raises(ValueError, match=r"^H has 1 zero rows"):
        unit_row_sum(H)


def test_unit_norm_rows_are_not_mistaken_for_zero_rows(small_chunks) -> None:
    H = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [2.0, 1.0]])
    assert cosine_anisotropy(H) > 0
    assert cosine_anisotropy_sampled(H, 50, 0) > 0


def test_drift_and_scatter_over_chunks(small_chunks) -> None:
    H = _cloud(11, 4, seed=5)  # n ≠ d, so chunking by columns would drop rows
    mean = H.mean(axis=0)
    assert drift_norm(H) == pytest.approx(np.linalg.norm(mean), rel=1e-12)
    expected = np.linalg.norm(mean) / np.linalg.norm(H, axis=1).mean()
    assert relative_drift(H) == pytest.approx(expected, rel=1e-12)
    m, scatter = centred_scatter(H)
    np.testing.assert_allclose(m.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(scatter.numpy(), (H - mean).T @ (H - mean), rtol=1e-10)


# -------------------------------------------------------------------- pair sampler


def test_sampled_pairs_are_uniform_over_ordered_distinct_pairs() -> None:
    # Four rows with six distinct pair cosines; the estimate must match the exact mean within a
    # few standard errors, which a sampler that skips row 0 or hits the diagonal does not.
    H = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-1.0, -1.0, 0.2], [1.0, 3.0, -2.0]])
    U = H / np.linalg.norm(H, axis=1, keepdims=True)
    cos = (U @ U.T)[~np.eye(4, dtype=bool)]
    n_pairs = 200_000
    se = cos.std() / np.sqrt(n_pairs)
    assert abs(cosine_anisotropy_sampled(H, n_pairs, 0) - cos.mean()) < 5 * se
