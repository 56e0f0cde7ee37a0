"""Update alignment (METHODS.md §1.7): does what changed between the previous selected step s and
this one s′ fall in the tangent proxy? Two kinds of update rows, each scored like gradient energy
against the tangent-energy probe's exchangeable controls (Haar k-frames in ``span(m̂)⊥``, m̂ the
mean direction projected out of the scoring proxies; seeded as the energy's "all" bin at s′), so
the p-value is calibrated under "the proxy is a random set of directions" (``*_energy_fraction``,
``*_energy_ratio``, ``*_energy_p_value``, one row set per site and proxy method):

* ``embedding_update`` — ``ΔW_E`` restricted to the token types of the analysis data, in the
  embedding site's proxy (needs ``capture.embed = true``);
* ``centroid_update`` — the change of the mean activation of each of the ``centroid_types`` most
  frequent token types, in each site's proxy.

The proxies must come from data of step s or earlier: a proxy fitted after the update contains
its directions and scores it high by construction. The sweep passes step s's own proxies under
``per_checkpoint`` and the frozen proxies under ``frozen_early``; a transition that starts before
the frozen fit window's last checkpoint (s < the window's end, so the fit saw data after s — also
when s′ lies past the end) is named ``embedding_update_in_window_*`` /
``centroid_update_in_window_*`` and stays out of the headline metrics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Int

from tangentlens.metrics import update_alignment
from tangentlens.probes.base import Needs, StepLabel, make_row
from tangentlens.probes.configs import PROBE_NEEDS, UpdateAlignmentConfig
from tangentlens.probes.tangent_energy import (
    TangentEnergyConfig,
    exchangeable_excluded,
    exchangeable_frames,
    seed_key,
)
from tangentlens.typing import Basis

__all__ = ["NAME", "UpdateAlignmentConfig", "needs", "rows", "tracked_types"]

#: The probe's name: its recipe table ``[probes.update_alignment]`` and its rows' ``probe``.
NAME = "update_alignment"


def needs(config: UpdateAlignmentConfig) -> Needs:
    """What the probe needs from a step\'s capture (:data:`~tangentlens.probes.configs.PROBE_NEEDS`;
    the same for every config)."""
    return PROBE_NEEDS[NAME]


def tracked_types(
    config: UpdateAlignmentConfig, counts: Int[np.ndarray, " vocab"]
) -> Int[np.ndarray, " n_types"]:
    """The ids of the ``centroid_types`` most frequent types of the analysis data (``counts``,
    the frequency table; ties by id; unseen types left out), most frequent first: the types
    whose centroid updates are scored."""
    counts = np.asarray(counts, dtype=np.int64)
    ranked = np.argsort(-counts, kind="stable")[: config.centroid_types]
    return ranked[counts[ranked] > 0]


def _score(
    data: StepLabel,
    kind: str,
    site: str,
    proxies: dict[str, Basis],
    delta: torch.Tensor,
    config: UpdateAlignmentConfig,
) -> list[dict[str, Any]]:
    if delta.shape[0] == 0 or not bool(delta.abs().max() > 0):
        return []  # nothing moved (e.g. duplicate checkpoints)
    keys = TangentEnergyConfig(seed=config.seed)
    out = []
    for method, proxy in proxies.items():
        key = seed_key(keys, data.step, data.layers.get(site), None)
        frames = exchangeable_frames(proxies, method, config.draws, key)
        result = update_alignment(delta, proxy, frames, exchangeable_excluded(proxies, method))
        common = {
            "site": site,
            "method": method,
            "rank": proxy.shape[1],
            "n_tokens": delta.shape[0],
        }
        for suffix, value in (
            ("energy_fraction", result.energy_fraction),
            ("energy_ratio", result.energy_ratio),
            ("energy_p_value", result.energy_p_value),
        ):
            out.append(make_row(data, NAME, f"{kind}_{suffix}", value, **common))
    return out


def rows(
    data: StepLabel,
    proxies: dict[str, dict[str, Basis]],
    embedding_delta: tuple[str, torch.Tensor] | None,
    centroid_deltas: dict[str, torch.Tensor],
    config: UpdateAlignmentConfig,
    *,
    in_window: bool = False,
) -> list[dict[str, Any]]:
    """Score the update ending at ``data.step``. ``proxies`` ``{site: {method: basis}}`` must be
    fitted on data of the previous step or earlier; ``in_window``: the proxies saw data after
    the previous step (a frozen fit window that ends after it; rows named
    ``*_update_in_window_*``). ``embedding_delta``:
    ``(embed site, ΔW_E rows)`` or None; ``centroid_deltas``: per site, the change of the
    tracked types' centroids (m × d, float64)."""
    suffix = "_in_window" if in_window else ""
    out: list[dict[str, Any]] = []
    if embedding_delta is not None and embedding_delta[0] in proxies:
        site, delta = embedding_delta
        out += _score(data, f"embedding_update{suffix}", site, proxies[site], delta, config)
    for site, delta in centroid_deltas.items():
        if site in proxies:
            out += _score(data, f"centroid_update{suffix}", site, proxies[site], delta, config)
    return out
