"""TwoNN intrinsic dimension (Facco et al. 2017) with exact nearest neighbours in torch.

For each point, ``μ = r₂/r₁`` (second over first nearest-neighbour distance) follows a Pareto law
``F(μ) = 1 − μ^(−d)``, so ``−log(1 − F(μ)) = d · log μ``: ``d`` is the slope of a regression
through the origin of ``−log(1 − F_emp)`` on ``log μ``. Two fit conventions (METHODS.md §2):

``"facco"`` — scikit-dimension's ``TwoNN`` (``skdim/id/_TwoNN.py``, ``method="linear"``):
    sort the ``N`` ratios, keep the ``n_keep = int(N · (1 − discard_fraction))`` smallest,
    ``F_emp = (1, …, n_keep) / N``, slope ``Σxy / Σx²`` with ``x = log μ``, ``y = −log(1 − F)``.
    Ties ``μ = 1`` are kept (``x = 0``).
``"razzhigaev"`` — the Shape-of-Learning group's estimator (``intrinsic_dimension`` in their
    ``llm-microscope`` package): centre, divide by the mean row norm, mark points with
    ``r₁ < 1e-8`` (scaled) as bad (``μ = −1``), sort, drop the ``u`` ratios ``μ ≤ 1 + 1e-8``,
    keep ranks in the full list (``F_emp = (u + 1, …, N) / N``), and fit only the first
    ``min(⌊n · fit_fraction⌋, n − 1)`` of the ``n = N − u`` remaining ratios (``fit_fraction``
    0.2 is their ``reduction_factor`` 5).

Exact duplicate rows (``r₁ = 0``) are removed before anything else (first occurrence kept), so
``N`` counts distinct points — scikit-dimension instead drops every copy's undefined ratio.

``batch_size`` set: the Razzhigaev et al. protocol — the distinct rows are shuffled with a local
generator seeded with ``seed``, split into ``⌊N / batch_size⌋`` near-equal batches (each at least
``batch_size`` rows), estimated per batch and averaged.

Neighbour search (:func:`two_nearest_distances`): a centred, scaled float32 copy; blockwise
``‖a‖² + ‖b‖² − 2 a·b`` over the upper triangle of block pairs only (each block feeds the top-8
candidates of its rows and of its columns), so the GEMM work is ``n²d`` and memory
``O(block² + 8n)``. Candidates are re-measured exactly in float64 (``‖xᵢ − xⱼ‖`` of the input
rows), and a point's result is accepted only when the float32 value of the last re-measured
candidate exceeds its float64 ``r₂²`` by more than the worst-case float32 rounding error; the
other points (near-ties at float32 resolution, e.g. very dense low-dimensional data) are redone
against every row in float64. So ``r₁, r₂`` — and ties — are those of float64 brute force.
On CPU the float32 GEMM goes through oneDNN when available (about 2× MKL's sgemm on AMD CPUs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float

from tangentlens.checks import (
    CHUNK_ROWS,
    check_choice,
    check_count,
    check_fraction,
    check_matrix,
    to_float64,
)
from tangentlens.metrics.options import TWONN_FITS
from tangentlens.typing import ArrayLike

__all__ = [
    "TwoNNEstimate",
    "remove_duplicate_rows",
    "two_nearest_distances",
    "twonn_dimension",
    "twonn_estimate",
    "twonn_fit_facco",
    "twonn_fit_razzhigaev",
]

Fit = Literal["facco", "razzhigaev"]
Distances = Float[torch.Tensor, "n"]

#: float32 candidates kept per point before the exact float64 re-measurement.
N_CANDIDATES = 8
#: Thresholds of the Razzhigaev reference (on distances scaled by the mean norm, and on μ − 1).
_RAZZHIGAEV_EPS = 1e-8


@dataclass(frozen=True)
class TwoNNEstimate:
    """A TwoNN estimate with its batches.

    Attributes:
        dimension: the estimate (mean of ``batch_dimensions``).
        batch_dimensions: per-batch estimates (one entry when ``batch_size`` is None).
        batch_sizes: rows in each batch.
        n_rows: rows given.
        n_distinct: rows left after removing exact duplicates.
    """

    dimension: float
    batch_dimensions: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    n_rows: int
    n_distinct: int


# ------------------------------------------------------------------------ neighbour search


def remove_duplicate_rows(X: torch.Tensor) -> torch.Tensor:
    """Row indices of ``X`` (n × d) with exact duplicates removed, first occurrences, in order
    (on ``X``'s device: numpy's byte-wise ``unique`` on the CPU, a sorting ``torch.unique``
    elsewhere; the same indices)."""
    t = X.detach() + 0.0  # + 0.0 maps −0.0 to 0.0
    if t.device.type != "cpu":
        distinct, inverse = torch.unique(t, dim=0, return_inverse=True)
        order = torch.arange(t.shape[0], device=t.device)
        first = torch.full((distinct.shape[0],), t.shape[0], device=t.device)
        return first.scatter_reduce(0, inverse, order, "amin").sort().values
    if t.dtype == torch.bfloat16:  # no numpy bfloat16; widening is exact
        t = t.float()
    a = np.ascontiguousarray(t.numpy())
    rows = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    _, first = np.unique(rows, return_index=True)
    return torch.from_numpy(np.sort(first))


def _centred(X: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(X − mean) / scale`` in float32 with ``scale = max|X − mean|`` (ranking-invariant, safe
    from overflow), and ``scale``."""
    n, d = X.shape
    mean = torch.zeros(d, dtype=torch.float64, device=X.device)
    for start in range(0, n, CHUNK_ROWS):
        mean += to_float64(X[start : start + CHUNK_ROWS]).sum(dim=0)
    mean /= n
    out = torch.empty(n, d, dtype=torch.float32, device=X.device)
    scale = 0.0
    for start in range(0, n, CHUNK_ROWS):
        c = to_float64(X[start : start + CHUNK_ROWS]) - mean
        scale = max(scale, float(c.abs().max()))
        out[start : start + CHUNK_ROWS] = c
    scale = scale if scale > 0 else 1.0
    out /= scale
    return out, scale


