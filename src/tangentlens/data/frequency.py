"""Token frequencies and equal-mass frequency bins (METHODS.md §1.5).

Frequencies are counted on the analysis corpus with the exact token ids the model saw, over the
kept positions only (:meth:`FrequencyTable.from_rows`: the positions
:func:`tangentlens.data.masks.analysis_mask` keeps, the same ones a capture accumulates — no
BOS/CLS/SEP/EOS/PAD, no position 0 or last position of a causal row; for masked-LM encoders the
original tokens, which is also what a capture bins by). Bins are equal-mass quantile bins of
log-frequency: ordered from rare to frequent, each holds about ``1 / n_bins`` of the token
occurrences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from jaxtyping import Float, Int

from tangentlens.data.masks import MaskPolicy, analysis_mask
from tangentlens.data.packing import SpecialTokens
from tangentlens.typing import ArrayLike

__all__ = ["FrequencyBins", "FrequencyTable"]

T = TypeVar("T", np.ndarray, torch.Tensor)


def _to_numpy(x: ArrayLike, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise ValueError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}")


def _check_ids(ids: np.ndarray, vocab_size: int, name: str) -> None:
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.size == 0:
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        offending = int(ids[bad].flat[0])
        raise ValueError(
            f"{name} holds token id {offending} outside the vocabulary: ids must lie in "
            f"[0, {vocab_size}) for vocab_size={vocab_size}"
        )


@dataclass(frozen=True)
class FrequencyTable:
    """Occurrence count of every token type: ``counts`` int64 of shape (vocab,)."""

    counts: Int[np.ndarray, " vocab"]

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or counts.size == 0 or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError(
                f"counts must be a non-empty 1-D integer array (vocab,), got shape {counts.shape} "
                f"and dtype {counts.dtype}"
            )
        if (counts < 0).any():
            raise ValueError("counts must be non-negative")
        object.__setattr__(self, "counts", counts.astype(np.int64))

    @classmethod
    def from_tokens(
        cls, tokens: ArrayLike, vocab_size: int, keep: ArrayLike | None = None
    ) -> FrequencyTable:
        """Count token ids (any shape) at the positions where ``keep`` (same shape) is true."""
        if not isinstance(vocab_size, int | np.integer) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        ids = _to_numpy(tokens, "tokens")
        if keep is not None:
            mask = _to_numpy(keep, "keep")
            if mask.shape != ids.shape or mask.dtype != np.bool_:
                raise ValueError(
                    f"keep must be a boolean array of the tokens' shape {ids.shape}, got shape "
                    f"{mask.shape} and dtype {mask.dtype}"
                )
            ids = ids[mask]
        ids = ids.reshape(-1)
        _check_ids(ids, int(vocab_size), "tokens")
        return cls(np.bincount(ids.astype(np.int64), minlength=int(vocab_size)))

    @classmethod
    def from_rows(
        cls,
        rows: ArrayLike,
        vocab_size: int,
        special: SpecialTokens,
        *,
        causal: bool,
        policy: MaskPolicy | None = None,
    ) -> FrequencyTable:
        """Count the token ids of packed ``(n_seq, seq_len)`` rows at the positions a capture of
        those rows keeps (:func:`~tangentlens.data.masks.analysis_mask`)."""
        tokens = torch.as_tensor(_to_numpy(rows, "rows"))
        policy = MaskPolicy() if policy is None else policy
        keep = analysis_mask(tokens, special, causal=causal, policy=policy).keep
        return cls.from_tokens(tokens, vocab_size, keep=keep)

    @property
    def vocab_size(self) -> int:
        return int(self.counts.shape[0])

    @property
    def total(self) -> int:
        """Number of counted occurrences."""
        return int(self.counts.sum())

    def _check_total(self) -> None:
        if self.total == 0:
            raise ValueError("the frequency table is empty: no token was counted")

    def log_frequency(self) -> Float[np.ndarray, " vocab"]:
        """Natural log of each type's relative frequency; ``-inf`` for unseen types."""
        self._check_total()
        with np.errstate(divide="ignore"):
            return np.log(self.counts.astype(np.float64)) - np.log(float(self.total))

    def unigram_entropy(self) -> float:
        """Entropy of the unigram distribution, ``−Σ p log p`` in nats."""
        self._check_total()
        p = self.counts[self.counts > 0] / float(self.total)
        return float(-(p * np.log(p)).sum())

    def merge(self, other: FrequencyTable) -> FrequencyTable:
        """Counts of both tables added (same vocabulary)."""
        if not isinstance(other, FrequencyTable) or other.vocab_size != self.vocab_size:
            raise ValueError(
                f"can only merge a FrequencyTable of the same vocab_size={self.vocab_size}, got "
                f"{getattr(other, 'vocab_size', type(other).__name__)}"
            )
        return FrequencyTable(self.counts + other.counts)

    def bins(self, n_bins: int = 5) -> FrequencyBins:
        """Equal-mass quantile bins of log-frequency; see :class:`FrequencyBins`."""
        return FrequencyBins.from_counts(self.counts, n_bins)


