"""Per-sequence gradient energy sums, gathered during capture, for the tangent-energy intervals
(METHODS.md §1.3).

A confidence interval must describe the reported estimator, the pooled energy fraction of
*every* kept token. Tokens of one sequence are not independent, so the bootstrap resamples
sequences — all analysed sequences, which needs per-sequence sums. When the proxies are known
before a step is captured (fit policy ``frozen_early``), the capture adds up, per sequence and
per frequency-bin *slot* (slot 0 = every kept token, slot ``b + 1`` = the tokens of bin ``b``):

* ``total``: ``Σ‖g‖²``;
* ``inside``: ``Σ gᵀ P_Q g = Σ‖g Q‖²`` for each proxy method (``P_Q`` = ``Q Qᵀ``);
* ``drift``: ``Σ (m̂ᵀg) g`` (d per sequence and slot), where the proxies hold the mean
  direction m̂: with it the energies of the drift-regressed gradients ``r = g − b (m̂ᵀg)``
  (:func:`tangentlens.metrics.drift_regression`) follow for any coefficient ``b``, which the
  whole step's moments fix only once the capture is done.

From these, :meth:`SequenceEnergy.sums` gives each method's sums: the proxy's energy and the
*exact* mean energies of its two control families (the controls' expected projector is
``k/(d − r) · (I − P_X)``, so no frame is drawn): for a proxy whose controls avoid m̂, of the
regressed gradients — ``Σ‖Qᵀr‖²``, ``k/(d − 1) · Σ‖r‖²`` (exchangeable: ``r ⊥ m̂``) and
``k/(d − 1 − k) · Σ(‖r‖² − ‖Qᵀr‖²)`` (complement, outside the proxy and m̂); for one whose
controls fill ℝ^d (m̂ itself, or no m̂), of the gradients — ``Σ‖Qᵀg‖²``, ``k/d · Σ‖g‖²`` and
``k/(d − k) · Σ(‖g‖² − ‖Qᵀg‖²)``. Summed over sequences these equal the energies computed from
the pooled second moments (up to float64 summation order). Cost per batch of n kept rows: the
rows' coordinates in every proxy (``n × d`` by ``d × ΣK``), their squared norms, and ``n × d``
for the drift — each row's sums added into its (sequence, slot) row — so time and memory grow
with ``n · d``, never with ``d²`` per sequence.
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

__all__ = [
    "EnergyProjectors",
    "EnergySums",
    "SequenceEnergy",
    "SequenceEnergyConfig",
]


@dataclass(frozen=True, eq=False)
class EnergyProjectors:
    """The projectors of one site.

    ``methods``: proxy names; ``bases``: the proxies (d × k each, float64); ``excluded``: per
    method the span its exchangeable controls avoid (m̂, d × 1; None: all of ℝ^d);
    ``stacked``: ``(M, d, d)`` — per method ``P_Q``; ``drift``: the mean direction m̂ (d,) whose
    drift sums are gathered (the ``excluded`` of every method that avoids it), or None.
    """

    methods: tuple[str, ...]
    bases: tuple[torch.Tensor, ...]
    excluded: tuple[torch.Tensor | None, ...]
    stacked: Float[torch.Tensor, "M d d"]
    drift: Float[torch.Tensor, " d"] | None = None

    def __post_init__(self) -> None:
        m = len(self.methods)
        if m < 1 or len(set(self.methods)) != m or len(self.bases) != m:
            raise ValueError("methods must be distinct names, one basis each")
        if len(self.excluded) != m:
            raise ValueError("excluded must name one span (or None) per method")
        d = self.stacked.shape[-1]
        if self.stacked.shape != (m, d, d):
            raise ValueError(f"stacked must be ({m}, d, d), got {tuple(self.stacked.shape)}")
        for x in self.excluded:
            if x is not None and (
                self.drift is None or x.shape != (d, 1) or not torch.equal(x[:, 0], self.drift)
            ):
                raise ValueError("an excluded span must be the mean direction m̂ (drift), d × 1")

    @classmethod
    def from_proxies(
        cls,
        proxies: Mapping[str, torch.Tensor],
        excluded: Mapping[str, torch.Tensor | None],
    ) -> EnergyProjectors:
        """Projectors from the proxies (``method → d × k`` orthonormal basis) and the span each
        method's exchangeable controls avoid (``method → m̂`` (d × 1) or None; one m̂ for all),
        on the proxies' device."""
        methods = tuple(proxies)
        if set(excluded) != set(methods):
            raise ValueError(f"excluded must be given for exactly the methods {methods}")
        bases = tuple(torch.as_tensor(proxies[m]).detach().double() for m in methods)
        spans = tuple(
            None if excluded[m] is None else excluded[m].detach().double().to(q.device)
            for m, q in zip(methods, bases, strict=True)
        )
        drifts = [x for x in spans if x is not None]
        drift = drifts[0][:, 0] if drifts else None
        stacked = torch.stack([q @ q.T for q in bases])
        return cls(methods, bases, spans, stacked, drift)

    @property
    def d(self) -> int:
        return int(self.stacked.shape[-1])


