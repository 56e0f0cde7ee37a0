"""How much gradient energy and gradient anisotropy a subspace holds (METHODS.md §1.3–1.4).

With gradients ``G`` (n × d) and an orthonormal basis ``Q`` (d × k):

* energy fraction ``E(Q) = ‖G Q‖²_F / ‖G‖²_F`` — pooled over tokens; equal to
  ``tr(Qᵀ M Q) / tr(M)`` with the accumulated second moment ``M = GᵀG``, so any number of
  subspaces is scored from one d × d matrix. Chance level ``k/d``;
* the closed-form null mean of Haar k-frames in the complement of an excluded subspace X of rank
  r: ``E[E(N)] = k/(d − r) · (1 − E(X))`` — for the exchangeable controls of a proxy with the mean
  direction projected out X = span(m̂), for its complement controls X = span(T, m̂)
  (:mod:`tangentlens.metrics.controls`);
* :func:`drift_regression` **(ours; METHODS.md §1.3, m̂'s own estimation error)** — the
  gradients with the part of each that their drift coordinate ``m̂ᵀg`` predicts removed:
  ``r = g − b (m̂ᵀg)``, ``b = M m̂ / (m̂ᵀ M m̂)`` the pooled least-squares coefficient, so that
  energy along the true drift is not credited to a proxy that holds part of it because m̂ errs
  (see the function);
* :func:`compare_energy` — the proxy against its controls: the ratio to the family's exact mean
  ``E(T) / null_mean`` (the population ratio's estimate: the frames' Monte-Carlo error does not
  shrink with the tokens, so a ratio to the frames drawn would carry it into every interval;
  ``sampled_ratio`` is ``E(T)`` over the frames' mean, a self-check), enrichment ``E/(k/d)``
  (null ``(1 − E(X)) · d/(d − r)`` with X excluded: never read it against 1), z-score and the
  permutation p-value ``(1 + #{E(N) ≥ E(T)}) / (1 + draws)``. A proxy must be orthogonal to the
  subspace its controls exclude, or inside it (the complement family): a proxy that reaches
  into it partly would be credited with energy its controls cannot reach, and is refused;
* spectral anisotropy share **(ours)** — with the *uncentred* second moment ``C = GᵀG/n``
  (like the energy fraction: a mean gradient is anisotropy too) and ``A = C − (tr C / d) I``,
  ``tr(Qᵀ A₊ Q) / tr(A₊)`` (``A₊`` keeps the positive eigenvalues);
* ΔIsoScore* — ``IsoScore*(G (I − P_Q)) − IsoScore*(G)`` from covariances (IsoScore is defined
  on centred variances): the projected covariance is ``(I − P) C (I − P)`` and the shrinkage
  covariance is projected the same way (scored in all d dimensions, so proxy and controls of
  equal rank pay the same for the k removed directions);
* :func:`compare_anisotropy_share` / :func:`compare_delta_isoscore_star` — either view of the
  proxy against its control frames, reported like the energy's: control mean and std (ddof 1),
  ``z = (x_T − mean) / std`` and ``p = (1 + #{x_N ≥ x_T}) / (1 + draws)`` (floor ``1/(draws+1)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
from jaxtyping import Float

from tangentlens.checks import CHUNK_ROWS, check_matrix, check_square, check_vector, to_float64
from tangentlens.metrics.isoscore import isoscore_from_moments, isoscore_star_from_covariance
from tangentlens.metrics.subspace import check_basis
from tangentlens.typing import ArrayLike, Moment

__all__ = [
    "ControlComparison",
    "DriftRegression",
    "EnergyComparison",
    "anisotropy_share_spectral",
    "anisotropy_shares_spectral",
    "compare_anisotropy_share",
    "compare_anisotropy_shares",
    "compare_delta_isoscore_star",
    "compare_delta_isoscores_star",
    "compare_energy",
    "delta_isoscore_star",
    "delta_isoscores_star",
    "drift_regression",
    "energy_fraction",
    "energy_fraction_from_moment",
    "energy_fractions_from_moment",
    "enrichment_null",
    "null_energy_mean",
]

Frames = Float[torch.Tensor, "draws d k"]
K = TypeVar("K")

#: Largest |Xᵀ N| entry tolerated between a control frame and the subspace it excludes.
_ORTHOGONAL_ATOL = 1e-8
#: ``‖XᵀQ‖_F`` (or ``‖Q − XXᵀQ‖_F``) below which a proxy counts as orthogonal to (inside) an
#: excluded span: the orthonormality tolerance of :func:`~tangentlens.metrics.check_basis`.
_OVERLAP_ATOL = 1e-6
#: ΔIsoScore* forms the projected covariances in chunks of at most this many entries (32 MB).
_FORMED_ENTRIES = 2**22


def _moment(M: ArrayLike, name: str = "M") -> Moment:
    S = to_float64(check_square(M, name))
    if not float(torch.diagonal(S).sum()) > 0:
        raise ValueError(f"{name} has zero trace: the gradients are all zero, energy is undefined")
    return S


def energy_fraction(G: ArrayLike, Q: ArrayLike) -> float:
    """``‖G Q‖²_F / ‖G‖²_F`` for gradients ``G`` (n × d) and an orthonormal ``Q`` (d × k);
    float64 row chunks, memory bounded in n."""
    X = check_matrix(G, "G")
    B = check_basis(Q, "Q", d=X.shape[1]).to(X.device)
    inside = total = 0.0
    for start in range(0, X.shape[0], CHUNK_ROWS):
        chunk = to_float64(X[start : start + CHUNK_ROWS])
        inside += float((chunk @ B).pow(2).sum())
        total += float(chunk.pow(2).sum())
    if not total > 0:
        raise ValueError("G is all zeros: the energy fraction is undefined")
    return inside / total


def energy_fractions_from_moment(M: ArrayLike, frames: Frames) -> torch.Tensor:
    """``tr(Qⱼᵀ M Qⱼ) / tr(M)`` for a batch of orthonormal frames ``(draws, d, k)``; float64
    ``(draws,)``. ``M = Σ gᵢgᵢᵀ`` (d × d)."""
    S = _moment(M)
    F = to_float64(torch.as_tensor(frames)).to(S.device)
    if F.ndim != 3 or F.shape[1] != S.shape[0]:
        raise ValueError(f"frames must be (draws, {S.shape[0]}, k), got {tuple(F.shape)}")
    return _fractions(S, F)


def _fractions(S: Moment, F: torch.Tensor) -> torch.Tensor:
    """:func:`energy_fractions_from_moment` of a validated moment and frames."""
    return torch.einsum("jdk,de,jek->j", F, S, F) / torch.diagonal(S).sum()


def _fraction(S: Moment, B: torch.Tensor) -> float:
    """:func:`energy_fraction_from_moment` of a validated moment and basis."""
    return float(_fractions(S, B[None].to(S.device))[0])


def energy_fraction_from_moment(M: ArrayLike, Q: ArrayLike) -> float:
    """``tr(Qᵀ M Q) / tr(M)``: :func:`energy_fraction` from the second moment ``M = GᵀG``."""
    S = _moment(M)
    B = check_basis(Q, "Q", d=S.shape[0])
    return _fraction(S, B)


def null_energy_mean(k: int, d: int, excluded_rank: int, excluded_energy: float) -> float:
    """Exact mean energy fraction of a Haar k-frame in the complement of a subspace of rank
    ``excluded_rank`` holding ``excluded_energy`` of the gradient energy:
    ``k / (d − r) · (1 − E(X))`` (the frame's expected projector is ``k/(d − r) · (I − P_X)``)."""
    if not 0 <= excluded_rank < d or not 0 < k <= d - excluded_rank:
        raise ValueError(
            f"need 0 ≤ excluded rank r < d = {d} and k in [1, d − r], got r = {excluded_rank}, "
            f"k = {k}"
        )
    return k / (d - excluded_rank) * (1.0 - excluded_energy)


def enrichment_null(d: int, excluded_rank: int, excluded_energy: float) -> float:
    """What ``E(T) / (k/d)`` reads for a proxy uniform in the complement of a subspace of rank
    ``excluded_rank`` holding ``excluded_energy``: ``(1 − E(X)) · d/(d − r)`` (the null mean
    over ``k/d``; e.g. 0.71 at E(m̂) = 0.3, d = 64, r = 1). The enrichment's reference, not 1."""
    if not 0 <= excluded_rank < d:
        raise ValueError(f"need 0 ≤ excluded rank r < d = {d}, got r = {excluded_rank}")
    return (1.0 - excluded_energy) * d / (d - excluded_rank)


@dataclass(frozen=True)
class DriftRegression:
    """The gradients' second moment with the drift's part removed (:func:`drift_regression`):
    ``moment`` ``S = L M Lᵀ`` (d × d, float64; ``S m̂ = 0``), the coefficient ``b`` (d,
    ``m̂ᵀb = 1``) of ``L = I − b m̂ᵀ``, the share of the gradient energy removed
    ``removed = ‖M m̂‖² / (m̂ᵀ M m̂ · tr M)`` (``≥ E(m̂)``; equal when the drift coordinate
    co-varies with no other direction) and ``total = tr M``."""

    moment: Moment
    coefficient: Float[torch.Tensor, " d"]
    removed: float
    total: float


def drift_regression(M: ArrayLike, m: ArrayLike) -> DriftRegression:
    """The second moment of the gradients ``g`` with their drift coordinate's linear prediction
    removed: ``r = L g``, ``L = I − b m̂ᵀ``, ``b = M m̂ / (m̂ᵀ M m̂)`` — the pooled least-squares
    coefficient of ``g`` on ``m̂ᵀg`` (``M = Σ ggᵀ``, ``m`` the unit mean direction m̂) — so
    ``S = Σ rrᵀ = L M Lᵀ = M − (M m̂)(M m̂)ᵀ / (m̂ᵀ M m̂)``, the Schur complement of the drift
    coordinate. ``L`` is the oblique projection onto m̂⊥ along ``b``: ``r ⊥ m̂``.

    Why **(ours; METHODS.md §1.3, "m̂'s own estimation error")**: m̂ is the activations' mean
    direction, and its error ``m̂ − m ∝ Σ_H^{1/2} z / (√n ‖μ‖)`` lies mostly in the
    high-variance directions a PCA or semi-NMF proxy spans. Projecting m̂ out of the proxy then
    leaves part of the true drift m in it, and gradients with energy along m credit the proxy
    with it: under the null (gradients isotropic in m⊥ plus energy along m) the orthogonal
    estimator read ratio 1.035 and P(p ≤ .05) = 0.93 at ρ = ‖μ‖/√tr Σ_H = 0.3 (d = 128,
    k = 8, 4 096 tokens). No estimate of m from the activations alone removes it — the error's
    direction is random, and fitting the proxy and m̂ on one half of the sequences and scoring
    the other (cross-fitting) doubles it (m̂ from half the tokens errs √2 more; the gradients
    do not depend on which half m̂ came from). The gradients locate it: energy along the true
    m makes their coordinates in the proxy co-vary with ``m̂ᵀg`` exactly through ``Qᵀm``, and
    the regression removes that part. The null of a proxy scored on ``S`` against Haar frames
    in m̂⊥ scored on the same ``S`` does not depend on m̂'s error: ``S`` is fixed by the
    gradients and m̂, not by the proxy, so a proxy uniform in m̂⊥ is exchangeable with the
    frames (the permutation p-value stays exactly calibrated), and under the null above the
    drift's energy left in ``S`` is a fraction ``σ²/a²`` of the leak (σ², a²: the energy per
    direction off and along m). What it measures: the energy beyond what the drift coordinate
    explains — with m̂ exact and ``m̂ᵀg`` uncorrelated with the other coordinates, ``b = m̂``
    and this is the orthogonal estimator; where the gradients' drift coordinate co-varies with
    a direction of the proxy, that shared energy counts as the drift's, not the proxy's
    (conservative for the proxy).

    A zero drift energy (``m̂ᵀ M m̂ = 0``) leaves ``M`` as it is (``b = m̂``).

    >>> r = drift_regression(torch.diag(torch.tensor([4.0, 1.0])), torch.tensor([1.0, 0.0]))
    >>> r.moment.tolist(), r.coefficient.tolist(), r.removed
    ([[0.0, 0.0], [0.0, 1.0]], [1.0, 0.0], 0.8)
    """
    S = _moment(M)
    u = to_float64(check_vector(m, "m")).to(S.device)
    if u.shape[0] != S.shape[0] or abs(float(u.norm()) - 1) > _OVERLAP_ATOL:
        raise ValueError(f"m must be a unit vector of length {S.shape[0]} (the mean direction)")
    total = float(torch.diagonal(S).sum())
    response = S @ u
    along = float(u @ response)
    if not along > 0:
        return DriftRegression(S, u, 0.0, total)
    b = response / along
    regressed = S - torch.outer(response, response) / along
    return DriftRegression((regressed + regressed.T) / 2, b, float(response @ b) / total, total)


@dataclass(frozen=True)
class EnergyComparison:
    """The proxy's energy fraction against its controls (see :func:`compare_energy`):
    ``energy_ratio = E(T) / null_mean`` (the exact control mean), ``sampled_ratio = E(T) /
    control_mean`` (the frames drawn), ``enrichment_null`` what ``energy_enrichment`` reads
    under the null."""

    energy_fraction: float
    control_mean: float
    control_std: float
    control_min: float
    control_max: float
    null_mean: float
    energy_ratio: float
    sampled_ratio: float
    energy_enrichment: float
    enrichment_null: float
    energy_z: float
    energy_p_value: float
    draws: int
    rank: int
    d: int


def _check_outside_or_inside(T: torch.Tensor, X: torch.Tensor) -> None:
    """Refuse a proxy ``T`` that is neither orthogonal to the excluded span ``X`` nor inside it
    (``‖XᵀT‖_F`` and ``‖T − XXᵀT‖_F`` both above the basis tolerance)."""
    cross = X.T @ T.to(X.device)
    leak = float(cross.norm())
    residual = float((T.to(X.device) - X @ cross).norm())
    if leak > _OVERLAP_ATOL and residual > _OVERLAP_ATOL:
        raise ValueError(
            f"the proxy reaches into the subspace its controls exclude (‖XᵀQ‖²_F = "
            f"{leak**2:.3g} of rank {T.shape[1]}): it would be credited with energy its "
            "controls cannot reach. Project the excluded span out of the proxy (for the mean "
            "direction m̂: tangentlens.proxies.add_fixed_proxy or measure(..., proxies=...), "
            "which record mean_direction_overlap), or pass the excluded span the proxy avoids"
        )


def compare_energy(
    M: ArrayLike,
    proxy: ArrayLike,
    controls: Frames,
    excluded: ArrayLike | None,
    *,
    total: float | None = None,
) -> EnergyComparison:
    """Score the proxy ``Q_T`` (d × k) and its control frames ``(draws, d, k)`` from ``M = GᵀG``
    — or from the drift-regressed moment ``S`` (:func:`drift_regression`), with ``total`` the
    energy every fraction is a share of (``tr(GᵀG)``; default ``tr M``).

    ``excluded`` (d × r orthonormal, or None): the subspace the controls were drawn outside of
    (checked: every frame must be orthogonal to it, and the proxy orthogonal to it or inside
    it — else a ``ValueError``); the controls are Haar k-frames in its complement
    (:func:`~tangentlens.metrics.control_frames`), whose exact mean energy is
    ``null_mean = k/(d − r) · (1 − E(excluded))`` (with ``total``: ``k/(d − r) · (tr M −
    tr(XᵀMX)) / total``, what ``M`` holds outside X). ``energy_ratio = E(T) / null_mean``
    (``inf`` when the null mean is 0); ``sampled_ratio = E(T) / mean E(N)`` over the frames
    given (the ratio to use for frames of another family, e.g. data-matched ones);
    ``energy_enrichment = E(T) / (k/d)``, ``enrichment_null = (1 − E(excluded)) · d/(d − r)``
    (its value for a proxy uniform in the complement: ``energy_ratio`` is their quotient);
    ``energy_z = (E(T) − mean) / std`` (std with
    ddof = 1; ``inf`` when the controls do not vary); ``energy_p_value = (1 + #{E(N) ≥ E(T)})
    / (1 + draws)``.
    """
    S = _moment(M)
    T = check_basis(proxy, "proxy", d=S.shape[0])
    d, k = T.shape
    C = to_float64(torch.as_tensor(controls))
    if C.ndim != 3 or C.shape[1:] != (d, k):
        raise ValueError(f"controls must be (draws, {d}, {k}) (matched rank), got {tuple(C.shape)}")
    X = None if excluded is None else check_basis(excluded, "excluded", d=d)
    if X is not None:
        _check_outside_or_inside(T, X)
        leak = float((X.T.to(C.device) @ C).abs().max())
        if leak > _ORTHOGONAL_ATOL:
            raise ValueError(
                f"the controls are not orthogonal to the excluded subspace (max |Xᵀ N| = "
                f"{leak:.2g}): draw them with tangentlens.metrics.control_frames(excluded=...)"
            )
    scale = 1.0 if total is None else float(torch.diagonal(S).sum()) / total
    if not scale >= 0 or not math.isfinite(scale):
        raise ValueError(f"total must be a positive energy, got {total!r}")
    e_t = _fraction(S, T) * scale
    e_n = _fractions(S, C.to(S.device)) * scale
    against = _against_controls(torch.cat([e_n.new_tensor([e_t]), e_n]))
    mean = against.control_mean
    r, e_x = (0, 1.0 - scale) if X is None else (X.shape[1], 1.0 - scale * (1 - _fraction(S, X)))
    null = null_energy_mean(k, d, r, e_x)
    return EnergyComparison(
        energy_fraction=e_t,
        control_mean=mean,
        control_std=against.control_std,
        control_min=float(e_n.min()),
        control_max=float(e_n.max()),
        null_mean=null,
        energy_ratio=e_t / null if null > 0 else math.inf,
        sampled_ratio=e_t / mean if mean > 0 else math.inf,
        energy_enrichment=e_t / (k / d),
        enrichment_null=enrichment_null(d, r, e_x),
        energy_z=against.z,
        energy_p_value=against.p_value,
        draws=against.draws,
        rank=k,
        d=d,
    )


def _check_frames(frames: Frames, d: int) -> torch.Tensor:
    F = to_float64(torch.as_tensor(frames))
    if F.ndim != 3 or F.shape[1] != d:
        raise ValueError(f"frames must be (draws, {d}, k), got {tuple(F.shape)}")
    return F


def anisotropy_shares_spectral(M: ArrayLike, frames: Frames) -> torch.Tensor:
    """:func:`anisotropy_share_spectral` of every frame of ``(draws, d, k)`` (one eigen-
    decomposition for all); float64 ``(draws,)``."""
    S = to_float64(check_square(M, "M"))
    return _excess_spectrum(S).shares(_check_frames(frames, S.shape[0]).to(S.device))


@dataclass(frozen=True)
class _ExcessSpectrum:
    """``A₊`` of an uncentred second moment: eigenvectors ``(d, d)``, clamped eigenvalues
    ``(d,)`` and their sum."""

    vectors: torch.Tensor
    positive: torch.Tensor
    total: float

    def shares(self, F: torch.Tensor) -> torch.Tensor:
        """``tr(Fⱼᵀ A₊ Fⱼ) / tr(A₊)`` of validated frames ``(draws, d, k)``."""
        weights = torch.einsum("di,jdk->jik", self.vectors, F).pow(2).sum(dim=2)  # ‖Qⱼᵀ vᵢ‖²
        return (weights * self.positive).sum(dim=1) / self.total


def _excess_spectrum(S: Moment) -> _ExcessSpectrum:
    d = S.shape[0]
    sym = (S + S.T) / 2
    excess = sym - torch.diagonal(sym).mean() * torch.eye(d, dtype=S.dtype, device=S.device)
    values, vectors = torch.linalg.eigh(excess)
    positive = values.clamp(min=0)
    total = float(positive.sum())
    if not total > 1e-12 * float(torch.diagonal(sym).abs().sum()):
        raise ValueError("M is isotropic (no eigenvalue above its mean): the share is undefined")
    return _ExcessSpectrum(vectors, positive, total)


def anisotropy_share_spectral(M: ArrayLike, Q: ArrayLike) -> float:
    """``tr(Qᵀ A₊ Q) / tr(A₊)`` with ``A = C − (tr C/d) I`` and ``C`` the *uncentred* gradient
    second moment ``GᵀG/n`` (METHODS.md §1.4; pass ``M = Σ gᵢgᵢᵀ`` or ``GᵀG/n`` — the share does
    not depend on the scale). A mean gradient counts as anisotropy: isotropic noise plus a large
    mean inside ``span(Q)`` gives ≈ 1. 0 for isotropic gradients, 1 when ``span(Q)`` holds every
    direction of excess second moment. Raises when ``M`` is isotropic (``A₊ = 0``). Passing a
    covariance instead scores the centred variant (a mean gradient then counts for nothing)."""
    S = to_float64(check_square(M, "M"))
    B = check_basis(Q, "Q", d=S.shape[0])
    return float(anisotropy_shares_spectral(S, B[None])[0])


def delta_isoscores_star(
    C: ArrayLike, frames: Frames, C0: ArrayLike, zeta: float = 0.2
) -> torch.Tensor:
    """:func:`delta_isoscore_star` of every frame ``F`` of ``(draws, d, k)``; float64
    ``(draws,)``.

    IsoScore depends on the spectrum only through ``(Σλ)² / Σλ² = (tr M)² / ‖M‖²_F``
    (:mod:`tangentlens.metrics.isoscore`), so a projected score needs no eigen-decomposition:
    with ``Σ`` the shrunk covariance, ``W = ΣF`` and ``R = W − F FᵀW`` (= ``PΣF``),
    ``PΣP = Σ − F Wᵀ − R Fᵀ`` costs 2d²k per frame, and its trace and Frobenius norm give the
    score. ``PΣP`` is formed rather than ``‖Σ‖² − 2‖ΣF‖² + ‖FᵀΣF‖²`` summed: that sum cancels
    when the frame holds nearly all of ``Σ`` (7e-6 relative at a 10⁶ spike), the formed matrix
    keeps the eigen-decomposition's accuracy. The unprojected score is computed, and ``C``,
    ``C0`` validated, once; frames are taken in chunks of ≤ 2²² matrix entries."""
    shrunk = _Shrunk.of(C, C0, zeta)
    return shrunk.deltas(_check_frames(frames, shrunk.d).to(shrunk.matrix.device))


@dataclass(frozen=True)
class _Shrunk:
    """The symmetrised shrunk covariance ``Σ = (1 − ζ) C + ζ C0`` ``(d, d)`` and the
    unprojected ``IsoScore*`` (``before``)."""

    matrix: torch.Tensor
    before: float

    @classmethod
    def of(cls, C: ArrayLike, C0: ArrayLike, zeta: float) -> _Shrunk:
        S = to_float64(check_square(C, "C"))
        S0 = to_float64(check_square(C0, "C0", size=S.shape[0])).to(S.device)
        before = isoscore_star_from_covariance(S, S0, zeta)  # validates C, C0 and zeta once
        shrunk = (1 - zeta) * S + zeta * S0
        return cls((shrunk + shrunk.T) / 2, before)

    @property
    def d(self) -> int:
        return int(self.matrix.shape[0])

    def deltas(self, F: torch.Tensor) -> torch.Tensor:
        """ΔIsoScore* of validated frames ``(draws, d, k)``."""
        d, shrunk = self.d, self.matrix
        after = []
        for chunk in F.split(max(1, _FORMED_ENTRIES // (d * d))):
            W = shrunk @ chunk  # (draws, d, k)
            R = W - chunk @ (chunk.transpose(1, 2) @ W)
            left, right = torch.cat([chunk, R], dim=2), torch.cat([W, chunk], dim=2)
            # P Σ P = Σ − [F R] [W F]ᵀ, one product of inner size 2k per frame
            M = torch.baddbmm(
                shrunk.expand(len(chunk), d, d), left, right.transpose(1, 2), alpha=-1
            )
            trace = torch.diagonal(M, dim1=1, dim2=2).sum(dim=1)
            after.append(isoscore_from_moments(trace, M.pow(2).sum(dim=(1, 2)), d))
        return torch.cat(after) - self.before


def delta_isoscore_star(C: ArrayLike, Q: ArrayLike, C0: ArrayLike, zeta: float = 0.2) -> float:
    """``IsoScore*(G (I − P_Q)) − IsoScore*(G)`` from the gradient covariance ``C`` (d × d),
    the shrinkage covariance ``C0`` (projected with ``C``) and ``zeta``. Positive: removing
    ``span(Q)`` makes the gradients more isotropic."""
    S = to_float64(check_square(C, "C"))
    B = check_basis(Q, "Q", d=S.shape[0])
    return float(delta_isoscores_star(S, B[None], C0, zeta)[0])


@dataclass(frozen=True)
class ControlComparison:
    """One score of the proxy against the same score of its matched-rank control frames.

    ``control_std`` with ddof = 1 (0 for one draw); ``z = (value − control_mean) /
    control_std`` (``±inf`` when the controls do not vary and differ from the value, 0 when equal);
    ``p_value = (1 + #{control ≥ value}) / (1 + draws)``, never below ``1/(draws + 1)``.
    """

    value: float
    control_mean: float
    control_std: float
    z: float
    p_value: float
    draws: int


def _against_controls(scores: torch.Tensor) -> ControlComparison:
    """``scores[0]`` (the proxy) against ``scores[1:]`` (its controls)."""
    value, controls = float(scores[0]), scores[1:]
    draws = int(controls.numel())
    mean = float(controls.mean())
    std = float(controls.std()) if draws > 1 else 0.0
    if std > 0:
        z = (value - mean) / std
    else:
        z = math.copysign(math.inf, value - mean) if value != mean else 0.0
    return ControlComparison(
        value=value,
        control_mean=mean,
        control_std=std,
        z=z,
        p_value=(1 + int((controls >= value).sum())) / (1 + draws),
        draws=draws,
    )


def _proxy_and_controls(proxy: ArrayLike, controls: Frames, d: int) -> torch.Tensor:
    """``(1 + draws, d, k)``: the proxy stacked on its matched-rank controls."""
    T = check_basis(proxy, "proxy", d=d)
    k = T.shape[1]
    C = to_float64(torch.as_tensor(controls)).to(T.device)
    if C.ndim != 3 or C.shape[1:] != (d, k) or C.shape[0] < 1:
        raise ValueError(
            f"controls must be (draws ≥ 1, {d}, {k}) (matched rank), got {tuple(C.shape)}"
        )
    return torch.cat([T[None], C])


def compare_anisotropy_share(M: ArrayLike, proxy: ArrayLike, controls: Frames) -> ControlComparison:
    """Spectral anisotropy share of the proxy (d × k) and of its control frames
    ``(draws, d, k)`` from the *uncentred* gradient second moment ``M`` (``Σ gᵢgᵢᵀ`` or
    ``GᵀG/n``): one eigen-decomposition for any number of frames. ``value`` =
    ``tr(Q_Tᵀ A₊ Q_T) / tr(A₊)``; mean, std, z and ``p = (1 + #{share(N) ≥ share(T)}) /
    (1 + draws)`` as :class:`ControlComparison`."""
    return compare_anisotropy_shares(M, {0: (proxy, controls)})[0]


def compare_anisotropy_shares(
    M: ArrayLike, candidates: Mapping[K, tuple[ArrayLike, Frames]]
) -> dict[K, ControlComparison]:
    """:func:`compare_anisotropy_share` of several proxies (``key → (proxy, controls)``, e.g. one
    per proxy method) against the same moment ``M``: one eigen-decomposition for all."""
    S = to_float64(check_square(M, "M"))
    spectrum = _excess_spectrum(S)
    return {
        key: _against_controls(spectrum.shares(_proxy_and_controls(*pair, S.shape[0]).to(S.device)))
        for key, pair in candidates.items()
    }


def compare_delta_isoscore_star(
    C: ArrayLike, proxy: ArrayLike, controls: Frames, C0: ArrayLike, zeta: float = 0.2
) -> ControlComparison:
    """ΔIsoScore* ``= IsoScore*(G(I − P_Q)) − IsoScore*(G)`` of the proxy and of its control
    frames ``(draws, d, k)`` from the gradient *covariance* ``C``, the shrinkage covariance
    ``C0`` and ``zeta`` (no eigen-decomposition per frame: :func:`delta_isoscores_star`).
    Positive: removing the frame makes the gradients more isotropic. Mean, std, z and
    ``p = (1 + #{Δ(N) ≥ Δ(T)}) / (1 + draws)`` as :class:`ControlComparison` (so
    ``p ≥ 1/(draws + 1)``: 1/21 with 20)."""
    return compare_delta_isoscores_star(C, {0: (proxy, controls)}, C0, zeta)[0]


def compare_delta_isoscores_star(
    C: ArrayLike,
    candidates: Mapping[K, tuple[ArrayLike, Frames]],
    C0: ArrayLike,
    zeta: float = 0.2,
) -> dict[K, ControlComparison]:
    """:func:`compare_delta_isoscore_star` of several proxies (``key → (proxy, controls)``)
    against the same covariances: the unprojected score computed, and ``C``, ``C0``
    validated, once for all."""
    shrunk = _Shrunk.of(C, C0, zeta)
    return {
        key: _against_controls(
            shrunk.deltas(_proxy_and_controls(*pair, shrunk.d).to(shrunk.matrix.device))
        )
        for key, pair in candidates.items()
    }
