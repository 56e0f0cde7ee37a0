"""Energy fractions, controls and anisotropy shares on planted and isotropic gradients."""

import math

import numpy as np
import pytest
import torch

from tangentlens.metrics import (
    anisotropy_share_spectral,
    compare_anisotropy_share,
    compare_delta_isoscore_star,
    compare_energy,
    control_frames,
    data_matched_frames,
    delta_isoscore_star,
    energy_fraction,
    energy_fraction_from_moment,
    energy_fractions_from_moment,
    exclusion_basis,
    null_energy_mean,
    principal_angles,
    span_basis,
)

D, K = 48, 4


def _basis(d, k, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]


def _planted_gradients(share, n=4000, seed=0):
    """Gradients with exactly ``share`` of their energy in span(T): the T and complement parts
    are rescaled to the planted energies."""
    gen = torch.Generator().manual_seed(seed)
    T = _basis(D, K, seed + 100)
    G = torch.randn(n, D, generator=gen, dtype=torch.float64)
    inside = G @ T @ T.T
    outside = G - inside
    total = float(G.pow(2).sum())
    G = inside * math.sqrt(share * total / float(inside.pow(2).sum())) + outside * math.sqrt(
        (1 - share) * total / float(outside.pow(2).sum())
    )
    return G, T


def test_energy_fraction_matches_numpy_and_the_moment_form():
    G, _ = _planted_gradients(0.3)
    Q = _basis(D, 6, 7)
    ref = np.linalg.norm(G.numpy() @ Q.numpy()) ** 2 / np.linalg.norm(G.numpy()) ** 2
    assert energy_fraction(G, Q) == pytest.approx(ref, rel=1e-12)
    assert energy_fraction(G.float(), Q) == pytest.approx(ref, rel=1e-6)
    assert energy_fraction_from_moment(G.T @ G, Q) == pytest.approx(ref, rel=1e-10)
    frames = torch.stack([Q, _basis(D, 6, 8)])
    batched = energy_fractions_from_moment(G.T @ G, frames)
    assert float(batched[0]) == pytest.approx(ref, rel=1e-10)


def test_planted_share_is_recovered_and_p_value_is_minimal():
    G, T = _planted_gradients(0.6)
    M = G.T @ G
    controls = control_frames(D, K, draws=99, seed_key=(0, 1000, 3, 0), excluded=T)
    result = compare_energy(M, T, controls, T)
    assert result.energy_fraction == pytest.approx(0.6, rel=1e-10)
    assert result.energy_p_value == pytest.approx(1 / 100)
    assert result.draws == 99 and result.rank == K and result.d == D
    assert result.energy_enrichment == pytest.approx(0.6 / (K / D))
    # the ratio reads the family's exact mean; the frames' own ratio is the self-check
    assert result.energy_ratio == pytest.approx(0.6 / (K / (D - K) * 0.4), rel=1e-10)
    assert result.sampled_ratio == pytest.approx(0.6 / result.control_mean, rel=1e-12)
    assert result.energy_z > 10
    # each control holds ≈ its share of the remaining 40 %, on average exactly the closed form
    assert result.null_mean == pytest.approx(K / (D - K) * 0.4)
    se = result.control_std / math.sqrt(99)
    assert abs(result.control_mean - result.null_mean) < 4 * se


def test_isotropic_gradients_sit_at_chance_and_match_the_closed_form():
    gen = torch.Generator().manual_seed(5)
    G = torch.randn(200_000, D, generator=gen, dtype=torch.float64)
    T = _basis(D, K, 11)
    controls = control_frames(D, K, draws=400, seed_key=(1,), excluded=T)
    result = compare_energy(G.T @ G, T, controls, T)
    assert result.energy_fraction == pytest.approx(K / D, rel=0.03)
    assert result.control_mean == pytest.approx(result.null_mean, rel=0.01)
    assert 0.05 < result.energy_p_value < 0.95


