"""Geometry metrics against reference implementations, side by side.

* TwoNN (ours, ``fit="facco"``) vs scikit-dimension ``TwoNN().fit(X).dimension_`` on the same
  points (goal: ≥ 4× faster, relative difference ≤ 1e-6).
* Exact O(n·d) mean pairwise cosine vs an all-pairs computation (row chunks of the Gram matrix of
  the unit rows, so memory stays bounded).

Run ``python -m benchmarks geometry [--quick]``; ``run(quick)`` returns the rows.
The points are an anisotropic Gaussian with a common offset (a spectrum decaying over three
decades plus a drift), float32 — the shape of transformer activations.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from benchmarks._timing import best_time
from tangentlens.metrics.geometry import cosine_anisotropy
from tangentlens.metrics.twonn import twonn_dimension

FULL = {"twonn_n": 16384, "cosine_n": 65536, "d": 768, "repeats": 2}
QUICK = {"twonn_n": 2048, "cosine_n": 4096, "d": 128, "repeats": 1}


def _points(n: int, d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    spectrum = torch.logspace(0, -1.5, d)  # standard deviations over three decades of variance
    offset = torch.randn(d, generator=gen)
    return torch.randn(n, d, generator=gen) * spectrum + offset


def _all_pairs_cosine(H: torch.Tensor, chunk: int = 2048) -> float:
    """Mean cosine over i ≠ j from explicit Gram blocks of the unit rows (float32 GEMM, float64
    sums; the diagonal is subtracted exactly)."""
    U = H / torch.linalg.vector_norm(H, dim=1, keepdim=True)
    n, total = U.shape[0], 0.0
    for start in range(0, n, chunk):
        block = U[start : start + chunk] @ U.T
        total += float(block.sum(dtype=torch.float64))
        total -= float(torch.diagonal(block, offset=start).sum(dtype=torch.float64))
    return total / (n * (n - 1))


def bench_twonn(n: int, d: int, repeats: int) -> dict[str, Any]:
    from skdim.id import TwoNN

    X = _points(n, d, seed=0)
    X_np = X.numpy()
    ours_s, ours = best_time(lambda: twonn_dimension(X, "facco"), repeats)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_s, ref = best_time(lambda: TwoNN().fit(X_np).dimension_, repeats)
    return {
        "benchmark": "twonn_facco",
        "shape": f"{n} × {d}",
        "ours": ours,
        "reference": float(ref),
        "reference_name": "scikit-dimension TwoNN",
        "ours_s": ours_s,
        "reference_s": ref_s,
        "difference": abs(ours - ref) / abs(ref),
        "difference_kind": "relative",
        "goal": "≥ 4× faster, rel. diff ≤ 1e-6",
    }


def bench_cosine(n: int, d: int, repeats: int) -> dict[str, Any]:
    H = _points(n, d, seed=1)
    ours_s, ours = best_time(lambda: cosine_anisotropy(H), repeats)
    ref_s, ref = best_time(lambda: _all_pairs_cosine(H), 1)
    return {
        "benchmark": "cosine_anisotropy",
        "shape": f"{n} × {d}",
        "ours": ours,
        "reference": ref,
        "reference_name": "all pairs (chunked Gram)",
        "ours_s": ours_s,
        "reference_s": ref_s,
        "difference": abs(ours - ref),
        "difference_kind": "absolute",
        "goal": "exact in O(n·d)",
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Run the geometry benchmarks; one dict per comparison."""
    cfg = QUICK if quick else FULL
    return [
        bench_twonn(cfg["twonn_n"], cfg["d"], cfg["repeats"]),
        bench_cosine(cfg["cosine_n"], cfg["d"], cfg["repeats"]),
    ]
