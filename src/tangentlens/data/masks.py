"""Which token positions carry geometry: masks that exclude BOS/CLS, position 0, padding and
other special tokens, with a count of what was excluded for the report.

:func:`analysis_mask` is the one definition of the positions a capture keeps: the capture engine
uses it for activation moments, gradient moments, the reservoir and attention statistics, and the
sweep counts token frequencies over exactly the same positions. For masked-LM encoders it is
evaluated on the *original* (uncorrupted) tokens, so a position whose input became ``[MASK]`` or
a random token is kept and stands for the token it hides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tangentlens.data.packing import SpecialTokens
from tangentlens.typing import TokenMask, Tokens

__all__ = [
    "ANALYSIS_EXCLUSION_REASONS",
    "EXCLUSION_REASONS",
    "MaskPolicy",
    "MaskResult",
    "analysis_mask",
    "token_mask",
]

#: The reasons a position can be excluded, in report order ("total" is added to the counts).
EXCLUSION_REASONS = ("bos", "position0", "padding", "special")
#: :func:`analysis_mask`'s reasons: those of :func:`token_mask` plus ``no_target``.
ANALYSIS_EXCLUSION_REASONS = (*EXCLUSION_REASONS, "no_target")


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


def analysis_mask(
    tokens: Tokens,
    special: SpecialTokens,
    *,
    causal: bool,
    policy: MaskPolicy = MaskPolicy(),
) -> MaskResult:
    """The positions a capture keeps: :func:`token_mask`, and for a causal model also the last
    column (``no_target``: it predicts nothing, so its gradient is exactly zero).

    ``tokens`` are the text's own tokens — for masked-LM capture the original tokens, not the
    corrupted input (a ``[MASK]`` input is kept and counted under its original token). Counts
    per reason as :func:`token_mask` (``no_target`` counts last-column positions not already
    excluded by another reason); ``total`` counts positions excluded by any reason.
    """
    masks = token_mask(tokens, special, causal=causal, policy=policy)
    keep, excluded = masks.keep.clone(), dict(masks.excluded)
    excluded["no_target"] = 0
    if causal:
        no_target = torch.zeros_like(keep)
        no_target[:, -1] = keep[:, -1]
        excluded["no_target"] = int(no_target.sum())
        keep &= ~no_target
        excluded["total"] += excluded["no_target"]
    return MaskResult(keep=keep, excluded=excluded)
