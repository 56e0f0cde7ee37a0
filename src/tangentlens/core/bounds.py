"""The bounds a model's width ``d`` sets on a recipe, found before anything is captured: when a
sweep is planned (from the suite's published shape), when a step unit starts (from the loaded
model, for a suite whose shape is not known offline) and by :func:`tangentlens.measure` (from
the model or the capture). Each bound is named by its recipe key, with the range the unit that
enforces it would allow, computed as that unit computes it.

The proxies stage's own (:func:`stage_width_bounds`): each dictionary is fitted at rank
``proxies.rank`` in ``1 … d − 1`` (``tangentlens.dictionaries.base.check_rank``), and an SAE
proxy's ``proxies.sae_k`` active latents are chosen among its ``d_sae = 8·d`` latents. Then each
probe's (``Probe.width_bounds``: the built-in ``tangent`` probes bound the rank by the room
their control frames are drawn in, and ``tangent_energy`` its data-matched span).

Light: no torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tangentlens.checks import Bound, check_bounds

if TYPE_CHECKING:
    from tangentlens.core.recipe import Recipe

__all__ = ["SAE_EXPANSION", "check_width", "stage_width_bounds"]

#: Latents per input dimension of the SAEs the stage trains (``SAE(d_sae=None)``: ``8 × d``).
SAE_EXPANSION = 8


def stage_width_bounds(recipe: Recipe, d: int) -> list[Bound]:
    """The ranges a model of width ``d`` sets on the proxies stage's own settings."""
    stage = recipe.proxies
    if stage is None:
        return []
    out = [
        Bound("proxies.rank", stage.rank, 1, d - 1, f"a dictionary's rank is below d = {d}"),
    ]
    if "sae" in stage.methods:
        latents = SAE_EXPANSION * d
        why = f"an SAE proxy's active latents are among its d_sae = {SAE_EXPANSION}·d = {latents}"
        out.append(Bound("proxies.sae_k", stage.sae_k, 1, latents, why))
    return out


def check_width(recipe: Recipe, d: int, where: str) -> None:
    """Refuse, in one line starting with ``where`` (the model, e.g. ``suite 'mini-pythia'
    (d_model = 128)``), the first setting of ``recipe`` outside the ranges a model of width
    ``d`` sets: the proxies stage's and each enabled probe's (``Probe.width_bounds``), the
    tightest of a key's ranges reported with what sets it."""
    bounds = stage_width_bounds(recipe, d)
    for entry in recipe.probes.values():
        bounds += entry.probe.bounds(entry.config, recipe, d)
    try:
        check_bounds(bounds)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
