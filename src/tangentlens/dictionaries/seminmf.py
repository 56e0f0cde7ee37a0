"""Semi-NMF concept dictionaries: ``H ≈ Z D`` with non-negative codes ``Z`` (n × k) and free
directions ``D`` (k × d) (Ding, Li & Jordan 2010).

Both solvers alternate an exact least-squares update of the directions,
``D ← (ZᵀZ)⁺ Zᵀ H``, with an update of the codes given ``A = H Dᵀ`` (n × k) and ``B = D Dᵀ``
(k × k):

* ``"mu"`` — the reference, Ding–Li–Jordan's multiplicative rule
  ``Z ← Z ∘ sqrt(([A]₊ + Z [B]₋) / ([A]₋ + Z [B]₊ + ε))``;
* ``"hals"`` (default) — one sweep of exact coordinate descent over the columns of ``Z``
  (hierarchical ALS): ``Z[:, j] ← max(0, (A[:, j] − Σ_{r≠j} Z[:, r] B[r, j]) / B[j, j])``
  (= ``max(0, Z[:, j] + (A[:, j] − Z B[:, j]) / B[j, j])``). Each column update solves its
  non-negative least-squares subproblem exactly, so the objective decreases at least as fast as
  with the multiplicative rule; ``make bench`` compares the two.

The objective ``‖H − Z D‖²_F = ‖H‖² − 2⟨Z, A⟩ + ⟨ZᵀZ, B⟩`` is evaluated from these small
products (no n × d residual is formed), in float64; large products run in the working dtype
(float32 by default). Fitting stops when the objective's relative decrease falls below ``tol``
or once the factorisation is exact (relative objective ≤ 1e-10).

Fitting and encoding run on one thread (:func:`tangentlens.runtime.single_thread`): the loop
issues thousands of products of n × k matrices, too small to gain from more threads and slowed
four- to fivefold by spinning threads when another program holds a core; the results do not
depend on the thread count. On the CPU the loop runs in numpy, whose per-call cost is a third of
torch's on these small products; on an accelerator in torch (the same code).

On an accelerator the loop does not wait on the host per iteration: it reads its objectives
(the stopping test, and ``on_iteration``) once per block of :data:`CHECK_EVERY` iterations, in
one transfer, and ends on the iteration the test stops at (each iteration's state is kept
within the block); the least-squares directions are solved by a Cholesky factorisation of
``ZᵀZ`` (a dead code, an all-zero column, gets a unit pivot: its direction stays 0, as the
pseudo-inverse gives) without the eigen-decomposition's host check, flagged when ``ZᵀZ`` is
too ill-conditioned for the pseudo-inverse's cut to be moot (``‖L⁻¹‖²_F · tr(ZᵀZ) · k · eps ≥
1``, which bounds the smallest eigenvalue from below); a block with a flagged iteration is run
again from its start with the pseudo-inverse (waiting on the host once per iteration). A fit
waits at most once per 10 iterations, plus its set-up (the norm, the first directions, the
SVD bound and the final error).

Where ``tol`` stops the fit depends on the last bits of the arithmetic: semi-NMF's objective is
flat along some directions. On the quickstart's reservoirs (n = 4096, d = 128, k = 16), scaling
the input by ``1 + 1e-7`` moved the fitted span by up to 3.8° at the largest principal angle
(≤ 0.26° on average over the angles) and the relative error by ≤ 6e-5; angles between semi-NMF
fits (``subspace_stability``) carry that floor, which :func:`rounding_angles` measures for a
given fit (the same rows scaled by :data:`ROUNDING_SCALE`: one span in exact arithmetic).

Initialisation (seeded, shared by both solvers): ``D₀`` = ``k`` distinct rows of ``H`` drawn with a
local generator, ``Z₀ = max(0, A B⁺)``. The truncated SVD at the same rank bounds the error from
below (``svd_bound_``); semi-NMF can never beat it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from tangentlens.checks import check_choice, check_count, check_fraction, check_matrix
from tangentlens.dictionaries.base import check_fitted, check_rank
from tangentlens.metrics.subspace import DEFAULT_RANK_RTOL, principal_angles, span_basis
from tangentlens.runtime import single_thread
from tangentlens.seeding import seeded_generator
from tangentlens.typing import Activations, ArrayLike, Basis, Codes, Dictionary

__all__ = ["CHECK_EVERY", "ROUNDING_SCALE", "SOLVERS", "SemiNMF", "rounding_angles"]

#: Semi-NMF solvers: ``hals`` (the default) or ``mu`` (the multiplicative reference).
SOLVERS: tuple[str, ...] = ("hals", "mu")
_EPS = 1e-12
#: A relative objective ‖H − ZD‖²/‖H‖² below this is an exact factorisation: stop there.
_OBJECTIVE_FLOOR = 1e-10
#: The device loop reads its objectives (the stopping test) once per this many iterations.
CHECK_EVERY = 10
_DTYPES = {"float32": torch.float32, "float64": torch.float64}

# The loops hold the codes transposed, ``Zt = Zᵀ`` (k × n: each code a contiguous row) with
# ``At = Aᵀ = D Hᵀ``, and are written once for an array namespace ``xp``: numpy for a CPU tensor
# (its per-call cost is a third of torch's on these small products: 1.4 against 4–5 ms per
# iteration at n = 4096, d = 128, k = 16), torch on an accelerator.
Namespace = Any


def _namespace(X: torch.Tensor) -> Namespace:
    return np if X.device.type == "cpu" else torch


def _arrays(xp: Namespace, tensor: torch.Tensor) -> Any:
    return tensor.numpy() if xp is np else tensor


def _tensor(array: Any) -> torch.Tensor:
    return torch.from_numpy(array) if isinstance(array, np.ndarray) else array


def _float64(xp: Namespace, a: Any) -> Any:
    return xp.asarray(a, dtype=xp.float64)


def _gram(xp: Namespace, Zt: Any) -> Any:
    """``ZᵀZ`` (k × k) in float64."""
    Z64 = _float64(xp, Zt)
    return Z64 @ Z64.T


def _directions(xp: Namespace, gram: Any, Zt: Any, X: Any) -> Any:
    """Least-squares ``D = (ZᵀZ)⁺ Zᵀ H`` (k × d) from the float64 Gram ``ZᵀZ``: the solve in
    float64, ``D`` in ``X``'s dtype."""
    values, vectors = xp.linalg.eigh(gram)
    # the pseudo-inverse of the symmetric Gram, cut as torch.linalg.pinv cuts (k · eps · λ_max)
    cutoff = float(abs(values).max()) * len(values) * np.finfo(np.float64).eps
    inverse = xp.where(abs(values) > cutoff, 1 / xp.where(values == 0, 1, values), 0)
    rhs = _float64(xp, Zt @ X)
    return xp.asarray((vectors * inverse) @ (vectors.T @ rhs), dtype=X.dtype)


