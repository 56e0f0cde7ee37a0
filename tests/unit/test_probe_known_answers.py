"""Probes on planted data whose values are known in closed form: each test fails when the probe
scores a random subspace instead of the proxy, or when a metric it reports is broken (IsoScore
replaced by 1 − IsoScore, TwoNN doubled, attention entropy halved)."""

import math
from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture import AttentionStatistics, SiteStatistics, StatisticsConfig
from tangentlens.capture.captured import Capture
from tangentlens.probes import qk_drift, shape_of_learning, tangent_energy

D, K = 32, 4


def _step(sites: dict, attention: dict | None = None) -> Capture:
    statistics = SimpleNamespace(sites=sites, attention=attention or {})
    layers = {name: i for i, name in enumerate(sites)}
    return Capture("s", 7, 70, statistics, layers, seq_len=16)


def _gradient_site(share: float, proxy: torch.Tensor, n: int, gen: torch.Generator):
    """Gradients holding exactly ``share`` of their energy in ``span(proxy)``."""
    g = torch.randn(n, D, generator=gen, dtype=torch.float64)
    inside, outside = g @ proxy @ proxy.T, g - g @ proxy @ proxy.T
    a = math.sqrt(share / float(inside.pow(2).sum()))
    b = math.sqrt((1 - share) / float(outside.pow(2).sum()))
    g = a * inside + b * outside
    site = SiteStatistics(D, StatisticsConfig(gradients=True, reservoir_size=0))
    site.update(
        torch.randn(n, D, generator=gen), g, torch.zeros(n, dtype=torch.long), torch.arange(n)
    )
    return site


def test_tangent_energy_recovers_a_planted_share_and_reads_chance_for_a_random_subspace():
    gen = torch.Generator().manual_seed(0)
    proxy = torch.linalg.qr(torch.randn(D, K, generator=gen, dtype=torch.float64))[0]
    site = _gradient_site(0.6, proxy, 4000, gen)
    config = tangent_energy.TangentEnergyConfig(bootstrap=0)
    random = torch.linalg.qr(torch.randn(D, K, generator=gen, dtype=torch.float64))[0]
    rows = tangent_energy.rows(
        _step({"b.0": site}), {"b.0": {"proxy": proxy, "random": random}}, config, draws=99
    )
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert got[("proxy", "energy_fraction")] == pytest.approx(0.6, rel=1e-10)
    # no m̂ among the proxies: the exchangeable (headline) frames are Haar in ℝ^d, mean k/d
    assert got[("proxy", "energy_null_mean")] == pytest.approx(K / D, rel=1e-10)
    assert got[("proxy", "energy_control_mean")] == pytest.approx(K / D, rel=0.1)
    assert got[("proxy", "energy_ratio")] == pytest.approx(0.6 / (K / D), rel=1e-10)
    null = K / (D - K) * 0.4  # complement frames share the other 40 %
    assert got[("proxy", "energy_complement_null_mean")] == pytest.approx(null, rel=1e-10)
    assert got[("proxy", "energy_complement_control_mean")] == pytest.approx(null, rel=0.1)
    assert got[("proxy", "energy_complement_ratio")] == pytest.approx(0.6 / null, rel=1e-10)
    assert got[("proxy", "energy_complement_p_value")] == pytest.approx(1 / 100)
    assert got[("proxy", "energy_enrichment")] == pytest.approx(0.6 / (K / D))
    assert got[("proxy", "energy_p_value")] == pytest.approx(1 / 100)
    # a random k-frame holds its chance share of what the proxy leaves: ≈ 0.4 k/(d − k) … plus
    # its overlap with the proxy; it must not look enriched
    assert got[("random", "energy_p_value")] > 0.05
    assert got[("random", "energy_ratio")] == pytest.approx(1.0, abs=0.5)
    assert got[("random", "energy_fraction")] < 0.3