def _merge(
    best_v: torch.Tensor, best_i: torch.Tensor, v: torch.Tensor, i: torch.Tensor, k: int
) -> None:
    """In place: keep the ``k`` smallest of ``best ∪ new`` per row."""
    vv, pos = torch.cat([best_v, v], dim=1).topk(k, dim=1, largest=False)
    best_i.copy_(torch.cat([best_i, i], dim=1).gather(1, pos))
    best_v.copy_(vv)


@functools.cache
def _onednn_linear_works() -> bool:
    """Whether oneDNN's fp32 linear (AVX-512 kernels; MKL's sgemm runs about 2× slower on AMD
    CPUs) is usable here. Strict fp32 — it only changes the summation order."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        a = torch.linspace(-1, 1, 15).reshape(5, 3)  # fixed values: no global RNG draws
        b, c = torch.linspace(2, -1, 12).reshape(4, 3), torch.linspace(0, 1, 4)
        out = torch._C._nn.mkldnn_linear(a.to_mkldnn(), b.to_mkldnn(), c.to_mkldnn()).to_dense()
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.allclose(out, torch.addmm(c, a, b.T), atol=1e-5))


def _minus2_gram_plus(A: torch.Tensor, B: torch.Tensor, sq_b: torch.Tensor) -> torch.Tensor:
    """``sq_b − 2·A·Bᵀ`` ``(len(A), len(B))`` in float32."""
    if A.device.type == "cpu" and A.dtype == torch.float32 and _onednn_linear_works():
        # −2·A is exact (a power of two), so this is the same quantity, one rounding per dot.
        m2a = (A * -2.0).to_mkldnn()
        return torch._C._nn.mkldnn_linear(m2a, B.to_mkldnn(), sq_b.to_mkldnn()).to_dense()
    return torch.addmm(sq_b.unsqueeze(0), A, B.T, alpha=-2.0)


def _candidates(
    Xs: torch.Tensor, sq: torch.Tensor, k: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest other rows of ``Xs`` by float32 squared distance: values, indices."""
    n = Xs.shape[0]
    best_v = torch.full((n, k), float("inf"), dtype=Xs.dtype, device=Xs.device)
    best_i = torch.full((n, k), -1, dtype=torch.long, device=Xs.device)
    for a in range(0, n, block_size):
        A, sq_a = Xs[a : a + block_size], sq[a : a + block_size]
        for b in range(a, n, block_size):
            B, sq_b = Xs[b : b + block_size], sq[b : b + block_size]
            D = _minus2_gram_plus(A, B, sq_b).add_(sq_a.unsqueeze(1))
            if a == b:
                D.fill_diagonal_(float("inf"))
            v, i = D.topk(min(k, D.shape[1]), dim=1, largest=False)
            _merge(best_v[a : a + block_size], best_i[a : a + block_size], v, i + b, k)
            if a != b:  # the same block serves the rows of B (a contiguous copy sorts faster)
                v, i = D.T.contiguous().topk(min(k, D.shape[0]), dim=1, largest=False)
                _merge(best_v[b : b + block_size], best_i[b : b + block_size], v, i + a, k)
    return best_v, best_i