def _directions_solved(
    gram: torch.Tensor, Zt: torch.Tensor, X: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``D = (ZᵀZ)⁻¹ Zᵀ H`` (k × d, in ``X``'s dtype) by a Cholesky factorisation of the float64
    Gram, without a host read, and whether it equals the pseudo-inverse's solution (a 0-d bool
    on the device): a dead code (a zero diagonal entry: its row and column are zero) gets the
    largest pivot of the others, so its direction is 0; the rest must be factorised and
    conditioned well enough that no eigenvalue falls under :func:`_directions`' cut
    (``λ_min ≥ 1/‖L⁻¹‖²_F > k · eps · tr ≥ k · eps · λ_max``)."""
    k = gram.shape[0]
    diagonal = torch.diagonal(gram)
    dead = diagonal == 0
    scale = torch.where(diagonal.max() > 0, diagonal.max(), torch.ones_like(diagonal[0]))
    padded = gram + torch.diag(dead.to(gram.dtype) * scale)
    factor, info = torch.linalg.cholesky_ex(padded)
    eye = torch.eye(k, dtype=gram.dtype, device=gram.device)
    inverse = torch.linalg.solve_triangular(factor, eye, upper=False)
    bound = inverse.pow(2).sum() * torch.diagonal(padded).sum() * k * np.finfo(np.float64).eps
    ok = (info == 0) & (bound < 1)
    rhs = Zt.to(torch.float64) @ X.to(torch.float64)
    return torch.cholesky_solve(rhs, factor).to(X.dtype), ok


def _objective(xp: Namespace, Zt: Any, At: Any, B: Any, gram: Any, sq_norm: float) -> Any:
    """``‖H − Z D‖² / ‖H‖² = (‖H‖² − 2⟨Z, A⟩ + ⟨ZᵀZ, B⟩) / ‖H‖²`` from ``At = D Hᵀ``,
    ``B = D Dᵀ`` and the float64 Gram of ``Z`` (float64 reductions): a float64 scalar of the
    namespace (on the device for torch: read with the block's others)."""
    cross = (_float64(xp, Zt) * At).sum()
    quad = (gram * B).sum()
    return (sq_norm - 2 * cross + quad) / sq_norm


def _mu_sweep(xp: Namespace, Zt: Any, At: Any, B: Any) -> None:
    """The multiplicative update of ``Zt`` in place (``B`` is symmetric: ``(Z B₋)ᵀ = B₋ Zᵀ``)."""
    B_pos, B_neg = xp.clip(B, 0, None), xp.clip(-B, 0, None)
    A_pos, A_neg = xp.clip(At, 0, None), xp.clip(-At, 0, None)
    Zt *= xp.sqrt((A_pos + B_neg @ Zt) / (A_neg + B_pos @ Zt + _EPS))


def _hals_sweep(xp: Namespace, Zt: Any, At: Any, B: Any) -> None:
    """One sweep of exact coordinate descent over the codes ``Zt`` (k × n), in place: code row
    ``j`` becomes ``max(0, (Aᵀ[j] − Σ_{r≠j} B[j, r] Zt[r]) / B[j, j])``, the HALS update with
    the divisions done once per sweep; a zero direction (``B[j, j] = 0``) keeps its codes (in
    numpy the live rows are listed; in torch every row is updated and a dead one put back, so
    the device is not read)."""
    diagonal = xp.diagonal(B)
    scale = xp.where(diagonal > 0, diagonal, 1)[:, None]
    A_scaled, B_scaled = At / scale, B / scale
    B_scaled = B_scaled - xp.diag(xp.diagonal(B_scaled))  # a zero diagonal, the rest as is
    row, zero = xp.empty_like(Zt[:1]), xp.zeros_like(Zt[0, 0])
    if xp is np:
        for j in [j for j, b in enumerate(diagonal.tolist()) if b > 0]:
            # rows as 1 × n slices: both namespaces write a product into them in place
            xp.matmul(B_scaled[j : j + 1], Zt, out=row)
            xp.subtract(A_scaled[j : j + 1], row, out=row)
            xp.maximum(row, zero, out=Zt[j : j + 1])
        return
    live = diagonal > 0
    for j in range(Zt.shape[0]):
        xp.matmul(B_scaled[j : j + 1], Zt, out=row)
        xp.subtract(A_scaled[j : j + 1], row, out=row)
        xp.maximum(row, zero, out=row)
        Zt[j : j + 1] = xp.where(live[j], row, Zt[j : j + 1])


def _copy(xp: Namespace, a: Any) -> Any:
    return a.copy() if xp is np else a.clone()


def _block(
    xp: Namespace,
    sweep: Callable[[Namespace, Any, Any, Any], None],
    Xa: Any,
    Zt: Any,
    D: Any,
    sq_norm: float,
    steps: int,
    exact: bool,
) -> tuple[list[tuple[Any, Any, Any]], list[float], list[float]]:
    """``steps`` iterations from codes ``Zt`` (updated in place) and directions ``D``: each
    iteration's state ``(Zt, D, ZᵀZ)`` (copies of ``Zt`` when there are several), objective and,
    with the Cholesky directions (``exact`` False), whether they equal the pseudo-inverse's
    (1.0) — read from the device in one transfer."""
    states, objectives, solved = [], [], []
    for _ in range(steps):
        At, B = D @ Xa.T, D @ D.T
        sweep(xp, Zt, At, B)
        gram = _gram(xp, Zt)
        objectives.append(_objective(xp, Zt, At, B, gram, sq_norm))
        if exact:
            D = _directions(xp, gram, Zt, Xa)
        else:
            D, ok = _directions_solved(gram, Zt, Xa)
            solved.append(ok)
        states.append((_copy(xp, Zt) if steps > 1 else Zt, D, gram))
    read = _read(xp, objectives + solved)
    return states, read[: len(objectives)], read[len(objectives) :]


def _read(xp: Namespace, values: list[Any]) -> list[float]:
    """Scalars of the namespace as floats: numpy's as they are, torch's in one transfer."""
    if xp is np or not values:
        return [float(v) for v in values]
    return torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in values]).tolist()


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
        xp = _namespace(X)
        Xa, Zt = _arrays(xp, X), _arrays(xp, Z.T.contiguous())
        D = _directions(xp, _gram(xp, Zt), Zt, Xa)
        sweep = _hals_sweep if self.solver == "hals" else _mu_sweep
        history: list[float] = []
        converged, gram = False, None
        block = 1 if xp is np else CHECK_EVERY  # numpy reads its scalars for free
        exact = xp is np  # the pseudo-inverse's directions (the device's fall back to them)
        while not converged and len(history) < self.max_iter:
            steps = min(block, self.max_iter - len(history))
            start = (_copy(xp, Zt) if block > 1 else Zt, D)
            states, values, fine = _block(xp, sweep, Xa, Zt, D, sq_norm, steps, exact)
            if not all(fine):  # an ill-conditioned Gram: the block again, pseudo-inverses
                Zt, D = start
                exact = True
                continue
            exact = xp is np
            taken = 0
            for value in values:
                taken += 1
                history.append(value)
                if on_iteration is not None:
                    on_iteration(len(history), value)
                if self._stops(history):
                    converged = True
                    break
            Zt, D, gram = states[taken - 1]  # the state the last objective read describes
        final = float(_objective(xp, Zt, D @ Xa.T, D @ D.T, gram, sq_norm))  # gram: the last Zt
        self.components_ = _tensor(D)
        self.n_iter_ = len(history)
        self.converged_ = converged
        self.objective_ = history
        self.relative_error_ = math.sqrt(max(final, 0.0))
        self.svd_bound_ = self._svd_bound(X, sq_norm)
        return self

    def _stops(self, history: list[float]) -> bool:
        """Whether the fit ends after the last objective of ``history``: an exact factorisation,
        or a relative decrease of at most ``tol``."""
        last = history[-1]
        if last <= _OBJECTIVE_FLOOR:
            return True
        return len(history) > 1 and history[-2] - last <= self.tol * history[-2]

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
        xp = _namespace(X)
        Zt, At, B = (_arrays(xp, t) for t in (Z.T.contiguous(), A.T.contiguous(), B))
        previous = float(_objective(xp, Zt, At, B, _gram(xp, Zt), sq_norm))
        for _ in range(check_count(sweeps, "sweeps", minimum=1)):
            _hals_sweep(xp, Zt, At, B)
            current = float(_objective(xp, Zt, At, B, _gram(xp, Zt), sq_norm))
            if previous - current <= self.tol * max(previous, _EPS):
                break
            previous = current
        return _tensor(Zt).T

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


