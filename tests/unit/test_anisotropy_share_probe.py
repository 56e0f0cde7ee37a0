"""The anisotropy-share probe on planted gradient moments with known answers (METHODS.md §1.4)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture.accumulators import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.metrics import anisotropy_shares_spectral, control_frames
from tangentlens.probes import anisotropy_share
from tangentlens.probes.tangent_energy import seed_key

D, K, N = 32, 4, 3000
SITE = "blocks.2.hook_resid_post"
LAYER, STEP = 2, 640


def _basis(d: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]


def _exact_noise(n: int, seed: int) -> torch.Tensor:
    """Rows with mean exactly 0 and ``XᵀX / n = I`` exactly (orthonormal design)."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(n, D, generator=gen, dtype=torch.float64)
    return math.sqrt(n) * torch.linalg.qr(A - A.mean(dim=0))[0]


def _isoscore(eigenvalues: list[float]) -> float:
    """IsoScore of a covariance spectrum, written out from Rudman et al. 2022 (METHODS.md)."""
    lam = torch.tensor(eigenvalues, dtype=torch.float64)
    d = lam.numel()
    lam_hat = math.sqrt(d) * lam / torch.linalg.vector_norm(lam)
    defect = float(torch.linalg.vector_norm(lam_hat - 1)) / math.sqrt(2 * (d - math.sqrt(d)))
    return ((d - defect**2 * (d - math.sqrt(d))) ** 2 - d) / (d * (d - 1))


def _step(bins: list[torch.Tensor]) -> Capture:
    """A step whose only site has gradient moments of the given bins (and of their union)."""
    overall, per_bin = MomentAccumulator(D), []
    for rows in bins:
        overall.update(rows)
        acc = MomentAccumulator(D)
        acc.update(rows)
        per_bin.append(acc)
    site = SimpleNamespace(g=overall, g_bins=per_bin)
    return Capture("planted", STEP, 0, SimpleNamespace(sites={SITE: site}), {SITE: LAYER}, 8)


def _table(rows: list[dict]) -> dict[tuple[str, str, str], float]:
    return {(r["method"], r["freq_bin"], r["metric"]): r["value"] for r in rows}


T = _basis(D, K, 1)  # the proxy
T1, T2 = T[:, 0], T[:, 1]
#: The proxies stage's control frames: draws per measurement and their seed.
CONTROLS = {"draws": 99, "seed": 3}
CONFIG = anisotropy_share.AnisotropyShareConfig(isoscore_draws=19, zeta=0.0)


def _planted_bins() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    # bin 0: isotropic noise plus a large mean gradient along a direction of the proxy
    mean_in_proxy = torch.randn(N, D, generator=gen, dtype=torch.float64) + 4.0 * T1
    # bin 1: zero mean, variance 9 along a proxy direction and 1 in every other direction
    stretched = _exact_noise(N, 3)
    stretched = stretched + 2.0 * (stretched @ T2)[:, None] * T2
    return [mean_in_proxy, stretched]


