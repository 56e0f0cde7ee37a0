"""Frequency–spread correlation (Bessel-corrected squared centroid distances from streamed sums:
brute-force reference, equal-spread null against a label-permutation band, planted effect, probe
level), curvature visibility and bootstrap intervals against brute force and known answers."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, rankdata, spearmanr

from tangentlens.capture import CaptureConfig, CaptureStatistics, StatisticsConfig, TypeSums
from tangentlens.capture.accumulators import SiteStatistics
from tangentlens.capture.captured import Capture
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

# ------------------------------------------------------------------ frequency and spread


def _zipf_stream(seed, *, vocab=3000, n=40_000, d=768, beta=0.0, tau=0.0, seq_len=None):
    """A stream of ``n`` tokens drawn with Zipf probabilities ``p_t ∝ 1/rank`` and, per occurrence,
    an isotropic Gaussian row around its type's random centroid with per-coordinate variance
    ``σ²_t = exp(−β (log p_t − mean log p) + τ z_t)``: β = τ = 0 is the equal-spread null,
    β > 0 plants spread shrinking with frequency. With ``seq_len``, occurrences sit at uniform
    positions and their variance is ``σ²_t / (pos + 1)`` (heteroscedastic, as causal context
    averaging makes it; drawn last, so the streams without it are unchanged). Returns tokens,
    rows and ``σ²_t``."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    tokens = rng.choice(vocab, size=n, p=p)
    var = np.exp(-beta * (np.log(p) - np.log(p).mean()) + tau * rng.normal(size=vocab))
    centres = rng.normal(size=(vocab, d)) * 3.0
    H = rng.standard_normal(size=(n, d))
    H *= np.sqrt(var)[tokens, None]
    if seq_len is not None:
        H /= np.sqrt(rng.integers(0, seq_len, size=n) + 1.0)[:, None]
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


