"""The frequency-geometry probe's curvature rows and row labels against an independent
recomputation: the distinct sampled rows, their k-nearest-neighbour patches pooled per anchor
bin (anchors without a bin left out), one row per bin with its anchor count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tangentlens.capture import CaptureConfig, CaptureStatistics, StatisticsConfig
from tangentlens.capture.accumulators import SiteStatistics
from tangentlens.capture.captured import Capture
from tangentlens.data import FrequencyTable
from tangentlens.metrics import local_spectra, pooled_visibility
from tangentlens.metrics.twonn import remove_duplicate_rows
from tangentlens.probes import frequency_geometry

D, VOCAB, N, N_BINS, STEP = 6, 40, 600, 3, 9
SITES = {"hook_embed": None, "blocks.0.hook_resid_post": 0, "blocks.1.hook_resid_post": 1}
CONFIG = frequency_geometry.FrequencyGeometryConfig(
    min_count=2, k=12, tangent_dim=9, n_anchors=150, seed=5, null_draws=0
)


def _site(seed: int, *, activations_only: bool = False):
    """A curved 2-d sheet in D dimensions (so the patches have curvature), 30 exact duplicate
    rows, tokens, and bins with some positions unbinned (−1)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(N, 2, generator=gen, dtype=torch.float64) * 4 - 2
    sheet = torch.stack([u[:, 0], u[:, 1], u[:, 0] ** 2, u[:, 0] * u[:, 1], u[:, 1] ** 2], 1)
    h = torch.cat([sheet, 0.01 * torch.randn(N, 1, generator=gen, dtype=torch.float64)], 1)
    h[-30:] = h[:30]  # repeated vectors have no patch
    tokens = torch.randint(0, VOCAB, (N,), generator=gen)
    bins = torch.randint(-1, N_BINS, (N,), generator=gen)
    stats = StatisticsConfig(
        gradients=False, n_bins=N_BINS, reservoir_size=N, type_sums=True, vocab_size=VOCAB
    )
    site = SiteStatistics(D, stats)
    site.update(h, None, tokens, torch.arange(N), bins.clamp(min=0))
    site.reservoir._columns["bin"][: len(site.reservoir)] = bins  # the unbinned positions
    return site, stats


@pytest.fixture
def rows():
    sites = {}
    for i, name in enumerate(SITES):
        sites[name], stats = _site(i)
    counts = np.bincount(np.random.default_rng(0).integers(0, VOCAB, 5000), minlength=VOCAB)
    capture = CaptureStatistics(
        config=CaptureConfig(sites=tuple(SITES), gradients=False), statistics=stats, sites=sites
    )
    data = Capture("planted", STEP, 0, capture, SITES, 16, FrequencyTable(counts))
    return data, frequency_geometry.rows(data, CONFIG)


def test_curvature_visibility_rows_equal_a_recomputation(rows):
    data, out = rows
    got = {(r["site"], r["freq_bin"]): r for r in out if r["metric"] == "curvature_visibility"}
    assert {site for site, _ in got} == set(SITES)
    for site in SITES:
        sample = data.statistics.sites[site].reservoir.columns()
        first = remove_duplicate_rows(sample["H"])
        points = sample["H"][first]
        assert points.shape[0] == N - 30
        spectra = local_spectra(points, k=12, tangent_dim=D - 1, n_anchors=150, seed=5)
        anchor_bins = sample["bin"][first][spectra.anchors]
        binned = anchor_bins >= 0
        assert 0 < int(binned.sum()) < len(binned)  # some anchors have no bin
        kept = type(spectra)(
            spectra.anchors[binned], spectra.inside[binned], spectra.outside[binned]
        )
        expected = pooled_visibility(kept, anchor_bins[binned], N_BINS)
        for b in range(N_BINS):
            row = got[(site, str(b))]
            assert row["value"] == pytest.approx(float(expected[b]), rel=1e-12)
            assert row["n_tokens"] == int((anchor_bins == b).sum()) > 0
            assert row["probe"] == "frequency_geometry" and row["layer"] == SITES[site]
            assert row["method"] == "-" and row["step"] == STEP
        assert float(expected.min()) > 0 and math.isfinite(float(expected.max()))


def test_correlation_rows_are_labelled_with_the_probe_and_site(rows):
    _, out = rows
    names = {"freq_distance_pearson", "freq_distance_spearman"}
    labelled = [r for r in out if r["metric"] in names]
    assert len(labelled) == 2 * len(SITES)
    assert all(r["probe"] == "frequency_geometry" and r["site"] in SITES for r in labelled)


def test_the_null_seed_key_counts_the_embedding_as_layer_zero():
    config = frequency_geometry.FrequencyGeometryConfig(seed=3)
    assert frequency_geometry.null_seed_key(config, 7, None) == (3, 7, 0)
    assert frequency_geometry.null_seed_key(config, 7, 0) == (3, 7, 1)
    assert frequency_geometry.null_seed_key(config, 7, 4) == (3, 7, 5)