def test_planted_anisotropy_in_the_proxy_is_captured_with_the_smallest_p_value():
    """The proxies hold m̂ (⟂ T, as after projection): the headline controls are Haar k-frames in
    m̂⊥ — exchangeable with a random proxy, so they may overlap T — drawn with the energy's seeds.
    """
    m_hat = control_frames(D, 1, 1, (8,), excluded=T)[0]
    proxies = {SITE: {"pca": T, "mean_direction": m_hat}}
    rows = anisotropy_share.rows(_step(_planted_bins()), proxies, CONFIG, **CONTROLS)
    assert {r["method"] for r in rows} == {"pca", "mean_direction"}
    got = _table(rows)
    frames = {
        b: control_frames(
            D, K, CONTROLS["draws"], seed_key(CONTROLS["seed"], STEP, LAYER, b), excluded=m_hat
        )
        for b in (0, 1)
    }
    # bin 0: the uncentred second moment is ≈ I + 16 t₁t₁ᵀ: its excess lies in the proxy. (The
    # covariance, ≈ I, has no excess there: the centred share read ≈ 0.1, the noise's share.)
    assert got[("pca", "0", "anisotropy_share_spectral")] == pytest.approx(1.0, abs=2e-3)
    held = (frames[0].transpose(1, 2) @ T1).pow(2).sum(dim=1)  # ‖Nⱼᵀt₁‖²: each control's share
    assert got[("pca", "0", "anisotropy_share_spectral_control_mean")] == pytest.approx(
        float(held.mean()), abs=2e-3
    )
    assert got[("pca", "0", "anisotropy_share_spectral_p_value")] == 1 / 100
    # bin 1: exact design, second moment I + 8 t₂t₂ᵀ: share exactly 1 and each control's exactly
    # ‖Nⱼᵀt₂‖², on average k/(d − 1) (Haar in m̂⊥)
    held = (frames[1].transpose(1, 2) @ T2).pow(2).sum(dim=1)
    mean, std = float(held.mean()), float(held.std())
    assert got[("pca", "1", "anisotropy_share_spectral")] == pytest.approx(1.0, abs=1e-12)
    assert got[("pca", "1", "anisotropy_share_spectral_control_mean")] == pytest.approx(
        mean, rel=1e-10
    )
    assert got[("pca", "1", "anisotropy_share_spectral_control_std")] == pytest.approx(
        std, rel=1e-10
    )
    assert got[("pca", "1", "anisotropy_share_spectral_z")] == pytest.approx(
        (1 - mean) / std, rel=1e-9
    )
    assert abs(mean - K / (D - 1)) < 4 * std / math.sqrt(CONTROLS["draws"])
    assert got[("pca", "1", "anisotropy_share_spectral_p_value")] == 1 / 100
    # ΔIsoScore* (ζ = 0: IsoScore of the bin covariance ∝ I + 8 t₂t₂ᵀ); removing the proxy leaves
    # an isotropic (d − k)-dim cloud. Closed form; p at its floor 1/(isoscore_draws + 1) = 1/20.
    before = _isoscore([9.0] + [1.0] * (D - 1))
    after = _isoscore([1.0] * (D - K) + [0.0] * K)
    assert got[("pca", "1", "delta_isoscore_star")] == pytest.approx(after - before, rel=1e-9)
    assert got[("pca", "1", "delta_isoscore_star_p_value")] == 1 / 20
    assert got[("pca", "1", "delta_isoscore_star_control_mean")] < after - before
    assert got[("pca", "1", "delta_isoscore_star_z")] > 3


def test_metric_names_and_one_row_each():
    rows = anisotropy_share.rows(_step(_planted_bins()), {SITE: {"pca": T}}, CONFIG, **CONTROLS)
    names = {
        f"{view}{suffix}"
        for view in ("anisotropy_share_spectral", "delta_isoscore_star")
        for suffix in ("", "_control_mean", "_control_std", "_z", "_p_value")
    }
    assert {r["metric"] for r in rows} == names
    assert len(rows) == len(names) * 3  # bins "all", "0", "1"


def test_a_random_subspace_in_place_of_the_proxy_reads_at_control_level():
    R = _basis(D, K, 9)  # unrelated to the planted mean direction t₁
    rows = anisotropy_share.rows(
        _step(_planted_bins()[:1]), {SITE: {"random": R}}, CONFIG, **CONTROLS
    )
    got = _table(rows)
    # the second moment ≈ I + 16 t₁t₁ᵀ: any frame Q holds ≈ ‖Qᵀt₁‖² of the excess, and a Haar
    # frame in ℝ^d (no m̂ among the proxies) holds k/d of it on average
    held = float((R.T @ T1).pow(2).sum())
    share = got[("random", "0", "anisotropy_share_spectral")]
    assert share == pytest.approx(held, abs=5e-3)
    mean = got[("random", "0", "anisotropy_share_spectral_control_mean")]
    std = got[("random", "0", "anisotropy_share_spectral_control_std")]
    assert mean == pytest.approx(K / D, abs=4 * std / math.sqrt(99) + 5e-3)
    assert got[("random", "0", "anisotropy_share_spectral_p_value")] > 0.05
    assert abs(got[("random", "0", "anisotropy_share_spectral_z")]) < 2
    assert got[("random", "0", "delta_isoscore_star_p_value")] > 0.05