def _step_data(tokens, H, vocab, *, constant_site=False, reservoir_size=None, type_ids=None):
    """Capture of one synthetic step: the rows streamed into a site's statistics (type sums of
    every type, or of ``type_ids``, and a reservoir holding every row — or a uniform sample of
    ``reservoir_size`` rows —, no bins, so no curvature rows) and the stream's own frequency
    table. ``constant_site`` adds an embedding-like site where every occurrence of a type is one
    vector."""
    config = StatisticsConfig(
        gradients=False,
        n_bins=0,
        type_sums=True,
        vocab_size=vocab,
        type_ids=type_ids,
        reservoir_size=int(tokens.size) if reservoir_size is None else reservoir_size,
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


def _probe_values(data, min_count=2, **settings):
    config = frequency_geometry.FrequencyGeometryConfig(min_count=min_count, **settings)
    out = frequency_geometry.rows(data, config)
    return {(r["site"], r["metric"]): r for r in out}


_NULL = (
    "freq_distance_spearman_null_mean",
    "freq_distance_spearman_null_std",
    "freq_distance_spearman_excess",
)


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
    # the Spearman's shuffle null (new rows; the two correlations are unchanged): homoscedastic
    # Gaussian occurrences at d = 256 leave the ranks a shift of ≈ +0.01, which the null carries
    null_mean, null_std, excess = (table[(_SITE, m)]["value"] for m in _NULL)
    assert excess == pytest.approx(spearman["value"] - null_mean, abs=1e-12)
    assert 0 < null_mean < 0.05 and abs(excess) < 3 * null_std
    assert null_std == pytest.approx(np.std(null_spearman), rel=0.5)  # a label-shuffle's spread
    assert {metric for _, metric in table} == {
        "freq_distance_pearson",
        "freq_distance_spearman",
        *_NULL,
        "freq_distance_pearson_null_mean",
        "freq_distance_pearson_null_std",
    }
    # equal spread: the Pearson lies inside its shuffle null's ±2 sd (null), the null centred
    pearson_null = table[(_SITE, "freq_distance_pearson_null_mean")]["value"]
    pearson_sd = table[(_SITE, "freq_distance_pearson_null_std")]["value"]
    assert abs(pearson_null) < 0.03 and abs(pearson["value"] - pearson_null) < 2 * pearson_sd
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
    # planted: the Pearson lies far beyond its shuffle null (the verdict's 2 null sd)
    pearson_null = table[(_SITE, "freq_distance_pearson_null_mean")]["value"]
    pearson_sd = table[(_SITE, "freq_distance_pearson_null_std")]["value"]
    assert pearson["value"] < pearson_null - 10 * pearson_sd
    # the null of these homoscedastic d = 256 clouds keeps a rank shift of ≈ +0.01 only: the
    # excess reads the planted Spearman, a little below it
    null_mean = table[(_SITE, "freq_distance_spearman_null_mean")]["value"]
    assert 0 < null_mean < 0.05
    assert table[(_SITE, "freq_distance_spearman_excess")]["value"] == pytest.approx(
        truth_spearman - null_mean, abs=0.03
    )


def test_probe_correlates_the_frequency_tables_log_frequency_not_the_captures_count():
    """The analysis corpus's frequency table, not the count in the capture stream: with a table
    whose frequencies are not proportional to the captured counts (a reversed ranking), the
    Pearson is the table's, a value the counts' differs from."""
    vocab = 3000
    tokens, H, _ = _zipf_stream(14, vocab=vocab, d=32, beta=0.3, tau=0.3)  # planted spread
    data = _step_data(tokens, H, vocab)
    count = np.bincount(tokens, minlength=vocab)
    other = np.repeat(np.arange(vocab), np.maximum(count[::-1], 1))  # the ranking reversed
    data = replace(data, frequencies=FrequencyTable.from_tokens(other, vocab))
    table = _probe_values(data, min_count=5, null_draws=0)
    keep = count >= 5
    count_sums, scatter = _sums_of_squares(tokens, H, vocab)
    spread = scatter[keep] / (count_sums[keep] - 1)
    table_lf = data.frequencies.log_frequency()[keep]
    want = pearsonr(table_lf, spread)[0]
    assert table[(_SITE, "freq_distance_pearson")]["value"] == pytest.approx(want, abs=1e-9)
    assert abs(want - pearsonr(np.log(count[keep]), spread)[0]) > 0.05


def _replayed_null(data, tokens, H, config):
    """The probe's shuffle null by brute force, from the explicit rows: numpy centroids, the
    reservoir's rows (as the float32 it stores) minus their centroid, ×√(n/(n − 1)); per
    replicate the same seeded index draws, type after type in id order, ``np.var(ddof=1)`` of
    each type's drawn rows and scipy's Spearman and Pearson. Returns the replicates' Spearman,
    the pool size and the replicates' Pearson."""
    from tangentlens.seeding import seeded_generator

    vocab = data.frequencies.vocab_size
    count = np.bincount(tokens, minlength=vocab)
    centroids = np.zeros((vocab, H.shape[1]))
    np.add.at(centroids, tokens, H)
    centroids /= np.maximum(count, 1)[:, None]
    kept = np.flatnonzero(count >= config.min_count)
    ids = data.statistics.sites[_SITE].reservoir.ids.numpy()
    ids = np.sort(ids)
    ids = ids[count[tokens[ids]] >= config.min_count]
    t = tokens[ids]
    stored = H[ids].astype(np.float32).astype(np.float64)
    pool = (stored - centroids[t]) * np.sqrt(count[t] / (count[t] - 1))[:, None]
    lf = np.log(count[kept] / tokens.size)
    n = count[kept]
    ends = np.cumsum(n)
    replicates, pearson = [], []
    for b in range(config.null_draws):
        generator = seeded_generator(config.seed, data.step, data.layers[_SITE] + 1, b)
        index = torch.randint(len(pool), (int(n.sum()),), generator=generator).numpy()
        spread = [
            np.var(pool[index[hi - m : hi]], axis=0, ddof=1).sum()
            for m, hi in zip(n, ends, strict=True)
        ]
        replicates.append(spearmanr(lf, spread)[0])
        pearson.append(pearsonr(lf, spread)[0])
    return np.array(replicates), len(pool), np.array(pearson)


def test_probe_shuffle_null_replays_by_brute_force():
    """Heteroscedastic occurrences, a 4096-row reservoir sample: the null rows equal a brute-force
    replay of the same null with the same seeds (mean, std with ddof 1, excess)."""
    vocab = 3000
    tokens, H, _ = _zipf_stream(13, vocab=vocab, d=24, seq_len=128)
    data = _step_data(tokens, H, vocab, reservoir_size=4096)
    config = frequency_geometry.FrequencyGeometryConfig(min_count=5, null_draws=12, seed=3)
    out = frequency_geometry.rows(data, config)
    table = {r["metric"]: r for r in out}
    replicates, pool, pearson = _replayed_null(data, tokens, H, config)
    assert 3000 < pool < 4096  # the sample's rows of types seen ≥ 5 times
    # the headline Pearson's null, from the same replicates (issue 33)
    null_pearson = table["freq_distance_pearson_null_mean"]["value"]
    assert null_pearson == pytest.approx(pearson.mean(), abs=1e-9)
    assert table["freq_distance_pearson_null_std"]["value"] == pytest.approx(
        np.std(pearson, ddof=1), abs=1e-9
    )
    assert table[_NULL[0]]["value"] == pytest.approx(replicates.mean(), abs=1e-9)
    assert table[_NULL[1]]["value"] == pytest.approx(np.std(replicates, ddof=1), abs=1e-9)
    observed = table["freq_distance_spearman"]["value"]
    assert table[_NULL[2]]["value"] == pytest.approx(observed - replicates.mean(), abs=1e-9)
    assert observed > 0.15  # heteroscedastic occurrences: the raw ranks' bias…
    assert abs(table[_NULL[2]]["value"]) < 2.5 * table[_NULL[1]]["value"]  # …and the null's
    assert abs(table["freq_distance_pearson"]["value"]) < 0.06
    assert {r["n_tokens"] for r in out} == {int((np.bincount(tokens) >= 5).sum())}
    again = frequency_geometry.rows(data, config)
    assert again == out  # seeded: the same rows
    other = {
        r["metric"]: r["value"] for r in frequency_geometry.rows(data, replace(config, seed=4))
    }
    assert other[_NULL[0]] != table[_NULL[0]]["value"]
    assert other["freq_distance_pearson"] == table["freq_distance_pearson"]["value"]


def _direct_null_mean(tokens, var, *, d, seq_len, min_count, reps, seed):
    """The null's population version, simulated directly: every type seen ≥ ``min_count`` times
    gets its ``n_t`` occurrences afresh from the stream's pooled residual distribution — a source
    token drawn from the stream, a uniform position, Gaussian noise of variance
    ``σ²_source / (pos + 1)`` — and the Spearman of log-frequency with their Bessel spread, averaged
    over ``reps`` replicates."""
    rng = np.random.default_rng(seed)
    count = np.bincount(tokens, minlength=var.size)
    kept = np.flatnonzero(count >= min_count)
    n = count[kept]
    label = np.repeat(np.arange(kept.size), n)
    rhos = []
    for _ in range(reps):
        source = tokens[rng.integers(0, tokens.size, size=label.size)]
        scale = var[source] / (rng.integers(0, seq_len, size=label.size) + 1)
        X = rng.standard_normal((label.size, d)) * np.sqrt(scale)[:, None]
        S = np.zeros((kept.size, d))
        np.add.at(S, label, X)
        Q = np.bincount(label, weights=(X**2).sum(axis=1), minlength=kept.size)
        rhos.append(spearmanr(np.log(n), (Q - (S**2).sum(axis=1) / n) / (n - 1))[0])
    return float(np.mean(rhos))


@pytest.mark.parametrize(("beta", "tolerance"), [(0.0, 0.03), (0.5, 0.045)])
def test_probe_null_mean_matches_a_direct_simulation_of_the_null(beta, tolerance):
    """The probe's null mean (sampled residual pool, rescaled) against fresh occurrences from the
    pooled residual distribution itself (2 seeds, d = 32, heteroscedastic). Equal spread: they
    agree (here +0.232 against +0.225; over 20 seeds +0.228 against +0.227, sd of the difference
    0.014). Spread ∝ f^−0.5 (a pool that mixes types of different spreads): the pool's residuals
    of rare, wide types average over few occurrences, so their tails are a little light and the
    null mean reads lower (here +0.216 against +0.232; 20 seeds +0.217 against +0.234, sd 0.021)
    — the approximation the module docstring states. Without the centroid subtraction the pool
    would hold the centroids' spread and the null mean would read −0.01."""
    vocab, d, seq_len = 3000, 32, 128
    probe, direct = [], []
    for seed in (21, 22):
        tokens, H, var = _zipf_stream(seed, vocab=vocab, d=d, beta=beta, seq_len=seq_len)
        data = _step_data(tokens, H, vocab, reservoir_size=4096)
        table = _probe_values(data, min_count=5, null_draws=30)
        probe.append(table[(_SITE, _NULL[0])]["value"])
        direct.append(
            _direct_null_mean(tokens, var, d=d, seq_len=seq_len, min_count=5, reps=30, seed=seed)
        )
    assert 0.18 < np.mean(direct) < 0.28
    assert np.mean(probe) == pytest.approx(np.mean(direct), abs=tolerance)


def test_probe_null_is_the_same_when_only_the_frequent_types_are_tracked():
    """The sweep keeps type sums of the types seen ≥ min_count times only (``tracked_types``):
    every row, the null's included, equals the rows of sums over the whole vocabulary."""
    vocab = 3000
    tokens, H, _ = _zipf_stream(15, vocab=vocab, d=16, seq_len=64)
    config = frequency_geometry.FrequencyGeometryConfig(min_count=5, null_draws=8)
    full = frequency_geometry.rows(_step_data(tokens, H, vocab, reservoir_size=2048), config)
    ids = frequency_geometry.tracked_types(config, np.bincount(tokens, minlength=vocab))
    subset = _step_data(tokens, H, vocab, reservoir_size=2048, type_ids=tuple(ids.tolist()))
    assert len(full) == 7 and frequency_geometry.rows(subset, config) == full


def test_probe_omits_the_null_rows_without_enough_sampled_residuals():
    """No reservoir, fewer than max(2d, 256) sampled rows of correlated types, or null_draws = 0:
    the two correlations alone, with the same values."""
    vocab = 3000
    tokens, H, _ = _zipf_stream(14, vocab=vocab, d=16, seq_len=64)
    full = _probe_values(_step_data(tokens, H, vocab, reservoir_size=2048), min_count=5)
    assert set(_NULL) <= {metric for _, metric in full}
    cases = [
        _probe_values(_step_data(tokens, H, vocab, reservoir_size=240), min_count=5),
        _probe_values(_step_data(tokens, H, vocab, reservoir_size=2048), 5, null_draws=0),
    ]
    no_reservoir = _step_data(tokens, H, vocab, reservoir_size=0)
    cases.append(_probe_values(no_reservoir, min_count=5))
    for table in cases:
        assert {metric for _, metric in table} == {
            "freq_distance_pearson",
            "freq_distance_spearman",
        }
        for metric in ("freq_distance_pearson", "freq_distance_spearman"):
            assert table[(_SITE, metric)]["value"] == full[(_SITE, metric)]["value"]


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