def _remeasure(X: torch.Tensor, rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Sorted float64 distances ``‖x_row − x_c‖`` for candidate indices ``cand`` (m, k)."""
    out = torch.empty(cand.shape, dtype=torch.float64, device=X.device)
    step = max(1, CHUNK_ROWS // cand.shape[1])
    for s in range(0, rows.shape[0], step):
        x = to_float64(X[rows[s : s + step]]).unsqueeze(1)
        diff = to_float64(X[cand[s : s + step]]) - x
        out[s : s + step] = torch.linalg.vector_norm(diff, dim=2).sort(dim=1).values
    return out


def _brute_force(X: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted float64 distances from ``rows`` to their ``k`` nearest other rows, all pairs in
    float64 (row and column chunks, so memory stays bounded)."""
    n = X.shape[0]
    mean = sum(to_float64(X[s : s + CHUNK_ROWS]).sum(0) for s in range(0, n, CHUNK_ROWS)) / n
    m = rows.shape[0]
    best_v = torch.full((m, k), float("inf"), dtype=torch.float64, device=X.device)
    best_i = torch.full((m, k), -1, dtype=torch.long, device=X.device)
    step = 1024
    for s in range(0, m, step):
        r = rows[s : s + step]
        A = to_float64(X[r]) - mean
        sq_a = torch.einsum("nd,nd->n", A, A)
        for c in range(0, n, CHUNK_ROWS):
            B = to_float64(X[c : c + CHUNK_ROWS]) - mean
            sq_b = torch.einsum("nd,nd->n", B, B)
            D = torch.addmm(sq_b.unsqueeze(0), A, B.T, alpha=-2.0).add_(sq_a.unsqueeze(1))
            own = (r >= c) & (r < c + B.shape[0])
            D[own.nonzero().squeeze(1), r[own] - c] = float("inf")
            v, i = D.topk(min(k, D.shape[1]), dim=1, largest=False)
            _merge(best_v[s : s + step], best_i[s : s + step], v, i + c, k)
    return _remeasure(X, rows, best_i)


def two_nearest_distances(X: ArrayLike, *, block_size: int = 2048) -> tuple[Distances, Distances]:
    """Exact distances ``(r₁, r₂)`` (each ``(n,)``, float64) of every row of ``X`` (n × d, n ≥ 3)
    to its nearest and second-nearest *other* row. Duplicates give ``r₁ = 0``.

    Candidates (8 per row) come from a blockwise float32 search (``block_size`` rows per block)
    and are re-measured in float64 from the input rows, first the 3 nearest, then all 8. A row is
    settled when the float32 value of its last re-measured candidate exceeds its float64 ``r₂²``
    by more than the worst-case float32 rounding error of a squared distance,
    ``2(d + 8)·2⁻²⁴·(‖xᵢ‖² + maxⱼ‖xⱼ‖²)`` (centred, scaled data): then no other row can be
    closer. The rest (near-ties at float32 resolution, e.g. very dense low-dimensional data) are
    redone against all rows in float64.
    """
    Xt = check_matrix(X, "X", min_rows=3)
    block_size = check_count(block_size, "block_size", minimum=1)
    return _two_nearest(Xt, block_size)


def _two_nearest(Xt: torch.Tensor, block_size: int = 2048) -> tuple[Distances, Distances]:
    """:func:`two_nearest_distances` on a validated matrix."""
    n, d = Xt.shape
    k = min(N_CANDIDATES, n - 1)
    Xs, scale = _centred(Xt)
    sq = torch.einsum("nd,nd->n", Xs, Xs)
    best_v, best_i = _candidates(Xs, sq, k, block_size)
    sq64 = to_float64(sq)
    err = 2 * (d + 8) * 2.0**-24 * (sq64 + sq64.max())
    rows = torch.arange(n, device=Xt.device)
    dist = torch.empty(n, 2, dtype=torch.float64, device=Xt.device)
    # Re-measure the first m candidates; a row is settled when its m-th float32 value exceeds its
    # float64 r₂² by more than the rounding bound, or when m covers every other row.
    for m in sorted({min(3, k), k}):
        found = _remeasure(Xt, rows, best_i[rows, :m])[:, :2]
        dist[rows] = found
        if m == n - 1:
            rows = rows[:0]
            break
        bound = to_float64(best_v[rows, m - 1]) - err[rows]
        rows = rows[~(bound >= (found[:, 1] / scale) ** 2)]
        if rows.numel() == 0:
            break
    if rows.numel():
        dist[rows] = _brute_force(Xt, rows, k)[:, :2]
    return dist[:, 0].contiguous(), dist[:, 1].contiguous()


# ------------------------------------------------------------------------------- the fits


def _slope_through_origin(x: torch.Tensor, y: torch.Tensor) -> float:
    xx = float(x @ x)
    if xx == 0:
        raise ValueError("all fitted ratios μ equal 1 (r₁ = r₂ ties): TwoNN slope undefined")
    return float(x @ y) / xx


def twonn_fit_facco(mu: ArrayLike, discard_fraction: float = 0.1) -> float:
    """Facco fit exactly as scikit-dimension's ``TwoNN``: smallest ``int(N(1 − discard))`` ratios,
    ``F_emp = i / N``, least squares through the origin of ``−log(1 − F)`` on ``log μ``."""
    discard_fraction = check_fraction(
        discard_fraction, "discard_fraction", low_open=True, high_open=True
    )
    m = to_float64(torch.as_tensor(mu)).flatten()
    if bool((~torch.isfinite(m)).any()) or bool((m < 1).any()):
        raise ValueError("mu must hold finite ratios r₂/r₁ ≥ 1")
    N = m.shape[0]
    n_keep = int(N * (1 - discard_fraction))
    if n_keep < 2:
        raise ValueError(
            f"discard_fraction={discard_fraction} keeps {n_keep} of {N} ratios; the fit needs ≥ 2"
        )
    if n_keep >= N:
        raise ValueError(
            f"discard_fraction={discard_fraction} keeps all {N} ratios, so F_emp reaches 1 and "
            "−log(1 − F) is infinite; use a larger discard_fraction"
        )
    x = torch.log(m.sort().values[:n_keep])
    F = torch.arange(1, n_keep + 1, dtype=torch.float64, device=x.device) / N
    return _slope_through_origin(x, -torch.log1p(-F))


def twonn_fit_razzhigaev(r1: ArrayLike, r2: ArrayLike, fit_fraction: float = 0.2) -> float:
    """Razzhigaev fit from distances already divided by the mean norm of the centred rows.

    Points with ``r₁ < 1e-8`` count as bad (``μ = −1``); ratios ``μ ≤ 1 + 1e-8`` are dropped
    but keep their ranks in ``F_emp = rank / N``; the first ``min(⌊n · fit_fraction⌋, n − 1)``
    of the ``n`` kept ratios are fitted through the origin.
    """
    fit_fraction = check_fraction(fit_fraction, "fit_fraction", low_open=True)
    a = to_float64(torch.as_tensor(r1)).flatten()
    b = to_float64(torch.as_tensor(r2)).flatten()
    bad = a < _RAZZHIGAEV_EPS
    mu = torch.where(bad, torch.full_like(a, -1.0), b / torch.where(bad, torch.ones_like(a), a))
    mu = mu.sort().values
    N = mu.shape[0]
    useless = int((mu <= 1 + _RAZZHIGAEV_EPS).sum())
    n = N - useless
    # ⌊n · f⌋ robust to float rounding (n // 5 for the reference's fit_fraction 0.2)
    n_fit = min(int(n * fit_fraction + 1e-9), n - 1)
    if n_fit < 2:
        raise ValueError(
            f"fit_fraction={fit_fraction} leaves {n_fit} of {n} usable ratios (μ > 1) to fit; "
            "the fit needs ≥ 2: give more points or a larger fit_fraction"
        )
    F = torch.arange(useless + 1, useless + n_fit + 1, dtype=torch.float64, device=mu.device) / N
    x = torch.log(mu[useless : useless + n_fit])
    return _slope_through_origin(x, -torch.log1p(-F))


def _estimate(
    X: torch.Tensor,
    fit: str,
    discard_fraction: float,
    fit_fraction: float,
    distances: tuple[Distances, Distances] | None = None,
) -> float:
    """One TwoNN estimate on the distinct rows ``X`` (their ``(r₁, r₂)`` if already known)."""
    r1, r2 = _two_nearest(X) if distances is None else distances
    if bool((r1 == 0).any()):
        raise ValueError("rows closer than float64 resolution: TwoNN ratio undefined")
    if fit == "facco":
        return twonn_fit_facco(r2 / r1, discard_fraction)
    n = X.shape[0]
    mean = sum(to_float64(X[s : s + CHUNK_ROWS]).sum(0) for s in range(0, n, CHUNK_ROWS)) / n
    scale = (
        sum(
            float(torch.linalg.vector_norm(to_float64(X[s : s + CHUNK_ROWS]) - mean, dim=1).sum())
            for s in range(0, n, CHUNK_ROWS)
        )
        / n
    )
    return twonn_fit_razzhigaev(r1 / scale, r2 / scale, fit_fraction)


def twonn_estimate(
    H: ArrayLike,
    fit: Fit = "facco",
    *,
    discard_fraction: float = 0.1,
    fit_fraction: float = 0.2,
    batch_size: int | None = None,
    seed: int = 0,
) -> TwoNNEstimate:
    """TwoNN intrinsic dimension of the rows of ``H`` (n × d), with per-batch detail.

    Args:
        H: points, one per row.
        fit: ``"facco"`` (scikit-dimension) or ``"razzhigaev"`` (see the module docstring).
        discard_fraction: largest ratios left out by ``"facco"`` (in (0, 1); default 0.1).
        fit_fraction: smallest usable ratios fitted by ``"razzhigaev"`` (in (0, 1]; default 0.2).
        batch_size: ``None`` — one estimate on all distinct rows; an int — shuffle the distinct
            rows (seeded) into ``⌊N / batch_size⌋`` batches of at least ``batch_size`` rows and
            average the per-batch estimates (probes use 4096).
        seed: seeds the local generator of the shuffle.

    Raises:
        ValueError: bad input or options, fewer than 3 distinct rows, fewer distinct rows than
            ``batch_size``, or too few ratios for the fit.
    """
    X = check_matrix(H, "H", min_rows=3)
    fit = check_choice(fit, "fit", TWONN_FITS)
    if fit == "facco":
        check_fraction(discard_fraction, "discard_fraction", low_open=True, high_open=True)
    else:
        check_fraction(fit_fraction, "fit_fraction", low_open=True)
    seed = check_count(seed, "seed", minimum=0)
    if batch_size is not None:
        batch_size = check_count(batch_size, "batch_size", minimum=3)

    def distinct() -> torch.Tensor:
        keep = remove_duplicate_rows(X)
        if keep.shape[0] < 3:
            raise ValueError(f"TwoNN needs at least 3 distinct rows, got {keep.shape[0]}")
        return keep

    if batch_size is None:
        # Duplicates show up as r₁ = 0 (float64 differences vanish only for equal rows), so the
        # deduplication pass is only paid when there are some.
        distances = _two_nearest(X)
        keep = None
        if bool((distances[0] == 0).any()):
            keep = distinct()
            distances = _two_nearest(X[keep])
        n_distinct = X.shape[0] if keep is None else int(keep.shape[0])
        Xd = X if keep is None else X[keep]
        dims = (_estimate(Xd, fit, discard_fraction, fit_fraction, distances),)
        sizes = (n_distinct,)
    else:
        keep = distinct()
        n_distinct = int(keep.shape[0])
        if n_distinct < batch_size:
            raise ValueError(
                f"batch_size={batch_size} needs at least {batch_size} distinct rows, got "
                f"{n_distinct}; pass a smaller batch_size or batch_size=None"
            )
        gen = torch.Generator().manual_seed(seed)
        perm = keep[torch.randperm(n_distinct, generator=gen).to(keep.device)]
        batches = torch.tensor_split(perm, n_distinct // batch_size)
        dims = tuple(_estimate(X[idx], fit, discard_fraction, fit_fraction) for idx in batches)
        sizes = tuple(int(idx.shape[0]) for idx in batches)
    return TwoNNEstimate(
        dimension=float(np.mean(dims)),
        batch_dimensions=dims,
        batch_sizes=sizes,
        n_rows=int(X.shape[0]),
        n_distinct=n_distinct,
    )


def twonn_dimension(
    H: ArrayLike,
    fit: Fit = "facco",
    *,
    discard_fraction: float = 0.1,
    fit_fraction: float = 0.2,
    batch_size: int | None = None,
    seed: int = 0,
) -> float:
    """TwoNN intrinsic dimension of the rows of ``H`` (n × d); see :func:`twonn_estimate`."""
    return twonn_estimate(
        H,
        fit,
        discard_fraction=discard_fraction,
        fit_fraction=fit_fraction,
        batch_size=batch_size,
        seed=seed,
    ).dimension
