"""Frequency–spread correlation (Bessel-corrected squared centroid distances from streamed sums:
brute-force reference, equal-spread null against a label-permutation band, planted effect, probe
level), curvature visibility and bootstrap intervals against brute force and known answers."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, rankdata, spearmanr

from tangentlens.capture import CaptureConfig, CaptureStatistics, StatisticsConfig, TypeSums
from tangentlens.capture.accumulators import SiteStatistics
from tangentlens.data import FrequencyTable
from tangentlens.metrics import (
    bootstrap_ratio,
    centroid_spread_from_sums,
    centroids_from_sums,
    frequency_distance_correlation,
    group_sums,
    local_spectra,
    pooled_visibility,
)
from tangentlens.probes import frequency_geometry
from tangentlens.probes.base import Capture

# ------------------------------------------------------------------ frequency and spread


def _zipf_stream(seed, *, vocab=3000, n=40_000, d=768, beta=0.0, tau=0.0):
    """A stream of ``n`` tokens drawn with Zipf probabilities ``p_t ∝ 1/rank`` and, per occurrence,
    an isotropic Gaussian row around its type's random centroid with per-coordinate variance
    ``σ²_t = exp(−β (log p_t − mean log p) + τ z_t)``: β = τ = 0 is the equal-spread null,
    β > 0 plants spread shrinking with frequency. Returns tokens, rows and ``σ²_t``."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    tokens = rng.choice(vocab, size=n, p=p)
    var = np.exp(-beta * (np.log(p) - np.log(p).mean()) + tau * rng.normal(size=vocab))
    centres = rng.normal(size=(vocab, d)) * 3.0
    H = rng.standard_normal(size=(n, d))
    H *= np.sqrt(var)[tokens, None]
    H += centres[tokens]
    return tokens, H, var


def _log_frequency(tokens, vocab):
    """log(count / total) per type; −inf for types never seen (left out by the correlation)."""
    with np.errstate(divide="ignore"):
        return np.log(np.bincount(tokens, minlength=vocab) / tokens.size)


def _streamed(tokens, H, vocab, chunks=7):
    """Per-type sums accumulated batch by batch, as a capture does."""
    sums = TypeSums(range(vocab), H.shape[1], vocab_size=vocab)
    for tok, rows in zip(np.array_split(tokens, chunks), np.array_split(H, chunks), strict=True):
        sums.update(torch.from_numpy(tok), torch.from_numpy(rows))
    return sums


def _sums_of_squares(tokens, H, vocab):
    """Brute force from explicit rows: count and Σ‖h − c‖² per type (two passes, numpy)."""
    count = np.bincount(tokens, minlength=vocab)
    centroids = np.zeros((vocab, H.shape[1]))
    np.add.at(centroids, tokens, H)
    centroids /= np.maximum(count, 1)[:, None]
    scatter = np.bincount(
        tokens, weights=((H - centroids[tokens]) ** 2).sum(axis=1), minlength=vocab
    )
    return count, scatter


def _pearson_rows(X, y):
    Xc = X - X.mean(axis=1, keepdims=True)
    yc = y - y.mean()
    return Xc @ yc / (np.linalg.norm(Xc, axis=1) * np.linalg.norm(yc))


def test_spread_from_streamed_sums_matches_per_type_ddof1_variances():
    rng = np.random.default_rng(0)
    vocab, d = 40, 8
    counts = rng.integers(2, 60, size=vocab)
    counts[[3, 17]] = [1, 0]  # seen once: no spread; never seen: no centroid
    tokens = rng.permutation(np.repeat(np.arange(vocab), counts))
    centres = rng.normal(size=(vocab, d)) * 5
    scale = rng.uniform(0.1, 2.0, size=vocab)
    H = centres[tokens] + rng.normal(size=(tokens.size, d)) * scale[tokens, None]
    sums = _streamed(tokens, H, vocab, chunks=5)
    spread = centroid_spread_from_sums(sums.count, sums.sum, sums.sum_sq_norms)
    assert spread.dtype == torch.float64 and spread.shape == (vocab,)
    for t in range(vocab):
        rows = H[tokens == t]
        if len(rows) < 2:
            assert math.isnan(float(spread[t]))
            continue
        reference = np.var(rows, axis=0, ddof=1).sum()
        assert float(spread[t]) == pytest.approx(reference, rel=1e-10)
        c = rows.mean(axis=0)
        assert reference == pytest.approx(((rows - c) ** 2).sum() / (len(rows) - 1), rel=1e-12)
    centroids = centroids_from_sums(sums.count, sums.sum)
    assert torch.isnan(centroids[17]).all() and not torch.isnan(centroids[3]).any()
    # every occurrence the same vector: spread exactly 0, never negative from rounding
    same = TypeSums([0], 4, vocab_size=1)
    same.update(torch.zeros(5, dtype=torch.int64), torch.full((5, 4), 0.1))
    assert float(centroid_spread_from_sums(same.count, same.sum, same.sum_sq_norms)[0]) == 0.0


