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
