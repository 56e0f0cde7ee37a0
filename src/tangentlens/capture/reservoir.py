"""A capped, seeded sample of rows that does not depend on how the stream was batched.

Every row carries a global id (its position in the analysis stream, e.g.
``sequence_index × seq_len + position``). Its priority is a 53-bit hash of ``(seed, id)``; the
reservoir keeps the ``capacity`` rows of smallest priority (bottom-k sampling), which is a uniform
sample without replacement of all rows seen. Because priorities depend only on ids, any split of
the stream into batches — and any merge of reservoirs filled from disjoint parts — holds exactly
the same rows. Memory is ``capacity`` rows whatever the number of tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Int

__all__ = ["RowReservoir", "row_priorities"]

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


class RowReservoir:
    """Bottom-k sample of rows with named columns (e.g. ``H``, ``G``, ``token``, ``bin``).

    Args:
        capacity: rows kept at most (≥ 1).
        seed: seed of the priority hash.

    Columns are tensors whose first dimension is the row; every :meth:`add` must give the same
    column names. :meth:`columns` returns the sample ordered by row id.
    """

    def __init__(self, capacity: int, seed: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"reservoir capacity must be an integer ≥ 1, got {capacity!r}")
        self.capacity = capacity
        self.seed = seed
        self._ids = torch.empty(0, dtype=torch.int64)
        self._priority = torch.empty(0, dtype=torch.float64)
        self._columns: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return int(self._ids.numel())

    def add(self, ids: RowIds, columns: dict[str, torch.Tensor]) -> None:
        """Offer rows ``ids`` (n,) int64 with their ``columns`` (each ``(n, ...)``)."""
        ids = ids.to("cpu", torch.int64)
        for name, col in columns.items():
            if col.shape[0] != ids.shape[0]:
                raise ValueError(
                    f"column {name!r} has {col.shape[0]} rows but {ids.shape[0]} ids were given"
                )
        if self._columns and set(columns) != set(self._columns):
            raise ValueError(
                f"columns must stay {sorted(self._columns)} for every add, got {sorted(columns)}"
            )
        priority = row_priorities(self.seed, ids)
        if len(self) == self.capacity:  # only rows that can enter need to be copied
            keep = priority < self._priority.max()
            ids, priority = ids[keep], priority[keep]
            columns = {name: col[keep.to(col.device)] for name, col in columns.items()}
        self._absorb(ids, priority, {k: v.detach().cpu() for k, v in columns.items()})

    def merge(self, other: RowReservoir) -> None:
        """Absorb ``other`` (same capacity and seed, disjoint row ids)."""
        if (other.capacity, other.seed) != (self.capacity, self.seed):
            raise ValueError(
                "reservoirs merge only with equal capacity and seed, got "
                f"({self.capacity}, {self.seed}) and ({other.capacity}, {other.seed})"
            )
        if not len(other):
            return
        if self._columns and set(other._columns) != set(self._columns):
            raise ValueError(
                f"cannot merge reservoirs with columns {sorted(self._columns)} and "
                f"{sorted(other._columns)}"
            )
        self._absorb(other._ids, other._priority, other._columns)

    def _absorb(
        self, ids: torch.Tensor, priority: torch.Tensor, columns: dict[str, torch.Tensor]
    ) -> None:
        if not self._columns:
            self._columns = {k: v[:0] for k, v in columns.items()}
        all_ids = torch.cat([self._ids, ids])
        all_priority = torch.cat([self._priority, priority])
        merged = {k: torch.cat([self._columns[k], columns[k]]) for k in self._columns}
        if all_ids.numel() > self.capacity:
            chosen = torch.topk(all_priority, self.capacity, largest=False).indices
            all_ids, all_priority = all_ids[chosen], all_priority[chosen]
            merged = {k: v[chosen] for k, v in merged.items()}
        self._ids, self._priority, self._columns = all_ids, all_priority, merged

    @property
    def ids(self) -> RowIds:
        """Row ids of the sample, ascending."""
        return self._ids.sort().values

    def columns(self) -> dict[str, torch.Tensor]:
        """The sampled columns, rows ordered by ascending id."""
        order = self._ids.argsort()
        return {name: col[order] for name, col in self._columns.items()}
