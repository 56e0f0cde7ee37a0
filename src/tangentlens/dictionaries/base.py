"""The concept-dictionary protocol: ``fit(H) → self``, ``encode``, ``decode``, ``basis()``.

A dictionary factorises activations ``H`` (n × d) as ``H ≈ Z D`` with codes ``Z`` (n × k) and
directions ``D`` (k × d); the tangent proxy is ``span(D)``, handed out as an orthonormal basis
``Q`` (d × r) whose effective rank ``r ≤ k`` is reported. Estimator style: parameters in
``__init__``, ``fit`` returns ``self``, fitted attributes end in ``_``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tangentlens.typing import Activations, ArrayLike, Basis, Codes

__all__ = ["ConceptDictionary", "check_fitted", "check_rank"]


@runtime_checkable
class ConceptDictionary(Protocol):
    """What every dictionary (PCA, semi-NMF, SAE) offers once fitted."""

    rank: int

    def fit(self, H: ArrayLike) -> ConceptDictionary: ...

    def encode(self, H: ArrayLike) -> Codes: ...

    def decode(self, Z: ArrayLike) -> Activations: ...

    def basis(self) -> Basis: ...

    @property
    def effective_rank_(self) -> int: ...


def check_rank(rank: object, d: int, n: int | None = None) -> int:
    """Validate a dictionary rank: an integer with ``1 ≤ rank < d`` (and ``rank ≤ n`` samples)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank < d:
        raise ValueError(
            f"rank must be an integer in [1, {d - 1}] (below the width d={d}), got {rank!r}"
        )
    if n is not None and n < rank:
        raise ValueError(f"fitting rank {rank} needs at least {rank} samples, got {n}")
    return rank


def check_fitted(
    dictionary: object, fitted_by: str = "fit(H)", attribute: str = "components_"
) -> None:
    """Refuse a dictionary that has no fitted ``attribute`` yet, naming what fits it."""
    if not hasattr(dictionary, attribute):
        name = type(dictionary).__name__
        raise ValueError(f"this {name} is not fitted yet: call {fitted_by} first")
