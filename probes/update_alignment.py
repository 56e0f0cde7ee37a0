"""Update alignment (METHODS.md §1.7): does what changed between the previous selected step s and
this one s′ fall in the tangent proxy? Two kinds of update rows, each scored like gradient energy
against the tangent-energy probe's exchangeable controls (Haar k-frames in ``span(m̂)⊥``, m̂ the
mean direction projected out of the scoring proxies; seeded as the energy's "all" bin at s′), so
the p-value is calibrated under "the proxy is a random set of directions" (``*_energy_fraction``,
``*_energy_ratio`` — to the controls' exact mean ``k/(d − 1) · (1 − E(m̂))``, as the energy's —
``*_energy_p_value``, one row set per site and proxy method):

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tangentlens import metrics, models  # lazy packages
from tangentlens._lazy import LazyModule
from tangentlens.capture.needs import Needs
from tangentlens.checks import check_count
from tangentlens.contract import AcrossInputs, Probe, StateInputs
from tangentlens.probes.tangent_energy import (
    check_mean_direction,
    exchangeable_excluded,
    exchangeable_frames,
    exchangeable_room,
    seed_key,
)
from tangentlens.reporting import Estimator, MustMatch, Reporting
from tangentlens.results import StepLabel, make_row

if TYPE_CHECKING:
    from jaxtyping import Int

    from tangentlens.typing import Basis

torch = LazyModule("torch")

__all__ = ["NAME", "PROBE", "UpdateAlignmentConfig", "rows", "tracked_types"]


@dataclass(frozen=True)
class UpdateAlignmentConfig:
    """``draws`` controls, drawn from ``seed``; centroid updates of the ``centroid_types`` most
    frequent types."""

    draws: int = 100
    centroid_types: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("draws", "centroid_types"):
            check_count(getattr(self, name), name, minimum=1)


#: The probe's name: its recipe table ``[probes.update_alignment]`` and its rows' ``probe``.
NAME = "update_alignment"


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
    out = []
    for method, proxy in proxies.items():
        key = seed_key(config.seed, data.step, data.layers.get(site), None)
        frames = exchangeable_frames(proxies, method, config.draws, key)
        result = metrics.update_alignment(
            delta, proxy, frames, exchangeable_excluded(proxies, method)
        )
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
    for site, methods in proxies.items():
        check_mean_direction(methods, site)
    out: list[dict[str, Any]] = []
    if embedding_delta is not None and embedding_delta[0] in proxies:
        site, delta = embedding_delta
        out += _score(data, f"embedding_update{suffix}", site, proxies[site], delta, config)
    for site, delta in centroid_deltas.items():
        if site in proxies:
            out += _score(data, f"centroid_update{suffix}", site, proxies[site], delta, config)
    return out


def _tracked_centroids(
    stats: Any, counts: np.ndarray, config: UpdateAlignmentConfig
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per site: (ids of the ``centroid_types`` most frequent types seen at this step, their
    centroids in float64 — the update is a difference of nearby centroids)."""
    tracked = torch.from_numpy(tracked_types(config, counts))
    out = {}
    for site, s in stats.sites.items():
        if s.types is None:
            continue
        at = s.types.rows_of(tracked).to(s.types.sum.device)
        count = s.types.count[at]
        seen = count > 0
        centroids = s.types.sum[at][seen].double() / count[seen, None]
        out[site] = (tracked[seen.cpu()], centroids)
    return out


def _state(inputs: StateInputs, config: UpdateAlignmentConfig) -> dict[str, Any]:
    """What a step keeps for the next transition: the tracked centroids per site, ``W_E``'s
    rows of the types the analysis data holds (in the model's precision) and the embedding's
    site (the sweep saves the state on the host)."""
    model, counts = inputs.model, inputs.data.frequencies.counts
    if not hasattr(model, "W_E"):
        raise ValueError(f"{type(model).__name__} exposes no W_E: update_alignment cannot run")
    seen = torch.from_numpy(counts > 0)
    return {
        "centroids": _tracked_centroids(inputs.capture.statistics, counts, config),
        "embedding": model.W_E.detach()[: seen.numel()][seen.to(model.W_E.device)],
        "embed_site": models.lens_model(model).hook_name("embed"),
    }


