"""Share of gradient anisotropy held by the tangent proxy (METHODS.md §1.4), per site, method and
frequency bin.

* ``anisotropy_share_spectral`` (ours) of the proxy and ``anisotropy_share_spectral_control``
  (mean over the controls);
* ``delta_isoscore_star`` — ``IsoScore*(G(I − P_Q)) − IsoScore*(G)`` for the proxy, and
  ``delta_isoscore_star_control`` (mean over ``isoscore_draws`` controls: each IsoScore* is a
  d × d eigen-decomposition, so fewer draws than the energy controls by default). The shrinkage
  covariance C0 is the site's gradient covariance over all tokens (for the "all" bin this makes
  IsoScore* plain IsoScore); ``zeta`` as Rudman & Eickhoff (0.2).

Controls are the same seeded Haar frames as the tangent-energy probe's first draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tangentlens.metrics import anisotropy_shares_spectral, complement_frames, delta_isoscores_star
from tangentlens.metrics._validate import check_count
from tangentlens.probes.base import Needs, StepData, make_row, measurement
from tangentlens.probes.tangent_energy import TangentEnergyConfig, seed_key
from tangentlens.typing import Basis

__all__ = ["NAME", "AnisotropyShareConfig", "needs", "rows"]

NAME = "anisotropy_share"


@dataclass(frozen=True)
class AnisotropyShareConfig:
    """``isoscore_draws`` controls for ΔIsoScore* and the spectral share; ``zeta`` shrinkage."""

    isoscore_draws: int = 20
    zeta: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        check_count(self.isoscore_draws, "isoscore_draws", minimum=1)
        if not 0 <= self.zeta <= 1:
            raise ValueError(f"zeta must be in [0, 1], got {self.zeta!r}")


def needs(config: AnisotropyShareConfig) -> Needs:
    return Needs(gradients=True, bins=True)


def rows(
    data: StepData, proxies: dict[str, dict[str, Basis]], config: AnisotropyShareConfig
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    keys = TangentEnergyConfig(seed=config.seed)
    for site_name, site in data.statistics.sites.items():
        if site.g is None or site_name not in proxies or site.g.count < 3:
            continue
        layer = data.layers.get(site_name)
        c0 = site.g.covariance()
        for method, proxy in proxies[site_name].items():
            rank = proxy.shape[1]
            for bin_index, acc in [(None, site.g), *enumerate(site.g_bins)]:
                if acc.count < 3 or acc.second_moment is None:
                    continue
                if not float(torch.diagonal(acc.second_moment).sum()) > 0:
                    continue  # no gradient here; tangent_energy reports the NaN
                cov = acc.covariance()
                key = seed_key(keys, data.step, layer, bin_index)
                frames = complement_frames(proxy, rank, config.isoscore_draws, key)
                common = measurement(site_name, method, rank, bin_index, acc.count)
                spectral = anisotropy_shares_spectral(cov, torch.cat([proxy[None], frames]))
                delta = delta_isoscores_star(cov, torch.cat([proxy[None], frames]), c0, config.zeta)
                for metric, value in (
                    ("anisotropy_share_spectral", float(spectral[0])),
                    ("anisotropy_share_spectral_control", float(spectral[1:].mean())),
                    ("delta_isoscore_star", float(delta[0])),
                    ("delta_isoscore_star_control", float(delta[1:].mean())),
                ):
                    out.append(make_row(data, NAME, metric, value, **common))
    return out
