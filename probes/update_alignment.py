"""Update alignment (METHODS.md §1.7): does the change of the token-embedding matrix between
the previous selected step and this one, ``ΔW_E`` (rows of types seen in the analysis data),
fall in the embedding site's tangent proxy? Scored like gradient energy against the same seeded
controls: ``update_energy_fraction``, ``update_energy_ratio``, ``update_energy_p_value`` (site
``hook_embed``, one row set per proxy method). Needs ``capture.embed = true``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tangentlens.metrics import complement_frames, update_alignment
from tangentlens.probes.base import Needs, StepData, make_row
from tangentlens.probes.tangent_energy import TangentEnergyConfig, seed_key
from tangentlens.typing import Basis

__all__ = ["NAME", "UpdateAlignmentConfig", "needs", "rows"]

NAME = "update_alignment"


@dataclass(frozen=True)
class UpdateAlignmentConfig:
    draws: int = 100
    seed: int = 0


def needs(config: UpdateAlignmentConfig) -> Needs:
    return Needs()


def rows(
    data: StepData,
    embed_site: str,
    proxies: dict[str, Basis],
    delta_embed: torch.Tensor,
    config: UpdateAlignmentConfig,
) -> list[dict[str, Any]]:
    """``delta_embed``: ``W_E(step) − W_E(previous)`` restricted to seen types (m × d);
    ``proxies``: the embedding site's bases by method."""
    out: list[dict[str, Any]] = []
    if not bool(delta_embed.abs().max() > 0):
        return out  # identical embeddings (e.g. duplicate checkpoints): nothing moved
    keys = TangentEnergyConfig(seed=config.seed)
    for method, proxy in proxies.items():
        key = seed_key(keys, data.step, None, None)
        frames = complement_frames(proxy, proxy.shape[1], config.draws, key)
        result = update_alignment(delta_embed, proxy, frames)
        common = {"site": embed_site, "method": method, "rank": proxy.shape[1]}
        for metric, value in (
            ("update_energy_fraction", result.energy_fraction),
            ("update_energy_ratio", result.energy_ratio),
            ("update_energy_p_value", result.energy_p_value),
        ):
            out.append(make_row(data, NAME, metric, value, n_tokens=delta_embed.shape[0], **common))
    return out
