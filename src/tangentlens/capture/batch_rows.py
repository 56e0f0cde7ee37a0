"""One batch's kept rows as every site's statistics read them: their token ids, global row ids
and frequency bins on the host, and what is derived from them once for all sites.

Every site of a capture keeps the same rows of a batch (one kept-position set), so the host
bookkeeping — the rows sorted by bin, the tracked types' rows, the per-sequence groups, the
reservoir's priorities and selection — is the same for all of them: :meth:`BatchRows.shared`
makes each piece once per batch (with its device copy, sent in one transfer by the piece's
maker) and hands the same value to every site.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from jaxtyping import Int

__all__ = ["BatchRows"]

T = TypeVar("T")
Ids = Int[torch.Tensor, " n"]


@dataclass(eq=False)
class BatchRows:
    """The kept rows of one batch: ``tokens`` (n,), global ``row_ids`` (n,) and frequency
    ``bins`` (n,) or None, int64 on the host."""

    tokens: Ids
    row_ids: Ids
    bins: Ids | None = None
    _made: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tokens: Ids, row_ids: Ids, bins: Ids | None = None) -> BatchRows:
        """The rows given (moved to the host, int64)."""
        return cls(
            tokens.cpu().long(),
            row_ids.cpu().long(),
            None if bins is None else bins.cpu().long(),
        )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()`` the first time ``key`` is asked for in this batch, the same value after."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]
