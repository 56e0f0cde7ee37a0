"""Fitting the tangent proxies of a site: concept dictionaries on its activations.

PCA is fitted from the streamed moments of every kept token; semi-NMF and SAEs on the sampled
activation rows (the capture's reservoir). Each proxy is an orthonormal basis (d × rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangentlens.capture import SiteStatistics
from tangentlens.dictionaries import PCA, SAE, SemiNMF
from tangentlens.typing import Basis

__all__ = ["METHODS", "ProxyConfig", "fit_proxies"]

METHODS: tuple[str, ...] = ("seminmf", "pca", "sae")


@dataclass(frozen=True)
class ProxyConfig:
    """Which dictionaries span the proxies, at which rank, with which seed.

    ``sae_samples``: activation rows the SAE trains on (the sample is cycled); ``sae_k``: active
    latents per row of the TopK SAE.
    """

    methods: tuple[str, ...] = ("seminmf", "pca")
    rank: int = 16
    seed: int = 0
    seminmf_max_iter: int = 500
    sae_samples: int = 100_000
    sae_k: int = 16

    def __post_init__(self) -> None:
        methods = tuple(self.methods)
        unknown = [m for m in methods if m not in METHODS]
        if not methods or unknown or len(set(methods)) != len(methods):
            raise ValueError(f"methods must be distinct names from {METHODS}, got {methods!r}")
        object.__setattr__(self, "methods", methods)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be an integer ≥ 1, got {self.rank!r}")


def fit_proxies(site: SiteStatistics, config: ProxyConfig) -> dict[str, Basis]:
    """One orthonormal basis (d × rank, float64) per method for this site."""
    needs_sample = any(m in ("seminmf", "sae") for m in config.methods)
    sample = None
    if needs_sample:
        if site.reservoir is None or not len(site.reservoir):
            raise ValueError("semi-NMF and SAE proxies need the capture's reservoir sample")
        sample = site.reservoir.columns()["H"]
    proxies: dict[str, torch.Tensor] = {}
    for method in config.methods:
        if method == "pca":
            h = site.h
            fitted = PCA.from_moments(config.rank, h.count, h.sum, h.second_moment)
        elif method == "seminmf":
            fitted = SemiNMF(config.rank, seed=config.seed, max_iter=config.seminmf_max_iter)
            fitted.fit(sample)
        else:
            fitted = SAE(
                config.rank,
                k=config.sae_k,
                training_samples=config.sae_samples,
                batch_size=min(1024, sample.shape[0]),  # type: ignore[union-attr]
                seed=config.seed,
            ).fit(sample)
        proxies[method] = fitted.basis()
    return proxies
