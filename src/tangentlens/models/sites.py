"""Family- and loader-aware TransformerLens hook-site names: the templates of each loader and
family, built in one place, and the kind of a name without a model. A lens names a model's sites
from them (:meth:`~tangentlens.models.adapter.LensModel.hook_name`,
:meth:`~tangentlens.models.adapter.LensModel.parse_site`,
:meth:`~tangentlens.models.adapter.LensModel.residual_sites`); this module imports no model.

The residual stream after block ``l`` is ``blocks.{l}.hook_resid_post`` in decoders; in BERT-style
(post-LN) encoders it is ``blocks.{l}.hook_normalized_resid_post`` on ``HookedEncoder`` (whose
``hook_resid_post`` is taken before the block's final LayerNorm) and ``blocks.{l}.hook_resid_post``
on a ``TransformerBridge`` (the Hugging Face layer's output, after that LayerNorm). Decoders with
parallel attention and MLP (Pythia) have no ``resid_mid``; a site a model lacks is refused with the
valid ones (encoders offer no ``resid_mid``). Each kind names the same tensor on both loaders:

=========== =============================== =========================================
kind        HookedEncoder                   TransformerBridge of a BERT encoder
=========== =============================== =========================================
embed       ``embed.hook_embed``            ``embed.hook_out`` (word embeddings; the
                                            bridge's ``hook_embed`` is their normed sum
                                            with the position embeddings)
resid_post  ``blocks.{l}.hook_normalized_   ``blocks.{l}.hook_resid_post``
            resid_post``
attn_out    ``blocks.{l}.hook_attn_out``    ``blocks.{l}.attn.o.hook_out`` (the bridge's
                                            ``hook_attn_out`` is after the residual and
                                            the LayerNorm)
=========== =============================== =========================================

The ``"hf"`` loader (:class:`~tangentlens.models.hf_lens.HfLens`: EuroBERT and ModernBERT
encoders, which TransformerLens neither converts nor bridges) names its sites as
``HookedEncoder`` does except the block output, ``blocks.{l}.hook_resid_post`` (the layer's
output; the last one taken before the encoder's final norm); ``embed.hook_embed`` is the token
embedding (ModernBERT normalises it before block 0, so there it is not ``resid_pre`` of block 0).

Decoders' names are TransformerLens' on both loaders (``hook_embed``,
``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_q`` before the rotary embedding, …). On
the bridge a kind is offered only when its hook exists at every block (an architecture without
per-head attention hooks offers no ``q``, ``k``, ``pattern``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Literal

__all__ = ["SITE_KINDS", "bridge_templates", "hf_templates", "hooked_templates", "site_kind"]

Family = Literal["decoder", "encoder"]
#: Site kind → hook-name template (``{l}`` stands for the block index).
SiteTemplates = dict[str, str]

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
_BRIDGE_BERT = {
    **{k: v for k, v in _DECODER.items() if k != "resid_mid"},  # as HookedEncoder's: none
    "embed": "embed.hook_out",
    "attn_out": "blocks.{l}.attn.o.hook_out",
}

#: The ``"hf"`` loader's sites (forward hooks on the Hugging Face modules; see :mod:`.hf_lens`).
_HF_ENCODER = {
    "embed": "embed.hook_embed",
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_post": "blocks.{l}.hook_resid_post",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
}


def hooked_templates(family: Family, parallel_attn_mlp: bool) -> SiteTemplates:
    """The sites of a ``HookedTransformer`` (``decoder``) or ``HookedEncoder`` (``encoder``)."""
    if family == "encoder":
        return dict(_ENCODER)
    if parallel_attn_mlp:
        return {k: v for k, v in _DECODER.items() if k != "resid_mid"}
    return dict(_DECODER)


def bridge_templates(
    family: Family, architecture: str, names: Collection[str], n_layers: int
) -> SiteTemplates:
    """The sites of a ``TransformerBridge`` of ``architecture`` whose hook names are ``names``:
    the kinds whose hook exists at every block (BERT encoders: :data:`_BRIDGE_BERT`)."""
    templates = _BRIDGE_BERT if family == "encoder" else _DECODER
    return {
        kind: template
        for kind, template in templates.items()
        if all(template.format(l=layer) in names for layer in range(n_layers))
    }


def hf_templates() -> SiteTemplates:
    """The sites of an ``"hf"``-loaded encoder (no per-head attention sites)."""
    return dict(_HF_ENCODER)


#: The per-layer attention label of the rows of ``qk_drift`` (not a hook: the block's heads).
_ATTENTION = "blocks.{l}.attn"


def site_kind(name: str) -> str | None:
    """The kind of the hook name ``name`` under any family and loader, without a model (no two
    tables give one name two kinds); ``"attn"`` for ``qk_drift``'s ``blocks.{l}.attn``; None for
    a name of none (e.g. ``"-"``, a row about the whole model).

    >>> site_kind("blocks.3.hook_normalized_resid_post"), site_kind("hook_embed")
    ('resid_post', 'embed')
    """
    tables = (_DECODER, _ENCODER, _BRIDGE_BERT, _HF_ENCODER, {"attn": _ATTENTION})
    for table in tables:
        for kind, template in table.items():
            pattern = re.escape(template).replace(re.escape("{l}"), r"\d+")
            if re.fullmatch(pattern, name):
                return kind
    return None
