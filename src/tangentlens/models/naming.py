"""Which model a name means, across naming schemes: hub ids (``EleutherAI/pythia-70m-deduped``),
the TransformerLens names and aliases SAELens' pretrained registry uses (``pythia-70m-deduped``,
``gpt2-small``) and suites' names — matched through TransformerLens' own alias table, read
offline — and a model's width where it is known offline.

TransformerLens keeps no offline table of model configs (its ``get_pretrained_model_config``
reads the hub's ``config.json``), so widths are known for the Pythia models only
(:data:`~tangentlens.models.shapes.PYTHIA_CONFIGS`); other models are compared by name alone.
Both import TransformerLens.
"""

from __future__ import annotations

import functools

from tangentlens.models.shapes import PYTHIA_CONFIGS

__all__ = ["model_key", "model_width"]


@functools.cache
def _official_names() -> dict[str, str]:
    """Lower-cased official name or alias → TransformerLens' official (hub) name."""
    from transformer_lens.loading_from_pretrained import make_model_alias_map

    return make_model_alias_map()


def model_key(name: str) -> str:
    """The key every name of one model shares: TransformerLens' official name of ``name`` (an
    official name or alias, any case) when its table knows it, else ``name``; without the
    organisation prefix, lower-cased (``gpt2-small`` → ``gpt2``, ``EleutherAI/pythia-70m-deduped``
    → ``pythia-70m-deduped``)."""
    official = _official_names().get(name.lower(), name)
    return official.rstrip("/").rsplit("/", 1)[-1].lower()


def model_width(name: str) -> int | None:
    """``d_model`` of the model ``name`` (any TransformerLens name or alias) when it is known
    offline — a Pythia model's — else None."""
    config = PYTHIA_CONFIGS.get(_official_names().get(name.lower(), ""))
    return None if config is None else int(config["hidden_size"])
