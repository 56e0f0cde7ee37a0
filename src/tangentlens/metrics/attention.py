"""Query/key drift and attention entropy per head (Godey et al. 2024; METHODS.md §3).

* attention entropy — ``−Σⱼ aᵢⱼ log aᵢⱼ`` of each query row of an attention pattern (nats), averaged
  over the query positions kept; lower means sharper attention;
* query/key drift — per head, the mean query ``m_Q`` and mean key ``m_K`` (``d_head`` each) and
  ``‖m_Q‖``, ``‖m_K‖``, ``cos(m_Q, m_K)`` and the mean-term logit ``⟨m_Q, m_K⟩ / √d_head``.

Everything is computed in float64. ``*_sums`` functions return the additive pieces that the capture
accumulates over batches; the plain functions reduce one tensor directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float

from tangentlens.checks import as_tensor, check_count, to_float64
from tangentlens.typing import ArrayLike

__all__ = [
    "QKDrift",
    "attention_entropy",
    "attention_entropy_sums",
    "pattern_entropy_sums",
    "qk_drift",
    "qk_drift_from_means",
]

Pattern = Float[torch.Tensor, "batch head query key"]
QueryMask = Bool[torch.Tensor, "batch query"]
PerHead = Float[torch.Tensor, " head"]

#: How far a pattern row may sum from 1 (float32 softmax rows are within ~1e-6).
_ROW_SUM_TOLERANCE = 1e-3


def _check_pattern(pattern: ArrayLike) -> torch.Tensor:
    p = as_tensor(pattern, "pattern")
    if p.ndim != 4:
        raise ValueError(f"pattern must be 4-D (batch, head, query, key), got {tuple(p.shape)}")
    if not bool(torch.isfinite(p).all()):
        raise ValueError("pattern contains NaN or inf; only finite probabilities are allowed")
    if bool((p < 0).any()):
        raise ValueError("pattern has negative entries; attention probabilities must be ≥ 0")
    worst = float((p.to(torch.float64).sum(dim=-1) - 1).abs().max()) if p.numel() else 0.0
    if worst > _ROW_SUM_TOLERANCE:
        raise ValueError(
            f"pattern rows must sum to 1 over keys (softmax); worst row is off by {worst:.2g}"
        )
    return p


def attention_entropy_sums(
    pattern: ArrayLike, query_mask: QueryMask | None = None
) -> tuple[PerHead, int]:
    """Per-head sum of row entropies over the kept query rows, and the number of rows per head.

    Args:
        pattern: ``(batch, head, query, key)`` attention probabilities (rows sum to 1).
        query_mask: ``(batch, query)`` bool, the query positions to count (default all).

    Returns:
        ``(sums, n)``: float64 ``(head,)`` sums of ``−Σⱼ aᵢⱼ log aᵢⱼ`` (nats) and ``n`` rows.
    """
    return pattern_entropy_sums(_check_pattern(pattern), query_mask)


def pattern_entropy_sums(
    pattern: Pattern,
    query_mask: QueryMask | None = None,
    *,
    count: int | None = None,
    row_dtype: torch.dtype = torch.float64,
) -> tuple[PerHead, int]:
    """:func:`attention_entropy_sums` of a pattern known to be a softmax (a model's own, read by
    the capture's hooks): not validated — the checks cost as much as the entropy. ``count``:
    the number of kept query rows when the caller knows it (the capture counts them on the
    host: no read of the device's mask); ``row_dtype``: the precision of each row's
    ``−Σⱼ a log a`` over its keys (float64, or float32 where float64 is slow; the rows' sums
    are float64 either way)."""
    p = to_float64(pattern) if row_dtype == torch.float64 else pattern.to(row_dtype)
    batch, _, n_query, _ = p.shape
    row_entropy = -torch.special.xlogy(p, p).sum(dim=-1).to(torch.float64)  # (batch, head, query)
    if query_mask is None:
        return row_entropy.sum(dim=(0, 2)), batch * n_query
    if query_mask.shape != (batch, n_query) or query_mask.dtype != torch.bool:
        raise ValueError(
            f"query_mask must be a bool tensor of shape {(batch, n_query)}, got "
            f"{query_mask.dtype} {tuple(query_mask.shape)}"
        )
    keep = query_mask.to(p.device, torch.float64)[:, None, :]
    n = int(query_mask.sum()) if count is None else count
    return (row_entropy * keep).sum(dim=(0, 2)), n


def attention_entropy(pattern: ArrayLike, query_mask: QueryMask | None = None) -> PerHead:
    """Mean attention entropy per head (nats), ``(head,)`` float64, over the kept query rows."""
    sums, n = attention_entropy_sums(pattern, query_mask)
    if n == 0:
        raise ValueError("query_mask keeps no query position; entropy needs at least one")
    return sums / n


@dataclass(frozen=True)
class QKDrift:
    """Per-head drift of queries and keys; every field is a float64 ``(head,)`` tensor."""

    query_norm: PerHead
    key_norm: PerHead
    cosine: PerHead
    mean_logit: PerHead


def qk_drift_from_means(mean_query: ArrayLike, mean_key: ArrayLike) -> QKDrift:
    """:class:`QKDrift` from the per-head mean query and key, each ``(head, d_head)``.

    ``mean_logit = ⟨m_Q, m_K⟩ / √d_head`` is the logit every query–key pair shares through the
    means. A zero mean has no direction: the cosine then raises ``ValueError``.
    """
    mq = to_float64(as_tensor(mean_query, "mean_query"))
    mk = to_float64(as_tensor(mean_key, "mean_key"))
    if mq.ndim != 2 or mq.shape != mk.shape:
        raise ValueError(
            "mean_query and mean_key must both be (head, d_head), got "
            f"{tuple(mq.shape)} and {tuple(mk.shape)}"
        )
    if not (bool(torch.isfinite(mq).all()) and bool(torch.isfinite(mk).all())):
        raise ValueError("mean_query / mean_key contain NaN or inf")
    nq = torch.linalg.vector_norm(mq, dim=1)
    nk = torch.linalg.vector_norm(mk, dim=1)
    if bool((nq == 0).any()) or bool((nk == 0).any()):
        raise ValueError("a head has an exactly zero mean query or key: its cosine is undefined")
    dot = (mq * mk).sum(dim=1)
    return QKDrift(
        query_norm=nq, key_norm=nk, cosine=dot / (nq * nk), mean_logit=dot / math.sqrt(mq.shape[1])
    )


def qk_drift(queries: ArrayLike, keys: ArrayLike) -> QKDrift:
    """:class:`QKDrift` of query and key vectors, each ``(n, head, d_head)`` (one row per token)."""
    q = as_tensor(queries, "queries")
    k = as_tensor(keys, "keys")
    if q.ndim != 3 or k.ndim != 3 or q.shape[1:] != k.shape[1:]:
        raise ValueError(
            "queries and keys must be (n, head, d_head) with the same head and d_head, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    check_count(q.shape[0], "number of queries", minimum=1)
    check_count(k.shape[0], "number of keys", minimum=1)
    return qk_drift_from_means(to_float64(q).mean(dim=0), to_float64(k).mean(dim=0))
