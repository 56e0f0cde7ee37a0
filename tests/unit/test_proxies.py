"""Proxy fitting on planted activations: per-checkpoint centring before pooling, methods on the
same centred data, the mean direction as its own proxy, fit diagnostics."""

from types import SimpleNamespace

import pytest
import torch

from tangentlens.capture import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.metrics import principal_angles
from tangentlens.proxies import (
    MEAN_DIRECTION,
    ActivationPool,
    ProxyConfig,
    fit_rows,
)
from tangentlens.registry import FIT_PROBE

D, K = 24, 3


def _checkpoint(mean: torch.Tensor, basis: torch.Tensor, n: int, gen: torch.Generator):
    """Rows ``mean + Z basisᵀ`` (variance in span(basis)) plus a little isotropic noise."""
    x = mean + torch.randn(n, K, generator=gen, dtype=torch.float64) * 2 @ basis.T
    x = x + 0.05 * torch.randn(n, D, generator=gen, dtype=torch.float64)
    acc = MomentAccumulator(D)
    acc.update(x)
    return acc, x


def _window(gen):
    """Two checkpoints whose means differ by 30 along e0 (the drift between checkpoints), with
    their variance in a planted K-dim span orthogonal to e0."""
    e = torch.eye(D, dtype=torch.float64)
    span = e[:, 1 : K + 1]
    return span, [_checkpoint(e[0] * shift, span, 800, gen) for shift in (5.0, 35.0)]


def test_window_pooling_centres_each_checkpoint():
    gen = torch.Generator().manual_seed(0)
    span, parts = _window(gen)
    pool = ActivationPool()
    for acc, x in parts:
        pool.add(acc, x)
    fitted = pool.fit(ProxyConfig(methods=("pca", "seminmf"), rank=K, seed=0))
    for method in ("pca", "seminmf"):
        # the planted span, not the drift between checkpoints (max angle to it: a few degrees)
        assert float(principal_angles(fitted.bases[method], span).max()) < 0.05
    drift = torch.eye(D, dtype=torch.float64)[:, :1]
    assert fitted.bases[MEAN_DIRECTION].shape == (D, 1)
    assert float(principal_angles(fitted.bases[MEAN_DIRECTION], drift)[0]) < 0.01
    # uncentred, the pooled moments turn the drift into "variance": PCA's top direction is e0
    raw = ActivationPool()
    for acc, x in parts:
        raw.add(acc, x)
    uncentred = raw.fit(ProxyConfig(methods=("pca",), rank=K, centre=False, mean_direction=False))
    assert float(uncentred.bases["pca"][:, 0].abs()[0]) > 0.99


def test_fit_diagnostics_and_explained_variance_rows():
    gen = torch.Generator().manual_seed(1)
    span, parts = _window(gen)
    acc, x = parts[0]
    pool = ActivationPool()
    pool.add(acc, x)
    fitted = pool.fit(ProxyConfig(methods=("pca", "seminmf"), rank=K, mean_direction=False))
    assert fitted.diagnostics["pca"]["pca_explained_variance"] == pytest.approx(
        float(torch.linalg.eigvalsh(torch.cov(x.T)).flip(0)[:K].sum() / torch.cov(x.T).trace()),
        rel=1e-9,
    )
    nmf = fitted.diagnostics["seminmf"]
    sigma = torch.linalg.svdvals(x - x.mean(dim=0))  # the fit sees the centred rows
    bound = float((sigma[K:].pow(2).sum() / sigma.pow(2).sum()).sqrt())
    assert nmf["seminmf_svd_bound"] == pytest.approx(bound, rel=1e-6)
    # non-negative codes span a cone: on centred data K atoms fit a K-dim cloud far worse than
    # the SVD at the same rank, which is what this diagnostic is there to show
    assert nmf["seminmf_relative_error"] > 2 * bound
    assert nmf["seminmf_converged"] in (0.0, 1.0)
    site = SimpleNamespace(h=acc)
    data = Capture("s", 3, 0, SimpleNamespace(sites={"b.0": site}), {"b.0": 0}, seq_len=4)
    e = torch.eye(D, dtype=torch.float64)
    proxies = {"b.0": {"planted": span, "elsewhere": e[:, K + 1 : 2 * K + 1]}}
    rows = {
        (r["method"], r["metric"]): r["value"]
        for r in fit_rows(data, proxies, {"b.0": fitted.diagnostics})
    }
    cov = torch.cov(x.T)
    planted = float(torch.trace(span.T @ cov @ span) / torch.trace(cov))
    assert rows[("planted", "explained_variance")] == pytest.approx(planted, rel=1e-9)
    assert planted > 0.98  # the planted variance, 12 of 12.1
    assert rows[("elsewhere", "explained_variance")] < 0.01
    assert {r["probe"] for r in fit_rows(data, proxies, {})} == {FIT_PROBE}


