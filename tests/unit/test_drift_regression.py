"""The gradients beyond the drift (issue 42, item 1; METHODS.md §1.3, m̂'s own estimation error):
``drift_regression`` against a row-by-row least-squares regression (reference), a proxy holding
part of the true drift because m̂ errs — credited by the orthogonal estimator, not by the
regressed one — in exact population moments (planted null), and energy genuinely in the proxy
read as before (planted signal). The Monte-Carlo null over ρ is tests/slow/test_drift_null.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tangentlens.metrics import compare_energy, control_frames, drift_regression

D, K = 16, 3


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def test_the_regression_is_the_row_by_row_least_squares_one():
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(500, D, generator=gen, dtype=torch.float64) * torch.linspace(0.5, 2, D)
    m = _unit(torch.randn(D, generator=gen, dtype=torch.float64))
    g = g + 3 * torch.randn(500, 1, generator=gen, dtype=torch.float64) * _unit(m + 0.3)
    drift = (g @ m).numpy()[:, None]
    b = np.linalg.lstsq(drift, g.numpy(), rcond=None)[0][0]  # each column on the drift coordinate
    r = g.numpy() - drift @ b[None]
    got = drift_regression(g.T @ g, m)
    np.testing.assert_allclose(got.coefficient.numpy(), b, rtol=1e-10)
    np.testing.assert_allclose(got.moment.numpy(), r.T @ r, rtol=1e-9, atol=1e-9)
    assert float(m @ got.coefficient) == pytest.approx(1.0, abs=1e-12)  # r ⊥ m̂
    assert float((got.moment @ m).abs().max()) < 1e-9
    total = float((g**2).sum())
    assert got.total == pytest.approx(total, rel=1e-12)
    assert got.removed == pytest.approx(1 - float((r**2).sum()) / total, rel=1e-10)
    assert got.removed >= float(((g @ m) ** 2).sum()) / total  # D ≥ E(m̂)


def test_bad_inputs_are_refused_and_no_drift_energy_leaves_the_moment():
    M = torch.eye(D, dtype=torch.float64)
    with pytest.raises(ValueError, match="m must be a unit vector of length 16"):
        drift_regression(M, torch.ones(D))
    with pytest.raises(ValueError, match="zero trace"):
        drift_regression(torch.zeros(D, D), torch.eye(D)[0])
    M[0, 0] = 0.0
    got = drift_regression(M, torch.eye(D, dtype=torch.float64)[0])
    assert torch.equal(got.moment, M) and got.removed == 0.0


def _population(a2: float, s2: float, m: torch.Tensor) -> torch.Tensor:
    """The exact gradient second moment: ``a2`` along the unit m, ``s2`` per direction in m⊥."""
    return a2 * torch.outer(m, m) + s2 * (torch.eye(D, dtype=torch.float64) - torch.outer(m, m))


def test_a_proxy_holding_part_of_the_true_drift_is_not_credited_with_its_energy():
    """m̂ errs by an angle ε = 0.1 into the proxy's span (as m̂'s error does: along the
    high-variance directions); m̂ is projected out of the proxy, which keeps part of the true
    m. With energy a² = 15 along m and σ² = 1 per other direction (half of it along m), the
    orthogonal estimator reads 1.037 against an exact null of 1; the regressed one keeps about
    σ²/a² = 1/15 of that excess (the drift plane's leftover), here 1.0025 (exact moments:
    nothing sampled)."""
    gen = torch.Generator().manual_seed(2)
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    m, u = basis[:, 0], basis[:, 1]
    eps = 0.1
    m_hat = _unit(math.cos(eps) * m + math.sin(eps) * u)
    proxy = basis[:, 1 : 1 + K]
    proxy = torch.linalg.qr(proxy - torch.outer(m_hat, m_hat @ proxy))[0]  # m̂ projected out
    M = _population(15.0, 1.0, m)
    frames = control_frames(D, K, 200, (0,), excluded=m_hat[:, None])
    orthogonal = compare_energy(M, proxy, frames, m_hat[:, None])
    assert float((proxy.T @ m).pow(2).sum()) > 0.005  # the proxy holds part of the true drift
    assert orthogonal.energy_ratio == pytest.approx(1.0369, abs=1e-4)  # credited with it
    drift = drift_regression(M, m_hat)
    regressed = compare_energy(drift.moment, proxy, frames, m_hat[:, None], total=drift.total)
    assert regressed.energy_ratio == pytest.approx(1.0025, abs=1e-4)
    excess = orthogonal.energy_ratio - 1
    assert 0.5 / 15 < (regressed.energy_ratio - 1) / excess < 1.25 / 15
    # m̂ exact: the regression is the orthogonal estimator
    exact = drift_regression(M, m)
    proxy_exact = torch.linalg.qr(basis[:, 1 : 1 + K])[0]
    frames_exact = control_frames(D, K, 200, (0,), excluded=m[:, None])
    a = compare_energy(M, proxy_exact, frames_exact, m[:, None])
    b = compare_energy(exact.moment, proxy_exact, frames_exact, m[:, None], total=exact.total)
    assert b.energy_ratio == pytest.approx(a.energy_ratio, rel=1e-12) == pytest.approx(1.0)
    assert b.energy_fraction == pytest.approx(a.energy_fraction, rel=1e-12)


def test_energy_genuinely_in_the_proxy_reads_as_before():
    """Energy 5 per direction in the proxy's span (uncorrelated with the drift coordinate) and
    a² = 15 along m̂ exactly: both estimators read the same enrichment, 5 / mean."""
    gen = torch.Generator().manual_seed(3)
    basis = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    m, proxy = basis[:, 0], basis[:, 1 : 1 + K]
    M = _population(15.0, 1.0, m) + 4.0 * proxy @ proxy.T
    frames = control_frames(D, K, 100, (0,), excluded=m[:, None])
    drift = drift_regression(M, m)
    got = compare_energy(drift.moment, proxy, frames, m[:, None], total=drift.total)
    outside = (D - 1) + 4.0 * K  # the energy in m⊥
    assert got.energy_ratio == pytest.approx(5.0 * K / (K / (D - 1) * outside), rel=1e-12)
    assert got.energy_p_value == pytest.approx(1 / 101)
    assert got.energy_fraction == pytest.approx(5.0 * K / float(torch.trace(M)), rel=1e-12)
