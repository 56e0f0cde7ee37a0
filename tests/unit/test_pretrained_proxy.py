"""A proxy fixed beforehand (a published SAE's) joins the fitted ones like them: the mean
direction projected out, its overlap reported."""

import pytest
import torch

from tangentlens.proxies import MEAN_DIRECTION, FittedProxies, add_fixed_proxy


def _orthonormal(d: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    return q


def test_the_mean_direction_is_projected_out_and_its_overlap_reported():
    d = 12
    m = _orthonormal(d, 1, 0)
    fitted = FittedProxies({"pca": _orthonormal(d, 3, 1), MEAN_DIRECTION: m}, {"pca": {}})
    fixed = _orthonormal(d, 3, 2)
    fixed = torch.linalg.qr(torch.cat([m, fixed[:, :2]], dim=1))[0]  # m̂ inside its span
    out = add_fixed_proxy(fitted, "pretrained_sae", fixed)
    basis = out.bases["pretrained_sae"]
    assert basis.dtype == torch.float64 and basis.shape == (d, 2)  # m̂ removed: one rank less
    torch.testing.assert_close(basis.T @ basis, torch.eye(2, dtype=torch.float64))
    assert float((basis.T @ m).abs().max()) < 1e-12
    inside = fixed @ fixed.T - m @ m.T  # span(fixed) minus m̂
    torch.testing.assert_close(basis @ basis.T, inside, atol=1e-12, rtol=0)
    overlap = out.diagnostics["pretrained_sae"]["mean_direction_overlap"]
    assert overlap == pytest.approx(1.0, abs=1e-12)
    assert set(fitted.bases) == {"pca", MEAN_DIRECTION}  # the input is left as it was


def test_without_a_mean_direction_the_basis_is_kept_and_names_stay_distinct():
    fixed = _orthonormal(8, 2, 3)
    out = add_fixed_proxy(FittedProxies({"pca": _orthonormal(8, 2, 4)}), "pretrained_sae", fixed)
    assert torch.equal(out.bases["pretrained_sae"], fixed)
    assert out.diagnostics["pretrained_sae"] == {}
    with pytest.raises(ValueError, match="already hold a method named 'pca'"):
        add_fixed_proxy(out, "pca", fixed)