def test_pool_bad_input():
    with pytest.raises(ValueError, match="no checkpoint"):
        ActivationPool().fit(ProxyConfig())
    acc = MomentAccumulator(D)
    acc.update(torch.ones(3, D))
    pool = ActivationPool()
    pool.add(acc, None)
    with pytest.raises(ValueError, match="need sampled activation rows"):
        pool.fit(ProxyConfig(methods=("seminmf",)))


def test_sae_fit_reports_explained_variance_and_l0():
    gen = torch.Generator().manual_seed(2)
    _, parts = _window(gen)
    pool = ActivationPool()
    pool.add(*parts[0])
    config = ProxyConfig(methods=("sae",), rank=K, sae_k=2, sae_samples=1600, mean_direction=False)
    fitted = pool.fit(config)
    assert set(fitted.diagnostics["sae"]) == {"sae_explained_variance", "sae_l0"}
    assert 0 < fitted.diagnostics["sae"]["sae_l0"] <= 2  # TopK keeps at most k latents
    assert fitted.bases["sae"].shape == (D, K)


def test_mean_direction_is_projected_out_of_every_proxy():
    gen = torch.Generator().manual_seed(3)
    e = torch.eye(D, dtype=torch.float64)
    span = e[:, 1 : K + 1]
    # the mean lies along e1, one of the planted variance directions: PCA's span holds m̂
    acc, x = _checkpoint(10 * e[1], span, 800, gen)
    pool = ActivationPool()
    pool.add(acc, x)
    fitted = pool.fit(ProxyConfig(methods=("pca",), rank=K))
    m = fitted.bases[MEAN_DIRECTION][:, 0]
    assert fitted.diagnostics["pca"]["mean_direction_overlap"] == pytest.approx(1.0, abs=1e-3)
    pca = fitted.bases["pca"]
    assert float((pca.T @ m).abs().max()) < 1e-10  # orthogonal to m̂
    # what is left of the planted span once m̂ is out: e2, e3 (the near-m̂ residual direction
    # is kept at the same rank, orthonormalised)
    assert pca.shape == (D, K)
    assert float(principal_angles(pca[:, :2], span[:, 1:]).max()) < 0.05
    # a proxy orthogonal to m̂ keeps its span
    _, parts = _window(gen)
    pool = ActivationPool()
    pool.add(*parts[0])
    fitted = pool.fit(ProxyConfig(methods=("pca",), rank=K))
    assert fitted.diagnostics["pca"]["mean_direction_overlap"] < 1e-3
    assert float(principal_angles(fitted.bases["pca"], span).max()) < 0.05


def _collapsing_at(seeds: set[int]):
    """A semi-NMF whose fits at ``seeds`` span one dimension less than their rank (its codes
    died), as a collapse reads to the pool."""
    from tangentlens.dictionaries import SemiNMF

    class Collapsing(SemiNMF):
        @property
        def effective_rank_(self) -> int:
            return self.rank - 1 if self.seed in seeds else super().effective_rank_

        def basis(self):
            if self.seed in seeds:
                raise ValueError(f"the semi-NMF directions span only {self.rank - 1} dimensions")
            return super().basis()

    return Collapsing


@pytest.mark.parametrize(("dead", "restarts"), [(set(), None), ({0}, 1.0), ({0, 1}, 2.0)])
def test_a_collapsed_semi_nmf_is_fitted_again_from_the_next_seed(monkeypatch, dead, restarts):
    """A fit whose codes died is fitted again from the next seed, at most twice, and says so
    (``seminmf_restarts``); a fit that did not collapse has no such row; the basis is the
    restarted fit's."""
    import tangentlens.proxies as proxies

    gen = torch.Generator().manual_seed(4)
    _, parts = _window(gen)
    acc, x = parts[0]
    config = ProxyConfig(methods=("seminmf",), rank=K, mean_direction=False)
    monkeypatch.setattr(proxies, "SemiNMF", _collapsing_at(dead))
    pool = ActivationPool()
    pool.add(acc, x)
    fitted = pool.fit(config)
    assert fitted.diagnostics["seminmf"].get("seminmf_restarts") == restarts
    seed = max(dead, default=-1) + 1
    direct = proxies.SemiNMF(K, seed=seed).fit(x - x.mean(0)).basis()
    assert torch.equal(fitted.bases["seminmf"], direct)


def test_a_fit_collapsed_from_every_seed_says_so(monkeypatch):
    import tangentlens.proxies as proxies

    gen = torch.Generator().manual_seed(4)
    _, parts = _window(gen)
    acc, x = parts[0]
    monkeypatch.setattr(proxies, "SemiNMF", _collapsing_at({0, 1, 2}))
    pool = ActivationPool()
    pool.add(acc, x)
    with pytest.raises(ValueError, match="span only 2 dimensions"):
        pool.fit(ProxyConfig(methods=("seminmf",), rank=K, mean_direction=False))
