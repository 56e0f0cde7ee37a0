"""Semi-NMF concept dictionaries: ``H ≈ Z D`` with non-negative codes ``Z`` (n × k) and free
directions ``D`` (k × d) (Ding, Li & Jordan 2010).

Both solvers alternate an exact least-squares update of the directions,
``D ← (ZᵀZ)⁺ Zᵀ H``, with an update of the codes given ``A = H Dᵀ`` (n × k) and ``B = D Dᵀ``
(k × k):

* ``"mu"`` — the reference, Ding–Li–Jordan's multiplicative rule
  ``Z ← Z ∘ sqrt(([A]₊ + Z [B]₋) / ([A]₋ + Z [B]₊ + ε))``;
* ``"hals"`` (default) — one sweep of exact coordinate descent over the columns of ``Z``
  (hierarchical ALS): ``Z[:, j] ← max(0, Z[:, j] + (A[:, j] − Z B[:, j]) / B[j, j])``. Each column
  update solves its non-negative least-squares subproblem exactly, so the objective decreases at
  least as fast as with the multiplicative rule; ``make bench`` compares the two.

The objective ``‖H − Z D‖²_F = ‖H‖² − 2⟨Z, A⟩ + ⟨ZᵀZ, B⟩`` is evaluated from these small
products (no n × d residual is formed), in float64; large products run in the working dtype
(float32 by default). Fitting stops when the objective's relative decrease falls below ``tol``
or once the factorisation is exact (relative objective ≤ 1e-10).

Fitting and encoding run on one thread (:func:`tangentlens.runtime.single_thread`): the loop
issues thousands of products of n × k matrices, too small to gain from more threads and slowed
four- to fivefold by spinning threads when another program holds a core; the results do not
depend on the thread count.

Initialisation (seeded, shared by both solvers): ``D₀`` = ``k`` distinct rows of ``H`` drawn with a
local generator, ``Z₀ = max(0, A B⁺)``. The truncated SVD at the same rank bounds the error from
below (``svd_bound_``); semi-NMF can never beat it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tangentlens.checks import check_choice, check_count, check_fraction, check_matrix
from tangentlens.dictionaries.base import check_fitted, check_rank
from tangentlens.metrics.subspace import DEFAULT_RANK_RTOL, span_basis
from tangentlens.runtime import single_thread
from tangentlens.seeding import seeded_generator
from tangentlens.typing import Activations, ArrayLike, Basis, Codes, Dictionary

__all__ = ["SOLVERS", "SemiNMF"]

#: Semi-NMF solvers: ``hals`` (the default) or ``mu`` (the multiplicative reference).
SOLVERS: tuple[str, ...] = ("hals", "mu")
_EPS = 1e-12
#: A relative objective ‖H − ZD‖²/‖H‖² below this is an exact factorisation: stop there.
_OBJECTIVE_FLOOR = 1e-10
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _directions(Z: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """Least-squares ``D = (ZᵀZ)⁺ Zᵀ H`` (k × d); the k × k solve in float64."""
    gram = (Z.T @ Z).to(torch.float64)
    rhs = (Z.T @ H).to(torch.float64)
    return (torch.linalg.pinv(gram, hermitian=True) @ rhs).to(H.dtype)


def _mu_step(Z: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    B_pos, B_neg = B.clamp(min=0), (-B).clamp(min=0)
    A_pos, A_neg = A.clamp(min=0), (-A).clamp(min=0)
    return Z * torch.sqrt((A_pos + Z @ B_neg) / (A_neg + Z @ B_pos + _EPS))


def _hals_step(Z: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    Z = Z.clone()
    for j in range(Z.shape[1]):
        if B[j, j] > 0:
            step = (A[:, j] - Z @ B[:, j]) / B[j, j]
            Z[:, j] = (Z[:, j] + step).clamp_(min=0)
    return Z


class SemiNMF:
    """Semi-NMF dictionary of rank ``k``.

    Args:
        rank: number of directions, ``1 ≤ rank < d``.
        solver: ``"hals"`` (default) or ``"mu"`` (the multiplicative reference).
        seed: seeds the initial directions.
        tol: stop when the objective's relative decrease per iteration is below this.
        max_iter: iteration cap (``converged_`` tells whether ``tol`` was reached).
        dtype: working precision of the large products, ``"float32"`` or ``"float64"``.

    Fitted attributes: ``components_`` (k × d, the directions ``D``), ``n_iter_``,
    ``converged_``, ``objective_`` (per-iteration ``‖H − ZD‖²/‖H‖²``), ``relative_error_``
    (``‖H − ZD‖_F / ‖H‖_F``), ``svd_bound_`` (the same for the rank-k truncated SVD).
    """

    def __init__(
        self,
        rank: int,
        *,
        solver: str = "hals",
        seed: int = 0,
        tol: float = 1e-5,
        max_iter: int = 500,
        dtype: str = "float32",
    ) -> None:
        self.rank = check_count(rank, "rank", minimum=1)
        self.solver = check_choice(solver, "solver", SOLVERS)
        self.seed = check_count(seed, "seed", minimum=0)
        self.tol = check_fraction(tol, "tol", low=0.0, high=1.0, low_open=True, high_open=True)
        self.max_iter = check_count(max_iter, "max_iter", minimum=1)
        self.dtype = check_choice(dtype, "dtype", _DTYPES)

    # ------------------------------------------------------------------ fitting

    def _prepare(self, H: ArrayLike) -> torch.Tensor:
        X = check_matrix(H, "H").to(_DTYPES[self.dtype])
        check_rank(self.rank, X.shape[1], X.shape[0])
        return X

    def _init(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randperm(X.shape[0], generator=seeded_generator(self.seed, 0x5E31))[
            : self.rank
        ]
        D = X[rows.to(X.device)].clone()
        A, B = X @ D.T, D @ D.T
        pinv = torch.linalg.pinv(B.to(torch.float64), hermitian=True).to(X.dtype)
        return (A @ pinv).clamp_(min=0), D

    @single_thread()  # thousands of small products: a second thread gains nothing, spins a lot
    def fit(
        self, H: ArrayLike, on_iteration: Callable[[int, float], None] | None = None
    ) -> SemiNMF:
        """Fit ``H`` (n × d, finite, n ≥ rank).

        ``on_iteration(i, objective)`` is called after each iteration with the relative objective
        ``‖H − ZD‖²/‖H‖²`` (progress reporting).
        """
        X = self._prepare(H)
        sq_norm = float(X.to(torch.float64).pow(2).sum())
        if not sq_norm > 0:
            raise ValueError("H is all zeros: there is nothing to factorise")
        Z, D = self._init(X)
        D = _directions(Z, X)
        step = _hals_step if self.solver == "hals" else _mu_step
        history: list[float] = []
        converged = False
        for _ in range(self.max_iter):
            A, B = X @ D.T, D @ D.T
            Z = step(Z, A, B)
            history.append(self._objective(Z, A, B, sq_norm))
            if on_iteration is not None:
                on_iteration(len(history), history[-1])
            D = _directions(Z, X)
            exact = history[-1] <= _OBJECTIVE_FLOOR
            if exact or (len(history) > 1 and history[-2] - history[-1] <= self.tol * history[-2]):
                converged = True
                break
        A, B = X @ D.T, D @ D.T
        self.components_ = D
        self.n_iter_ = len(history)
        self.converged_ = converged
        self.objective_ = history
        self.relative_error_ = math.sqrt(max(self._objective(Z, A, B, sq_norm), 0.0))
        self.svd_bound_ = self._svd_bound(X, sq_norm)
        return self

    @staticmethod
    def _objective(Z: torch.Tensor, A: torch.Tensor, B: torch.Tensor, sq_norm: float) -> float:
        """``‖H − Z D‖² / ‖H‖²`` from ``A = H Dᵀ``, ``B = D Dᵀ`` (float64 reductions)."""
        Z64 = Z.to(torch.float64)
        cross = float((Z64 * A.to(torch.float64)).sum())
        quad = float(((Z64.T @ Z64) * B.to(torch.float64)).sum())
        return (sq_norm - 2 * cross + quad) / sq_norm

    def _svd_bound(self, X: torch.Tensor, sq_norm: float) -> float:
        gram = X.T.to(torch.float64) @ X.to(torch.float64) if X.shape[0] >= X.shape[1] else None
        if gram is None:  # fewer rows than columns: the n × n Gram has the same spectrum
            X64 = X.to(torch.float64)
            gram = X64 @ X64.T
        values = torch.linalg.eigvalsh((gram + gram.T) / 2).flip(0).clamp(min=0)
        tail = float(values[self.rank :].sum())
        return math.sqrt(max(tail, 0.0) / sq_norm)

    # ------------------------------------------------------------------ use

    @property
    def effective_rank_(self) -> int:
        """Rank of ``span(D)`` (singular values above ``1e-6 × σ_max``)."""
        check_fitted(self)
        return span_basis(self.components_, DEFAULT_RANK_RTOL).shape[1]

    @single_thread()
    def encode(self, H: ArrayLike, sweeps: int = 200) -> Codes:
        """Non-negative codes ``Z`` (n × k) of ``H`` with the directions held fixed (HALS
        sweeps until the objective changes by less than ``tol``, at most ``sweeps``)."""
        check_fitted(self)
        X = check_matrix(H, "H").to(self.components_.dtype)
        D = self.components_
        if X.shape[1] != D.shape[1]:
            raise ValueError(
                f"H must have {D.shape[1]} columns (the fitted width), got {X.shape[1]}"
            )
        sq_norm = max(float(X.to(torch.float64).pow(2).sum()), _EPS)
        A, B = X @ D.T, D @ D.T
        Z = (A @ torch.linalg.pinv(B.to(torch.float64), hermitian=True).to(X.dtype)).clamp(min=0)
        previous = self._objective(Z, A, B, sq_norm)
        for _ in range(check_count(sweeps, "sweeps", minimum=1)):
            Z = _hals_step(Z, A, B)
            current = self._objective(Z, A, B, sq_norm)
            if previous - current <= self.tol * max(previous, _EPS):
                break
            previous = current
        return Z

    def decode(self, Z: ArrayLike) -> Activations:
        """``Z D`` (n × d)."""
        check_fitted(self)
        return check_matrix(Z, "Z").to(self.components_.dtype) @ self.components_

    @property
    def directions(self) -> Dictionary:
        """The fitted directions ``D`` (k × d)."""
        check_fitted(self)
        return self.components_

    def basis(self) -> Basis:
        """Orthonormal basis of ``span(D)`` (d × rank), float64.

        Raises ``ValueError`` when the directions span fewer than ``rank`` dimensions (a
        collapsed dictionary: some codes died); :attr:`effective_rank_` tells how many.
        """
        check_fitted(self)
        Q = span_basis(self.components_, DEFAULT_RANK_RTOL)
        if Q.shape[1] < self.rank:
            raise ValueError(
                f"the semi-NMF directions span only {Q.shape[1]} of {self.rank} dimensions (the "
                f"effective rank collapsed); fit a rank ≤ {Q.shape[1]} or another seed"
            )
        return Q