def _band(values, level):
    return np.quantile(values, [(1 - level) / 2, (1 + level) / 2])


def _permutation_null(log_frequency, spread, seed, n_perm=400):
    """Pearson and Spearman of ``n_perm`` label permutations: the log-frequency labels permuted
    across types (the null of no association)."""
    rng = np.random.default_rng(10_000 + seed)
    perms = np.argsort(rng.random((n_perm, log_frequency.size)), axis=1)
    pearson = _pearson_rows(log_frequency[perms], spread)
    spearman = _pearson_rows(rankdata(log_frequency)[perms], rankdata(spread))
    return pearson, spearman


def test_equal_spread_zipf_types_fall_inside_the_permutation_null():
    """2000+ Zipf types, all with the same isotropic spread (d = 768, 5 seeds): no association.
    Every seed's Pearson lies inside the 95 % label-permutation band; the Spearman inside the 99 %
    band in at least 4 of the 5 seeds, and its mean over the seeds is small. The (n − 1)/n-shrunk
    spread of the old estimator (÷ n) lies far outside the bands on the same data.

    Why the Spearman gets a looser criterion: a type's spread estimate is noisier (and, as a χ²,
    more skewed) the rarer the type, so the types are not exchangeable and the permutation band
    is too narrow for ranks. Over 60 seeds of this null the Spearman averages +0.012 (sd 0.018);
    the 95 % band covers it in 92 % of the seeds, the 99 % band in 97 %, and even without any
    skew (χ² simulation at d = 10⁵) the 95 % band covers it only 91 % of the time. The Pearson
    (mean +0.003, sd 0.014) is covered by its 95 % band in every one of the 60 seeds."""
    vocab, spearmans, spearman_inside = 3000, [], 0
    for seed in range(5):
        tokens, H, _ = _zipf_stream(seed, vocab=vocab)
        sums = _streamed(tokens, H, vocab)
        log_frequency = _log_frequency(tokens, vocab)
        spread = centroid_spread_from_sums(sums.count, sums.sum, sums.sum_sq_norms)
        corr = frequency_distance_correlation(log_frequency, spread, sums.count, min_count=2)
        keep = sums.count.numpy() >= 2
        assert corr.n == keep.sum() > 2000
        lf, y = log_frequency[keep], spread.numpy()[keep]
        assert corr.pearson == pytest.approx(pearsonr(lf, y)[0], abs=1e-12)
        assert corr.spearman == pytest.approx(spearmanr(lf, y)[0], abs=1e-12)
        null_pearson, null_spearman = _permutation_null(lf, y, seed)
        p_lo, p_hi = _band(null_pearson, 0.95)
        s_lo, s_hi = _band(null_spearman, 0.99)
        assert p_lo < corr.pearson < p_hi, (seed, corr)
        spearman_inside += int(s_lo < corr.spearman < s_hi)
        spearmans.append(corr.spearman)
        # the test has power against the (n − 1)/n bias: the ÷ n spread is far outside the band
        n = sums.count.numpy()[keep]
        shrunk = y * (n - 1) / n
        assert pearsonr(lf, shrunk)[0] > p_hi + 0.5 and spearmanr(lf, shrunk)[0] > s_hi + 0.5
    assert spearman_inside >= 4, spearmans
    assert abs(np.mean(spearmans)) < 0.04, spearmans