def test_control_frames_are_haar_in_the_complement_and_seeded_per_draw():
    T = _basis(D, K, 3)
    frames = control_frames(D, 6, draws=2000, seed_key=(7, 2, 1, 0), excluded=T)
    eye = torch.eye(6, dtype=torch.float64)
    assert frames.shape == (2000, D, 6)
    torch.testing.assert_close(frames[17].T @ frames[17], eye)
    assert float((T.T @ frames).abs().max()) < 1e-12  # exactly orthogonal to the proxy
    # Haar on the complement: the mean projector is (k / (d − k_T)) (I − P_T)
    mean_projector = torch.einsum("jdk,jek->de", frames, frames) / 2000
    expected = 6 / (D - K) * (torch.eye(D, dtype=torch.float64) - T @ T.T)
    assert float((mean_projector - expected).abs().max()) < 0.02
    # one draw is reproducible alone; different keys differ
    again = control_frames(D, 6, draws=18, seed_key=(7, 2, 1, 0), excluded=T)
    assert torch.equal(again[17], frames[17])
    other = control_frames(D, 6, draws=1, seed_key=(7, 2, 1, 1), excluded=T)
    assert not torch.allclose(other[0], frames[0])


def test_data_matched_frames_lie_in_the_pca_span_minus_the_proxy():
    T = _basis(D, K, 1)
    V = span_basis(torch.cat([T[:, :2].T, _basis(D, 10, 2).T]))  # PCA span shares 2 proxy dirs
    assert V.shape[1] == 12
    frames = data_matched_frames(V, 8, draws=10, seed_key=(0,), excluded=T)  # 12 − rank(TᵀV)
    assert float((T.T @ frames).abs().max()) < 1e-12
    inside = V @ V.T @ frames
    torch.testing.assert_close(inside, frames)
    with pytest.raises(ValueError, match="only 8 dimensions outside the excluded subspace"):
        data_matched_frames(V, 9, draws=1, seed_key=(0,), excluded=T)
    # without an excluded subspace: Haar in the whole PCA span, mean projector (k/m) V Vᵀ
    many = data_matched_frames(V, 3, draws=3000, seed_key=(1,))
    mean_projector = torch.einsum("jdk,jek->de", many, many) / 3000
    assert float((mean_projector - 3 / 12 * V @ V.T).abs().max()) < 0.02


def test_spectral_share_known_answers():
    T = _basis(D, K, 4)
    C = torch.eye(D, dtype=torch.float64) + 5 * T @ T.T  # all excess variance inside T
    assert anisotropy_share_spectral(C, T) == pytest.approx(1.0, abs=1e-12)
    N = control_frames(D, K, 1, (0,), excluded=T)[0]
    assert anisotropy_share_spectral(C, N) == pytest.approx(0.0, abs=1e-12)
    half = span_basis(torch.cat([T[:, :2], N[:, :2]], dim=1).T)
    assert anisotropy_share_spectral(C, half) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="isotropic"):
        anisotropy_share_spectral(torch.eye(D, dtype=torch.float64), T)


