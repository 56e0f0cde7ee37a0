"""``capture.precision = "float32"`` against float64: the accuracy table.

Synthetic anisotropic rows (variances spanning three decades, a random orientation) whose mean's
norm is ρ = 30 times their spread (ρ = ‖μ‖/√tr Σ, METHODS.md §1.3), float32-representable as a
model's activations are, 10⁶ rows in batches of 8192 (the pythia_1b recipe's 16 × 512), at
d = 768 and 2048 (``--quick``: 10⁵ rows, d = 256). Each row of the table: the largest error of
float32 accumulation (:class:`tangentlens.capture.MomentAccumulator` at ``precision="float32"``:
float32 Grams of rows shifted by a frozen mean, added into float64) against float64's, and the
bound :mod:`tangentlens.capture.precision` states for it (the ``reference`` column):

* second moment: ``‖ΔM‖₂`` against ``ε = (n_b + 2)·u·(1 + n_b·u)²/(1 − n_b·u) · Σ‖x − c‖²``;
* top-8 and every eigenvalue of the scatter: ``max |Δλ|`` against ``ε`` (Weyl);
* energy fractions of a random rank-16 frame and of the top-16 PCA span: ``|ΔE|`` against
  ``17·ε/(tr M − ε)``;
* their ratio: the relative change against the sum of their relative bounds;
* plain float32 running sums of the unshifted rows (a float32 accumulator), for contrast.

Rows carry ``value`` (the error), ``bound`` and ``relative`` (the error over the quantity's
size); the accuracy test at a size the CPU affords is ``tests/unit/test_precision.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tangentlens.capture import MomentAccumulator
from tangentlens.capture.precision import gram_error_bound

#: Rows per batch (the pythia_1b recipe's 16 × 512) and the mean's norm over the spread.
BATCH_ROWS, RHO, RANK = 8192, 30.0, 16
SHAPES = {False: ((768, 10**6), (2048, 10**6)), True: ((256, 10**5),)}


def _source(d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(basis, spread per direction, mean) of the synthetic rows."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    spread = 10.0 ** torch.linspace(0, -1.5, d, dtype=torch.float64)
    direction = torch.randn(d, generator=gen, dtype=torch.float64)
    mean = RHO * math.sqrt(float(spread.pow(2).sum())) * direction / direction.norm()
    return basis, spread, mean


def _batches(d: int, n: int, seed: int = 0):
    basis, spread, mean = _source(d, seed)
    transform = (basis * spread).T.float()  # z @ (B diag(s))ᵀ, in float32
    gen = torch.Generator().manual_seed(seed + 1)
    for start in range(0, n, BATCH_ROWS):
        z = torch.randn(min(BATCH_ROWS, n - start), d, generator=gen)
        yield (z @ transform + mean.float()).double()


def _row(name: str, shape: str, value: float, bound: float, size: float) -> dict[str, Any]:
    return {
        "benchmark": name,
        "shape": shape,
        "reference_name": "stated bound",
        "ours_s": value,
        "reference_s": bound,
        "ours": value,
        "reference": bound,
        "difference": value / size if size else float("nan"),
        "difference_kind": "relative",
        "goal": "≤ the bound" if bound == bound else "for contrast",
        "unit": "",
    }


def accuracy_rows(d: int, n: int) -> list[dict[str, Any]]:
    """The table's rows at width ``d`` and ``n`` rows."""
    exact = MomentAccumulator(d)
    fast = MomentAccumulator(d, precision="float32")
    plain = torch.zeros(d, d, dtype=torch.float32)
    shifted_sq = 0.0
    for x in _batches(d, n):
        exact.update(x)
        fast.update(x)
        x32 = x.float()
        plain.addmm_(x32.T, x32)
        shifted_sq += float((x - fast.shift).pow(2).sum())  # type: ignore[operator]
    eps = gram_error_bound(BATCH_ROWS, shifted_sq)
    shape = f"d {d}, {n} rows, ρ {RHO:g}"

    def scatter(M: torch.Tensor) -> torch.Tensor:
        return M - torch.outer(exact.sum, exact.sum) / exact.count

    lam64 = torch.linalg.eigvalsh(scatter(exact.second_moment))
    lam32 = torch.linalg.eigvalsh(scatter(fast.second_moment))
    lam_plain = torch.linalg.eigvalsh(scatter(plain.double()))
    top = float(lam64[-1])
    moved = (lam32 - lam64).abs()
    rows = [
        _row(
            "second moment ‖ΔM‖₂",
            shape,
            float(torch.linalg.matrix_norm(fast.second_moment - exact.second_moment, 2)),
            eps,
            float(torch.linalg.matrix_norm(scatter(exact.second_moment), 2)),
        ),
        _row("top-8 eigenvalues max |Δλ|", shape, float(moved[-8:].max()), eps, top),
        _row("every eigenvalue max |Δλ|", shape, float(moved.max()), eps, float(lam64[0])),
    ]
    gen = torch.Generator().manual_seed(7)
    frames = {
        "random": torch.linalg.qr(torch.randn(d, RANK, generator=gen, dtype=torch.float64))[0],
        "top PCA": torch.linalg.eigh(scatter(exact.second_moment)).eigenvectors[:, -RANK:],
    }
    trace = float(torch.diagonal(exact.second_moment).sum())
    bound = (RANK + 1) * eps / (trace - eps)
    fractions = {}
    for label, Q in frames.items():
        e64, e32 = (
            float(torch.trace(Q.T @ M @ Q)) / float(torch.diagonal(M).sum())
            for M in (exact.second_moment, fast.second_moment)
        )
        fractions[label] = (e64, e32)
        rows.append(_row(f"energy fraction ({label}) |ΔE|", shape, abs(e32 - e64), bound, e64))
    r64 = fractions["top PCA"][0] / fractions["random"][0]
    r32 = fractions["top PCA"][1] / fractions["random"][1]
    relative = sum(bound / f[0] for f in fractions.values())
    change = abs(r32 / r64 - 1)
    rows.append(_row("energy ratio (top / random), relative", shape, change, relative, 1))
    rows.append(
        _row(
            "plain float32 running sums: every eigenvalue",
            shape,
            float((lam_plain - lam64).abs().max()),
            float("nan"),
            float(lam64[0]),
        )
    )
    smallest = float(lam_plain[0])
    rows.append(_row("plain float32: smallest eigenvalue", shape, smallest, float("nan"), 1))
    return rows


def run(
    quick: bool = False, emit: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """The accuracy table (see the module docstring), each shape's rows passed to ``emit`` as
    soon as they are measured."""
    rows = []
    with torch.no_grad():
        for d, n in SHAPES[quick]:
            for row in accuracy_rows(d, n):
                rows.append(row)
                if emit is not None:
                    emit(row)
    return rows


def render(rows: list[dict[str, Any]], console: Any) -> None:
    """The accuracy table: each error, its bound, and the error relative to the quantity."""
    from rich.table import Table

    table = Table(title="capture.precision float32 against float64")
    for column in ("quantity", "shape", "error", "bound", "error / size", "within"):
        table.add_column(column, justify="left" if column in ("quantity", "shape") else "right")
    for r in rows:
        bound = r["reference_s"]
        within = "—" if bound != bound else ("yes" if r["ours_s"] <= bound else "NO")
        table.add_row(
            r["benchmark"],
            r["shape"],
            f"{r['ours_s']:.3g}",
            f"{bound:.3g}",
            f"{r['difference']:.2g}",
            within,
        )
    console.print(table)
