"""Shape aliases and the factorisation convention, in one place.

Convention used across tangentlens:

* ``H`` — activations at one hook site, ``(n, d)``: one row per kept token.
* ``G`` — gradients of the model's own loss with respect to ``H``, ``(n, d)``.
* ``H ≈ Z D`` — codes ``Z ≥ 0`` of shape ``(n, k)``, dictionary ``D`` of shape ``(k, d)``.
* ``Q`` — an orthonormal basis of a subspace, ``(d, r)``; its projector is ``Q Qᵀ``.
* Token batches are ``(batch, pos)`` integer tensors.

Metric functions accept torch tensors or numpy arrays (``ArrayLike``) and return Python floats.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import torch
from jaxtyping import Bool, Float, Int

#: A torch tensor or a numpy array (metric functions take either).
ArrayLike: TypeAlias = torch.Tensor | np.ndarray

#: ``H``: activations at one hook site, ``(n, d)``, one row per kept token.
Activations: TypeAlias = Float[torch.Tensor, "n d"]
#: ``G``: gradients of the model's own loss with respect to ``H``, ``(n, d)``.
Gradients: TypeAlias = Float[torch.Tensor, "n d"]
#: ``Z``: non-negative codes of ``H ≈ Z D``, ``(n, k)``.
Codes: TypeAlias = Float[torch.Tensor, "n k"]
#: ``D``: a dictionary's directions, ``(k, d)``.
Dictionary: TypeAlias = Float[torch.Tensor, "k d"]
#: ``Q``: an orthonormal basis of a subspace, ``(d, r)``.
Basis: TypeAlias = Float[torch.Tensor, "d r"]
#: A second moment or covariance, ``(d, d)``.
Moment: TypeAlias = Float[torch.Tensor, "d d"]
#: Token ids, ``(batch, pos)``.
Tokens: TypeAlias = Int[torch.Tensor, "batch pos"]
#: Which positions are kept, ``(batch, pos)``.
TokenMask: TypeAlias = Bool[torch.Tensor, "batch pos"]

__all__ = [
    "Activations",
    "ArrayLike",
    "Basis",
    "Codes",
    "Dictionary",
    "Gradients",
    "Moment",
    "TokenMask",
    "Tokens",
]
