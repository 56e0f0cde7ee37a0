"""Tests written against surviving mutants of ``metrics.attribution``, ``metrics.bootstrap`` and
``metrics.frequency`` (``make mutate``): chunked accumulation, degenerate control sets, exact
boundaries of the validation, and the arguments named in error messages."""

import math

import numpy as np
import pytest
import torch

import tangentlens.metrics.attribution as attribution
from tangentlens.metrics import (
    anisotropy_share_spectral,
    bootstrap_ratio,
    compare_energy,
    control_frames,
    energy_fraction,
    frequency_distance_correlation,
    null_energy_mean,
)


def _basis(d: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]


def test_energy_fraction_accumulates_over_row_chunks(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    G = torch.randn(10, 6, generator=gen, dtype=torch.float64)
    Q = _basis(6, 2)
    expected = float((G @ Q).pow(2).sum() / G.pow(2).sum())
    monkeypatch.setattr(attribution, "CHUNK_ROWS", 3)  # four chunks, the last one short
    assert energy_fraction(G, Q) == pytest.approx(expected, rel=1e-12)
    # a gradient of tiny norm is still a gradient
    assert energy_fraction(1e-3 * G, Q) == pytest.approx(expected, rel=1e-12)


def test_energy_fraction_messages_name_the_argument():
    Q = _basis(4, 2)
    with pytest.raises(ValueError, match=r"^G is all zeros: the energy fraction is undefined$"):
        energy_fraction(torch.zeros(3, 4), Q)
    with pytest.raises(ValueError, match=r"^G "):
        energy_fraction(torch.zeros(3), Q)
    with pytest.raises(ValueError, match=r"^Q "):
        energy_fraction(torch.ones(3, 4), torch.ones(4, 2))


def test_null_energy_mean_bounds():
    assert null_energy_mean(4, 10, 6, 0.5) == pytest.approx(4 / 4 * 0.5)  # k = d − r allowed
    assert null_energy_mean(3, 10, 0, 0.0) == pytest.approx(3 / 10)  # nothing excluded
    message = r"need 0 ≤ excluded rank r < d = 10 and k in \[1, d − r\], got r = {}, k = {}"
    with pytest.raises(ValueError, match=message.format(6, 0)):
        null_energy_mean(0, 10, 6, 0.5)
    with pytest.raises(ValueError, match=message.format(6, 5)):
        null_energy_mean(5, 10, 6, 0.5)
    with pytest.raises(ValueError, match=message.format(10, 1)):
        null_energy_mean(1, 10, 10, 0.5)
    with pytest.raises(ValueError, match=message.format(-1, 1)):
        null_energy_mean(1, 10, -1, 0.5)


def test_compare_energy_degenerate_controls():
    d, k = 6, 2
    proxy = torch.eye(d, dtype=torch.float64)[:, :k]
    # all the energy in the proxy: every control holds none, the ratio is infinite
    M = torch.zeros(d, d, dtype=torch.float64)
    M[0, 0] = M[1, 1] = 1.0
    eye = torch.eye(d, dtype=torch.float64)
    frames = torch.stack([eye[:, [2, 3]], eye[:, [4, 5]], eye[:, [3, 5]], eye[:, [2, 4]]])
    frames = torch.cat([frames, control_frames(d, k, 1, (0,), excluded=proxy)])
    frames[-1] = eye[:, [5, 2]]  # coordinate frames: no control holds any energy, exactly
    result = compare_energy(M, proxy, frames, proxy)
    assert result.energy_ratio == math.inf and result.energy_z == math.inf
    assert result.energy_p_value == pytest.approx(1 / 6)
    # one control: no spread, z is ±inf by the sign of the difference, p counts that control
    one = compare_energy(torch.eye(d, dtype=torch.float64), proxy, frames[:1], proxy)
    assert one.control_std == 0.0 and one.energy_z == 0.0  # isotropic: proxy = control
    below = torch.diag(torch.tensor([0.1, 0.1, 1, 1, 1, 1], dtype=torch.float64))
    low = compare_energy(below, proxy, frames[:1], proxy)
    assert low.control_std == 0.0 and low.energy_z == -math.inf and low.energy_p_value == 1.0
    with pytest.raises(ValueError, match=r"^proxy "):
        compare_energy(torch.eye(d), torch.ones(d, k), frames, proxy)
    with pytest.raises(ValueError, match=r"controls must be \(draws, 6, 2\)"):
        compare_energy(torch.eye(d), proxy, frames[:, :, :1], proxy)


def test_spectral_share_of_an_exactly_isotropic_moment_is_undefined():
    with pytest.raises(ValueError, match=r"^M is isotropic"):
        anisotropy_share_spectral(torch.eye(5, dtype=torch.float64), _basis(5, 2))


def test_bootstrap_ratio_validation_and_defaults():
    num = np.array([1.0, 2.0, 3.0, 4.0])
    den = np.array([0.1, 0.1, 0.1, 0.1])  # Σ den = 0.4 < 1 is a valid denominator
    default = bootstrap_ratio(num, den)
    explicit = bootstrap_ratio(num, den, replicates=1000, seed=0, level=0.95)
    assert (default.ci_low, default.ci_high) == (explicit.ci_low, explicit.ci_high)
    assert default.value == pytest.approx(25.0)
    assert bootstrap_ratio(num, den, replicates=10).replicates == 10
    with pytest.raises(ValueError, match=r"^numerators and denominators must be \(g,\)"):
        bootstrap_ratio(num, np.ones(3))
    with pytest.raises(ValueError, match="NaN or inf"):
        bootstrap_ratio(num, np.array([1.0, np.nan, 1.0, 1.0]))
    for level in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"^level "):
            bootstrap_ratio(num, den, level=level)
    with pytest.raises(ValueError, match=r"^replicates "):
        bootstrap_ratio(num, den, replicates=9)
    with pytest.raises(ValueError, match=r"^seed "):
        bootstrap_ratio(num, den, seed=-1)


def test_frequency_correlation_takes_types_seen_twice_by_default():
    count = torch.tensor([2.0, 2.0, 2.0, 5.0, 9.0])
    log_f = torch.log(count / count.sum())
    spread = torch.tensor([1.0, 1.5, 0.5, 2.0, 3.0])
    assert frequency_distance_correlation(log_f, spread, count).n == 5


def test_delta_isoscore_star_default_shrinkage_is_rudman_eickhoffs():
    from tangentlens.metrics import delta_isoscore_star

    gen = torch.Generator().manual_seed(2)
    X = torch.randn(200, 6, generator=gen, dtype=torch.float64) * torch.arange(1.0, 7.0)
    C, C0 = torch.cov(X.T), torch.eye(6, dtype=torch.float64)
    Q = _basis(6, 2, seed=3)
    assert delta_isoscore_star(C, Q, C0) == delta_isoscore_star(C, Q, C0, zeta=0.2)
    assert delta_isoscore_star(C, Q, C0) != delta_isoscore_star(C, Q, C0, zeta=0.5)
