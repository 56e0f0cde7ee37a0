"""Fitting the tangent proxies of a site: concept dictionaries on its activations.

PCA is fitted from the streamed moments of every kept token; semi-NMF and SAEs on the sampled
activation rows (the capture's reservoir). Each proxy is an orthonormal basis (d × rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangentlens.capture import MomentAccumulator, SiteStatistics
from tangentlens.dictionaries import PCA, SAE, SemiNMF
from tangentlens.metrics._validate import check_count
from tangentlens.typing import Basis

__all__ = ["METHODS", "ProxyConfig", "fit_proxies", "fit_proxy_bases"]

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
        check_count(self.rank, "rank", minimum=1)


def fit_proxies(site: SiteStatistics, config: ProxyConfig) -> dict[str, Basis]:
    """One orthonormal basis (d × rank, float64) per method for this site: PCA from its moments,
    semi-NMF / SAE on its reservoir's activation rows."""
    sample = None
    if site.reservoir is not None and len(site.reservoir):
        sample = site.reservoir.columns()["H"]
    return fit_proxy_bases(site.h, sample, config)


def fit_proxy_bases(
    moments: MomentAccumulator, sample: torch.Tensor | None, config: ProxyConfig
) -> dict[str, Basis]:
    """Proxies from activation ``moments`` (PCA) and sampled rows ``sample`` (n × d; semi-NMF,
    SAE) — e.g. pooled over the early window of steps."""
    if sample is None and any(m in ("seminmf", "sae") for m in config.methods):
        raise ValueError("semi-NMF and SAE proxies need sampled activation rows (the reservoir)")
    proxies: dict[str, torch.Tensor] = {}
    for method in config.methods:
        if method == "pca":
            fitted = PCA.from_moments(
                config.rank, moments.count, moments.sum, moments.second_moment
            )
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
