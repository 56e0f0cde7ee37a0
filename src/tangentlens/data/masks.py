"""Which token positions carry geometry: masks that exclude BOS/CLS, position 0, padding and
other special tokens, with a count of what was excluded for the report."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangentlens.data.packing import SpecialTokens
from tangentlens.typing import TokenMask, Tokens

__all__ = ["EXCLUSION_REASONS", "MaskPolicy", "MaskResult", "token_mask"]

#: The reasons a position can be excluded, in report order ("total" is added to the counts).
EXCLUSION_REASONS = ("bos", "position0", "padding", "special")


@dataclass(frozen=True)
class MaskPolicy:
    """Which kinds of positions to exclude (all by default, as METHODS.md prescribes)."""

    bos: bool = True
    position0: bool = True
    padding: bool = True
    special: bool = True


@dataclass(frozen=True)
class MaskResult:
    """``keep`` (batch, pos) bool, and ``excluded``: positions excluded per reason.

    Each reason is counted on its own (a position holding Pythia's BOS = EOS id counts as both
    "bos" and "special"); ``"total"`` counts positions excluded by any reason. A reason that the
    policy switches off counts 0.
    """

    keep: TokenMask
    excluded: dict[str, int]

    @property
    def n_kept(self) -> int:
        return int(self.keep.sum())


def _isin(tokens: torch.Tensor, ids: set[int]) -> torch.Tensor:
    if not ids:
        return torch.zeros_like(tokens, dtype=torch.bool)
    return torch.isin(tokens, torch.tensor(sorted(ids), dtype=tokens.dtype, device=tokens.device))


def token_mask(
    tokens: Tokens,
    special: SpecialTokens,
    *,
    causal: bool,
    policy: MaskPolicy = MaskPolicy(),
) -> MaskResult:
    """Mask of the positions to keep in a (batch, pos) token batch.

    Reasons: ``bos`` — the position holds ``bos_id`` or ``cls_id`` (the encoder's CLS plays the
    BOS role); ``position0`` — column 0 of a causal model (its state is the same for every
    sequence); ``padding`` — ``pad_id``; ``special`` — any other special id (``eos_id``,
    ``sep_id``, ``mask_id``, ``other_ids``).
    """
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
        raise ValueError(
            f"tokens must be a 2-D torch tensor (batch, pos), got {type(tokens).__name__} with "
            f"shape {tuple(getattr(tokens, 'shape', ()))}"
        )
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must hold integer ids, got dtype {tokens.dtype}")
    if not isinstance(special, SpecialTokens):
        raise ValueError(f"special must be a SpecialTokens, got {type(special).__name__}")
    ids = {
        "bos": {special.bos_id, special.cls_id} - {None},
        "padding": {special.pad_id} - {None},
        "special": ({special.eos_id, special.sep_id, special.mask_id} - {None})
        | set(special.other_ids),
    }
    enabled = {
        "bos": policy.bos,
        "position0": policy.position0 and causal,
        "padding": policy.padding,
        "special": policy.special,
    }
    excluded_any = torch.zeros_like(tokens, dtype=torch.bool)
    excluded: dict[str, int] = {}
    for reason in EXCLUSION_REASONS:
        if not enabled[reason]:
            excluded[reason] = 0
            continue
        if reason == "position0":
            hit = torch.zeros_like(tokens, dtype=torch.bool)
            hit[:, :1] = True
        else:
            hit = _isin(tokens, ids[reason])
        excluded[reason] = int(hit.sum())
        excluded_any |= hit
    excluded["total"] = int(excluded_any.sum())
    return MaskResult(keep=~excluded_any, excluded=excluded)
