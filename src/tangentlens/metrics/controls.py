"""Matched-rank random control subspaces for the tangent account (METHODS.md §1.2).

* :func:`complement_frames` — Haar-random k-frames inside the orthogonal complement of the proxy
  ``T``: ``M ~ N(0, 1)^{d×k}``, ``M ← (I − P_T) M``, QR with the signs of ``diag(R)`` made
  positive (so the frame is Haar-distributed on the complement's Stiefel manifold);
* :func:`data_matched_frames` — random k-frames inside the top-m PCA span of ``H`` and orthogonal
  to the proxy, ruling out "gradients just live where the variance is".

Each draw has its own generator seeded from ``(*seed_key, draw)`` through ``numpy``'s
``SeedSequence`` — e.g. ``seed_key = (seed, step, layer, bin + 1)`` with bin 0 meaning "all" — so
any single draw can be reproduced alone and the global RNG is never touched. Frames are float64
``(draws, d, k)`` tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float

from tangentlens.checks import check_count
from tangentlens.metrics.subspace import check_basis
from tangentlens.seeding import seeded_generator

__all__ = ["complement_basis", "complement_frames", "data_matched_frames", "draw_generator"]

Frames = Float[torch.Tensor, "draws d k"]

#: Cosines of principal angles above this count as overlap between the PCA span and the proxy.
_OVERLAP_TOL = 1e-10


def draw_generator(seed_key: Sequence[int], draw: int) -> torch.Generator:
    """A local generator for one draw, seeded from ``(*seed_key, draw)`` (non-negative ints)."""
    return seeded_generator(*seed_key, draw)


def _haar_in(W: torch.Tensor, k: int, draws: int, seed_key: Sequence[int]) -> Frames:
    """``draws`` Haar k-frames inside ``span(W)`` (W: d × m orthonormal, m ≥ k): Gaussian
    m × k draws (one generator each), one batched QR, signs of ``diag(R)`` made positive."""
    g = torch.stack(
        [
            torch.randn(W.shape[1], k, generator=draw_generator(seed_key, j), dtype=torch.float64)
            for j in range(draws)
        ]
    )
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    return W @ q


def complement_basis(proxy: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis (d × (d − k_T)) of ``span(proxy)^⊥``: one d × d QR, so a caller
    drawing controls for one proxy under several seed keys computes it once."""
    T = check_basis(proxy, "proxy")
    d, k_t = T.shape
    full, _ = torch.linalg.qr(torch.cat([T, torch.eye(d, dtype=T.dtype)], dim=1))  # d × d
    return full[:, k_t:]  # the first k_T columns span T


def complement_frames(
    proxy: torch.Tensor,
    k: int,
    draws: int,
    seed_key: Sequence[int],
    *,
    complement: torch.Tensor | None = None,
) -> Frames:
    """Haar k-frames in the orthogonal complement of ``span(proxy)`` (proxy: d × k_T orthonormal).

    Equivalent to projecting Gaussian frames with ``I − P_T`` and orthonormalising; drawn in
    coordinates of an orthonormal basis of the complement, so the result is exactly orthogonal
    to the proxy. ``k ≤ d − k_T``. ``complement``: :func:`complement_basis` of this proxy, when
    the caller already has it (same frames, one QR fewer).
    """
    T = check_basis(proxy, "proxy")
    d, k_t = T.shape
    k = check_count(k, "k", minimum=1)
    draws = check_count(draws, "draws", minimum=1)
    if k > d - k_t:
        raise ValueError(f"k must be ≤ d − k_T = {d - k_t} (the complement's dimension), got {k}")
    if complement is None:
        complement = complement_basis(T)
    elif complement.shape != (d, d - k_t):
        raise ValueError(
            f"complement must be the proxy's complement basis ({d}, {d - k_t}), got "
            f"{tuple(complement.shape)}"
        )
    return _haar_in(complement, k, draws, seed_key)


def data_matched_frames(
    proxy: torch.Tensor, pca_basis: torch.Tensor, k: int, draws: int, seed_key: Sequence[int]
) -> Frames:
    """Haar k-frames inside the top-m PCA span of ``H`` (``pca_basis``: d × m, orthonormal) and
    orthogonal to the proxy: the subspace ``span(V) ∩ span(T)^⊥``, of dimension
    ``m − rank(TᵀV) ≥ m − k_T``, which must be ≥ k."""
    T = check_basis(proxy, "proxy")
    V = check_basis(pca_basis, "pca_basis", d=T.shape[0])
    k = check_count(k, "k", minimum=1)
    draws = check_count(draws, "draws", minimum=1)
    _, s, vh = torch.linalg.svd(T.T @ V, full_matrices=True)  # vh: m × m
    overlap = int((s > _OVERLAP_TOL).sum())
    W = V @ vh[overlap:].T  # orthonormal basis of span(V) ∩ span(T)^⊥
    if W.shape[1] < k:
        raise ValueError(
            f"the top-{V.shape[1]} PCA span has only {W.shape[1]} dimensions orthogonal to the "
            f"proxy, fewer than k = {k}; use a larger m (m ≥ k + k_T = {k + T.shape[1]} suffices)"
        )
    return _haar_in(W, k, draws, seed_key)