def _activation_site(points: torch.Tensor, sample: torch.Tensor):
    site = SiteStatistics(points.shape[1], StatisticsConfig(gradients=False, reservoir_size=0))
    n = points.shape[0]
    site.update(points, None, torch.zeros(n, dtype=torch.long), torch.arange(n))
    site.reservoir = SimpleNamespace(columns=lambda: {"H": sample})
    return site


def test_shape_of_learning_known_answers():
    gen = torch.Generator().manual_seed(1)
    scales = torch.tensor([3.0] + [1.0] * (D - 1), dtype=torch.float64)
    planted = torch.randn(40_000, D, generator=gen, dtype=torch.float64) * scales
    isotropic = torch.randn(40_000, D, generator=gen, dtype=torch.float64)
    # a 4-dimensional Gaussian cloud embedded in D dimensions: TwoNN ≈ 4
    embed = torch.linalg.qr(torch.randn(D, 4, generator=gen, dtype=torch.float64))[0]
    manifold = (torch.randn(4096, 4, generator=gen, dtype=torch.float64) @ embed.T).float()
    sites = {
        "b.0": _activation_site(planted, manifold),
        "b.1": _activation_site(isotropic, manifold),
    }
    config = shape_of_learning.ShapeOfLearningConfig(twonn_fit="facco", twonn_batch=4096)
    got = {
        (r["site"], r["metric"]): r["value"] for r in shape_of_learning.rows(_step(sites), config)
    }
    # σ₁²/Σσ² of the planted spectrum: 9 / (9 + 31) (sampling error ~1 %)
    assert got[("b.0", "centred_anisotropy")] == pytest.approx(9 / 40, rel=0.03)
    assert got[("b.1", "centred_anisotropy")] == pytest.approx(1 / D, rel=0.1)
    assert got[("b.1", "isoscore")] == pytest.approx(1.0, abs=0.01)  # isotropic
    assert got[("b.0", "isoscore")] < 0.95
    assert got[("b.0", "twonn_dimension")] == pytest.approx(4.0, rel=0.1)


def test_qk_drift_known_answers():
    n_heads, d_head, batch, n = 2, 4, 3, 6
    # uniform causal attention: query i spreads over i + 1 keys, entropy log(i + 1)
    causal = torch.tril(torch.ones(n, n, dtype=torch.float64))
    pattern = (causal / causal.sum(dim=1, keepdim=True)).expand(batch, n_heads, n, n)
    q = torch.zeros(batch, n, n_heads, d_head, dtype=torch.float64)
    k = torch.zeros_like(q)
    q[..., 0, 0], k[..., 0, 0] = 2.0, 3.0  # head 0: parallel means
    q[..., 1, 0], k[..., 1, 1] = 1.0, 5.0  # head 1: orthogonal means
    keep = torch.ones(batch, n, dtype=torch.bool)
    keep[:, 0] = False  # position 0 is excluded
    stats = AttentionStatistics(n_heads, d_head)
    for kind, tensor in (("q", q), ("k", k), ("pattern", pattern)):
        stats.update(kind, tensor, keep)
    rows = qk_drift.rows(_step({}, {0: stats}), qk_drift.QKDriftConfig())
    got = {(r["method"], r["metric"]): r["value"] for r in rows}
    entropy = sum(math.log(i + 1) for i in range(1, n)) / (n - 1)
    for head in ("head0", "head1"):
        assert got[(head, "attention_entropy")] == pytest.approx(entropy, rel=1e-12)
    assert got[("head0", "qk_query_norm")] == pytest.approx(2.0)
    assert got[("head0", "qk_key_norm")] == pytest.approx(3.0)
    assert got[("head0", "qk_cosine")] == pytest.approx(1.0)
    assert got[("head0", "qk_mean_logit")] == pytest.approx(6.0 / 2.0)  # ⟨m_Q, m_K⟩ / √4
    assert got[("head1", "qk_cosine")] == pytest.approx(0.0, abs=1e-12)
