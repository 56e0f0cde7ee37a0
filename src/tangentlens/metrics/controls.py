"""Matched-rank random control subspaces for the tangent account (METHODS.md §1.2).

A proxy ``T`` (d × k_T) that had the mean direction m̂ projected out of it is scored against two
families of Haar-random k-frames, each drawn from a span alone (never from the basis given for
it):

* **exchangeable** — Haar k-frames in ``span(m̂)⊥`` (in ℝ^d when no m̂ was projected out). They
  are exchangeable with a proxy whose span is uniform in ``span(m̂)⊥``, so the permutation
  p-value against them is exactly calibrated under the null "the proxy is a random set of
  directions" (``P(p ≤ α) = ⌊α(B + 1)⌋/(B + 1)`` for B draws); their exact mean energy is
  ``k/(d − 1) · (1 − E(m̂))``. The headline metrics use them;
* **complement** — Haar k-frames in ``span(T, m̂)⊥``, the "normal directions" of Bernas et al.
  Their mean energy is ``k/(d − 1 − k_T) · (1 − E(T) − E(m̂))``. They share a fixed energy budget
  with the proxy (a random proxy that catches more energy leaves less to its controls), so their
  p-value is *not* calibrated (P(p ≤ 0.05) ≈ 0.07–0.12 at d = 64–128, k = 16): reported under
  ``*_complement_*`` names.

:func:`control_frames` draws either family from the subspace to exclude; :func:`exclusion_basis`
builds that subspace's basis from several bases (e.g. ``T`` and ``m̂``);
:func:`data_matched_frames` draws frames inside the top-m PCA span of ``H`` minus an excluded
subspace (ruling out "gradients just live where the variance is"). Every frame is
``M ~ N(0, 1)^{d×k}`` projected onto the allowed subspace, then orthonormalised by QR with the
signs of ``diag(R)`` made positive — Haar-distributed on that subspace's Stiefel manifold, and a
function of the subspace only: the same span given in another basis gives the same frames (up to
rounding). Each draw has its own generator seeded from ``(*seed_key, draw)`` through ``numpy``'s
``SeedSequence`` — e.g. ``seed_key = (seed, step, layer, bin + 1)`` with bin 0 meaning "all" —
so any single draw can be reproduced alone and the global RNG is never touched; both families of
one key start from the same Gaussian draws. Frames are float64 ``(draws, d, k)`` tensors, drawn
and orthonormalised on the device of the excluded basis (or ``device``) with that device's own
generators (:mod:`tangentlens.seeding`: the same key gives the same frames on every device of a
type; a GPU's differ from the CPU's, statistically the same).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch
from jaxtyping import Float

from tangentlens.checks import check_count
from tangentlens.metrics.subspace import check_basis
from tangentlens.runtime import single_thread
from tangentlens.seeding import seeded_generator, seeded_generators
from tangentlens.typing import Basis

__all__ = [
    "REUSED_DRAWS_BYTES",
    "control_frames",
    "data_matched_frames",
    "draw_generator",
    "exclusion_basis",
    "expected_projector",
    "reused_draws",
]

Frames = Float[torch.Tensor, "draws d k"]

#: Singular values (relative to 1) above this count as a direction of the excluded span, and
#: cosines of principal angles above it as overlap between the PCA span and the excluded span.
_OVERLAP_TOL = 1e-10


def draw_generator(seed_key: Sequence[int], draw: int) -> torch.Generator:
    """A local generator for one draw, seeded from ``(*seed_key, draw)`` (non-negative ints)."""
    return seeded_generator(*seed_key, draw)


#: While :func:`reused_draws` is active: the Gaussian draws and frames kept so far, and the
#: bytes still free for more.
_REUSED: contextvars.ContextVar[
    tuple[dict[tuple, Frames], list[int], list[torch.Tensor]] | None
] = contextvars.ContextVar("reused_draws", default=None)

#: What :func:`reused_draws` keeps by default, at most (a step unit holds it through its capture:
#: the memory plan counts it).
REUSED_DRAWS_BYTES = 256 * 2**20


@contextlib.contextmanager
def reused_draws(max_bytes: int = REUSED_DRAWS_BYTES) -> Iterator[None]:
    """Within the block, the Gaussian draws of each ``(d, k, draws, seed key)`` and the frames
    of each ``(d, k, draws, seed key, excluded span)`` are made once and reused — the same
    numbers, computed once: a step's probes (the per-sequence projectors, the energy rows, the
    anisotropy share; a proxy and its complement family) draw the frames of one key up to eight
    times. The first ``max_bytes`` are kept (not the most recent: the probes scan the keys in
    the same order one after another, where least-recently-used keeping would never hit); the
    rest are made each time. Nested blocks share the outer one's."""
    if _REUSED.get() is not None:
        yield
        return
    token = _REUSED.set(({}, [check_count(max_bytes, "max_bytes", minimum=0)], []))
    try:
        yield
    finally:
        _REUSED.reset(token)


