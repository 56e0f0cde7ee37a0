"""What ``curvature_visibility`` can and cannot show (issue 33, item 5; METHODS.md §1.6), on
planted point clouds with closed forms (k-nearest-neighbour patches of a uniform 2-D density ρ
are discs of radius r, ``r² = k / (π ρ)``, whose in-plane variance is ``r²/2``):

* null (density alone): one flat plane in ℝ¹² with isotropic noise σ, sampled densely in one
  region and sparsely in another, reads ``(d − 2) σ² / (r²/2 + 2σ²)`` — 0.12 where dense and
  0.0003 where sparse, a 400-fold difference with no curvature anywhere;
* planted (curvature at matched density): a cylinder of radius R against a plane, same density,
  no noise: the cylinder reads ``r² / (32 R²)`` (the normal coordinate ``u²/2R`` of a disc
  patch has variance ``r⁴ / (64 R²)``), the plane 0.

So it separates curved from flat only at matched density and noise: frequency bins (frequent
tokens sit in denser regions) differ in density by construction and cannot be compared by it
alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tangentlens.metrics import local_spectra, pooled_visibility
from tangentlens.metrics.curvature import LocalSpectra

D, K, N = 12, 32, 2000


def _disc(rng: np.random.Generator, radius: float) -> np.ndarray:
    r = radius * np.sqrt(rng.uniform(size=N))
    t = rng.uniform(0, 2 * np.pi, N)
    return np.stack([r * np.cos(t), r * np.sin(t)], axis=1)


def _pooled(points: np.ndarray, inner: np.ndarray, groups: np.ndarray) -> torch.Tensor:
    """Pooled visibility per group over the anchors away from the cloud's rim."""
    spectra = local_spectra(points, k=K, tangent_dim=2, n_anchors=None)
    keep = torch.from_numpy(inner)
    kept = LocalSpectra(spectra.anchors[keep], spectra.inside[keep], spectra.outside[keep])
    return pooled_visibility(kept, torch.from_numpy(groups[inner]), int(groups.max()) + 1)


def _patch_r2(radius: float) -> float:
    """Squared radius of a K-neighbour patch in a uniform disc of N points."""
    return K / (np.pi * N / (np.pi * radius**2))


def test_on_one_flat_manifold_it_reads_the_sampling_density():
    rng = np.random.default_rng(0)
    sigma = 0.01
    basis = np.linalg.qr(rng.normal(size=(D, 2)))[0]
    dense, sparse = _disc(rng, 1.0), _disc(rng, 20.0) + np.array([100.0, 0.0])
    points = np.concatenate([dense, sparse]) @ basis.T + sigma * rng.normal(size=(2 * N, D))
    inner = np.concatenate(
        [np.linalg.norm(dense, axis=1) < 0.7, np.linalg.norm(sparse - [100.0, 0.0], axis=1) < 14]
    )
    groups = np.repeat([0, 1], N)
    visibility = _pooled(points, inner, groups)
    for region, radius in enumerate((1.0, 20.0)):
        flat = (D - 2) * sigma**2 / (_patch_r2(radius) / 2 + 2 * sigma**2)
        assert float(visibility[region]) == pytest.approx(flat, rel=0.1)
    assert float(visibility[0] / visibility[1]) > 300  # no curvature anywhere


def test_at_matched_density_it_separates_a_curved_patch_from_a_flat_one():
    rng = np.random.default_rng(1)
    radius = 3.0
    uv = _disc(rng, 1.0)
    cylinder = np.stack(
        [radius * np.sin(uv[:, 0] / radius), radius * (1 - np.cos(uv[:, 0] / radius)), uv[:, 1]],
        axis=1,
    )
    plane = np.stack([uv[:, 0], np.zeros(N), uv[:, 1]], axis=1)
    inner = np.linalg.norm(uv, axis=1) < 0.7
    groups = np.zeros(N, dtype=np.int64)
    curved = float(_pooled(cylinder, inner, groups)[0])
    assert curved == pytest.approx(_patch_r2(1.0) / (32 * radius**2), rel=0.1)
    assert float(_pooled(plane, inner, groups)[0]) < 1e-12
