"""Every argument check of tangentlens: scalars (counts, fractions, option values), tensors
(shapes, finiteness, float64 conversion) and recipe tables (a config dataclass built from a TOML
table, :func:`build_section`).

Every check raises ``ValueError`` naming the argument, what was wrong and what is allowed. torch
is imported on the first tensor check, so recipe and config validation stays light. Tensors keep
their device; numpy arrays become CPU tensors without a copy where possible.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from tangentlens._lazy import LazyModule

if TYPE_CHECKING:
    import torch

    from tangentlens.typing import ArrayLike
else:
    torch = LazyModule("torch")

__all__ = [
    "CHUNK_ROWS",
    "Bound",
    "as_tensor",
    "build_section",
    "check_bounds",
    "check_choice",
    "check_count",
    "check_fraction",
    "check_matrix",
    "check_square",
    "check_vector",
    "finite_elementwise",
    "finite_flags",
    "finite_sums",
    "suggest",
    "to_float64",
]


@dataclass(frozen=True)
class Bound:
    """A range ``low … high`` that a model's width sets on the setting ``key`` (its recipe
    key), whose value is ``value``; ``why``: what sets it, with the formula."""

    key: str
    value: int
    low: int
    high: int
    why: str


def check_bounds(bounds: Iterable[Bound]) -> None:
    """Refuse the first setting (in the order given) whose value lies outside the
    intersection of its bounds, naming its key, its value, the allowed range (none when
    empty) and what sets the binding ends."""
    by_key: dict[str, list[Bound]] = {}
    for bound in bounds:
        by_key.setdefault(bound.key, []).append(bound)
    for key, found in by_key.items():
        low = max(found, key=lambda b: b.low)
        high = min(found, key=lambda b: b.high)
        value = found[0].value
        if not low.low <= value <= high.high:
            allowed = f"{low.low} … {high.high}" if low.low <= high.high else "none"
            binding = high if value > high.high else low
            raise ValueError(f"{key} = {value} is out of range: {binding.why}; allowed: {allowed}")


def check_count(n: object, name: str, *, minimum: int) -> int:
    """Validate an integer count ``≥ minimum`` (bools rejected)."""
    if isinstance(n, bool) or not isinstance(n, Integral):
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {n!r}")
    if int(n) < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {n}")
    return int(n)


def check_fraction(
    x: object,
    name: str,
    *,
    low: float = 0.0,
    high: float = 1.0,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Validate a real number in the interval between ``low`` and ``high`` (open or closed ends)."""
    left, right = ("(" if low_open else "["), (")" if high_open else "]")
    allowed = f"a number in {left}{low}, {high}{right}"
    if isinstance(x, bool) or not isinstance(x, Real) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be {allowed}, got {x!r}")
    v = float(x)
    too_low = v <= low if low_open else v < low
    too_high = v >= high if high_open else v > high
    if too_low or too_high:
        raise ValueError(f"{name} must be {allowed}, got {v}")
    return v


def check_choice(value: object, name: str, allowed: Iterable[str]) -> str:
    """Validate that ``value`` is one of ``allowed``."""
    options = tuple(allowed)
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return str(value)


def suggest(word: object, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the option nearest ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def finite_flags(tensors: Iterable[torch.Tensor]) -> list[bool]:
    """Whether each tensor holds only finite values, with one device sync when all do.

    A finite sum means every element is finite (NaN and ±inf propagate through a sum), so each
    tensor is summed once (at float32 precision at least: :func:`finite_sums`) — about 15×
    cheaper on the CPU than an element-wise ``isfinite`` mask. Only a tensor whose sum is not
    finite (a NaN, an inf, or finite values whose sum overflows) is checked element-wise, in
    chunks of ``CHUNK_ROWS`` rows (:func:`finite_elementwise`).
    """
    tensors = list(tensors)
    sums = finite_sums(tensors)
    if not sums:
        return []
    return [ok or finite_elementwise(t) for t, ok in zip(tensors, _finite_sums(sums), strict=True)]


def finite_sums(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's 0-d sum at float32 precision at least (0 for a non-float tensor), on its
    device: finite when every element is, unless the finite values' sum overflows."""
    return [
        t.sum(dtype=torch.promote_types(t.dtype, torch.float32))
        if t.is_floating_point()
        else t.new_zeros((), dtype=torch.float32)
        for t in tensors
    ]


def _finite_sums(sums: list[torch.Tensor]) -> list[bool]:
    """Whether each 0-d sum is finite, with one sync (the sums gathered on the first's device)."""
    return torch.isfinite(torch.stack([s.to(sums[0].device) for s in sums])).tolist()


def finite_elementwise(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is finite, checked in row chunks (one read each)."""
    # Row chunks keep the temporary boolean mask small on large matrices.
    flat = x.reshape(x.shape[0], -1) if x.ndim > 0 else x.reshape(1, 1)
    return all(
        bool(torch.isfinite(flat[start : start + CHUNK_ROWS]).all())
        for start in range(0, flat.shape[0], CHUNK_ROWS)
    )


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not finite_flags([x])[0]:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _coerce(value: Any, annotation: Any, path: str) -> Any:
    """Check a TOML value against a field annotation (as a string from ``__future__``). A text
    field also takes an integer or a list of integers, as the text they stand for (``1500`` →
    ``"1500"``, ``[0, 1000]`` → ``"0,1000"``): ``--set suite.steps=1500`` reaches the recipe
    unquoted, whatever quotes the shell removed."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{path} must be a list, got {value!r}")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(
                f"{path} must be a table ([{path}] or {path}.KEY = VALUE), got {value!r}"
            )
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{path} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if _is_int(value):  # suite.steps = 1500, capture.layers = 3: the text they stand for
            return str(value)
        if isinstance(value, list) and value and all(_is_int(v) for v in value):
            return ",".join(map(str, value))  # suite.steps = [0, 1000]
        if not isinstance(value, str):
            raise ValueError(f"{path} must be a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return build_section(hint, value, path)
    return value


def build_section(cls: type, table: Any, path: str) -> Any:
    """``cls`` (a recipe section's dataclass) from a TOML-like table: unknown keys and values
    of the wrong type are refused naming ``path.key`` (and the nearest allowed key). A config's own
    check that names one of its fields is reported under ``path.field``, any other under
    ``path``."""
    if not isinstance(table, dict):
        raise ValueError(f"{path} must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in table.items():
        if key not in names:
            raise ValueError(f"unknown key {path}.{key}; allowed: {names}{suggest(key, names)}")
        kwargs[key] = _coerce(value, hints[key], f"{path}.{key}")
    try:
        return cls(**kwargs)
    except ValueError as error:  # a config's own check: say where in the recipe
        message = str(error)
        if message.startswith(f"{path}."):
            raise
        first = message.split(" ", 1)[0].rstrip(":")
        raise ValueError(f"{path}.{message}" if first in names else f"{path}: {message}") from None
