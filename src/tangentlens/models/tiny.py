"""A tiny random Pythia-shaped decoder, for the checks that need a model but no checkpoint
(:func:`tangentlens.conformance.check_probe`): built in milliseconds once TransformerLens is
imported, seeded without touching the global random state."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

__all__ = ["TINY_CONTEXT", "TINY_VOCAB", "random_decoder"]

#: The tiny decoder's vocabulary.
TINY_VOCAB = 64
#: The tiny decoder's context (positions).
TINY_CONTEXT = 16


def random_decoder(seed: int) -> HookedTransformer:
    """A float32 decoder of two blocks (d_model 32, 4 heads, parallel attention and MLP,
    partial rotary, LayerNorm), randomly initialised from ``seed`` (the global random state is
    restored after)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    config = HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_head=8,
        d_mlp=64,
        d_vocab=TINY_VOCAB,
        n_ctx=TINY_CONTEXT,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=4,
        parallel_attn_mlp=True,
        dtype=torch.float32,
        device="cpu",
        model_name="tiny-random-decoder",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return HookedTransformer(config)
