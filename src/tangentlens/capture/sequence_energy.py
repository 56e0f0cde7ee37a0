"""Per-sequence gradient energy sums, gathered during capture, for the tangent-energy intervals
(METHODS.md §1.3).

A confidence interval must describe the reported estimator, the pooled energy fraction of
*every* kept token. Tokens of one sequence are not independent, so the bootstrap resamples
sequences — all analysed sequences, which needs per-sequence sums. When the proxies are known
before a step is captured (fit policy ``frozen_early``), the capture adds up, per sequence and
per frequency-bin *slot* (slot 0 = every kept token, slot ``b + 1`` = the tokens of bin ``b``):

* ``total``: ``Σ‖g‖²``;
* ``inside``: ``Σ gᵀ P_Q g = Σ‖g Q‖²`` for each proxy method (``P_Q`` = ``Q Qᵀ``);
* ``control``: ``Σ gᵀ P̄ g`` with ``P̄ = E[N Nᵀ] = k/(d − r) · (I − P_X)`` the *exact* mean
  projector of the method's exchangeable controls (Haar k-frames outside the excluded span X,
  m̂), so ``Σ_seq control`` is the family's exact mean energy ``k/(d − r) · (‖G‖² − ‖G X‖²)``,
  the denominator of the energy ratio — not the mean over the frames drawn, whose Monte-Carlo
  error would not shrink with the sequences;
* ``complement``: the same with the complement family's ``P̄`` (X = span(Q, m̂)).

Summed over sequences these equal the energies computed from the pooled second moments (up to
float64 summation order). The projectors depend on the proxies and m̂ only: no control frame is
drawn before the capture. Cost: one d × d Gram matrix per (sequence, bin) group of a batch —
about one extra ``Gᵀ G`` per batch, in a few batched products (:func:`group_grams`) — and one
product of the groups' Gram matrices with the ``3M`` projectors (``(groups, d²) @ (d², 3M)``),
whatever the number of tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float, Int

from tangentlens.capture.batch_rows import BatchRows
from tangentlens.capture.transfer import upload, upload_many
from tangentlens.checks import check_count
from tangentlens.metrics.controls import exclusion_basis, expected_projector

__all__ = [
    "EnergyProjectors",
    "EnergySums",
    "SequenceEnergy",
    "SequenceEnergyConfig",
    "group_grams",
]

#: The projectors of each method, in the order of :attr:`EnergyProjectors.stacked`.
_KINDS = ("inside", "control", "complement")


@dataclass(frozen=True, eq=False)
class EnergyProjectors:
    """The projectors of one site.

    ``methods``: proxy names; ``bases``: the proxies (d × k each, float64); ``excluded``: per
    method the span its exchangeable controls avoid (m̂, d × 1; None: all of ℝ^d);
    ``stacked``: ``(M, 3, d, d)`` — per method ``P_Q``, the exchangeable controls' exact mean
    projector ``k/(d − r) · (I − P_X)`` and the complement controls' (X = span(Q, m̂)).
    """

    methods: tuple[str, ...]
    bases: tuple[torch.Tensor, ...]
    excluded: tuple[torch.Tensor | None, ...]
    stacked: Float[torch.Tensor, "M 3 d d"]

    def __post_init__(self) -> None:
        m = len(self.methods)
        if m < 1 or len(set(self.methods)) != m or len(self.bases) != m:
            raise ValueError("methods must be distinct names, one basis each")
        if len(self.excluded) != m:
            raise ValueError("excluded must name one span (or None) per method")
        d = self.stacked.shape[-1]
        if self.stacked.shape != (m, len(_KINDS), d, d):
            raise ValueError(
                f"stacked must be ({m}, {len(_KINDS)}, d, d), got {tuple(self.stacked.shape)}"
            )

    @classmethod
    def from_proxies(
        cls,
        proxies: Mapping[str, torch.Tensor],
        excluded: Mapping[str, torch.Tensor | None],
    ) -> EnergyProjectors:
        """Projectors from the proxies (``method → d × k`` orthonormal basis) and the span each
        method's exchangeable controls avoid (``method → d × r`` or None), on the proxies'
        device."""
        methods = tuple(proxies)
        if set(excluded) != set(methods):
            raise ValueError(f"excluded must be given for exactly the methods {methods}")
        bases = tuple(torch.as_tensor(proxies[m]).detach().double() for m in methods)
        spans = tuple(
            None if excluded[m] is None else excluded[m].detach().double().to(q.device)
            for m, q in zip(methods, bases, strict=True)
        )
        stacked = []
        for q, x in zip(bases, spans, strict=True):
            d, k = q.shape
            stacked.append(
                torch.stack(
                    [
                        q @ q.T,
                        expected_projector(d, k, x, device=q.device),
                        expected_projector(d, k, exclusion_basis(q, x)),
                    ]
                )
            )
        return cls(methods, bases, spans, torch.stack(stacked))

    @property
    def d(self) -> int:
        return int(self.stacked.shape[-1])


class EnergySums(NamedTuple):
    """Per-sequence sums ``(S,)`` each of one method and slot: ``Σ‖gQ‖²``, ``Σ‖g‖²`` and the
    exact mean energies of the exchangeable and the complement controls."""

    inside: torch.Tensor
    total: torch.Tensor
    control: torch.Tensor
    complement: torch.Tensor


@dataclass(eq=False)
class _GramPlan:
    """How :func:`group_grams` gathers the groups of consecutive rows (``sizes`` (groups,),
    ``n`` rows) by size class: per class the rows of its groups (padded with the index ``n``,
    a zero row) and where their Gram matrices go, on the host — or on a device, once
    :meth:`with_indices` has the copies (sent in one transfer)."""

    n: int
    n_groups: int
    classes: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of(cls, sizes: Int[torch.Tensor, " groups"], n: int) -> _GramPlan:
        sizes = sizes.cpu()  # the grouping is bookkeeping: done on the host
        ends = torch.cumsum(sizes, 0)
        starts = ends - sizes
        size_class = torch.ceil(torch.log2(sizes.double())).long()
        classes = []
        for c in torch.unique(size_class).tolist():
            at = torch.nonzero(size_class == c).squeeze(1)
            offsets = torch.arange(2**c)
            rows = starts[at, None] + offsets
            classes.append((torch.where(offsets < sizes[at, None], rows, n), at))
        return cls(n, len(sizes), classes)

    def indices(self) -> list[torch.Tensor]:
        """Every index of the plan, class by class (rows, then where they go)."""
        return [t for pair in self.classes for t in pair]

    def with_indices(self, sent: list[torch.Tensor]) -> _GramPlan:
        """The plan with its indices replaced by ``sent`` (in :meth:`indices`' order)."""
        pairs = [(sent[2 * i], sent[2 * i + 1]) for i in range(len(self.classes))]
        return _GramPlan(self.n, self.n_groups, pairs)

    def grams(self, x: Float[torch.Tensor, "n d"]) -> Float[torch.Tensor, "groups d d"]:
        """The groups' Gram matrices of ``x`` (indices on ``x``'s device)."""
        d = x.shape[1]
        padded = torch.cat([x, x.new_zeros(1, d)])  # row n: the zero row padding points at
        out = x.new_empty(self.n_groups, d, d)
        for rows, at in self.classes:
            block = padded[rows]  # (groups of the class, 2^c, d)
            out[at] = block.transpose(1, 2) @ block
        return out


def group_grams(
    x: Float[torch.Tensor, "n d"], sizes: Int[torch.Tensor, " groups"]
) -> Float[torch.Tensor, "groups d d"]:
    """The Gram matrix ``XᵢᵀXᵢ`` of each group of consecutive rows of ``x`` (group ``i`` has
    ``sizes[i]`` rows). Groups are batched by size class (padded with zero rows to the next power
    of two, at most twice the work), so a batch costs a handful of batched products, not one
    small product per group."""
    plan = _GramPlan.of(sizes, x.shape[0])
    return plan.with_indices(upload_many(plan.indices(), x.device)).grams(x)


@dataclass(eq=False)
class _Groups:
    """One batch's (sequence, slot) groups for :meth:`SequenceEnergy.update`, the same for
    every site: the sequences (``ids``, host), the rows' order, where each group's sums go
    (slot 0 and, for binned groups, their bin's slot) and the Gram plan; indices on the
    device, sent in one copy."""

    ids: torch.Tensor
    order: torch.Tensor
    to_all: torch.Tensor
    binned: torch.Tensor | None
    to_bin: torch.Tensor | None
    plan: _GramPlan

    @classmethod
    def of(
        cls,
        row_ids: Int[torch.Tensor, " n"],
        bins: Int[torch.Tensor, " n"] | None,
        seq_len: int,
        n_slots: int,
        device: torch.device,
    ) -> _Groups:
        s = n_slots
        sequences = row_ids.cpu().long() // seq_len  # ids and bins: host bookkeeping
        slot = torch.zeros_like(sequences)
        if bins is not None and s > 1:
            b = bins.cpu().long()
            slot = torch.where((b >= 0) & (b < s - 1), b + 1, 0)
        key, order = torch.sort(sequences * s + slot, stable=True)
        groups, sizes = torch.unique_consecutive(key, return_counts=True)
        group_seq, group_slot = groups // s, groups % s  # on the host, as the ids
        ids, where = torch.unique(group_seq, return_inverse=True)
        binned = torch.nonzero(group_slot > 0).squeeze(1)
        plan = _GramPlan.of(sizes, len(order))
        host = [order, where * s]
        if len(binned):
            host += [binned, where[binned] * s + group_slot[binned]]
        sent = upload_many(host + plan.indices(), device)
        extra = 4 if len(binned) else 2
        return cls(
            ids,
            sent[0],
            sent[1],
            sent[2] if len(binned) else None,
            sent[3] if len(binned) else None,
            plan.with_indices(sent[extra:]),
        )


@dataclass(frozen=True, eq=False)
class SequenceEnergyConfig:
    """Per-sequence energy sums to gather during capture: the projectors per hook site, the
    token-row width ``seq_len`` (a row id ``// seq_len`` is the sequence index) and the
    frequency bins ``n_bins`` (the sums keep ``n_bins + 1`` slots). Compared by identity:
    statistics merge only when gathered with the same projectors."""

    seq_len: int
    projectors: Mapping[str, EnergyProjectors]
    n_bins: int = 0

    def __post_init__(self) -> None:
        check_count(self.seq_len, "seq_len", minimum=1)
        check_count(self.n_bins, "n_bins", minimum=0)


class SequenceEnergy:
    """Per-sequence sums ``total`` (S, slots), ``inside``, ``control`` and ``complement``
    (S, M, slots) of one site, in float64, for the sequences ``sequences`` (S,) (ascending
    stream indices) that had at least one kept token. A sequence with no token of bin ``b`` has
    zeros in slot ``b + 1``.
    """

    def __init__(
        self,
        projectors: EnergyProjectors,
        seq_len: int,
        n_slots: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        self.projectors = projectors
        self.seq_len = check_count(seq_len, "seq_len", minimum=1)
        self.n_slots = check_count(n_slots, "n_slots", minimum=1)
        m, d = len(projectors.methods), projectors.d
        # flattened to d² columns: kind-major (every method's P_Q, then P̄, then P̄ complement)
        flat = projectors.stacked.transpose(0, 1).reshape(len(_KINDS) * m, d * d)
        self._flat = upload(flat.to(torch.float64), device)  # pinned: no wait
        self._chunks: list[tuple[torch.Tensor, ...]] = []

    @property
    def methods(self) -> tuple[str, ...]:
        return self.projectors.methods

    def update(
        self,
        g: Float[torch.Tensor, "n d"],
        row_ids: Int[torch.Tensor, " n"],
        bins: Int[torch.Tensor, " n"] | None = None,
        *,
        batch: BatchRows | None = None,
    ) -> None:
        """Add kept gradient rows ``g`` (n, d), their global row ids and frequency bins (n,;
        bins outside ``[0, slots − 1)`` count in slot 0 only); ``batch``: the same rows'
        :class:`~tangentlens.capture.batch_rows.BatchRows`, whose grouping every site of the
        batch shares (made once)."""
        p = self.projectors
        if g.ndim != 2 or g.shape[1] != p.d or row_ids.shape != (g.shape[0],):
            raise ValueError(
                f"gradients must be (n, {p.d}) with one row id each, got {tuple(g.shape)} and "
                f"{tuple(row_ids.shape)}"
            )
        if not g.shape[0]:
            return
        m, s = len(p.methods), self.n_slots
        device = self._flat.device
        if batch is None:
            groups = _Groups.of(row_ids, bins, self.seq_len, s, device)
        else:
            key = ("sequence groups", self.seq_len, s, device)
            groups = batch.shared(
                key, lambda: _Groups.of(batch.row_ids, batch.bins, self.seq_len, s, device)
            )
        x = g.detach().to(device, torch.float64)[groups.order]
        grams = groups.plan.grams(x).flatten(1)  # (groups, d²)
        energies = (grams @ self._flat.T).view(-1, len(_KINDS), m)  # (groups, kind, method)
        total = torch.diagonal(grams.view(-1, p.d, p.d), dim1=1, dim2=2).sum(dim=1)
        n, kinds = len(groups.ids), len(_KINDS)
        # per (sequence, slot) row: Σ‖g‖², then the energies (kind-major); slot 0 gets every
        # group, a group of bin b its slot b + 1 as well (the rows' indices made on the host)
        values = torch.cat([total[:, None], energies.flatten(1)], dim=1)
        out = torch.zeros(n * s, 1 + kinds * m, dtype=torch.float64, device=device)
        out.index_add_(0, groups.to_all, values)
        if groups.binned is not None:
            out.index_add_(0, groups.to_bin, values[groups.binned])
        out = out.view(n, s, 1 + kinds * m)
        out_total = out[:, :, 0].contiguous()
        out_kinds = out[:, :, 1:].reshape(n, s, kinds, m).permute(2, 0, 3, 1).contiguous()
        self._chunks.append((groups.ids, out_total, *out_kinds))

    def _consolidated(self) -> tuple[torch.Tensor, ...]:
        """One chunk per sequence (sequences split across updates or merges are summed)."""
        m, s = len(self.projectors.methods), self.n_slots
        if not self._chunks:
            f64 = {"dtype": torch.float64}
            return (
                torch.zeros(0, dtype=torch.int64),
                torch.zeros(0, s, **f64),
                *(torch.zeros(0, m, s, **f64) for _ in _KINDS),
            )
        if len(self._chunks) > 1:
            device = self._chunks[0][1].device
            ids = torch.cat([c[0].cpu() for c in self._chunks])
            unique, where = torch.unique(ids, return_inverse=True)
            where = where.to(device)
            merged = [unique]
            for k in range(1, 2 + len(_KINDS)):
                parts = torch.cat([c[k].to(device) for c in self._chunks])
                out = parts.new_zeros((len(unique), *parts.shape[1:]))
                merged.append(out.index_add_(0, where, parts))
            self._chunks = [tuple(merged)]
        return self._chunks[0]

    @property
    def sequences(self) -> Int[torch.Tensor, " S"]:
        return self._consolidated()[0]

    @property
    def n_sequences(self) -> int:
        return int(self.sequences.numel())

    @property
    def total(self) -> Float[torch.Tensor, "S slots"]:
        return self._consolidated()[1]

    @property
    def inside(self) -> Float[torch.Tensor, "S M slots"]:
        return self._consolidated()[2]

    @property
    def control(self) -> Float[torch.Tensor, "S M slots"]:
        return self._consolidated()[3]

    @property
    def complement(self) -> Float[torch.Tensor, "S M slots"]:
        return self._consolidated()[4]

    def sums(self, method: str, bin_index: int | None = None) -> EnergySums:
        """Per-sequence :class:`EnergySums` (S,) each, of ``method`` over every kept token
        (``bin_index`` None) or over the tokens of one frequency bin."""
        if method not in self.methods:
            raise ValueError(f"no projectors for method {method!r}; have {self.methods}")
        slot = 0 if bin_index is None else bin_index + 1
        if not 0 <= slot < self.n_slots:
            raise ValueError(
                f"bin_index must be None or in [0, {self.n_slots - 1}), got {bin_index}"
            )
        j = self.methods.index(method)
        _, total, inside, control, complement = self._consolidated()
        return EnergySums(
            inside[:, j, slot], total[:, slot], control[:, j, slot], complement[:, j, slot]
        )

    def to(self, device: torch.device | str) -> SequenceEnergy:
        """Move the sums (and projectors) to ``device`` (in place); returns self."""
        self._chunks = [(c[0], *(t.to(device) for t in c[1:])) for c in self._chunks]
        self._flat = self._flat.to(device)
        return self

    def merge(self, other: SequenceEnergy) -> None:
        """Add the sums of a disjoint part of the stream gathered with the same projectors."""
        if (
            other.projectors is not self.projectors
            or other.seq_len != self.seq_len
            or other.n_slots != self.n_slots
        ):
            raise ValueError("sequence energies merge only when gathered with the same projectors")
        self._chunks.extend(other._chunks)