def test_at_small_width_the_pearson_stays_centred_and_the_spearman_skew_is_small():
    """At d = 16 the per-type spread of a rare type is a right-skewed χ² with few degrees of
    freedom: the Pearson (on the unbiased s²) stays inside the null band, the Spearman keeps the
    small positive shift the module docstring states (≈ +0.05, vs ≈ +0.75 for the ÷ n spread)."""
    vocab, spearman, shrunk_spearman = 3000, [], []
    for seed in range(5):
        tokens, H, _ = _zipf_stream(seed, vocab=vocab, d=16)
        sums = _streamed(tokens, H, vocab)
        log_frequency = _log_frequency(tokens, vocab)
        spread = centroid_spread_from_sums(sums.count, sums.sum, sums.sum_sq_norms)
        corr = frequency_distance_correlation(log_frequency, spread, sums.count, min_count=2)
        keep = sums.count.numpy() >= 2
        null_pearson, _ = _permutation_null(log_frequency[keep], spread.numpy()[keep], seed)
        p_lo, p_hi = _band(null_pearson, 0.95)
        assert p_lo < corr.pearson < p_hi
        spearman.append(corr.spearman)
        n = sums.count.numpy()[keep]
        shrunk = spread.numpy()[keep] * (n - 1) / n
        shrunk_spearman.append(spearmanr(log_frequency[keep], shrunk)[0])
    assert 0.0 < np.mean(spearman) < 0.1
    assert np.mean(shrunk_spearman) > 0.6


@pytest.mark.parametrize("seed", range(3))
def test_planted_spread_shrinking_with_frequency_gives_the_planted_correlation(seed):
    """σ²_t falls with frequency (β = 0.3, log-normal scatter τ = 0.3): the reported Pearson and
    Spearman match the correlations of log-frequency with the true spread d·σ²_t (≈ −0.55)."""
    vocab, d = 3000, 768
    tokens, H, var = _zipf_stream(seed, vocab=vocab, d=d, beta=0.3, tau=0.3)
    sums = _streamed(tokens, H, vocab)
    log_frequency = _log_frequency(tokens, vocab)
    spread = centroid_spread_from_sums(sums.count, sums.sum, sums.sum_sq_norms)
    corr = frequency_distance_correlation(log_frequency, spread, sums.count, min_count=2)
    keep = sums.count.numpy() >= 2
    truth_pearson = pearsonr(log_frequency[keep], d * var[keep])[0]
    truth_spearman = spearmanr(log_frequency[keep], var[keep])[0]
    assert -0.65 < truth_pearson < -0.45 and -0.65 < truth_spearman < -0.45
    assert corr.pearson == pytest.approx(truth_pearson, abs=0.03)
    assert corr.spearman == pytest.approx(truth_spearman, abs=0.03)
    # the ÷ n spread is pulled far towards positive values on the same data
    n = sums.count.numpy()[keep]
    shrunk = spread.numpy()[keep] * (n - 1) / n
    assert pearsonr(log_frequency[keep], shrunk)[0] > truth_pearson + 0.2


def test_frequency_spread_inputs_are_validated():
    counts = torch.tensor([3, 1, 4, 5])
    sums, sq = torch.ones(4, 2), torch.ones(4)
    lf = torch.log(counts / counts.sum())
    spread = torch.tensor([1.0, float("nan"), 2.0, 0.5])
    with pytest.raises(ValueError, match=r"min_count must be an integer ≥ 2"):
        frequency_distance_correlation(lf, spread, counts, min_count=1)
    with pytest.raises(ValueError, match=r"only 1 token types have ≥ 5 .*at least 3"):
        frequency_distance_correlation(lf, spread, counts, min_count=5)
    with pytest.raises(ValueError, match=r"all be \(vocab,\) vectors"):
        frequency_distance_correlation(lf[:3], spread, counts)
    with pytest.raises(ValueError, match="non-negative occurrence counts"):
        centroid_spread_from_sums(torch.tensor([3, -1, 4, 5]), sums, sq)
    with pytest.raises(ValueError, match="whole numbers"):
        centroid_spread_from_sums(torch.tensor([3.0, 1.5, 4.0, 5.0]), sums, sq)
    with pytest.raises(ValueError, match=r"sum must be \(vocab, d\) with vocab = 4"):
        centroid_spread_from_sums(counts, torch.ones(3, 2), sq)
    with pytest.raises(ValueError, match=r"sum_sq_norms must have shape \(4,\)"):
        centroid_spread_from_sums(counts, sums, torch.ones(3))
    with pytest.raises(ValueError, match=r"frequency_geometry min_count must be an integer ≥ 2"):
        frequency_geometry.FrequencyGeometryConfig(min_count=1)


# ------------------------------------------------------------------ frequency_geometry probe

_SITE = "blocks.0.hook_resid_post"


