"""The capture's accessors: a site by kind and layer, its activations' and gradients' moments
over every kept token or one frequency bin — the statistics the probes read, by names that
say what they are."""

from __future__ import annotations

import pytest
import torch

from tangentlens.capture import CaptureConfig, CaptureStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture

SITES = {"hook_embed": None, "blocks.0.hook_resid_post": 0, "blocks.1.hook_resid_post": 1}
D, N, BINS = 5, 40, 3


def _capture(gradients: bool = True) -> tuple[Capture, dict[str, tuple]]:
    gen = torch.Generator().manual_seed(0)
    config = StatisticsConfig(gradients=gradients, n_bins=BINS, reservoir_size=0)
    sites, data = {}, {}
    for i, name in enumerate(SITES):
        h = torch.randn(N, D, generator=gen, dtype=torch.float64) + i
        g = torch.randn(N, D, generator=gen, dtype=torch.float64) * (i + 1)
        bins = torch.arange(N) % BINS
        site = SiteStatistics(D, config, site=name)
        site.update(h, g if gradients else None, torch.arange(N), torch.arange(N), bins)
        sites[name], data[name] = site, (h, g, bins)
    stats = CaptureStatistics(CaptureConfig(sites=tuple(SITES)), config, sites)
    return Capture("simulated", 7, 0, stats, dict(SITES), 8), data


def test_sites_by_kind_and_layer_and_their_moments_by_bin():
    capture, data = _capture()
    assert capture.site("resid_post", 0) == "blocks.0.hook_resid_post"
    assert capture.site("resid_post", 1) == "blocks.1.hook_resid_post"
    assert capture.site("embed") == "hook_embed"
    h, g, bins = data["blocks.1.hook_resid_post"]
    act = capture.activations("resid_post", layer=1)
    assert act is capture.statistics.sites["blocks.1.hook_resid_post"].h
    assert act.count == N and float(act.sum_sq_norms) == pytest.approx(float((h * h).sum()))
    grad = capture.gradients("resid_post", layer=1, freq_bin=2)
    rows = g[bins == 2]
    assert grad.count == len(rows) == 13
    assert float(grad.sum_sq_norms) == pytest.approx(float((rows * rows).sum()), rel=1e-12)
    torch.testing.assert_close(grad.sum, rows.sum(0))
    e_h, _, e_bins = data["hook_embed"]
    first = capture.activations("embed", freq_bin=0)
    torch.testing.assert_close(first.sum, e_h[e_bins == 0].sum(0))


def test_what_was_not_captured_is_refused_naming_what_was():
    capture, _ = _capture()
    with pytest.raises(KeyError, match=r"no 'resid_post' site at layer 5 in this capture; "):
        capture.activations("resid_post", 5)
    with pytest.raises(KeyError, match=r"captured: embed@None, resid_post@0, resid_post@1"):
        capture.site("mlp_out", 0)
    with pytest.raises(ValueError, match=r"freq_bin must be in 0\.\.2 .*got 3"):
        capture.gradients("resid_post", 0, freq_bin=3)
    without, _ = _capture(gradients=False)
    with pytest.raises(ValueError, match="this capture kept no gradients"):
        without.gradients("resid_post", 0)
