"""Tangent energy (Bernas et al. 2026; METHODS.md §1.2–1.3, 1.5): the share of gradient energy
in each tangent proxy against matched-rank random controls, overall and per frequency bin.

Per site, proxy method and frequency bin (``all`` and each bin), from the accumulated gradient
moment of that bin: ``energy_fraction`` (with a bootstrap interval over the sampled sequences),
the controls' ``energy_control_mean/std/min/max``, the closed-form ``energy_null_mean``,
``energy_ratio``, ``energy_enrichment``, ``energy_z`` and ``energy_p_value``; with
``data_matched_m`` set, ``data_matched_energy_ratio`` and ``data_matched_energy_p_value`` against
frames inside the top-m PCA span of the activations. Control draws are seeded from
``(seed, step, layer + 1, bin + 1, draw)`` (0 stands for the embedding and for "all").
``energy_fraction`` and ``energy_ratio`` carry bootstrap intervals over the sampled sequences
(the capture's reservoir; the point values use every token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from tangentlens.capture import SiteStatistics
from tangentlens.dictionaries import PCA
from tangentlens.metrics import (
    bootstrap_ratio,
    compare_energy,
    complement_frames,
    data_matched_frames,
    group_sums,
)
from tangentlens.metrics._validate import check_count
from tangentlens.probes.base import Needs, StepData, bin_label, make_row, measurement
from tangentlens.typing import Basis

__all__ = ["NAME", "TangentEnergyConfig", "needs", "rows"]

NAME = "tangent_energy"


@dataclass(frozen=True)
class TangentEnergyConfig:
    """``draws`` controls per measurement (100, ours; the paper used 20); ``bootstrap``
    replicates for the energy interval (0 = none); ``data_matched_m`` the PCA span of the
    data-matched control (None = off)."""

    draws: int = 100
    bootstrap: int = 200
    data_matched_m: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_count(self.draws, "draws", minimum=1)
        check_count(self.bootstrap, "bootstrap", minimum=0)
        check_count(self.seed, "seed", minimum=0)
        m = self.data_matched_m
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ValueError(
                f"data_matched_m must be an integer ≥ 2 (above the proxy rank) or None, got {m!r}"
            )


def needs(config: TangentEnergyConfig) -> Needs:
    return Needs(gradients=True, bins=True, reservoir=True)


def seed_key(
    config: TangentEnergyConfig, step: int, layer: int | None, bin_index: int | None
) -> tuple[int, int, int, int]:
    """The control seed key (without the draw): ``(seed, step, layer + 1, bin + 1)``."""
    return (
        config.seed,
        step,
        0 if layer is None else layer + 1,
        0 if bin_index is None else bin_index + 1,
    )


def _sampled_gradients(
    site: SiteStatistics, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The reservoir's gradient rows (float64), their sequence index and frequency bin — read
    once per site for every bootstrap of that site."""
    if site.reservoir is None or not len(site.reservoir) or site.g is None:
        return None
    columns = site.reservoir.columns()
    return columns["G"].double(), site.reservoir.ids // seq_len, columns.get("bin")


def _bootstrap(
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    proxy: Basis,
    frames: torch.Tensor,
    bin_index: int | None,
    config: TangentEnergyConfig,
) -> dict[str, tuple[float, float]]:
    """Bootstrap intervals over the reservoir's sampled sequences of the energy fraction
    (``Σ‖G_s Q‖² / Σ‖G_s‖²``) and of the energy ratio (``Σ‖G_s Q‖² / meanⱼ Σ‖G_s Nⱼ‖²``)."""
    if not config.bootstrap or sample is None:
        return {}
    g, sequences, bins = sample
    if bin_index is not None and bins is not None:
        rows = bins == bin_index
        g, sequences = g[rows], sequences[rows]
    if torch.unique(sequences).numel() < 2:
        return {}
    inside, _ = group_sums((g @ proxy).pow(2).sum(dim=1), sequences)
    total, _ = group_sums(g.pow(2).sum(dim=1), sequences)
    if not float(total.sum()) > 0:
        return {}  # the sampled rows carry no gradient (e.g. MLM sequences without a target)
    mean_projector = torch.einsum("jdk,jek->de", frames, frames) / frames.shape[0]
    control, _ = group_sums(((g @ mean_projector) * g).sum(dim=1), sequences)  # meanⱼ ‖g Nⱼ‖²
    kwargs = {"replicates": config.bootstrap, "seed": config.seed}
    fraction = bootstrap_ratio(inside, total, **kwargs)
    ratio = bootstrap_ratio(inside, control, **kwargs)
    return {
        "energy_fraction": (fraction.ci_low, fraction.ci_high),
        "energy_ratio": (ratio.ci_low, ratio.ci_high),
    }


