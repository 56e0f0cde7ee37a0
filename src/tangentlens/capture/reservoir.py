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

from tangentlens.capture.transfer import upload
from tangentlens.checks import check_count

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

    def __len__(self) -> int:
        return self._size

    def add(self, ids: RowIds, columns: dict[str, torch.Tensor]) -> None:
        """Offer rows ``ids`` (n,) int64 with their ``columns`` (each ``(n, ...)``)."""
        ids = ids.to("cpu", torch.int64)
        for name, col in columns.items():
            if col.shape[0] != ids.shape[0]:
                raise ValueError(
                    f"column {name!r} has {col.shape[0]} rows but {ids.shape[0]} ids were given"
                )
        self._offer(ids, row_priorities(self.seed, ids), columns)

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
            self._offer(other._ids[:n], other._priority[:n], columns)

    def _offer(
        self, ids: torch.Tensor, priority: torch.Tensor, columns: dict[str, torch.Tensor]
    ) -> None:
        if self._columns and set(columns) != set(self._columns):
            raise ValueError(
                f"columns must stay {sorted(self._columns)} for every add, got {sorted(columns)}"
            )
        if not self._columns:
            self._columns = {
                name: torch.empty(
                    (self.capacity, *col.shape[1:]), dtype=col.dtype, device=col.device
                )
                for name, col in columns.items()
            }
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
        if entering.numel():
            self._ids[slots] = ids[entering]
            self._priority[slots] = priority[entering]
            uploaded: dict[tuple[int, torch.device], torch.Tensor] = {}

            def on(index: torch.Tensor, device: torch.device) -> torch.Tensor:
                key = (id(index), device)  # each index goes to each device once
                if key not in uploaded:
                    uploaded[key] = upload(index, device)
                return uploaded[key]

            for name, col in columns.items():
                stored = self._columns[name]
                rows = col[on(entering, col.device)].detach()
                stored[on(slots, stored.device)] = upload(rows, stored.device).to(stored.dtype)
        self._size = min(self.capacity, pool.numel())

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
