"""The headline energy is null whatever m̂'s error (issue 42, item 1; METHODS.md §1.3): 1500
fixed-seed trials at each ρ = ‖μ‖/√tr Σ_H in {0.3, 1, 3, 30}, through the project's own
``ActivationPool.fit`` (PCA on the centred activations, m̂ their mean direction, projected out
of the proxy) and ``tangent_energy.rows``.

The null: activations of d = 64 whose variance sits in k = 8 directions (1 each, 0.02 in the
others: a PCA proxy spans m̂'s error), 4 096 i.i.d. Gaussian tokens, mean μ along a random m with
‖μ‖ = ρ √tr Σ_H; gradients isotropic in m⊥ plus half their energy along the true m. m̂ errs by
about 1/(ρ√n) mostly inside the proxy's span, so the orthogonal estimator credited the proxy
with drift energy (here P(p ≤ .05) ≈ 0.7 at ρ = 0.3, ≈ 0.1 at ρ = 1). The moments are drawn
exactly (sample mean ~ N(μ, Σ/n) independent of the scatter ~ Wishart(Σ, n − 1), Bartlett's
construction; the gradient moment ~ Wishart(Σ_G, n)), so a trial costs no n × d rows.

With B = 19 exchangeable frames P(p ≤ .05) = ⌊0.05 · 20⌋/20 = 0.05 for a proxy exchangeable
with them. Checked within [0.035, 0.065], the issue's band: ±0.015 is 2.7 binomial standard
errors √(0.05 · 0.95 / 1500) = 0.0056 of a calibrated proportion (a false alarm 0.8 % of the
time per ρ), and the mean ratio within 1 ± 0.01 (its standard error over 1500 trials is about
0.0003). Each ρ is a test of its own (about 30 s), spread over the workers
(``tests/conftest.py``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tangentlens.capture.accumulators import MomentAccumulator
from tangentlens.capture.captured import Capture
from tangentlens.probes import tangent_energy
from tangentlens.proxies import ActivationPool, ProxyConfig
from tangentlens.runtime import threads

D, K, N, DRAWS, TRIALS = 64, 8, 4096, 19, 1500
RHOS = (0.3, 1.0, 3.0, 30.0)
SITE = "blocks.0.hook_resid_post"
CONFIG = tangent_energy.TangentEnergyConfig(bootstrap=0)


def _wishart(root: np.ndarray, dof: int, rng: np.random.Generator) -> np.ndarray:
    """``Σ xᵢxᵢᵀ`` over ``dof`` i.i.d. N(0, root rootᵀ) rows (Bartlett's decomposition)."""
    a = np.tril(rng.standard_normal((D, D)), -1)
    a[np.diag_indices(D)] = np.sqrt(rng.chisquare(dof - np.arange(D)))
    la = root @ a
    return la @ la.T


def _moments(count: int, total: np.ndarray, second: np.ndarray) -> MomentAccumulator:
    acc = MomentAccumulator(D)
    acc.count = count
    acc.sum = torch.from_numpy(total)
    acc.second_moment = torch.from_numpy((second + second.T) / 2)
    return acc


def _trial(rho: float, trial: int, rng: np.random.Generator, root: np.ndarray) -> tuple:
    m = rng.standard_normal(D)
    m /= np.linalg.norm(m)
    mean = rho * math.sqrt(float(np.sum(root**2))) * m + root @ rng.standard_normal(D) / math.sqrt(
        N
    )
    h = _moments(N, N * mean, _wishart(root, N - 1, rng) + N * np.outer(mean, mean))
    pool = ActivationPool()
    pool.add(h, None)
    proxies = pool.fit(ProxyConfig(methods=("pca",), rank=K)).bases
    rest = np.eye(D) - np.outer(m, m)  # gradients: σ² = 1 per direction in m⊥, (d − 1) along m
    g = _moments(N, np.zeros(D), _wishart(rest + math.sqrt(D - 1) * np.outer(m, m), N, rng))
    site = SimpleNamespace(g=g, g_bins=[], sequence_energy=None, reservoir=None)
    capture = Capture("null", trial, 0, SimpleNamespace(sites={SITE: site}), {SITE: 0}, 8)
    rows = tangent_energy.rows(capture, {SITE: proxies}, CONFIG, draws=DRAWS, seed=int(10 * rho))
    got = {r["metric"]: r["value"] for r in rows if r["method"] == "pca"}
    return got["energy_ratio"], got["energy_p_value"]


def _null_trials(rho: float) -> tuple[float, float]:
    """The mean ratio and P(p ≤ .05) over the trials at ``rho`` (one thread: every operation is
    small)."""
    rng = np.random.default_rng([42, int(10 * rho)])
    scales = np.r_[np.ones(K), np.full(D - K, 0.02)]
    basis = np.linalg.qr(rng.standard_normal((D, D)))[0]
    root = basis * np.sqrt(scales)  # Σ_H^{1/2}: the variance in K random directions
    with threads(1):
        results = np.array([_trial(rho, t, rng, root) for t in range(TRIALS)])
    return float(results[:, 0].mean()), float((results[:, 1] <= 0.05).mean())


@pytest.mark.slow
@pytest.mark.parametrize("rho", RHOS)
def test_the_headline_energy_is_null_at_every_rho(rho):
    ratio, rejected = _null_trials(rho)
    assert abs(ratio - 1) <= 0.01, (rho, ratio, rejected)
    assert 0.035 <= rejected <= 0.065, (rho, ratio, rejected)