def _across_rows(inputs: AcrossInputs, config: UpdateAlignmentConfig) -> list[dict[str, Any]]:
    """Each transition's update, scored in ``scoring`` (fitted on data of the earlier step or
    before: the frozen window's, else the earlier step's own fit); ``before`` / ``now`` hold
    this probe's own state (:func:`_state`) and each step's ``proxies``."""
    out: list[dict[str, Any]] = []
    for t in inputs.transitions:
        deltas = {}
        for site, (ids, centroids) in t.now["centroids"].items():
            old_ids, old = t.before["centroids"][site]
            _, at_now, at_old = np.intersect1d(ids.numpy(), old_ids.numpy(), return_indices=True)
            deltas[site] = centroids[at_now].double() - old[at_old].double()
        delta_embed = t.now["embedding"].double() - t.before["embedding"].double()
        out += rows(
            t.label,
            t.scoring if t.scoring is not None else t.before["proxies"],
            (t.now["embed_site"], delta_embed),
            deltas,
            config,
            in_window=t.in_window,
        )
    return out


def _max_tracked_types(config: UpdateAlignmentConfig, max_tokens: int) -> int:
    return config.centroid_types


def _check_recipe(config: UpdateAlignmentConfig, recipe: Any) -> None:
    if not recipe.capture.embed:
        raise ValueError(
            "probes.update_alignment scores ΔW_E in the embedding's proxy: set capture.embed = true"
        )


#: The probe, declared once (:class:`~tangentlens.contract.Probe`): what the registry runs.
PROBE = Probe(
    name=NAME,
    config=UpdateAlignmentConfig,
    scope="tangent",
    needs=Needs(type_sums=True),
    across=_across_rows,
    state=_state,
    tracked_types=tracked_types,
    max_tracked_types=_max_tracked_types,
    recipe_check=_check_recipe,
    width_bounds=lambda config, recipe, d: [exchangeable_room(recipe, d, NAME)],
    metrics={
        "embedding_update_energy_fraction": (
            "energy fraction of `ΔW_E` (s → s′) in the embedding proxy, fitted on data of s or "
            "earlier"
        ),
        "embedding_update_energy_ratio": "over the controls' exact mean `k/(d − 1) · (1 − E(m̂))`",
        "embedding_update_energy_p_value": "permutation p-value",
        "centroid_update_energy_fraction": (
            "energy fraction of the change of each frequent type's mean activation, per site"
        ),
        "centroid_update_energy_ratio": "over the controls' exact mean `k/(d − 1) · (1 − E(m̂))`",
        "centroid_update_energy_p_value": "permutation p-value",
        "embedding_update_in_window_energy_fraction": (
            "as `embedding_update_*`, for a transition s → s′ that starts before the frozen fit "
            "window's last checkpoint (s < its end: the proxy saw data after s — the update, or "
            "part of it when s′ lies past the end; not evidence)"
        ),
        "embedding_update_in_window_energy_ratio": "idem",
        "embedding_update_in_window_energy_p_value": "idem",
        "centroid_update_in_window_energy_fraction": (
            "as `centroid_update_*`, inside the fit window"
        ),
        "centroid_update_in_window_energy_ratio": "idem",
        "centroid_update_in_window_energy_p_value": "idem",
    },
    reporting=Reporting(
        tables=(),
        figures=(),
        must_match=(MustMatch("draws", "probes.update_alignment.draws"),),
        estimators=(
            Estimator(
                "update_alignment",
                (
                    "s → s′ scored in proxies fitted on data of s or earlier (per_checkpoint: s's "
                    "own fit; frozen_early: the frozen proxies, *_update_in_window_* when s < the "
                    "window's last checkpoint); centroid differences in float64; exchangeable "
                    "controls"
                ),
            ),
        ),
    ),
)
