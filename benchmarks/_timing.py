"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DTYPES", "best_time", "synchronize", "torch_dtype"]

#: ``--dtype`` names → torch dtypes (the weight dtypes a sweep's ``suite.dtype`` accepts).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name; another name is a ``ValueError`` listing them."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {list(DTYPES)}")
    return DTYPES[name]


def synchronize() -> None:
    """Wait for every queued CUDA kernel on every GPU when CUDA is in use (no-op otherwise), so
    a wall-clock interval ends when the GPU work it launched has finished."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls of ``fn`` (seconds) and the last call's result.
    CUDA is synchronised before and after each call when it is in use: work queued before the
    call is not counted, and the call's own kernels are."""
    best, value = float("inf"), None
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        value = fn()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best, value
