"""Centroid distances, curvature visibility and bootstrap intervals against brute force and
known answers."""

import math

import numpy as np
import pytest
import torch

from tangentlens.capture import TypeSums
from tangentlens.metrics import (
    bootstrap_ratio,
    centroid_distance_sums,
    centroids_from_sums,
    frequency_distance_correlation,
    group_sums,
    local_spectra,
    pooled_visibility,
    rms_centroid_distance_from_sums,
)

# ------------------------------------------------------------------ centroid distances


def _typed_cloud(seed=0, vocab=30, d=8):
    """Types with Zipf counts; rarer types are spread wider (planted negative correlation)."""
    rng = np.random.default_rng(seed)
    counts = np.maximum((400 / np.arange(1, vocab + 1)).astype(int), 2)
    centres = rng.normal(size=(vocab, d)) * 5
    tokens = np.repeat(np.arange(vocab), counts)
    spread = 0.2 + 0.1 * np.arange(vocab)  # rank r ↦ wider
    H = centres[tokens] + rng.normal(size=(tokens.size, d)) * spread[tokens, None]
    return torch.from_numpy(H), torch.from_numpy(tokens), counts


def test_centroid_distances_match_brute_force():
    H, tokens, counts = _typed_cloud()
    sums = TypeSums(30, 8)
    sums.update(tokens, H)
    centroids = centroids_from_sums(sums.count, sums.sum)
    dist_sum, n = centroid_distance_sums(H, tokens, centroids)
    rms = rms_centroid_distance_from_sums(sums.count, sums.sum, sums.sum_sq_norms)
    for t in (0, 7, 29):
        rows = H[tokens == t].numpy()
        c = rows.mean(axis=0)
        d = np.linalg.norm(rows - c, axis=1)
        assert float(dist_sum[t] / n[t]) == pytest.approx(d.mean(), rel=1e-12)
        assert float(rms[t]) == pytest.approx(np.sqrt((d**2).mean()), rel=1e-9)
    assert n.tolist() == counts.tolist()


def test_planted_frequency_geometry_correlation_is_negative():
    H, tokens, counts = _typed_cloud(1)
    sums = TypeSums(30, 8)
    sums.update(tokens, H)
    dist_sum, n = centroid_distance_sums(H, tokens, centroids_from_sums(sums.count, sums.sum))
    corr = frequency_distance_correlation(np.log(counts / counts.sum()), dist_sum / n, n)
    assert corr.spearman < -0.9 and corr.pearson < -0.8 and corr.n == 30
    with pytest.raises(ValueError, match="at least 3"):
        frequency_distance_correlation(np.log(counts), dist_sum / n, n, min_count=10_000)
    with pytest.raises(ValueError, match="without a centroid"):
        centroid_distance_sums(H, tokens, torch.full((30, 8), float("nan")))


# ------------------------------------------------------------------ curvature visibility


def _brute_force_spectra(X, anchor, k, m):
    d = np.linalg.norm(X - X[anchor], axis=1)
    patch = X[np.argsort(d, kind="stable")[:k]]
    values = np.linalg.svd(patch - patch.mean(axis=0), compute_uv=False) ** 2 / k
    return values[:m].sum(), values[m:].sum()


def test_flat_patch_has_zero_visibility_and_circle_matches_closed_form():
    rng = np.random.default_rng(2)
    plane = rng.normal(size=(2000, 2)) @ rng.normal(size=(2, 12)) + 3.0
    flat = local_spectra(plane, k=24, tangent_dim=2, n_anchors=200)
    assert float(flat.visibility.max()) < 1e-6
    # a circle of radius R, equally spaced: each patch is an arc of half-length t = π R k / n
    n, k, R = 4000, 41, 3.0
    phi = 2 * np.pi * np.arange(n) / n
    basis = np.linalg.qr(rng.normal(size=(6, 2)))[0]
    circle = np.stack([R * np.cos(phi), R * np.sin(phi)], axis=1) @ basis.T  # isometric in 6-d
    spectra = local_spectra(circle, k=k, tangent_dim=1, n_anchors=50, seed=3)
    # exact for the discrete arc j·α, j = −20..20: tangent and normal coordinates are uncorrelated
    j = np.arange(-(k // 2), k // 2 + 1) * 2 * np.pi / n
    exact = np.var(np.cos(j)) / np.var(np.sin(j))
    np.testing.assert_allclose(spectra.visibility.numpy(), exact, rtol=1e-7)
    t = np.pi * R * (k - 1) / n  # the continuum formula, up to the discretisation of the arc
    assert exact == pytest.approx(t**2 / (15 * R**2), rel=0.1)
    pairs = zip(spectra.anchors[:5], spectra.inside, spectra.outside, strict=False)
    for a, inside, outside in pairs:
        ref_in, ref_out = _brute_force_spectra(circle, int(a), k, 1)
        assert float(inside) == pytest.approx(ref_in, rel=1e-9)
        assert float(outside) == pytest.approx(ref_out, rel=1e-7)


def test_pooled_visibility_is_a_ratio_of_sums():
    rng = np.random.default_rng(4)
    spectra = local_spectra(rng.normal(size=(500, 5)), k=10, tangent_dim=2, n_anchors=40)
    groups = torch.arange(40) % 3
    pooled = pooled_visibility(spectra, groups, 4)
    for g in range(3):
        rows = groups == g
        expected = spectra.outside[rows].sum() / spectra.inside[rows].sum()
        assert float(pooled[g]) == pytest.approx(float(expected), rel=1e-12)
    assert math.isnan(float(pooled[3]))
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        pooled_visibility(spectra, groups, 2)
    with pytest.raises(ValueError, match="tangent_dim must be < d"):
        local_spectra(rng.normal(size=(50, 3)), tangent_dim=3)
    with pytest.raises(ValueError, match="need at least 32 points"):
        local_spectra(rng.normal(size=(20, 5)))


# ------------------------------------------------------------------ bootstrap


def test_group_sums_and_bootstrap_interval():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sums, ids = group_sums(values, torch.tensor([5, 2, 5, 2]))
    assert ids.tolist() == [2, 5] and sums.tolist() == [6.0, 4.0]
    rng = np.random.default_rng(5)
    den = rng.uniform(1, 2, size=400)
    num = 0.3 * den + rng.normal(scale=0.05, size=400)
    result = bootstrap_ratio(num, den, replicates=2000, seed=1)
    assert result.value == pytest.approx(num.sum() / den.sum())
    assert result.ci_low < result.value < result.ci_high
    # the delta-method standard error of a ratio estimator as an independent reference
    r = result.value
    se = np.sqrt(((num - r * den) ** 2).sum()) / den.sum()
    assert (result.ci_high - result.ci_low) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.1)
    again = bootstrap_ratio(num, den, replicates=2000, seed=1)
    assert (again.ci_low, again.ci_high) == (result.ci_low, result.ci_high)
    with pytest.raises(ValueError, match="g ≥ 2"):
        bootstrap_ratio([1.0], [1.0])
    with pytest.raises(ValueError, match="sum to zero"):
        bootstrap_ratio([1.0, 1.0], [0.0, 0.0])