def test_controls_are_the_tangent_energy_frames():
    step = _step(_planted_bins())
    got = _table(anisotropy_share.rows(step, {SITE: {"pca": T}}, CONFIG, **CONTROLS))
    acc = step.statistics.sites[SITE].g_bins[0]
    # no m̂ among the proxies: the exchangeable frames are Haar in all of ℝ^d
    frames = control_frames(D, K, CONTROLS["draws"], seed_key(CONTROLS["seed"], STEP, LAYER, 0))
    shares = anisotropy_shares_spectral(acc.second_moment / acc.count, frames)
    assert got[("pca", "0", "anisotropy_share_spectral_control_mean")] == pytest.approx(
        float(shares.mean()), rel=1e-12
    )
    assert got[("pca", "0", "anisotropy_share_spectral_control_std")] == pytest.approx(
        float(shares.std()), rel=1e-12
    )
    # another seed of the stage gives other frames
    reseeded = _table(anisotropy_share.rows(step, {SITE: {"pca": T}}, CONFIG, draws=99, seed=4))
    assert reseeded[("pca", "0", "anisotropy_share_spectral_control_mean")] != pytest.approx(
        float(shares.mean()), rel=1e-6
    )


def test_more_isoscore_draws_than_energy_draws_extend_the_same_sequence():
    many = anisotropy_share.AnisotropyShareConfig(isoscore_draws=9, zeta=0.0)
    step = _step(_planted_bins())
    got = _table(anisotropy_share.rows(step, {SITE: {"pca": T}}, many, draws=5, seed=3))
    assert got[("pca", "1", "anisotropy_share_spectral_p_value")] == 1 / 6
    assert got[("pca", "1", "delta_isoscore_star_p_value")] == 1 / 10


def test_config_validation():
    with pytest.raises(ValueError, match="isoscore_draws must be an integer ≥ 1"):
        anisotropy_share.AnisotropyShareConfig(isoscore_draws=0)
    with pytest.raises(ValueError, match="zeta"):
        anisotropy_share.AnisotropyShareConfig(zeta=1.5)
    with pytest.raises(TypeError, match="seed"):
        anisotropy_share.AnisotropyShareConfig(seed=1)  # type: ignore[call-arg]


def test_rows_are_labelled_and_cells_below_three_tokens_or_without_gradient_are_skipped():
    """Row labels (probe, site, layer, rank, n_tokens per bin); a bin of exactly 3 tokens is
    scored, one of 2 is not, a zero-gradient bin is skipped without stopping at it, gradients of
    tiny norm (trace ≪ 1) are still scored, and a site without gradients does not stop the
    sites after it."""
    gen = torch.Generator().manual_seed(21)
    small = 1e-3 * torch.randn(40, D, generator=gen, dtype=torch.float64)
    bins = [
        torch.zeros(5, D, dtype=torch.float64),  # bin 0: no gradient
        small[:3],  # bin 1: exactly three tokens
        small[3:5],  # bin 2: two tokens
        small[5:],  # bin 3
    ]
    step = _step(bins)
    without_gradient = SimpleNamespace(g=None, g_bins=[])
    sites = {"blocks.0.hook_resid_post": without_gradient, SITE: step.statistics.sites[SITE]}
    data = Capture("planted", STEP, 0, SimpleNamespace(sites=sites), {SITE: LAYER}, 8)
    rows = anisotropy_share.rows(data, {name: {"pca": T} for name in sites}, CONFIG, **CONTROLS)
    assert {r["freq_bin"] for r in rows} == {"all", "1", "3"}
    counts = {"all": 45, "1": 3, "3": 35}
    for r in rows:
        assert r["probe"] == "anisotropy_share" and r["site"] == SITE and r["layer"] == LAYER
        assert r["rank"] == K and r["n_tokens"] == counts[r["freq_bin"]]
    acc = step.statistics.sites[SITE].g_bins[1]
    frames = control_frames(D, K, CONTROLS["draws"], seed_key(CONTROLS["seed"], STEP, LAYER, 1))
    shares = anisotropy_shares_spectral(acc.second_moment / acc.count, frames)
    got = _table(rows)
    assert got[("pca", "1", "anisotropy_share_spectral_control_mean")] == pytest.approx(
        float(shares.mean()), rel=1e-10
    )
