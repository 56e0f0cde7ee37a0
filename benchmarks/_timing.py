"""Timing helper shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["best_time"]


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls of ``fn`` (seconds) and the last call's result."""
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value