class EnergySums(NamedTuple):
    """Per-sequence sums ``(S,)`` each of one method and slot: the proxy's energy ``Σ‖gQ‖²``
    (of the drift-regressed gradients where its controls avoid m̂), ``Σ‖g‖²`` and the exact
    mean energies of the exchangeable and the complement controls."""

    inside: torch.Tensor
    total: torch.Tensor
    control: torch.Tensor
    complement: torch.Tensor


@dataclass(eq=False)
class _Slots:
    """Where one batch's rows add into the per-(sequence, slot) sums, the same for every site:
    the sequences (``ids`` (S,), on the host, ascending), each row's slot-0 row ``to_all`` (n,)
    and, for the rows of a frequency bin (``binned``), their bin's row ``to_bin``; indices on
    the device, sent in one copy."""

    ids: torch.Tensor
    to_all: torch.Tensor
    binned: torch.Tensor | None
    to_bin: torch.Tensor | None

    @classmethod
    def of(
        cls,
        row_ids: Int[torch.Tensor, " n"],
        bins: Int[torch.Tensor, " n"] | None,
        seq_len: int,
        n_slots: int,
        device: torch.device,
    ) -> _Slots:
        s = n_slots
        sequences = row_ids.cpu().long() // seq_len  # ids and bins: host bookkeeping
        slot = torch.zeros_like(sequences)
        if bins is not None and s > 1:
            b = bins.cpu().long()
            slot = torch.where((b >= 0) & (b < s - 1), b + 1, 0)
        ids, where = torch.unique(sequences, return_inverse=True)
        binned = torch.nonzero(slot > 0).squeeze(1)
        host = [where * s]
        if len(binned):
            host += [binned, where[binned] * s + slot[binned]]
        sent = upload_many(host, device)
        if not len(binned):
            return cls(ids, sent[0], None, None)
        return cls(ids, sent[0], sent[1], sent[2])


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
    """Per-sequence sums ``total`` (S, slots), ``inside`` (S, M, slots) and, with a drift
    direction, ``drift`` (S, slots, d) of one site, in float64, for the sequences
    ``sequences`` (S,) (ascending stream indices) that had at least one kept token. A sequence
    with no token of bin ``b`` has zeros in slot ``b + 1``.
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
        # every method's basis side by side (d × ΣK), and which method each column is (ΣK × M):
        # a row's ‖Qᵀg‖² per method is (g B)² summed over its method's columns
        bases = torch.cat([q.to(torch.float64) for q in projectors.bases], dim=1)
        widths = torch.tensor([q.shape[1] for q in projectors.bases])
        membership = torch.repeat_interleave(torch.eye(len(widths), dtype=torch.float64), widths, 0)
        drift = projectors.drift  # pinned uploads: no wait
        self._bases, self._membership = upload(bases, device), upload(membership, device)
        self._drift = None if drift is None else upload(drift.to(torch.float64), device)
        self._chunks: list[tuple[torch.Tensor, ...]] = []

    @property
    def methods(self) -> tuple[str, ...]:
        return self.projectors.methods

    @property
    def _width(self) -> int:
        """Columns per (sequence, slot): Σ‖g‖², one per method, d drift sums (with m̂)."""
        return 1 + len(self.methods) + (0 if self._drift is None else self.projectors.d)

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
        s = self.n_slots
        device = self._bases.device
        if batch is None:
            slots = _Slots.of(row_ids, bins, self.seq_len, s, device)
        else:
            key = ("sequence slots", self.seq_len, s, device)
            slots = batch.shared(
                key, lambda: _Slots.of(batch.row_ids, batch.bins, self.seq_len, s, device)
            )
        x = g.detach().to(device, torch.float64)
        coordinates = x @ self._bases  # (n, ΣK)
        # per row: ‖g‖², ‖Qᵀg‖² per method, then (m̂ᵀg) g
        columns = [x.pow(2).sum(dim=1, keepdim=True), coordinates.pow(2) @ self._membership]
        if self._drift is not None:
            columns.append((x @ self._drift)[:, None] * x)
        values = torch.cat(columns, dim=1)
        n = len(slots.ids)
        # per (sequence, slot) row; slot 0 gets every row, a row of bin b its slot b + 1 as well
        out = torch.zeros(n * s, self._width, dtype=torch.float64, device=device)
        out.index_add_(0, slots.to_all, values)
        if slots.binned is not None:
            out.index_add_(0, slots.to_bin, values[slots.binned])
        self._chunks.append((slots.ids, out.view(n, s, self._width)))

    def _consolidated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sequences, sums (S, slots, width))``, one row per sequence (sequences split
        across updates or merges are summed)."""
        if not self._chunks:
            empty = torch.zeros(0, self.n_slots, self._width, dtype=torch.float64)
            return torch.zeros(0, dtype=torch.int64), empty
        if len(self._chunks) > 1:
            device = self._chunks[0][1].device
            ids = torch.cat([c[0].cpu() for c in self._chunks])
            unique, where = torch.unique(ids, return_inverse=True)
            parts = torch.cat([c[1].to(device) for c in self._chunks])
            out = parts.new_zeros((len(unique), *parts.shape[1:]))
            self._chunks = [(unique, out.index_add_(0, where.to(device), parts))]
        return self._chunks[0]

    @property
    def sequences(self) -> Int[torch.Tensor, " S"]:
        return self._consolidated()[0]

    @property
    def n_sequences(self) -> int:
        return int(self.sequences.numel())

    @property
    def total(self) -> Float[torch.Tensor, "S slots"]:
        return self._consolidated()[1][:, :, 0]

    @property
    def inside(self) -> Float[torch.Tensor, "S M slots"]:
        m = len(self.methods)
        return self._consolidated()[1][:, :, 1 : 1 + m].transpose(1, 2)

    @property
    def drift(self) -> Float[torch.Tensor, "S slots d"] | None:
        """``Σ (m̂ᵀg) g`` per sequence and slot (None without a drift direction)."""
        if self._drift is None:
            return None
        return self._consolidated()[1][:, :, 1 + len(self.methods) :]

    def sums(
        self,
        method: str,
        bin_index: int | None = None,
        coefficient: Float[torch.Tensor, " d"] | None = None,
    ) -> EnergySums:
        """Per-sequence :class:`EnergySums` (S,) each, of ``method`` over every kept token
        (``bin_index`` None) or over the tokens of one frequency bin. A method whose controls
        avoid m̂ is scored on the drift-regressed gradients ``g − b (m̂ᵀg)``: ``coefficient``
        ``b`` (d,) is the slot's (:func:`tangentlens.metrics.drift_regression` of its pooled
        moment) and must be given."""
        if method not in self.methods:
            raise ValueError(f"no projectors for method {method!r}; have {self.methods}")
        slot = 0 if bin_index is None else bin_index + 1
        if not 0 <= slot < self.n_slots:
            raise ValueError(
                f"bin_index must be None or in [0, {self.n_slots - 1}), got {bin_index}"
            )
        j = self.methods.index(method)
        q = self.projectors.bases[j]
        d, k = q.shape
        total = self.total[:, slot]
        inside = self.inside[:, j, slot]
        if self.projectors.excluded[j] is None:  # controls in ℝ^d, complement outside the proxy
            return EnergySums(inside, total, k / d * total, k / (d - k) * (total - inside))
        if coefficient is None:
            raise ValueError(
                f"method {method!r} avoids m̂: its sums need the drift regression's coefficient"
            )
        drift = self.drift[:, slot]  # type: ignore[index]
        b = coefficient.to(drift.device, torch.float64)
        along = drift @ self._drift.to(drift.device)  # type: ignore[union-attr]
        qb = q.to(drift.device).T @ b
        regressed = inside - 2 * (drift @ q.to(drift.device)) @ qb + qb.dot(qb) * along
        outside = total - 2 * (drift @ b) + b.dot(b) * along  # Σ‖r‖², r ⊥ m̂
        return EnergySums(
            regressed, total, k / (d - 1) * outside, k / (d - 1 - k) * (outside - regressed)
        )

    def to(self, device: torch.device | str) -> SequenceEnergy:
        """Move the sums (and projectors) to ``device`` (in place); returns self."""
        self._chunks = [(ids, sums.to(device)) for ids, sums in self._chunks]
        self._bases, self._membership = self._bases.to(device), self._membership.to(device)
        if self._drift is not None:
            self._drift = self._drift.to(device)
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
