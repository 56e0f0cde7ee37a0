"""Scalar argument checks shared by configs and functions: counts, fractions, option values.

Every check raises ``ValueError`` naming the argument, what was wrong and what is allowed. No
numeric library is imported here, so recipe and config validation stays light; the tensor checks
of the metrics are in :mod:`tangentlens.metrics._validate`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from numbers import Integral, Real

__all__ = ["check_choice", "check_count", "check_fraction", "suggest"]


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