@dataclass(frozen=True)
class FrequencyBins:
    """Token types binned by frequency so that each bin holds about ``1 / n_bins`` of the mass.

    Bin 0 is the rarest, ``n_bins − 1`` the most frequent; unseen types get bin ``−1``.

    Construction (``T`` occurrences in all): sort the occurrences by log-frequency and cut the
    sorted list at the mass quantiles ``j · T / n_bins``. Types are never split: all types with
    the same count (a *count group*, e.g. all hapaxes) go to one bin — the bin holding the group's
    middle occurrence (equivalently, each cut moves to the nearest boundary between count groups;
    a group whose middle falls exactly on a quantile goes to the upper bin). Bins are therefore
    contiguous ranges of counts.

    If every count group holds less than ``1 / n_bins`` of the mass, that rule fills every bin.
    A group holding more — one very frequent type (a space or punctuation token), or a large tie
    group such as the hapaxes of a small corpus — spans several quantiles, which would leave bins
    empty. Then the ``n_bins − 1`` cuts are chosen among the group boundaries as the strictly
    increasing ones closest to the quantiles in squared mass distance, so every bin is non-empty:
    a dominant type ends up alone in the top bin and the rest of the mass is shared by the others
    (their masses are then no longer equal). Fewer distinct seen counts than ``n_bins`` cannot
    fill the bins and raise ``ValueError``.

    Fields: ``edges`` (n_bins + 1,) log-frequencies, bin ``j`` holding the types with
    ``edges[j] ≤ log f < edges[j + 1]`` (the last bin closed; ``edges[j]`` is the log-frequency
    of the rarest type in bin ``j``, ``edges[-1]`` of the most frequent type);
    ``bin_of_type`` (vocab,) int64; ``type_counts`` (n_bins,) distinct types per bin;
    ``token_counts`` (n_bins,) occurrences per bin.
    """

    n_bins: int
    edges: Float[np.ndarray, " n_bins_plus_1"]
    bin_of_type: Int[np.ndarray, " vocab"]
    type_counts: Int[np.ndarray, " n_bins"]
    token_counts: Int[np.ndarray, " n_bins"]

    @classmethod
    def from_counts(cls, counts: Int[np.ndarray, " vocab"], n_bins: int = 5) -> FrequencyBins:
        """Bins from per-type occurrence counts (see the class docstring for the rule)."""
        counts = np.asarray(counts, dtype=np.int64)
        if not isinstance(n_bins, int | np.integer) or n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
        total = int(counts.sum())
        if total == 0:
            raise ValueError("cannot bin an empty frequency table: no token was counted")
        values, group_types = np.unique(counts[counts > 0], return_counts=True)  # ascending
        if values.size < n_bins:
            raise ValueError(
                f"cannot fill {n_bins} frequency bins: the {int(group_types.sum())} seen token "
                f"types have only {values.size} distinct frequencies; use n_bins ≤ {values.size}"
            )
        mass = values * group_types  # occurrences per count group
        upper = np.cumsum(mass)  # cumulative mass after each group
        lower = upper - mass
        # bin holding the group's middle, floor(n · (lower + mass/2) / T), in exact integers
        group_bin = np.minimum((n_bins * (2 * lower + mass)) // (2 * total), n_bins - 1)
        if np.unique(group_bin).size < n_bins:
            group_bin = _least_squares_bins(upper, total, n_bins)
        bin_of_type = np.full(counts.shape, -1, dtype=np.int64)
        seen = counts > 0
        bin_of_type[seen] = group_bin[np.searchsorted(values, counts[seen])]
        log_values = np.log(values.astype(np.float64)) - np.log(float(total))
        first = np.searchsorted(group_bin, np.arange(n_bins))  # first group of each bin
        edges = np.append(log_values[first], log_values[-1])
        type_counts = np.bincount(group_bin, weights=group_types, minlength=n_bins)
        token_counts = np.bincount(group_bin, weights=mass, minlength=n_bins)
        arrays = (edges, bin_of_type, type_counts.astype(np.int64), token_counts.astype(np.int64))
        return cls(int(n_bins), *arrays)

    @property
    def vocab_size(self) -> int:
        return int(self.bin_of_type.shape[0])

    def assign(self, tokens: T) -> T:
        """Bin id of every token, same shape, int64 (torch in → torch out, on its device)."""
        if isinstance(tokens, torch.Tensor):
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise ValueError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
            ids = tokens.long()
            bad = (ids < 0) | (ids >= self.vocab_size)
            if bool(bad.any()):
                _check_ids(ids[bad][:1].cpu().numpy(), self.vocab_size, "tokens")
            return torch.tensor(self.bin_of_type, device=tokens.device)[ids]
        ids = _to_numpy(tokens, "tokens")
        _check_ids(ids, self.vocab_size, "tokens")
        return self.bin_of_type[ids]


def _least_squares_bins(upper: np.ndarray, total: int, n_bins: int) -> np.ndarray:
    """Bin of each count group with cuts at strictly increasing group boundaries that minimise
    ``Σ_j (F_cut_j / T − j / n_bins)²`` (dynamic programme); ``upper`` = cumulative mass (G,)."""
    n_groups = upper.size
    boundary = upper[:-1] / total  # boundary c (0-based) lies after group c: 0 … G − 2
    n_cuts = n_bins - 1
    # cost[j, c]: best cost of cuts 0..j with cut j at boundary c; choice for backtracking
    cost = np.full((n_cuts, n_groups - 1), np.inf)
    choice = np.zeros((n_cuts, n_groups - 1), dtype=np.int64)
    cost[0] = (boundary - 1 / n_bins) ** 2
    for j in range(1, n_cuts):
        prev = cost[j - 1]
        # best predecessor strictly left of c: running argmin of prev[0 .. c−1]
        best = np.full(n_groups - 1, np.inf)
        arg = np.zeros(n_groups - 1, dtype=np.int64)
        running, running_arg = np.inf, 0
        for c in range(1, n_groups - 1):
            if prev[c - 1] < running:
                running, running_arg = prev[c - 1], c - 1
            best[c], arg[c] = running, running_arg
        cost[j] = best + (boundary - (j + 1) / n_bins) ** 2
        choice[j] = arg
    cuts = np.zeros(n_cuts, dtype=np.int64)
    cuts[-1] = int(np.argmin(cost[-1]))
    for j in range(n_cuts - 1, 0, -1):
        cuts[j - 1] = choice[j, cuts[j]]
    # group g is in bin #{cuts c with c < g}: cut c puts groups ≤ c below it
    return np.searchsorted(cuts, np.arange(n_groups), side="left").astype(np.int64)
