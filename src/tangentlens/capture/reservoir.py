"""A capped, seeded sample of rows that does not depend on how the stream was batched.

Every row carries a global id (its position in the analysis stream, e.g.
``sequence_index × seq_len + position``). Its priority is a 53-bit hash of ``(seed, id)``; the
reservoir keeps the ``capacity`` rows of smallest priority (bottom-k sampling), which is a uniform
sample without replacement of all rows seen. Because priorities depend only on ids, any split of
the stream into batches — and any merge of reservoirs filled from disjoint parts — holds exactly
the same rows. Memory is ``capacity`` rows whatever the number of tokens.

Every site of a capture offers the same rows of a batch to a reservoir of the same capacity and
seed: an :class:`Offer` hashes the batch's ids once, and each selection (which rows enter, into
which slots) is made once per reservoir state and read by every reservoir in that state (the
sites' reservoirs, fed the same offers, stay in the same state), its indices sent to the
device in one copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Int

from tangentlens.capture.transfer import upload, upload_many
from tangentlens.checks import check_count

__all__ = ["Offer", "RowReservoir", "row_priorities"]

RowIds = Int[torch.Tensor, " n"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def row_priorities(seed: int, ids: RowIds) -> torch.Tensor:
    """Uniform ``[0, 1)`` float64 priorities of row ``ids`` (n,): SplitMix64 of the id offset by
    a ``SeedSequence`` hash of ``seed``. Deterministic across platforms and batchings."""
    offset = np.random.SeedSequence(seed).generate_state(1, dtype=np.uint64)[0]
    z = ids.cpu().numpy().astype(np.uint64) * _GOLDEN + offset
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0**-53)


#: Names of reservoir states: a filled reservoir's state is named by the offer that made it.
_STATES = itertools.count()


@dataclass(eq=False)
class _Selection:
    """Which offered rows enter (``entering``, into the offer) and the slots they take
    (``slots``), host int64, and the reservoir's size after; the two indices on each device
    they are needed on, sent together once."""

    entering: torch.Tensor
    slots: torch.Tensor
    size: int
    _sent: dict[torch.device, list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def on(self, device: torch.device) -> list[torch.Tensor]:
        """``[entering, slots]`` on ``device``."""
        if device not in self._sent:
            self._sent[device] = upload_many([self.entering, self.slots], device)
        return self._sent[device]


@dataclass(eq=False)
class Offer:
    """Rows ``ids`` (n,) offered at once to every reservoir of ``seed`` (every site of one
    batch): their priorities hashed once, each selection made once per reservoir state."""

    ids: RowIds
    seed: int
    priority: torch.Tensor = field(init=False)
    _selections: dict[Hashable, tuple[int, _Selection]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.ids = self.ids.to("cpu", torch.int64)
        self.priority = row_priorities(self.seed, self.ids)


class RowReservoir:
    """Bottom-k sample of rows with named columns (e.g. ``H``, ``G``, ``token``, ``bin``).

    Args:
        capacity: rows kept at most (≥ 1).
        seed: seed of the priority hash.

    Columns are tensors whose first dimension is the row; every :meth:`add` must give the same
    column names. Storage is a fixed block of ``capacity`` rows per column, on the device of the
    rows first offered (where the model is: no copy to the host per batch; :meth:`to` moves
    it); ids and priorities, the bookkeeping, stay on the CPU. An offered batch costs one
    selection over ``capacity + n`` priorities, and only the rows that enter the sample are
    gathered and copied in, into the slots of evicted rows. :meth:`columns` returns the sample
    ordered by row id.
    """

    def __init__(self, capacity: int, seed: int) -> None:
        check_count(capacity, "reservoir capacity", minimum=1)
        self.capacity = capacity
        self.seed = seed
        self._size = 0
        self._ids = torch.empty(capacity, dtype=torch.int64)
        self._priority = torch.empty(capacity, dtype=torch.float64)
        self._columns: dict[str, torch.Tensor] = {}
        # the state's name: equal for reservoirs that hold the same rows in the same slots
        self._state: Hashable = ("empty", capacity)

    def __len__(self) -> int:
        return self._size

    def add(self, ids: RowIds, columns: dict[str, torch.Tensor]) -> None:
        """Offer rows ``ids`` (n,) int64 with their ``columns`` (each ``(n, ...)``)."""
        self.offer(Offer(ids, self.seed), columns)

    def offer(self, offer: Offer, columns: dict[str, torch.Tensor]) -> None:
        """Offer the rows of ``offer`` (made for this reservoir's seed) with their ``columns``
        (each ``(n, ...)``); the selection is read from ``offer`` when another reservoir in
        this one's state made it."""
        if offer.seed != self.seed:
            raise ValueError(
                f"the offer was hashed with seed {offer.seed}, the reservoir's is {self.seed}"
            )
        for name, col in columns.items():
            if col.shape[0] != offer.ids.shape[0]:
                raise ValueError(
                    f"column {name!r} has {col.shape[0]} rows but {offer.ids.shape[0]} ids were "
                    "given"
                )
        self._check_columns(columns)
        made = offer._selections.get(self._state)
        if made is None:
            made = (next(_STATES), self._select(offer.priority))
            offer._selections[self._state] = made
        self._state, selection = made
        self._apply(selection, offer.ids, offer.priority, columns)

    def merge(self, other: RowReservoir) -> None:
        """Absorb ``other`` (same capacity and seed, disjoint row ids)."""
        if (other.capacity, other.seed) != (self.capacity, self.seed):
            raise ValueError(
                "reservoirs merge only with equal capacity and seed, got "
                f"({self.capacity}, {self.seed}) and ({other.capacity}, {other.seed})"
            )
        if len(other):
            n = len(other)
            columns = {k: v[:n] for k, v in other._columns.items()}
            self._check_columns(columns)
            priority = other._priority[:n]
            self._apply(self._select(priority), other._ids[:n], priority, columns)
            self._state = next(_STATES)

    def _check_columns(self, columns: dict[str, torch.Tensor]) -> None:
        if self._columns and set(columns) != set(self._columns):
            raise ValueError(
                f"columns must stay {sorted(self._columns)} for every add, got {sorted(columns)}"
            )

    def _select(self, priority: torch.Tensor) -> _Selection:
        """The rows of ``priority`` that enter the sample (the ``capacity`` smallest priorities
        of the sample and the offer) and the slots they take (those of evicted rows, then the
        free ones)."""
        size = self._size
        pool = torch.cat([self._priority[:size], priority])
        if pool.numel() <= self.capacity:
            entering = torch.arange(priority.numel())
            slots = torch.arange(size, size + priority.numel())
        else:
            chosen = torch.topk(pool, self.capacity, largest=False).indices
            kept_old = torch.zeros(size, dtype=torch.bool)
            kept_old[chosen[chosen < size]] = True
            entering = chosen[chosen >= size] - size
            free = torch.cat(
                [torch.nonzero(~kept_old).flatten(), torch.arange(size, self.capacity)]
            )
            slots = free[: entering.numel()]
        return _Selection(entering, slots, min(self.capacity, pool.numel()))

    def _apply(
        self,
        selection: _Selection,
        ids: torch.Tensor,
        priority: torch.Tensor,
        columns: dict[str, torch.Tensor],
    ) -> None:
        """Copy the entering rows (ids, priorities and each column, where it is stored) into
        their slots."""
        if not self._columns:
            self._columns = {
                name: torch.empty(
                    (self.capacity, *col.shape[1:]), dtype=col.dtype, device=col.device
                )
                for name, col in columns.items()
            }
        entering, slots = selection.entering, selection.slots
        if entering.numel():
            self._ids[slots] = ids[entering]
            self._priority[slots] = priority[entering]
            for name, col in columns.items():
                stored = self._columns[name]
                rows = col[selection.on(col.device)[0]].detach()
                stored[selection.on(stored.device)[1]] = upload(rows, stored.device).to(
                    stored.dtype
                )
        self._size = selection.size

    @property
    def ids(self) -> RowIds:
        """Row ids of the sample, ascending."""
        return self._ids[: self._size].sort().values

    def columns(self) -> dict[str, torch.Tensor]:
        """The sampled columns, rows ordered by ascending id (on the columns' device)."""
        order = self._ids[: self._size].argsort()
        return {name: col[order.to(col.device)] for name, col in self._columns.items()}

    def to(self, device: torch.device | str) -> RowReservoir:
        """Move the sampled columns to ``device`` (in place); returns self."""
        self._columns = {name: col.to(device) for name, col in self._columns.items()}
        return self
