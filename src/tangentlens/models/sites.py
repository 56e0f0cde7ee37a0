"""Family-aware TransformerLens hook-site names, built in one place.

The residual stream after block ``l`` is ``blocks.{l}.hook_resid_post`` in decoders and
``blocks.{l}.hook_normalized_resid_post`` in BERT-style (post-LN) encoders, whose
``hook_resid_post`` is taken before the block's final LayerNorm. Decoders with parallel attention
and MLP (Pythia) have no ``resid_mid``; a site a model lacks is refused with the valid ones.

>>> hook_name(model, "resid_post", 3)          # doctest: +SKIP
'blocks.3.hook_resid_post'
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "SITE_KINDS",
    "hook_name",
    "model_family",
    "parse_site",
    "residual_sites",
    "site_kinds",
]

Family = Literal["decoder", "encoder"]

#: Every site kind any family offers; ``embed`` is the only one without a layer.
SITE_KINDS: tuple[str, ...] = (
    "embed", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "pattern",
)  # fmt: skip

_DECODER = {
    "embed": "hook_embed",
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "resid_post": "blocks.{l}.hook_resid_post",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "q": "blocks.{l}.attn.hook_q",
    "k": "blocks.{l}.attn.hook_k",
    "pattern": "blocks.{l}.attn.hook_pattern",
}
_ENCODER = {
    **{k: v for k, v in _DECODER.items() if k != "resid_mid"},
    "embed": "embed.hook_embed",
    "resid_post": "blocks.{l}.hook_normalized_resid_post",
}


def model_family(model: torch.nn.Module) -> Family:
    """``"encoder"`` for TransformerLens' HookedEncoder (BERT-style), else ``"decoder"``."""
    from transformer_lens import HookedEncoder, HookedTransformer

    if isinstance(model, HookedEncoder):
        return "encoder"
    if isinstance(model, HookedTransformer):
        return "decoder"
    raise ValueError(
        f"expected a TransformerLens HookedTransformer or HookedEncoder, got {type(model).__name__}"
    )


def _templates(model: torch.nn.Module) -> dict[str, str]:
    if model_family(model) == "encoder":
        return _ENCODER
    if model.cfg.parallel_attn_mlp:
        return {k: v for k, v in _DECODER.items() if k != "resid_mid"}
    return _DECODER


def site_kinds(model: torch.nn.Module) -> tuple[str, ...]:
    """The site kinds this model offers, in canonical order."""
    return tuple(_templates(model))


def hook_name(model: torch.nn.Module, kind: str, layer: int | None = None) -> str:
    """The full hook name of site ``kind`` at block ``layer`` (no layer for ``embed``)."""
    templates = _templates(model)
    if kind not in templates:
        family = model_family(model)
        lacks = " (parallel attention and MLP: no resid_mid)" if kind == "resid_mid" else ""
        raise ValueError(
            f"site {kind!r} does not exist in this {family}{lacks}; allowed: {list(templates)}"
        )
    template = templates[kind]
    if "{l}" not in template:
        if layer is not None:
            raise ValueError(f"site {kind!r} takes no layer, got layer={layer}")
        return template
    n_layers = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(
            f"layer for site {kind!r} must be an integer in [0, {n_layers}), got {layer!r}"
        )
    return template.format(l=layer)


def residual_sites(model: torch.nn.Module) -> list[str]:
    """The residual stream after every block, first to last."""
    return [hook_name(model, "resid_post", layer) for layer in range(model.cfg.n_layers)]


def parse_site(model: torch.nn.Module, name: str) -> tuple[str, int | None]:
    """Inverse of :func:`hook_name`: ``(kind, layer)`` of a full hook name this model offers."""
    for kind in site_kinds(model):
        layers = [None] if kind == "embed" else range(model.cfg.n_layers)
        for layer in layers:
            if hook_name(model, kind, layer) == name:
                return kind, layer
    raise ValueError(
        f"unknown hook site {name!r}; allowed: {', '.join(site_kinds(model))} at layers 0.."
        f"{model.cfg.n_layers - 1}, e.g. {hook_name(model, 'resid_post', 0)!r}"
    )