def _kept(key: tuple) -> Frames | None:
    """What :func:`reused_draws` keeps under ``key`` (None: nothing, or no block is active)."""
    reused = _REUSED.get()
    return None if reused is None else reused[0].get(key)


def _keep(key: tuple, value: Frames, basis: torch.Tensor | None = None) -> Frames:
    """Keep ``value`` under ``key`` (and ``basis``, the excluded span ``key`` names by id)
    while the active block has room for it; returns it."""
    reused = _REUSED.get()
    if reused is not None and value.nbytes <= reused[1][0]:
        reused[0][key] = value
        reused[1][0] -= value.nbytes
        if basis is not None:
            reused[2].append(basis)
    return value


def _gaussians(d: int, k: int, draws: int, seed_key: Sequence[int], device: torch.device) -> Frames:
    """``draws`` standard Gaussian d × k matrices on ``device``, one generator each (float64;
    reused within :func:`reused_draws` — callers never modify them in place)."""
    key = ("gaussians", d, k, draws, tuple(int(v) for v in seed_key), device)
    kept = _kept(key)
    if kept is not None:
        return kept
    generators = seeded_generators(*seed_key, count=draws, device=device)  # draw_generator's
    return _keep(
        key,
        torch.stack(
            [
                torch.randn(d, k, generator=generator, dtype=torch.float64, device=device)
                for generator in generators
            ]
        ),
    )


def _span_key(basis: torch.Tensor | None) -> tuple | None:
    """A key naming the basis given for a span: the tensor object itself (while a
    :func:`reused_draws` block keeps its frames, it keeps the basis too, so the id is not
    reused) and its version (an in-place change makes it another basis). A basis recomputed
    into a new tensor gets its frames drawn again: the same numbers."""
    if basis is None:
        return None
    return id(basis), basis._version


def _orthonormalise(projected: Frames) -> Frames:
    """Batched QR with the signs of ``diag(R)`` made positive (Haar on the subspace)."""
    q, r = torch.linalg.qr(projected)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]


def exclusion_basis(basis: torch.Tensor, *more: torch.Tensor | None) -> Basis:
    """An orthonormal basis (d × r, float64) of the span of ``basis`` and of every further basis
    (d × kᵢ each; None entries are skipped) — e.g. ``exclusion_basis(T, m̂)`` for the complement
    family."""
    given = [check_basis(b, "excluded basis") for b in (basis, *more) if b is not None]
    d = given[0].shape[0]
    if any(b.shape[0] != d for b in given):
        raise ValueError(f"excluded bases must all have {d} rows, got {[b.shape for b in given]}")
    if len(given) == 1:
        return given[0]
    u, s, _ = torch.linalg.svd(torch.cat(given, dim=1), full_matrices=False)
    return u[:, s > _OVERLAP_TOL * float(s[0])]


