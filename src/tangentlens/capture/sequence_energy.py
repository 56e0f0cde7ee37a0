"""Per-sequence gradient energy sums, gathered during capture, for the tangent-energy intervals
(METHODS.md §1.3).

A confidence interval must describe the reported estimator, the pooled energy fraction of
*every* kept token. Tokens of one sequence are not independent, so the bootstrap resamples
sequences — all analysed sequences, which needs per-sequence sums. When the proxies are known
before a step is captured (fit policy ``frozen_early``), the capture adds up, per sequence and
per frequency-bin *slot* (slot 0 = every kept token, slot ``b + 1`` = the tokens of bin ``b``):

* ``total``: ``Σ‖g‖²``;
* ``inside``: ``Σ gᵀ P_Q g = Σ‖g Q‖²`` for each proxy method (``P_Q`` = ``Q Qᵀ``);
* ``control``: ``Σ gᵀ P̄ g`` with ``P̄ = meanⱼ Nⱼ Nⱼᵀ`` over the control frames of that method
  and slot, so ``Σ_seq control = meanⱼ ‖G Nⱼ‖²`` (the denominator of the energy ratio).

Summed over sequences these equal the energies computed from the pooled second moments (up to
float64 summation order). Cost: one d × d Gram matrix per (sequence, bin) group of a batch —
about one extra ``Gᵀ G`` per batch, in a few batched products (:func:`group_grams`) — and the
products of the groups' Gram matrices with the projectors each group needs (``P_Q`` and slot 0's
``P̄`` for all, its own slot's ``P̄`` for each: ``(groups, d²) @ (d², 3M)``), whatever the number
of tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tangentlens.capture.transfer import upload
from tangentlens.checks import check_count

__all__ = ["EnergyProjectors", "SequenceEnergy", "SequenceEnergyConfig", "group_grams"]


@dataclass(frozen=True, eq=False)
class EnergyProjectors:
    """The projectors of one site.

    ``methods``: proxy names; ``bases``: the proxies (d × k each, float64) the projectors were
    built from; ``inside``: ``P_Q`` per method, ``(M, d, d)``; ``control``: the mean control
    projector ``P̄`` per method and slot, ``(M, n_bins + 1, d, d)``; ``provenance``: what else the
    controls depend on (e.g. draws and seed keys), for the consumer to check.
    """

    methods: tuple[str, ...]
    bases: tuple[torch.Tensor, ...]
    inside: Float[torch.Tensor, "M d d"]
    control: Float[torch.Tensor, "M S d d"]
    provenance: Hashable = ()

    def __post_init__(self) -> None:
        m = len(self.methods)
        if m < 1 or len(set(self.methods)) != m or len(self.bases) != m:
            raise ValueError("methods must be distinct names, one basis each")
        d = self.inside.shape[-1]
        if self.inside.shape != (m, d, d) or self.control.ndim != 4:
            raise ValueError(
                f"inside must be (M, d, d) and control (M, slots, d, d), got "
                f"{tuple(self.inside.shape)} and {tuple(self.control.shape)}"
            )
        if self.control.shape[0] != m or self.control.shape[2:] != (d, d):
            raise ValueError(
                f"control must be ({m}, slots, {d}, {d}), got {tuple(self.control.shape)}"
            )

    @classmethod
    def from_frames(
        cls,
        proxies: Mapping[str, torch.Tensor],
        frames: Mapping[str, Sequence[torch.Tensor]],
        provenance: Hashable = (),
    ) -> EnergyProjectors:
        """Projectors from the proxies (``method → d × k`` orthonormal basis) and, per method,
        the control frames of every slot (``(draws, d, k)`` each; slot 0 = all tokens), on
        their device."""
        methods = tuple(proxies)
        if set(frames) != set(methods):
            raise ValueError(f"frames must be given for exactly the methods {methods}")
        slots = {len(frames[m]) for m in methods}
        if len(slots) != 1 or 0 in slots:
            raise ValueError("every method needs frames for the same, non-zero number of slots")
        bases = tuple(torch.as_tensor(proxies[m]).detach().double() for m in methods)
        inside = torch.stack([q @ q.T for q in bases])
        control = torch.stack(
            [
                torch.stack(
                    [
                        torch.einsum("jdk,jek->de", f.double(), f.double()) / f.shape[0]
                        for f in frames[m]
                    ]
                )
                for m in methods
            ]
        )
        return cls(methods, bases, inside, control, provenance)

    @property
    def d(self) -> int:
        return int(self.inside.shape[-1])

    @property
    def n_slots(self) -> int:
        """``n_bins + 1``: slot 0 is every kept token, slot ``b + 1`` frequency bin ``b``."""
        return int(self.control.shape[1])


def group_grams(
    x: Float[torch.Tensor, "n d"], sizes: Int[torch.Tensor, " groups"]
) -> Float[torch.Tensor, "groups d d"]:
    """The Gram matrix ``XᵢᵀXᵢ`` of each group of consecutive rows of ``x`` (group ``i`` has
    ``sizes[i]`` rows). Groups are batched by size class (padded with zero rows to the next power
    of two, at most twice the work), so a batch costs a handful of batched products, not one
    small product per group."""
    n, d = x.shape
    sizes = sizes.cpu()  # the grouping is bookkeeping: done on the host, indices uploaded
    ends = torch.cumsum(sizes, 0)
    starts = ends - sizes
    padded = torch.cat([x, x.new_zeros(1, d)])  # row n: the zero row padding points at
    size_class = torch.ceil(torch.log2(sizes.double())).long()
    out = x.new_empty(len(sizes), d, d)
    for c in torch.unique(size_class).tolist():
        at = torch.nonzero(size_class == c).squeeze(1)
        offsets = torch.arange(2**c)
        rows = starts[at, None] + offsets
        rows = torch.where(offsets < sizes[at, None], rows, n)
        block = padded[upload(rows, x.device)]  # (groups of the class, 2^c, d)
        out[upload(at, x.device)] = block.transpose(1, 2) @ block
    return out


@dataclass(frozen=True, eq=False)
class SequenceEnergyConfig:
    """Per-sequence energy sums to gather during capture: the projectors per hook site and the
    token-row width ``seq_len`` (a row id ``// seq_len`` is the sequence index). Compared by
    identity: statistics merge only when gathered with the same projectors."""

    seq_len: int
    projectors: Mapping[str, EnergyProjectors]

    def __post_init__(self) -> None:
        check_count(self.seq_len, "seq_len", minimum=1)


class SequenceEnergy:
    """Per-sequence sums ``total`` (S, slots), ``inside`` and ``control`` (S, M, slots) of one
    site, in float64, for the sequences ``sequences`` (S,) (ascending stream indices) that had
    at least one kept token. A sequence with no token of bin ``b`` has zeros in slot ``b + 1``.
    """

    def __init__(
        self, projectors: EnergyProjectors, seq_len: int, device: torch.device | str = "cpu"
    ) -> None:
        self.projectors = projectors
        self.seq_len = check_count(seq_len, "seq_len", minimum=1)
        m, s, d = len(projectors.methods), projectors.n_slots, projectors.d
        # flattened to d² columns: P_Q of every method and P̄ of slot 0 (every group needs
        # them), then P̄ of each slot ≥ 1 (only the groups of that slot need it)
        common = torch.cat([projectors.inside, projectors.control[:, 0]])
        self._common = common.reshape(2 * m, d * d).to(device, torch.float64)
        slotted = projectors.control.transpose(0, 1).reshape(s, m, d * d)
        self._slotted = slotted.to(device, torch.float64)
        self._chunks: list[tuple[torch.Tensor, ...]] = []

    @property
    def methods(self) -> tuple[str, ...]:
        return self.projectors.methods

    def update(
        self,
        g: Float[torch.Tensor, "n d"],
        row_ids: Int[torch.Tensor, " n"],
        bins: Int[torch.Tensor, " n"] | None = None,
    ) -> None:
        """Add kept gradient rows ``g`` (n, d), their global row ids and frequency bins (n,;
        bins outside ``[0, slots − 1)`` count in slot 0 only)."""
        p = self.projectors
        if g.ndim != 2 or g.shape[1] != p.d or row_ids.shape != (g.shape[0],):
            raise ValueError(
                f"gradients must be (n, {p.d}) with one row id each, got {tuple(g.shape)} and "
                f"{tuple(row_ids.shape)}"
            )
        if not g.shape[0]:
            return
        m, s = len(p.methods), p.n_slots
        sequences = row_ids.cpu().long() // self.seq_len  # ids and bins: host bookkeeping
        slot = torch.zeros_like(sequences)
        if bins is not None and s > 1:
            b = bins.cpu().long()
            slot = torch.where((b >= 0) & (b < s - 1), b + 1, 0)
        key, order = torch.sort(sequences * s + slot, stable=True)
        groups, sizes = torch.unique_consecutive(key, return_counts=True)
        device = self._common.device
        x = g.detach().to(device, torch.float64)[upload(order, device)]
        grams = group_grams(x, sizes).flatten(1)  # (groups, d²)
        common = grams @ self._common.T  # (groups, 2m): P_Q, then P̄ of slot 0
        inside, control_all = common[:, :m], common[:, m:]
        total = torch.diagonal(grams.view(-1, p.d, p.d), dim1=1, dim2=2).sum(dim=1)
        group_seq, group_slot = groups // s, groups % s  # on the host, as the ids
        ids, where = torch.unique(group_seq, return_inverse=True)
        on_device = upload(where, device)
        n = len(ids)
        # slot 0 gets every group (with the all-token control), a group's slot its own
        out_total = torch.zeros(n, s, dtype=torch.float64, device=device)
        out_inside = torch.zeros(n, m, s, dtype=torch.float64, device=device)
        out_control = torch.zeros(n, m, s, dtype=torch.float64, device=device)
        out_total[:, 0].index_add_(0, on_device, total)
        out_inside[:, :, 0].index_add_(0, on_device, inside)
        out_control[:, :, 0].index_add_(0, on_device, control_all)
        for slot_b in torch.unique(group_slot[group_slot > 0]).tolist():
            at = upload(torch.nonzero(group_slot == slot_b).squeeze(1), device)
            own = grams[at] @ self._slotted[slot_b].T  # (groups of the slot, m)
            out_total[:, slot_b].index_add_(0, on_device[at], total[at])
            out_inside[:, :, slot_b].index_add_(0, on_device[at], inside[at])
            out_control[:, :, slot_b].index_add_(0, on_device[at], own)
        self._chunks.append((ids, out_total, out_inside, out_control))

    def _consolidated(self) -> tuple[torch.Tensor, ...]:
        """One chunk per sequence (sequences split across updates or merges are summed)."""
        p = self.projectors
        m, s = len(p.methods), p.n_slots
        if not self._chunks:
            f64 = {"dtype": torch.float64}
            return (
                torch.zeros(0, dtype=torch.int64),
                torch.zeros(0, s, **f64),
                torch.zeros(0, m, s, **f64),
                torch.zeros(0, m, s, **f64),
            )
        if len(self._chunks) > 1:
            device = self._chunks[0][1].device
            ids = torch.cat([c[0].cpu() for c in self._chunks])
            unique, where = torch.unique(ids, return_inverse=True)
            where = where.to(device)
            merged = [unique]
            for k in (1, 2, 3):
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

    def sums(
        self, method: str, bin_index: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sequence ``(inside, total, control)`` (S,) each, of ``method`` over every kept
        token (``bin_index`` None) or over the tokens of one frequency bin."""
        if method not in self.methods:
            raise ValueError(f"no projectors for method {method!r}; have {self.methods}")
        slot = 0 if bin_index is None else bin_index + 1
        if not 0 <= slot < self.projectors.n_slots:
            raise ValueError(
                f"bin_index must be None or in [0, {self.projectors.n_slots - 1}), got {bin_index}"
            )
        j = self.methods.index(method)
        _, total, inside, control = self._consolidated()
        return inside[:, j, slot], total[:, slot], control[:, j, slot]

    def to(self, device: torch.device | str) -> SequenceEnergy:
        """Move the sums (and projectors) to ``device`` (in place); returns self."""
        self._chunks = [(c[0], *(t.to(device) for t in c[1:])) for c in self._chunks]
        self._common, self._slotted = self._common.to(device), self._slotted.to(device)
        return self

    def merge(self, other: SequenceEnergy) -> None:
        """Add the sums of a disjoint part of the stream gathered with the same projectors."""
        if other.projectors is not self.projectors or other.seq_len != self.seq_len:
            raise ValueError("sequence energies merge only when gathered with the same projectors")
        self._chunks.extend(other._chunks)
