"""Shared tensor checks for the metrics: shapes, finiteness, float64 conversion.

Every check raises ``ValueError`` naming the argument, what was wrong and what is allowed.
Tensors keep their device; numpy arrays become CPU tensors without a copy where possible. The
scalar checks (counts, fractions, option values) are in :mod:`tangentlens.checks`.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from tangentlens.typing import ArrayLike

__all__ = [
    "CHUNK_ROWS",
    "as_tensor",
    "check_matrix",
    "check_square",
    "check_vector",
    "to_float64",
]

#: Rows converted to float64 at a time by the chunked reductions (8192 × 768 × 8 B ≈ 50 MB).
CHUNK_ROWS = 8192


def as_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    """``x`` as a real floating tensor (integers become float64); rejects bool and complex."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biufc":
            raise ValueError(f"{name} must be a numeric array, got dtype {x.dtype}")
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        with warnings.catch_warnings():  # read-only arrays are fine: metrics never write
            warnings.simplefilter("ignore", UserWarning)
            x = torch.from_numpy(np.ascontiguousarray(x))
    elif not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    x = x.detach()
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name} must be real-valued (float or int), got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float64)
    return x


def _check_finite(x: torch.Tensor, name: str) -> None:
    # Row chunks keep the temporary boolean mask small on large matrices.
    flat = x.reshape(x.shape[0], -1) if x.ndim > 0 else x.reshape(1, 1)
    for start in range(0, flat.shape[0], CHUNK_ROWS):
        if not bool(torch.isfinite(flat[start : start + CHUNK_ROWS]).all()):
            raise ValueError(f"{name} contains NaN or inf; only finite values are allowed")


def check_matrix(x: ArrayLike, name: str, *, min_rows: int = 1, min_cols: int = 1) -> torch.Tensor:
    """Validate an ``(n, d)`` matrix: 2-D, finite, ``n ≥ min_rows``, ``d ≥ min_cols``."""
    t = as_tensor(x, name)
    if t.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n × d), got {t.ndim}-D with shape {tuple(t.shape)}")
    n, d = t.shape
    if n < min_rows:
        raise ValueError(f"{name} needs at least {min_rows} rows, got {n}")
    if d < min_cols:
        raise ValueError(f"{name} needs at least {min_cols} columns, got {d}")
    _check_finite(t, name)
    return t


def check_vector(
    x: ArrayLike, name: str, *, length: int | None = None, min_length: int = 1
) -> torch.Tensor:
    """Validate a 1-D finite vector, optionally of an exact ``length``."""
    t = as_tensor(x, name)
    if t.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {t.ndim}-D with shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {t.shape[0]}")
    if t.shape[0] < min_length:
        raise ValueError(f"{name} needs at least {min_length} entries, got {t.shape[0]}")
    _check_finite(t, name)
    return t


def check_square(x: ArrayLike, name: str, *, size: int | None = None) -> torch.Tensor:
    """Validate a finite square ``(d, d)`` matrix (optionally ``d == size``)."""
    t = as_tensor(x, name)
    if t.ndim != 2 or t.shape[0] != t.shape[1]:
        raise ValueError(f"{name} must be a square (d × d) matrix, got shape {tuple(t.shape)}")
    if size is not None and t.shape[0] != size:
        raise ValueError(f"{name} must be {size} × {size}, got {tuple(t.shape)}")
    _check_finite(t, name)
    return t


def to_float64(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 on its device (no copy if it already is)."""
    return x.to(torch.float64)