def _exact_rows(n, covariance_root, seed):
    """Rows with mean exactly 0 and ``XᵀX/n = Rᵀ R`` exactly (orthonormal design times R)."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(n, D, generator=gen, dtype=torch.float64)
    return math.sqrt(n) * torch.linalg.qr(A - A.mean(dim=0))[0] @ covariance_root


def test_spectral_share_uses_the_uncentred_second_moment():
    """METHODS §1.4: C = GᵀG/n. Noise with a little excess variance along n̂ ⟂ T plus a large
    mean gradient m t̂ in T: GᵀG/n = I + a n̂n̂ᵀ + m² t̂t̂ᵀ exactly, so with e = (a + m²)/d the
    share of T is (m² − e) / ((m² − e) + (a − e)). The covariance (I + a n̂n̂ᵀ) gives 0."""
    T = _basis(D, K, 12)
    n_hat = control_frames(D, 1, 1, (5,), excluded=T)[0][:, 0]
    a, m = 2.0, 4.0
    root = torch.eye(D, dtype=torch.float64) + (math.sqrt(1 + a) - 1) * torch.outer(n_hat, n_hat)
    G = _exact_rows(4000, root, seed=13) + m * T[:, 1]
    e = (a + m**2) / D
    expected = (m**2 - e) / ((m**2 - e) + (a - e))  # 0.9148…
    controls = control_frames(D, K, 49, (0, 10, 1, 0), excluded=T)
    result = compare_anisotropy_share(G.T @ G, T, controls)
    assert result.value == pytest.approx(expected, rel=1e-10)
    assert compare_anisotropy_share(G.T @ G / 4000, T, controls).value == pytest.approx(
        expected, rel=1e-10
    )
    # each control holds ‖Nᵀn̂‖² of the (a − e) part: mean k/(d − k) of it in expectation
    share_n = (a - e) / ((m**2 - e) + (a - e))
    expected_controls = share_n * (controls.transpose(1, 2) @ n_hat).pow(2).sum(dim=1)
    assert result.control_mean == pytest.approx(float(expected_controls.mean()), rel=1e-9)
    assert result.control_std == pytest.approx(float(expected_controls.std()), rel=1e-9)
    assert result.p_value == 1 / 50 and result.draws == 49
    # the centred matrix is blind to the mean gradient: that reading would say "no anisotropy"
    cov = torch.cov(G.T)
    assert anisotropy_share_spectral(cov, T) == pytest.approx(0.0, abs=1e-12)


def test_isotropic_noise_plus_a_mean_gradient_in_the_proxy_has_share_near_one():
    gen = torch.Generator().manual_seed(14)
    T = _basis(D, K, 15)
    G = torch.randn(20_000, D, generator=gen, dtype=torch.float64) + 5.0 * T[:, 0]
    result = compare_anisotropy_share(G.T @ G, T, control_frames(D, K, 99, (2,), excluded=T))
    assert result.value == pytest.approx(1.0, abs=1e-3)
    assert result.control_mean == pytest.approx(0.0, abs=1e-3)
    assert result.p_value == 1 / 100


def test_control_statistics_have_known_values():
    """Coordinate frames on C = diag(5, 4, 3, 2, 1, 1, 1, 1): A₊ = (2.75, 1.75, 0.75, 0, …)/5.25
    of the excess; proxy e₂ (1/3) against e₁, e₃, e₄, e₅ (11/21, 1/7, 0, 0)."""
    d = 8
    C = torch.diag(torch.tensor([5.0, 4, 3, 2, 1, 1, 1, 1], dtype=torch.float64))
    e = torch.eye(d, dtype=torch.float64)
    controls = torch.stack([e[:, [0]], e[:, [2]], e[:, [3]], e[:, [4]]])
    result = compare_anisotropy_share(C, e[:, [1]], controls)
    values = np.array([11 / 21, 1 / 7, 0, 0])
    assert result.value == pytest.approx(1 / 3, rel=1e-12)
    assert result.control_mean == pytest.approx(1 / 6, rel=1e-12)
    assert result.control_std == pytest.approx(values.std(ddof=1), rel=1e-12)  # ddof 1
    assert result.z == pytest.approx((1 / 3 - 1 / 6) / values.std(ddof=1), rel=1e-12)
    assert result.p_value == pytest.approx(2 / 5)  # (1 + one control above) / (1 + 4)
    # a proxy equal to its only distinct control ties: counted as "≥", z = 0
    tie = compare_anisotropy_share(C, e[:, [4]], controls[2:])
    assert tie.value == 0 and tie.z == 0 and tie.p_value == 1.0
    with pytest.raises(ValueError, match="matched rank"):
        compare_anisotropy_share(C, e[:, :2], controls)
    with pytest.raises(ValueError, match="matched rank"):
        compare_delta_isoscore_star(C, e[:, [1]], controls[:0], torch.eye(d))


def test_compare_delta_isoscore_star_against_the_closed_form():
    T = _basis(D, K, 6)
    C = torch.eye(D, dtype=torch.float64) + 20 * T @ T.T
    controls = control_frames(D, K, 19, (0, 1, 2, 3), excluded=T)
    result = compare_delta_isoscore_star(C, T, controls, torch.eye(D, dtype=torch.float64), 0.0)

    # ζ = 0: plain IsoScore. Removing T leaves eigenvalues (1 × (d − k), 0 × k)
    def iso(lam):
        lam_hat = math.sqrt(D) * lam / np.linalg.norm(lam)
        defect = np.linalg.norm(lam_hat - 1) / math.sqrt(2 * (D - math.sqrt(D)))
        return ((D - defect**2 * (D - math.sqrt(D))) ** 2 - D) / (D * (D - 1))

    before = iso(np.r_[np.full(K, 21.0), np.ones(D - K)])
    after = iso(np.r_[np.ones(D - K), np.zeros(K)])
    assert result.value == pytest.approx(after - before, rel=1e-9)
    # a control removes k unit directions: eigenvalues (21 × k, 1 × (d − 2k), 0 × k), all equal
    control = iso(np.r_[np.full(K, 21.0), np.ones(D - 2 * K), np.zeros(K)]) - before
    assert result.control_mean == pytest.approx(control, rel=1e-9)
    assert result.control_std == pytest.approx(0.0, abs=1e-12)
    assert result.p_value == 1 / 20 and result.draws == 19  # the floor with 19 draws
    assert result.z > 1e12  # controls equal up to rounding


def test_delta_isoscore_star_rewards_removing_the_anisotropic_directions():
    T = _basis(D, K, 6)
    C = torch.eye(D, dtype=torch.float64) + 20 * T @ T.T
    C0 = torch.eye(D, dtype=torch.float64)
    N = control_frames(D, K, 1, (0,), excluded=T)[0]
    gain_proxy = delta_isoscore_star(C, T, C0)
    gain_control = delta_isoscore_star(C, N, C0)
    assert gain_proxy > 0.5 > gain_control
    # removing exactly the anisotropic span leaves an isotropic (d − k)-dim cloud: IsoScore of
    # eigenvalues (1 × (d − k), 0 × k) in closed form
    lam = np.r_[np.ones(D - K), np.zeros(K)]
    lam_hat = math.sqrt(D) * lam / np.linalg.norm(lam)
    defect = np.linalg.norm(lam_hat - 1) / math.sqrt(2 * (D - math.sqrt(D)))
    phi = (D - defect**2 * (D - math.sqrt(D))) ** 2 / D**2
    from tangentlens.metrics import isoscore_star_from_covariance

    before = isoscore_star_from_covariance(C, C0, 0.2)
    assert gain_proxy == pytest.approx((D * phi - 1) / (D - 1) - before, rel=1e-9)


def test_bad_input():
    T = _basis(D, K, 0)
    with pytest.raises(ValueError, match="orthonormal"):
        energy_fraction(torch.randn(10, D), 2 * T)
    with pytest.raises(ValueError, match="48 rows"):
        energy_fraction(torch.randn(10, D), _basis(D + 1, K, 0))
    with pytest.raises(ValueError, match="NaN"):
        energy_fraction(torch.full((3, D), float("nan")), T)
    with pytest.raises(ValueError, match="zero trace"):
        energy_fraction_from_moment(torch.zeros(D, D), T)
    with pytest.raises(ValueError, match="matched rank"):
        compare_energy(torch.eye(D), T, control_frames(D, K + 1, 2, (0,), excluded=T), T)
    with pytest.raises(ValueError, match=r"k must be ≤ 44 \(the dimension of the subspace"):
        control_frames(D, 45, 1, (0,), excluded=T)
    with pytest.raises(ValueError, match="integers ≥ 0"):
        control_frames(D, 2, 1, (-1,), excluded=T)
    with pytest.raises(ValueError, match=r"k in \[1, d − r\], got r = 4, k = 45"):
        null_energy_mean(45, D, K, 0.5)
    with pytest.raises(ValueError, match="not orthogonal to the excluded subspace"):
        compare_energy(torch.eye(D), T, control_frames(D, K, 2, (0,)), T)
    assert float(principal_angles(T, T).max()) < 1e-7


def test_batched_shares_equal_single_calls():
    from tangentlens.metrics import anisotropy_shares_spectral, delta_isoscores_star

    T = _basis(D, K, 9)
    gen = torch.Generator().manual_seed(9)
    A = torch.randn(D, D, generator=gen, dtype=torch.float64)
    C = A @ A.T + 5 * T @ T.T
    C0 = torch.eye(D, dtype=torch.float64) + 0.1 * A @ A.T / D
    frames = torch.cat([T[None], control_frames(D, K, 4, (3,), excluded=T)])
    spectral = anisotropy_shares_spectral(C, frames)
    delta = delta_isoscores_star(C, frames, C0, 0.3)
    for j, frame in enumerate(frames):
        assert float(spectral[j]) == pytest.approx(anisotropy_share_spectral(C, frame), rel=1e-12)
        P = torch.eye(D, dtype=torch.float64) - frame @ frame.T
        from tangentlens.metrics import isoscore_star_from_covariance as iso

        expected = iso(P @ C @ P, P @ C0 @ P, 0.3) - iso(C, C0, 0.3)
        assert float(delta[j]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_several_proxies_against_one_moment_equal_their_single_comparisons():
    """``compare_anisotropy_shares`` / ``compare_delta_isoscores_star`` share one spectrum and
    one unprojected score: every proxy's comparison is exactly its single call's."""
    from tangentlens.metrics import compare_anisotropy_shares, compare_delta_isoscores_star

    gen = torch.Generator().manual_seed(11)
    A = torch.randn(D, D, generator=gen, dtype=torch.float64)
    C = A @ A.T + 5 * _basis(D, K, 1) @ _basis(D, K, 1).T
    C0 = torch.eye(D, dtype=torch.float64) + 0.1 * A @ A.T / D
    candidates = {
        name: (T, control_frames(D, T.shape[1], 6, (seed,), excluded=T))
        for name, T, seed in (("a", _basis(D, K, 1), 1), ("b", _basis(D, 1, 2), 2))
    }
    spectral = compare_anisotropy_shares(C, candidates)
    delta = compare_delta_isoscores_star(C, candidates, C0, 0.3)
    assert list(spectral) == list(delta) == ["a", "b"]
    for name, (T, frames) in candidates.items():
        assert spectral[name] == compare_anisotropy_share(C, T, frames)
        assert delta[name] == compare_delta_isoscore_star(C, T, frames, C0, 0.3)
    assert spectral["a"].value != spectral["b"].value and delta["a"].value != delta["b"].value


def test_frames_depend_on_the_excluded_span_not_on_its_basis():
    """METHODS §1.2: Gaussian frames projected with I − P and orthonormalised — the same span in
    another (non-orthogonal-mixed, re-orthonormalised) basis gives the same frames."""
    proxy = _basis(D, 3, 21)
    mixed = span_basis((proxy @ torch.tensor([[2.0, 1, 0], [0, 1, 0], [1, 0, -3]]).double()).T)
    assert float((mixed - proxy).abs().max()) > 0.1  # another basis …
    assert float(principal_angles(mixed, proxy).max()) < 1e-7  # … of the same span
    for key in [(0, 1, 2, 0), (0, 1, 2, 3)]:
        torch.testing.assert_close(
            control_frames(D, 3, 5, key, excluded=mixed),
            control_frames(D, 3, 5, key, excluded=proxy),
            rtol=0,
            atol=1e-12,
        )
        m = torch.linalg.qr(torch.randn(D, 1, dtype=torch.float64))[0]
        torch.testing.assert_close(
            control_frames(D, 3, 5, key, excluded=exclusion_basis(mixed, m)),
            control_frames(D, 3, 5, key, excluded=exclusion_basis(m, proxy)),
            rtol=0,
            atol=1e-12,
        )


def test_exclusion_basis_spans_every_given_basis_once():
    T = _basis(D, K, 22)
    m = _basis(D, 1, 23)
    both = exclusion_basis(T, m, None)
    assert both.shape == (D, K + 1)
    torch.testing.assert_close(both.T @ both, torch.eye(K + 1, dtype=torch.float64))
    joint = torch.cat([T, m], dim=1)
    torch.testing.assert_close(both @ both.T @ joint, joint)  # the span holds T and m
    overlapping = exclusion_basis(T, T[:, :1])  # a direction given twice counts once
    assert overlapping.shape == (D, K)
    assert exclusion_basis(T) is not None and torch.equal(exclusion_basis(T), T)
    with pytest.raises(ValueError, match="must all have 48 rows"):
        exclusion_basis(T, _basis(D + 1, 1, 0))


def test_closed_form_null_mean_follows_the_excluded_subspace():
    """k/(d − r) · (1 − E(X)) for Haar frames outside X, r = rank X: sampled means agree for X
    = nothing, m̂, and span(T, m̂) on anisotropic gradients with a share along m̂."""
    gen = torch.Generator().manual_seed(31)
    T = _basis(D, K, 32)
    m = control_frames(D, 1, 1, (33,), excluded=T)[0]
    G = torch.randn(20_000, D, generator=gen, dtype=torch.float64) * torch.linspace(
        0.2, 2, D, dtype=torch.float64
    )
    G = G + 3.0 * m[:, 0]
    M = G.T @ G
    e_t, e_m = energy_fraction_from_moment(M, T), energy_fraction_from_moment(M, m)
    for excluded, expected in (
        (None, K / D),
        (m, K / (D - 1) * (1 - e_m)),
        (exclusion_basis(T, m), K / (D - 1 - K) * (1 - e_t - e_m)),
    ):
        frames = control_frames(D, K, 4000, (34,), excluded=excluded)
        result = compare_energy(M, T, frames, excluded)
        assert result.null_mean == pytest.approx(expected, rel=1e-12)
        se = result.control_std / math.sqrt(4000)
        assert abs(result.control_mean - expected) < 4 * se


def test_delta_isoscores_keep_their_accuracy_when_the_frame_holds_nearly_all_variance():
    """A 10⁶ spike inside the proxy: the batched scores (trace and Frobenius norm of the formed
    PΣP) equal eigen-decompositions of the explicit projections to 1e-9; the summed-norm shortcut
    ``‖Σ‖² − 2‖ΣF‖² + ‖FᵀΣF‖²`` would be off by ~1e-5 here."""
    from tangentlens.metrics import delta_isoscores_star
    from tangentlens.metrics import isoscore_star_from_covariance as iso

    T = _basis(D, K, 4)
    gen = torch.Generator().manual_seed(4)
    A = torch.randn(D, D, generator=gen, dtype=torch.float64)
    C = A @ A.T / D + 1e6 * T @ T.T
    C0 = torch.eye(D, dtype=torch.float64)
    frames = torch.cat([T[None], control_frames(D, K, 3, (1,), excluded=T)])
    delta = delta_isoscores_star(C, frames, C0, 0.2)
    for j, frame in enumerate(frames):
        P = torch.eye(D, dtype=torch.float64) - frame @ frame.T
        expected = iso(P @ C @ P, P @ C0 @ P, 0.2) - iso(C, C0, 0.2)
        assert float(delta[j]) == pytest.approx(expected, rel=1e-9)
    assert float(delta[0]) > 0.4  # removing the spike makes the gradients far more isotropic


def test_delta_isoscore_star_null_isotropic_gradients_read_no_effect():
    """Null: for isotropic gradients every k-frame leaves the same spectrum (1 × (d − k),
    0 × k), so the proxy's ΔIsoScore* equals each control's (to rounding: the p-value of such
    ties is arbitrary) and its closed form."""
    T = _basis(D, K, 8)
    C = torch.eye(D, dtype=torch.float64)
    controls = control_frames(D, K, 19, (8,), excluded=T)
    result = compare_delta_isoscore_star(C, T, controls, C, 0.2)
    after = (D - K - 1) / (D - 1)  # (PR − 1)/(d − 1) with PR = d − k
    assert result.value == pytest.approx(after - 1.0, rel=1e-12)
    assert result.control_mean == pytest.approx(result.value, rel=1e-12)
    assert result.control_std < 1e-12
