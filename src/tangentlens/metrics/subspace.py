"""Subspaces in float64: orthonormal bases with a rank tolerance, projectors, principal angles.

Used by the dictionaries (which re-export these names) and by the controls. A subspace is
represented by an orthonormal basis ``Q`` (d × r): ``QᵀQ = I``, projector
``P = Q Qᵀ``. Dictionaries hand their directions as rows (``D``, k × d, the ``H ≈ Z D``
convention); :func:`span_basis` turns them into ``Q``.
"""

from __future__ import annotations

import functools
import math

import torch

from tangentlens.checks import check_count, check_fraction, check_matrix, to_float64
from tangentlens.typing import ArrayLike, Basis, Moment

__all__ = [
    "DEFAULT_RANK_RTOL",
    "check_basis",
    "principal_angles",
    "projector",
    "random_principal_angles",
    "span_basis",
]

#: Singular values below ``rtol × σ_max`` count as zero when a span's rank is decided.
DEFAULT_RANK_RTOL = 1e-6


def span_basis(directions: ArrayLike, rtol: float = DEFAULT_RANK_RTOL) -> Basis:
    """Orthonormal basis ``(d, r)`` float64 of the span of the rows of ``directions`` (k × d).

    Computed by SVD; ``r`` (the effective rank) counts singular values above ``rtol · σ_max``.
    The basis is the left singular vectors in decreasing singular-value order, each with its
    largest-magnitude entry made positive (deterministic signs). Raises ``ValueError`` for an
    all-zero input.
    """
    D = to_float64(check_matrix(directions, "directions"))
    rtol = check_fraction(rtol, "rtol", low=0.0, high=1.0, low_open=True, high_open=True)
    U, s, _ = torch.linalg.svd(D.T, full_matrices=False)  # D.T: (d, k)
    if not float(s[0]) > 0:
        raise ValueError("directions are all zero: their span has rank 0")
    r = int((s > rtol * s[0]).sum())
    Q = U[:, :r]
    signs = torch.sign(Q.gather(0, Q.abs().argmax(dim=0, keepdim=True)))
    return Q * signs


def check_basis(
    Q: ArrayLike, name: str = "Q", *, d: int | None = None, atol: float = 1e-6
) -> Basis:
    """Validate an orthonormal basis ``(d, r)``: finite, ``r ≤ d``, ``‖QᵀQ − I‖_max ≤ atol``.

    Returns it in float64.
    """
    B = to_float64(check_matrix(Q, name))
    rows, cols = B.shape
    if d is not None and rows != d:
        raise ValueError(f"{name} must have {d} rows (the site width), got {rows}")
    if cols > rows:
        raise ValueError(f"{name} must be d × r with r ≤ d, got {rows} × {cols}")
    err = float((B.T @ B - torch.eye(cols, dtype=B.dtype, device=B.device)).abs().max())
    if err > atol:
        raise ValueError(
            f"{name} must have orthonormal columns (QᵀQ = I); max deviation {err:.2g} > {atol:g}: "
            "orthonormalise it with tangentlens.dictionaries.span_basis"
        )
    return B


def projector(Q: ArrayLike) -> Moment:
    """``Q Qᵀ`` (d × d) float64, the orthogonal projector onto the span of ``Q``."""
    B = check_basis(Q)
    return B @ B.T


def principal_angles(Q1: ArrayLike, Q2: ArrayLike) -> torch.Tensor:
    """Principal angles (radians, float64, ascending) between ``span(Q1)`` and ``span(Q2)``.

    ``Q1`` (d × r₁) and ``Q2`` (d × r₂) are orthonormal bases; ``min(r₁, r₂)`` angles. Small
    angles come from sines and large ones from cosines (Björck & Golub 1973), so both ends are
    accurate.
    """
    A, B = check_basis(Q1, "Q1"), check_basis(Q2, "Q2")
    if A.shape[0] != B.shape[0]:
        raise ValueError(
            f"Q1 and Q2 must live in the same space, got d={A.shape[0]} and {B.shape[0]}"
        )
    if A.shape[1] < B.shape[1]:
        A, B = B, A
    return _angles(A, B)


def _angles(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Principal angles of orthonormal ``A`` (…, d, r₁) and ``B`` (…, d, r₂), r₁ ≥ r₂: small
    angles from sines, large ones from cosines; ascending, (…, r₂)."""
    cross = A.transpose(-2, -1) @ B  # (…, r_large, r_small)
    cosines = torch.linalg.svdvals(cross).clamp(max=1.0)  # descending → ascending angles
    sines = torch.linalg.svdvals(B - A @ cross).clamp(max=1.0)  # descending → descending
    sines = sines.flip(-1)  # ascending, aligned with ascending angles
    small = cosines**2 >= 0.5
    return torch.where(small, torch.arcsin(sines), torch.arccos(cosines)).clamp(0.0, math.pi / 2)


#: Pairs of random subspaces :func:`random_principal_angles` averages over.
RANDOM_PAIRS = 200


@functools.lru_cache(maxsize=256)
def random_principal_angles(
    d: int, k1: int, k2: int, pairs: int = RANDOM_PAIRS, seed: int = 0
) -> tuple[float, float]:
    """The random-subspace baseline of :func:`principal_angles`: the mean over ``pairs`` pairs
    of Haar-random subspaces of ℝ^d, of dimensions ``k1`` and ``k2``, of their mean and their
    largest principal angle, in degrees. Two random subspaces are already far apart (about 63°
    to 76° at k = 8–16, d = 32–128), so an angle between proxies is read against this, not
    against 90°. Seeded (the same numbers on every machine), on the host in float64; cached.

    >>> mean, largest = random_principal_angles(2, 1, 1, pairs=4000)
    >>> round(mean), round(largest)  # a random line against another in the plane: uniform angle
    (45, 45)
    """
    from tangentlens.seeding import seeded_generator

    d = check_count(d, "d", minimum=1)
    k1, k2 = check_count(k1, "k1", minimum=1), check_count(k2, "k2", minimum=1)
    if max(k1, k2) > d:
        raise ValueError(f"subspace dimensions must be ≤ d = {d}, got {k1} and {k2}")
    check_count(pairs, "pairs", minimum=1)
    big, small = max(k1, k2), min(k1, k2)  # the angles do not depend on the order
    generator = seeded_generator(seed, d, big, small)
    a = torch.linalg.qr(torch.randn(pairs, d, big, generator=generator, dtype=torch.float64))[0]
    b = torch.linalg.qr(torch.randn(pairs, d, small, generator=generator, dtype=torch.float64))[0]
    angles = _angles(a, b) * (180 / math.pi)  # (pairs, small)
    return float(angles.mean(dim=1).mean()), float(angles.max(dim=1).values.mean())
