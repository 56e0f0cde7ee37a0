"""BERT's masked-LM corruption of a token batch, seeded, shared by training and capture."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tangentlens.typing import Tokens

__all__ = ["IGNORE_INDEX", "mlm_corrupt"]

#: Label of a position that the masked-LM loss does not score (PyTorch's cross-entropy default).
IGNORE_INDEX = -100


def mlm_corrupt(
    tokens: Tokens,
    *,
    special_ids: Iterable[int],
    mask_id: int,
    vocab_size: int,
    probability: float,
    generator: torch.Generator,
) -> tuple[Tokens, Tokens]:
    """Choose ``probability`` of the non-special positions; 80 % of those become ``mask_id``,
    10 % a uniformly random id in ``[0, vocab_size)``, 10 % stay (Devlin et al. 2019).

    Returns ``(inputs, labels)``, both ``(batch, pos)``; labels hold the original id at chosen
    positions and :data:`IGNORE_INDEX` elsewhere. Draws three tensors from ``generator`` in a
    fixed order (choice, action, random ids), so equal generators give equal masks.
    """
    if not 0 < probability < 1:
        raise ValueError(f"mlm probability must be in (0, 1), got {probability}")
    special = torch.tensor(sorted(set(special_ids)), dtype=tokens.dtype)
    candidates = ~torch.isin(tokens, special)
    chosen = (torch.rand(tokens.shape, generator=generator) < probability) & candidates
    labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE_INDEX))
    action = torch.rand(tokens.shape, generator=generator)
    random_ids = torch.randint(vocab_size, tokens.shape, generator=generator, dtype=tokens.dtype)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
