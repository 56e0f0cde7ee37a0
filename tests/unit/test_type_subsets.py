"""Per-type sums over only the types a probe reads give the same results as sums over the whole
vocabulary: frequency_geometry's correlations and update_alignment's tracked centroids."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tangentlens.capture import CaptureConfig, CaptureStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture
from tangentlens.data import FrequencyTable
from tangentlens.probes import frequency_geometry, update_alignment

SITE = "blocks.0.hook_resid_post"


def _stream(seed: int, vocab: int = 400, n: int = 6000, d: int = 16):
    """Zipf tokens and rows around per-type centres with frequency-dependent spread."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    tokens = rng.choice(vocab, size=n, p=p)
    scale = np.exp(0.3 * np.log(p / p.mean()))[tokens, None]
    rows = rng.normal(size=(vocab, d))[tokens] * 3 + rng.normal(size=(n, d)) * scale
    return tokens, rows


def _captured(tokens, rows, vocab, type_ids):
    """Capture statistics of one site holding per-type sums of ``type_ids`` (None = all)."""
    config = StatisticsConfig(
        gradients=False, type_sums=True, vocab_size=vocab, type_ids=type_ids, reservoir_size=0
    )
    site = SiteStatistics(rows.shape[1], config)
    for tok, x in zip(np.array_split(tokens, 4), np.array_split(rows, 4), strict=True):
        site.update(torch.from_numpy(x), None, torch.from_numpy(tok), torch.arange(len(tok)))
    return CaptureStatistics(
        config=CaptureConfig(sites=(SITE,), gradients=False), statistics=config, sites={SITE: site}
    )


@pytest.mark.parametrize("min_count", [2, 5, 40])
def test_frequency_geometry_rows_unchanged_by_tracking_only_frequent_types(min_count):
    vocab = 400
    tokens, rows = _stream(0, vocab)
    # the frequency table counts the whole analysis data; the capture sees part of it
    frequencies = FrequencyTable.from_tokens(tokens, vocab)
    part = slice(0, 4500)
    config = frequency_geometry.FrequencyGeometryConfig(min_count=min_count)
    ids = frequency_geometry.tracked_types(config, frequencies.counts)
    assert 0 < len(ids) < vocab
    results = []
    for type_ids in (None, tuple(ids.tolist())):
        stats = _captured(tokens[part], rows[part], vocab, type_ids)
        data = Capture("synthetic", 1, 0, stats, {SITE: 0}, 50, frequencies)
        results.append(frequency_geometry.rows(data, config))
    full, tracked = results
    assert len(full) == 2 and full == tracked  # identical rows, values included


def test_tracked_centroids_unchanged_by_tracking_only_their_types():
    from tangentlens.probes.update_alignment import _tracked_centroids

    vocab, centroid_types = 400, 50
    tokens, rows = _stream(1, vocab)
    frequencies = FrequencyTable.from_tokens(tokens, vocab)
    data = SimpleNamespace(frequencies=frequencies)
    full = _captured(tokens[:3000], rows[:3000], vocab, None)
    config = update_alignment.UpdateAlignmentConfig(centroid_types=centroid_types)
    ids = update_alignment.tracked_types(config, frequencies.counts)
    extra = frequency_geometry.tracked_types(
        frequency_geometry.FrequencyGeometryConfig(min_count=30), frequencies.counts
    )
    union = tuple(np.union1d(ids, extra).tolist())  # what the sweep tracks for both probes
    subset = _captured(tokens[:3000], rows[:3000], vocab, union)
    # reference: the former computation on sums over the whole vocabulary
    counts = torch.from_numpy(frequencies.counts)
    tracked = torch.argsort(counts, descending=True, stable=True)[:centroid_types]
    tracked = tracked[counts[tracked] > 0]
    sums = full.sites[SITE].types
    seen = tracked[sums.count[tracked] > 0]
    expected = sums.sum[seen].double() / sums.count[seen, None]
    for stats in (full, subset):
        got_ids, got = _tracked_centroids(stats, data.frequencies.counts, config)[SITE]
        assert torch.equal(got_ids, seen) and torch.equal(got, expected)