def _step_data(tokens, H, vocab, *, constant_site=False):
    """Capture of one synthetic step: the rows streamed into a site's statistics (type sums and a
    reservoir holding every row, no bins, so no curvature rows) and the stream's own frequency
    table.
    ``constant_site`` adds an embedding-like site where every occurrence of a type is one
    vector."""
    config = StatisticsConfig(
        gradients=False,
        n_bins=0,
        type_sums=True,
        vocab_size=vocab,
        reservoir_size=int(tokens.size),
    )
    sites = {_SITE: SiteStatistics(H.shape[1], config)}
    if constant_site:
        sites["hook_embed"] = SiteStatistics(4, config)
    row_ids = np.arange(tokens.size)
    for tok, rows, ids in zip(*(np.array_split(a, 5) for a in (tokens, H, row_ids)), strict=True):
        tok_t = torch.from_numpy(tok)
        sites[_SITE].update(torch.from_numpy(rows), None, tok_t, torch.from_numpy(ids))
        if constant_site:
            embed = torch.from_numpy(np.cos(np.outer(tok, np.arange(1, 5))))
            sites["hook_embed"].update(embed, None, tok_t, torch.from_numpy(ids))
    capture = CaptureStatistics(
        config=CaptureConfig(sites=tuple(sites), gradients=False),
        statistics=config,
        sites=sites,
    )
    layers = {_SITE: 0, "hook_embed": None}
    return Capture(
        suite="synthetic",
        step=100,
        tokens_seen=int(tokens.size),
        statistics=capture,
        layers={site: layers[site] for site in sites},
        seq_len=50,
        frequencies=FrequencyTable.from_tokens(tokens, vocab),
    )


def _probe_values(data, min_count=2):
    config = frequency_geometry.FrequencyGeometryConfig(min_count=min_count)
    out = frequency_geometry.rows(data, config)
    return {(r["site"], r["metric"]): r for r in out}


def test_probe_equal_spread_lies_inside_the_permutation_band_and_matches_brute_force():
    vocab = 3000
    tokens, H, _ = _zipf_stream(11, vocab=vocab, d=256)
    table = _probe_values(_step_data(tokens, H, vocab, constant_site=True))
    # brute force from the explicit rows: ddof = 1 scatter per type
    count, scatter = _sums_of_squares(tokens, H, vocab)
    keep = count >= 2
    lf = np.log(count[keep] / tokens.size)
    y = scatter[keep] / (count[keep] - 1)
    pearson = table[(_SITE, "freq_distance_pearson")]
    spearman = table[(_SITE, "freq_distance_spearman")]
    assert pearson["n_tokens"] == spearman["n_tokens"] == keep.sum() > 2000
    assert pearson["value"] == pytest.approx(pearsonr(lf, y)[0], abs=1e-9)
    assert spearman["value"] == pytest.approx(spearmanr(lf, y)[0], abs=1e-9)
    null_pearson, null_spearman = _permutation_null(lf, y, 11)
    p_lo, p_hi = _band(null_pearson, 0.95)
    s_lo, s_hi = _band(null_spearman, 0.99)
    assert p_lo < pearson["value"] < p_hi
    assert s_lo < spearman["value"] < s_hi
    assert {metric for _, metric in table} == {"freq_distance_pearson", "freq_distance_spearman"}
    assert {site for site, _ in table} == {_SITE}  # the constant site has no spread to correlate


def test_probe_planted_spread_gives_the_planted_negative_correlation():
    vocab, d = 3000, 256
    tokens, H, var = _zipf_stream(12, vocab=vocab, d=d, beta=0.3, tau=0.3)
    table = _probe_values(_step_data(tokens, H, vocab), min_count=5)
    count = np.bincount(tokens, minlength=vocab)
    keep = count >= 5
    lf = np.log(count[keep] / tokens.size)
    truth_pearson = pearsonr(lf, d * var[keep])[0]
    truth_spearman = spearmanr(lf, var[keep])[0]
    assert truth_pearson < -0.4 and truth_spearman < -0.4
    pearson = table[(_SITE, "freq_distance_pearson")]
    assert pearson["n_tokens"] == keep.sum()
    assert pearson["value"] == pytest.approx(truth_pearson, abs=0.03)
    assert table[(_SITE, "freq_distance_spearman")]["value"] == pytest.approx(
        truth_spearman, abs=0.03
    )


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