#: The rescaling of :func:`rounding_angles`: 1 + 2⁻²⁰, eight float32 ulps at 1 — every input
#: value moves by a few units in its last place, and nothing else changes.
ROUNDING_SCALE = 1 + 2**-20


def rounding_angles(
    H: ArrayLike, rank: int, *, seed: int = 0, max_iter: int = 500, scale: float = ROUNDING_SCALE
) -> Float[torch.Tensor, " rank"]:
    """The rounding floor of a semi-NMF fit: the principal angles (degrees, ascending) between
    the span fitted on ``H`` (n × d) and the span fitted on ``scale · H``.

    Semi-NMF is scale-equivariant — the initial directions are rows of ``H``, the codes' updates
    read ``A = H Dᵀ`` against ``B = D Dᵀ`` (the scale cancels), the objective and the stopping
    test are relative — so in exact arithmetic both fits span one subspace (with ``scale`` a
    power of two they are bit for bit the same, tested). With the default ``scale`` every value
    moves by a few units in its last place: the angles are what rounding alone does to the fit
    (another CPU's BLAS, numpy against torch), and an angle between two semi-NMF fits within the
    sum of their floors is not a change of geometry."""
    X = check_matrix(H, "H").to(torch.float64)
    fits = [
        SemiNMF(rank, seed=seed, max_iter=max_iter).fit(rows).basis() for rows in (X, X * scale)
    ]
    return principal_angles(*fits) * (180 / math.pi)
