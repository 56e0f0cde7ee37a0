"""Curvature visibility (ours; METHODS.md §1.6): how much of a point's neighbourhood leaves its
local tangent plane.

For an anchor point, take its ``k`` nearest neighbours (the anchor included) among the rows of
``H``, centre the patch and compute its local PCA: ``inside`` is the variance in the top ``m``
local directions (the fitted tangent), ``outside`` the rest. Visibility ``= outside / inside``:
0 on a flat m-dimensional patch, growing with curvature: on a circle of radius R sampled
uniformly over a patch of half-length t ≪ R it is ``t² / (15 R²)`` (the tangent coordinate has
variance t²/3, the normal one ≈ u²/2R has variance t⁴/(45 R²)). Pooled over a
group of anchors (e.g. a frequency bin) as ``Σ outside / Σ inside`` — a ratio of pooled sums, as
everywhere in tangentlens.

It depends on the sampling density by itself: with noise σ off a flat m-dimensional manifold
the outside variance is ``(d − m) σ²`` whatever the patch, the inside grows with the patch's
radius, so dense regions (small patches) read high and sparse ones low — 0.12 against 0.0003 on
one noisy plane (``tests/unit/test_curvature_visibility.py``). Compare groups only at matched
density.

Neighbours come from exact brute-force distances (float32 Gram blocks), anchors from a seeded
local generator (on the host, so every device draws the same anchors). Local spectra are
float64, on the device of the points.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from tangentlens.checks import check_count, check_matrix, to_float64
from tangentlens.seeding import seeded_generator
from tangentlens.typing import ArrayLike

__all__ = ["LocalSpectra", "local_spectra", "pooled_visibility"]


@dataclass(frozen=True)
class LocalSpectra:
    """Per anchor: ``anchors`` (row indices into H), ``inside`` and ``outside`` variances."""

    anchors: Int[torch.Tensor, " a"]
    inside: Float[torch.Tensor, " a"]
    outside: Float[torch.Tensor, " a"]

    @property
    def visibility(self) -> Float[torch.Tensor, " a"]:
        """``outside / inside`` per anchor."""
        return self.outside / self.inside


def _neighbours(X: torch.Tensor, anchors: torch.Tensor, k: int, block: int = 1024) -> torch.Tensor:
    """Indices (a, k) of the k nearest rows of X to each anchor row (itself included)."""
    sq = X.pow(2).sum(dim=1)
    out = []
    for start in range(0, anchors.numel(), block):
        idx = anchors[start : start + block]
        d2 = sq[idx, None] + sq[None, :] - 2 * (X[idx] @ X.T)
        d2[torch.arange(idx.numel()), idx] = -1.0  # the anchor itself comes first
        out.append(torch.topk(d2, k, dim=1, largest=False).indices)
    return torch.cat(out)


def local_spectra(
    H: ArrayLike,
    *,
    k: int = 32,
    tangent_dim: int = 2,
    n_anchors: int | None = 2048,
    seed: int = 0,
) -> LocalSpectra:
    """Inside/outside variance of the ``k``-nearest-neighbour patch of each anchor.

    Args:
        H: points (n × d), n ≥ k.
        k: patch size (≥ tangent_dim + 2).
        tangent_dim: dimension ``m`` of the local tangent plane.
        n_anchors: anchors drawn without replacement (seeded); ``None`` uses every row.
        seed: seeds the anchor draw.
    """
    points = check_matrix(H, "H", min_rows=2)
    X = points.to(torch.float32)  # neighbour search in float32; spectra from the input, float64
    n, d = X.shape
    m = check_count(tangent_dim, "tangent_dim", minimum=1)
    if m >= d:
        raise ValueError(f"tangent_dim must be < d = {d}, got {m}")
    k = check_count(k, "k", minimum=m + 2)
    if k > n:
        raise ValueError(f"k = {k} neighbours need at least {k} points, got {n}")
    if n_anchors is not None:
        n_anchors = check_count(n_anchors, "n_anchors", minimum=1)
    if n_anchors is None or n_anchors >= n:
        anchors = torch.arange(n, device=X.device)
    else:  # drawn on the host: the same anchors on every device
        gen = seeded_generator(seed, 0xC0A)
        anchors = torch.randperm(n, generator=gen)[:n_anchors].sort().values.to(X.device)
    patches = to_float64(points[_neighbours(X, anchors, k)])  # (a, k, d)
    centred = patches - patches.mean(dim=1, keepdim=True)
    gram = centred @ centred.transpose(1, 2) / k  # (a, k, k): same nonzero spectrum
    values = torch.linalg.eigvalsh(gram).flip(-1).clamp(min=0)
    inside = values[:, :m].sum(dim=1)
    if bool((inside <= 0).any()):
        raise ValueError("a neighbourhood has zero variance (duplicate points); deduplicate H")
    return LocalSpectra(anchors=anchors, inside=inside, outside=values[:, m:].sum(dim=1))


def pooled_visibility(
    spectra: LocalSpectra, groups: Int[torch.Tensor, " a"], n_groups: int
) -> Float[torch.Tensor, " groups"]:
    """``Σ outside / Σ inside`` over the anchors of each group (e.g. the frequency bin of the
    anchor's token); NaN for a group without anchors."""
    g = torch.as_tensor(groups).long().to(spectra.inside.device)
    if g.shape != spectra.inside.shape:
        raise ValueError(f"groups must have one entry per anchor ({spectra.inside.numel()})")
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= n_groups):
        raise ValueError(f"groups must lie in [0, {n_groups}); drop anchors without a group")
    zeros = spectra.inside.new_zeros(n_groups, dtype=torch.float64)
    inside = zeros.index_add(0, g, spectra.inside)
    return zeros.index_add(0, g, spectra.outside) / inside
