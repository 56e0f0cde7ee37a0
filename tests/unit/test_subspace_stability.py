"""Subspace-stability rows on bases with known principal angles."""

import math

import pytest
import torch

from tangentlens.probes import subspace_stability
from tangentlens.results import StepLabel


def _rotated(theta: float) -> torch.Tensor:
    """Span of e0 and (cos θ e1 + sin θ e2) in 4-d."""
    e = torch.eye(4, dtype=torch.float64)
    return torch.stack([e[0], math.cos(theta) * e[1] + math.sin(theta) * e[2]], dim=1)


def test_angles_between_methods_steps_and_seeds():
    data = StepLabel("s", 10, 0, layers={"site": 2})
    q = _rotated(0.0)
    proxies = {"site": {"pca": q, "seminmf": _rotated(math.radians(30))}}
    previous = {"site": {"pca": _rotated(math.radians(10)), "seminmf": _rotated(math.radians(30))}}
    reseeded = {"site": {"seminmf": {0: q, 1: _rotated(math.radians(45))}}}
    config = subspace_stability.SubspaceStabilityConfig(seeds=2)
    rows = subspace_stability.rows(data, proxies, reseeded, config)
    rows += subspace_stability.transition_rows(data, proxies, previous)
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert got[("pca~seminmf", "principal_angle_max")] == pytest.approx(30)
    assert got[("pca~seminmf", "principal_angle_mean")] == pytest.approx(15)
    assert got[("pca@prev", "principal_angle_max")] == pytest.approx(10)
    assert got[("seminmf@prev", "principal_angle_max")] == pytest.approx(0, abs=1e-6)
    assert got[("seminmf~seed1", "principal_angle_max")] == pytest.approx(45)
    assert all(r["layer"] == 2 for r in rows)
    with pytest.raises(ValueError, match="seeds"):
        subspace_stability.SubspaceStabilityConfig(seeds=0)


def test_frozen_early_compares_each_refit_with_the_frozen_proxy():
    data = StepLabel("s", 10, 0, layers={"site": 2})
    frozen = {"site": {"pca": _rotated(0.0)}}
    refit = {"site": {"pca": _rotated(math.radians(20))}}
    config = subspace_stability.SubspaceStabilityConfig()
    rows = subspace_stability.rows(data, refit, {}, config, frozen=frozen)
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert got[("pca@frozen", "principal_angle_max")] == pytest.approx(20)
    assert got[("pca@frozen", "principal_angle_mean")] == pytest.approx(10)
    assert subspace_stability.rows(data, refit, {}, config) == []  # no frozen, no @frozen


def test_every_angle_has_its_random_subspace_baseline_beside_it():
    """issue 33, item 5: an angle between proxies is read against two random subspaces of the
    same ranks in ℝ^d, which are already far apart, not against 90°."""
    from tangentlens.metrics import random_principal_angles

    data = StepLabel("s", 10, 0, layers={"site": 2})
    proxies = {"site": {"pca": _rotated(0.0), "seminmf": _rotated(math.radians(30))}}
    rows = subspace_stability.rows(data, proxies, {}, subspace_stability.SubspaceStabilityConfig())
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    mean, largest = random_principal_angles(4, 2, 2)
    assert got[("pca~seminmf", "principal_angle_mean_random")] == mean
    assert got[("pca~seminmf", "principal_angle_max_random")] == largest
    assert [r["metric"] for r in rows] == [
        "principal_angle_mean",
        "principal_angle_mean_random",
        "principal_angle_max",
        "principal_angle_max_random",
    ]


def test_the_random_baseline_against_scipy_and_closed_forms():
    """Reference: the same seeded draws through scipy's ``subspace_angles``. Closed forms: two
    random lines in the plane meet at a uniform angle (mean 45°); in ℝ³ ``|cos θ|`` is uniform
    (mean arccos = 1 rad = 57.30°). Null: an independent random pair reads near the baseline;
    planted: subspaces 10° apart read far below it."""
    from scipy.linalg import subspace_angles

    from tangentlens.metrics import principal_angles, random_principal_angles
    from tangentlens.seeding import seeded_generator

    generator = seeded_generator(0, 32, 8, 3)  # (seed, d, larger rank, smaller rank)
    a = torch.linalg.qr(torch.randn(50, 32, 8, generator=generator, dtype=torch.float64))[0]
    b = torch.linalg.qr(torch.randn(50, 32, 3, generator=generator, dtype=torch.float64))[0]
    degrees = [
        subspace_angles(x.numpy(), y.numpy()) * 180 / math.pi for x, y in zip(a, b, strict=True)
    ]
    mean, largest = random_principal_angles(32, 8, 3, pairs=50)
    assert mean == pytest.approx(sum(x.mean() for x in degrees) / 50, rel=1e-10)
    assert largest == pytest.approx(sum(x.max() for x in degrees) / 50, rel=1e-10)
    assert random_principal_angles(32, 3, 8, pairs=50) == (mean, largest)  # order-free
    assert random_principal_angles(2, 1, 1, pairs=20_000)[0] == pytest.approx(45.0, abs=0.5)
    assert random_principal_angles(3, 1, 1, pairs=20_000)[0] == pytest.approx(57.30, abs=0.5)
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.linalg.qr(torch.randn(64, 16, generator=gen, dtype=torch.float64))[0]
            for _ in range(2))  # fmt: skip
    baseline = random_principal_angles(64, 16, 16)[0]
    assert float(principal_angles(x, y).mean()) * 180 / math.pi == pytest.approx(baseline, abs=3)
    planted = float(principal_angles(_rotated(0.0), _rotated(math.radians(10))).mean())
    assert planted * 180 / math.pi == pytest.approx(5.0)  # far below the baseline of 2 in ℝ⁴
    assert random_principal_angles(4, 2, 2)[0] > 35
    with pytest.raises(ValueError, match="subspace dimensions must be ≤ d = 4"):
        random_principal_angles(4, 5, 1)