def expected_projector(
    d: int,
    k: int,
    excluded: torch.Tensor | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``E[N Nᵀ] = k/(d − r) · (I − X Xᵀ)`` (d × d, float64): the exact mean projector of Haar
    k-frames ``N`` in ``span(X)⊥`` (``excluded`` X: d × r orthonormal, or None for all of ℝ^d),
    on ``excluded``'s device (else ``device``, default the CPU). By symmetry the mean of a Haar
    k-frame's projector is the projector onto the allowed subspace scaled by ``k / its
    dimension``, so ``tr(E[NNᵀ] M) / tr(M) = k/(d − r) · (1 − E(X))``: the control family's
    exact mean energy, and per sequence ``gᵀ E[NNᵀ] g = k/(d − r) · (‖g‖² − ‖Xᵀg‖²)``.

    >>> expected_projector(4, 1, torch.eye(4, dtype=torch.float64)[:, :1]).diagonal().tolist()
    [0.0, 0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
    """
    d = check_count(d, "d", minimum=1)
    k = check_count(k, "k", minimum=1)
    at = excluded.device if excluded is not None else torch.device(device or "cpu")
    allowed = torch.eye(d, dtype=torch.float64, device=at)
    if excluded is not None:
        X = check_basis(excluded, "excluded", d=d)
        allowed = allowed - X @ X.T
    room = d - (0 if excluded is None else excluded.shape[1])
    if k > room:
        raise ValueError(
            f"k must be ≤ {room} (the dimension of the subspace the controls are drawn in: d "
            f"minus the excluded rank), got {k}"
        )
    return allowed * (k / room)


@single_thread()  # a batch of small QR factorisations: one thread is as fast, and never spins
def control_frames(
    d: int,
    k: int,
    draws: int,
    seed_key: Sequence[int],
    *,
    excluded: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> Frames:
    """Haar k-frames in ``span(excluded)⊥`` (``excluded``: d × r orthonormal, or None for all of
    ℝ^d): ``M ~ N(0, 1)^{d×k}``, ``M ← (I − P) M``, QR with a sign fix. ``k ≤ d − r``. Drawn
    on ``excluded``'s device, else on ``device`` (default the CPU).

    Exchangeable controls of a proxy with m̂ projected out: ``excluded = m̂`` (d × 1); its
    complement controls: ``excluded = exclusion_basis(T, m̂)``. Within :func:`reused_draws`
    the same tensor is returned for the same key and excluded basis: never modify it in place.
    """
    d = check_count(d, "d", minimum=1)
    k = check_count(k, "k", minimum=1)
    draws = check_count(draws, "draws", minimum=1)
    at = excluded.device if excluded is not None else torch.device(device or "cpu")
    key = ("frames", d, k, draws, tuple(int(v) for v in seed_key), at, _span_key(excluded))
    kept = _kept(key)  # a basis kept with its frames was checked when they were drawn
    if kept is not None:
        return kept
    B = None if excluded is None else check_basis(excluded, "excluded", d=d)
    room = d - (0 if B is None else B.shape[1])
    if k > room:
        raise ValueError(
            f"k must be ≤ {room} (the dimension of the subspace the controls are drawn in: d "
            f"minus the excluded rank), got {k}"
        )
    g = _gaussians(d, k, draws, seed_key, at)
    if B is not None:
        g = g - B @ (B.T @ g)
    return _keep(key, _orthonormalise(g), excluded)


def data_matched_frames(
    pca_basis: torch.Tensor,
    k: int,
    draws: int,
    seed_key: Sequence[int],
    *,
    excluded: torch.Tensor | None = None,
) -> Frames:
    """Haar k-frames inside ``span(V) ∩ span(excluded)⊥`` (``pca_basis`` V: d × m orthonormal, the
    top-m PCA span of ``H``; ``excluded``: d × r orthonormal or None), of dimension
    ``m − rank(excludedᵀV) ≥ m − r``, which must be ≥ k. Gaussian d × k draws projected onto that
    subspace and orthonormalised, so the frames depend on the two spans only."""
    V = check_basis(pca_basis, "pca_basis")
    d, m = V.shape
    k = check_count(k, "k", minimum=1)
    draws = check_count(draws, "draws", minimum=1)
    W = V
    if excluded is not None:
        B = check_basis(excluded, "excluded", d=d)
        _, s, vh = torch.linalg.svd(B.T @ V, full_matrices=True)  # vh: m × m
        overlap = int((s > _OVERLAP_TOL).sum())
        W = V @ vh[overlap:].T  # orthonormal basis of span(V) ∩ span(B)^⊥
    if W.shape[1] < k:
        raise ValueError(
            f"the top-{m} PCA span has only {W.shape[1]} dimensions outside the excluded "
            f"subspace, fewer than k = {k}; use a larger m (m ≥ k + the excluded rank suffices)"
        )
    g = _gaussians(d, k, draws, seed_key, W.device)
    return _orthonormalise(W @ (W.T @ g))