def rows(
    data: StepData, proxies: dict[str, dict[str, Basis]], config: TangentEnergyConfig
) -> list[dict[str, Any]]:
    """Rows for every site with gradients; ``proxies[site][method]`` are the fitted bases."""
    out: list[dict[str, Any]] = []
    for site_name, site in data.statistics.sites.items():
        if site.g is None or site_name not in proxies:
            continue
        layer = data.layers.get(site_name)
        sample = _sampled_gradients(site, data.seq_len) if config.bootstrap else None
        moments = [(None, site.g), *enumerate(site.g_bins)]
        pca_span = None
        if config.data_matched_m is not None:
            h = site.h
            m = config.data_matched_m
            pca_span = PCA.from_moments(m, h.count, h.sum, h.second_moment).basis()
        for method, proxy in proxies[site_name].items():
            rank = proxy.shape[1]
            for bin_index, acc in moments:
                if acc.count == 0 or acc.second_moment is None:
                    continue
                if not float(torch.diagonal(acc.second_moment).sum()) > 0:
                    # no gradient reached these tokens: the energy fraction is undefined
                    freq_bin = bin_label(bin_index)
                    out.append(
                        make_row(
                            data,
                            NAME,
                            "energy_fraction",
                            math.nan,
                            site=site_name,
                            method=method,
                            rank=rank,
                            freq_bin=freq_bin,
                            n_tokens=acc.count,
                        )
                    )
                    continue
                key = seed_key(config, data.step, layer, bin_index)
                frames = complement_frames(proxy, rank, config.draws, key)
                result = compare_energy(acc.second_moment, proxy, frames)
                common = measurement(site_name, method, rank, bin_index, acc.count)
                ci = _bootstrap(sample, proxy, frames, bin_index, config)
                out.append(
                    make_row(
                        data,
                        NAME,
                        "energy_fraction",
                        result.energy_fraction,
                        ci=ci.get("energy_fraction"),
                        **common,
                    )
                )
                for metric, value in (
                    ("energy_control_mean", result.control_mean),
                    ("energy_control_std", result.control_std),
                    ("energy_control_min", result.control_min),
                    ("energy_control_max", result.control_max),
                    ("energy_null_mean", result.null_mean),
                    ("energy_enrichment", result.energy_enrichment),
                    ("energy_z", result.energy_z),
                    ("energy_p_value", result.energy_p_value),
                ):
                    out.append(make_row(data, NAME, metric, value, **common))
                out.append(
                    make_row(
                        data,
                        NAME,
                        "energy_ratio",
                        result.energy_ratio,
                        ci=ci.get("energy_ratio"),
                        **common,
                    )
                )
                if pca_span is not None:
                    matched = data_matched_frames(proxy, pca_span, rank, config.draws, key)
                    dm = compare_energy(acc.second_moment, proxy, matched)
                    out.append(
                        make_row(data, NAME, "data_matched_energy_ratio", dm.energy_ratio, **common)
                    )
                    out.append(
                        make_row(
                            data, NAME, "data_matched_energy_p_value", dm.energy_p_value, **common
                        )
                    )
    return out
